package control

import (
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// fakeRDMA reports a fixed plane and counts the questions.
type fakeRDMA struct {
	mu    sync.Mutex // guards the fields below
	info  wire.RDMAResponse
	calls int
}

func (f *fakeRDMA) RDMAInfo() wire.RDMAResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.info
}

func (f *fakeRDMA) set(info wire.RDMAResponse) {
	f.mu.Lock()
	f.info = info
	f.mu.Unlock()
}

func sampleRDMA() wire.RDMAResponse {
	return wire.RDMAResponse{State: wire.RDMAEnabled, Device: "rxe0", Port: 1, GID: "::ffff:10.0.2.15", GIDIndex: 1, MTU: 1024,
		LID: 7, PoolRegistered: 64 << 20, PoolMRs: 1, Peers: []wire.RDMAPeer{
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
	r := c.call(&wire.RDMARequest{})
	expectCode(t, r, tcproto.CodeOK)
	if r.Kind() != tcproto.ResponseBodyRdmaResponse {
		t.Fatalf("answer kind %s", r.Kind())
	}
	f.mu.Lock()
	want, calls := f.info, f.calls
	f.mu.Unlock()
	if got := body[wire.RDMAResponse](t, r); !reflect.DeepEqual(*got, want) || calls != 1 {
		t.Fatalf("decoded\n%+v\nwant\n%+v (reporter asked %d times)", *got, want, calls)
	}

	f.set(wire.RDMAResponse{State: wire.RDMAUnavailable, Reason: strings.Repeat("x", wire.MaxRDMAReason+100)})
	r = c.call(&wire.RDMARequest{})
	expectCode(t, r, tcproto.CodeOK)
	if got := body[wire.RDMAResponse](t, r); got.State != wire.RDMAUnavailable ||
		got.Reason != strings.Repeat("x", wire.MaxRDMAReason) || len(got.Peers) != 0 {
		t.Fatalf("unavailable with a long reason: %v, %d-byte reason, %d peers", got.State, len(got.Reason), len(got.Peers))
	}
	if strings.Contains(e.logBuf.String(), "op=RdmaRequest") {
		t.Fatalf("a read-only request was audited:\n%s", e.logBuf.String())
	}
	c.uc.Close()
	e.waitIdle()

	plain := newEnv(t, false)
	c = dialRaw(t, plain.sock)
	r = c.call(&wire.RDMARequest{})
	expectCode(t, r, tcproto.CodeOK)
	if got := body[wire.RDMAResponse](t, r); got.State != wire.RDMAOff || got.Reason == "" || got.Device != "" {
		t.Fatalf("without a reporter: %+v", got)
	}
}

// TestRDMAManyPeers: an answer with more peers than a frame holds is cut
// to fit, and still decodes.
func TestRDMAManyPeers(t *testing.T) {
	info := sampleRDMA()
	info.Peers = nil
	for i := 0; i < 20000; i++ {
		info.Peers = append(info.Peers, wire.RDMAPeer{ID: strings.Repeat("p", 60), Transport: "tcp", Link: "none"})
	}
	e := newEnv(t, false, func(_ *Config, d *Deps) { d.RDMA = &fakeRDMA{info: info} })
	c := dialRaw(t, e.sock)
	r := c.call(&wire.RDMARequest{})
	expectCode(t, r, tcproto.CodeOK)
	if got := body[wire.RDMAResponse](t, r); len(got.Peers) == 0 || len(got.Peers) >= len(info.Peers) || got.Device != "rxe0" {
		t.Fatalf("%d of %d peers sent, device %q", len(got.Peers), len(info.Peers), got.Device)
	}
	if !strings.Contains(e.logBuf.String(), "rdma answer cut short") {
		t.Fatal("cutting the answer was not logged")
	}
}
