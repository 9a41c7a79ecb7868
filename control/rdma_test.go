package control

import (
	"reflect"
	"strings"
	"sync"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// fakeRDMA reports a fixed plane and counts the questions.
type fakeRDMA struct {
	mu    sync.Mutex // guards the fields below
	info  RDMAInfo
	calls int
}

func (f *fakeRDMA) RDMAInfo() RDMAInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.info
}

func (f *fakeRDMA) set(info RDMAInfo) {
	f.mu.Lock()
	f.info = info
	f.mu.Unlock()
}

func sampleRDMA() RDMAInfo {
	return RDMAInfo{State: RDMAEnabled, Device: "rxe0", Port: 1, GID: "::ffff:10.0.2.15", GIDIndex: 1, MTU: 1024, LID: 7,
		PoolRegistered: 64 << 20, PoolMRs: 1, Peers: []RDMAPeer{
			{ID: "d1", Transport: "rdma", Link: "up", Epoch: 0x1234, QueuePairs: 2, Segments: 3, Accepting: true, AcceptedEpoch: 0x99},
			{ID: "d3", Transport: "tcp", Link: "failed"},
		}}
}

// TestRDMARequest: the reporter's answer reaches the client field for
// field; without a reporter the answer is OK, "off", with a reason; a long
// reason is cut; the call is read-only, so it is not audited.
func TestRDMARequest(t *testing.T) {
	f := &fakeRDMA{info: sampleRDMA()}
	e := newEnv(t, false, func(_ *Config, d *Deps) { d.RDMA = f })
	c := dialRaw(t, e.sock)
	r := c.call(&Request{Kind: tcproto.RequestBodyRdmaRequest})
	expectCode(t, r, tcproto.CodeOK)
	if r.Kind != tcproto.ResponseBodyRdmaResponse {
		t.Fatalf("answer kind %s", r.Kind)
	}
	f.mu.Lock()
	want, calls := f.info, f.calls
	f.mu.Unlock()
	if !reflect.DeepEqual(r.RDMA, want) || calls != 1 {
		t.Fatalf("decoded\n%+v\nwant\n%+v (reporter asked %d times)", r.RDMA, want, calls)
	}

	f.set(RDMAInfo{State: RDMAUnavailable, Reason: strings.Repeat("x", MaxRDMAReason+100)})
	r = c.call(&Request{Kind: tcproto.RequestBodyRdmaRequest})
	expectCode(t, r, tcproto.CodeOK)
	if r.RDMA.State != RDMAUnavailable || r.RDMA.Reason != strings.Repeat("x", MaxRDMAReason) || r.RDMA.Peers != nil {
		t.Fatalf("unavailable with a long reason: %v, %d-byte reason, %d peers", r.RDMA.State, len(r.RDMA.Reason), len(r.RDMA.Peers))
	}
	if strings.Contains(e.logBuf.String(), "op=RdmaRequest") {
		t.Fatalf("a read-only request was audited:\n%s", e.logBuf.String())
	}
	c.uc.Close()
	e.waitIdle()

	plain := newEnv(t, false)
	c = dialRaw(t, plain.sock)
	r = c.call(&Request{Kind: tcproto.RequestBodyRdmaRequest})
	expectCode(t, r, tcproto.CodeOK)
	if r.RDMA.State != RDMAOff || r.RDMA.Reason == "" || r.RDMA.Device != "" {
		t.Fatalf("without a reporter: %+v", r.RDMA)
	}
}

// TestRDMAManyPeers: an answer with more peers than a frame holds is cut
// to fit, and still decodes.
func TestRDMAManyPeers(t *testing.T) {
	info := sampleRDMA()
	info.Peers = nil
	for i := 0; i < 20000; i++ {
		info.Peers = append(info.Peers, RDMAPeer{ID: strings.Repeat("p", 60), Transport: "tcp", Link: "none"})
	}
	e := newEnv(t, false, func(_ *Config, d *Deps) { d.RDMA = &fakeRDMA{info: info} })
	c := dialRaw(t, e.sock)
	r := c.call(&Request{Kind: tcproto.RequestBodyRdmaRequest})
	expectCode(t, r, tcproto.CodeOK)
	if n := len(r.RDMA.Peers); n == 0 || n >= len(info.Peers) || r.RDMA.Device != "rxe0" {
		t.Fatalf("%d of %d peers sent, device %q", n, len(info.Peers), r.RDMA.Device)
	}
	if !strings.Contains(e.logBuf.String(), "rdma answer cut short") {
		t.Fatal("cutting the answer was not logged")
	}
}

// TestRDMADecodeLimits: the client's decoder holds strings and peer
// counts to its limits.
func TestRDMADecodeLimits(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	info := sampleRDMA()
	frame := EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyRdmaResponse, RDMA: info})
	var m Response
	if err := DecodeResponse(frame[FrameHeader:], DecodeLimits{MaxItems: 1}, &m); err == nil {
		t.Fatal("two peers decoded under a limit of one")
	}
	info.Device = strings.Repeat("d", 300)
	frame = EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyRdmaResponse, RDMA: info})
	if err := DecodeResponse(frame[FrameHeader:], DecodeLimits{}, &m); err == nil {
		t.Fatal("a 300-byte device name decoded under the 256-byte string limit")
	}
}
