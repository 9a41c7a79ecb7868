package control

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// sampleRequests is one request of every kind, with every field set.
func sampleRequests() []Request {
	ctx := Context{RequestID: 7, IdempotencyKey: []byte("key-1"), Lane: []byte("stream-first"),
		PolicyVersion: 3, QoS: 2, DeadlineMS: 1500}
	reqs := []xfer.Request{
		{Op: xfer.OpWrite, Local: 5, LocalOffset: 64, Target: 1, TargetOffset: 8192, Length: 4096},
		{Op: xfer.OpRead, Local: 5, LocalOffset: 0, Target: 1, TargetOffset: 0, Length: 1},
	}
	return []Request{
		{Ctx: ctx, Kind: tcproto.RequestBodyHelloRequest, ProtocolVersion: 1, Name: []byte("engine-0")},
		{Ctx: ctx, Kind: tcproto.RequestBodyPingRequest, Payload: []byte("abcdefgh")},
		{Ctx: ctx, Kind: tcproto.RequestBodyRegisterBufferRequest, Size: 1 << 30},
		{Ctx: ctx, Kind: tcproto.RequestBodyUnregisterBufferRequest, Segment: 9},
		{Ctx: ctx, Kind: tcproto.RequestBodyPoolInfoRequest},
		{Ctx: ctx, Kind: tcproto.RequestBodyAllocBlocksRequest, N: 4, Size: 65536},
		{Ctx: ctx, Kind: tcproto.RequestBodyFreeBlocksRequest, Offsets: []uint64{0, 4096, 1 << 40}},
		{Ctx: ctx, Kind: tcproto.RequestBodyAllocBatchRequest, Capacity: 128},
		{Ctx: ctx, Kind: tcproto.RequestBodySubmitRequest, Batch: 1<<32 | 5, Requests: reqs},
		{Ctx: ctx, Kind: tcproto.RequestBodyTaskStatusRequest, Batch: 77, Index: 3},
		{Ctx: ctx, Kind: tcproto.RequestBodyBatchStatusRequest, Batch: 77},
		{Ctx: ctx, Kind: tcproto.RequestBodyWaitRequest, Batch: 77, TimeoutMS: 250},
		{Ctx: ctx, Kind: tcproto.RequestBodyFreeBatchRequest, Batch: 77},
		{Ctx: ctx, Kind: tcproto.RequestBodyTransferRequestBody, Requests: reqs, TimeoutMS: 100},
		{Ctx: ctx, Kind: tcproto.RequestBodyStatsRequest},
		{Ctx: ctx, Kind: tcproto.RequestBodyRegisterFileRequest, Name: []byte("/data/kv.bin"), Direct: true, Size: 1 << 20},
		{Ctx: ctx, Kind: tcproto.RequestBodySubmitRequest, Batch: 78, Requests: reqs, Notify: [][]byte{[]byte("layer 3"), nil}},
		{Ctx: ctx, Kind: tcproto.RequestBodyTransferRequestBody, Requests: reqs, TimeoutMS: 9, Notify: [][]byte{nil, []byte("x")}},
		{Ctx: ctx, Kind: tcproto.RequestBodyExportSegmentRequest, Name: []byte("kvpool"), Segment: 1, Offset: 4096, Length: 1 << 20,
			Rights: RightRead | RightWrite},
		{Ctx: ctx, Kind: tcproto.RequestBodyUnexportSegmentRequest, Name: []byte("kvpool")},
		{Ctx: ctx, Kind: tcproto.RequestBodyOpenRemoteRequest, Name: []byte("decode-1/kvpool"), Rights: RightWrite},
		{Ctx: ctx, Kind: tcproto.RequestBodyCloseRemoteRequest, Segment: 12},
		{Ctx: ctx, Kind: tcproto.RequestBodySubscribeRequest, Name: []byte("kvpool")},
		{Ctx: ctx, Kind: tcproto.RequestBodyPollNotificationsRequest, TimeoutMS: 50, Max: 16},
		{Ctx: ctx, Kind: tcproto.RequestBodyPeersRequest},
		{Ctx: ctx, Kind: tcproto.RequestBodySegmentsRequest},
		{Ctx: ctx, Kind: tcproto.RequestBodyRdmaRequest},
	}
}

func normalize(m Request) Request {
	if len(m.Payload) == 0 {
		m.Payload = nil
	}
	if len(m.Offsets) == 0 {
		m.Offsets = nil
	}
	if len(m.Requests) == 0 {
		m.Requests = nil
	}
	if len(m.Notify) == 0 {
		m.Notify = nil
	}
	return m
}

func TestRequestRoundTrip(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	var got Request
	for _, want := range sampleRequests() {
		frame := EncodeRequest(b, &want)
		if n := binary.LittleEndian.Uint32(frame); int(n) != len(frame)-FrameHeader {
			t.Fatalf("%s: length prefix %d, body %d", want.Kind, n, len(frame)-FrameHeader)
		}
		if err := DecodeRequest(frame[FrameHeader:], DecodeLimits{}, &got); err != nil {
			t.Fatalf("%s: %v", want.Kind, err)
		}
		if g, w := normalize(got), normalize(want); !reflect.DeepEqual(g, w) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", want.Kind, g, w)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	sum := Summary{Total: 9, Waiting: 1, Pending: 2, Completed: 3, Failed: 1, Timeout: 1, Canceled: 1, Transferred: 1 << 33}
	cases := []Response{
		{RequestID: 1, Kind: tcproto.ResponseBodyHelloResponse, ProtocolVersion: 1, DaemonID: []byte("d"), Version: []byte("v"),
			Limits: LimitsInfo{1, 2, 3, 4, 5, 6, 7}},
		{RequestID: 1, Kind: tcproto.ResponseBodyHelloResponse, ProtocolVersion: 1, DaemonID: []byte("d"), Version: []byte("v"),
			Limits: LimitsInfo{1, 2, 3, 4, 5, 6, 7}, PeerAddr: []byte("127.0.0.1:7400")},
		{RequestID: 2, Kind: tcproto.ResponseBodyPoolInfoResponse, Segment: 1, Size: 1 << 30, BlockClasses: []uint64{4096, 8192}},
		{RequestID: 3, Kind: tcproto.ResponseBodyAllocBlocksResponse, Offsets: []uint64{0, 4096}},
		{RequestID: 4, Kind: tcproto.ResponseBodySubmitResponse, Codes: []Code{tcproto.CodeOK, tcproto.CodeNOT_FOUND}},
		{RequestID: 5, Kind: tcproto.ResponseBodyTaskStatusResponse, Task: TaskInfo{tcproto.TaskStateCOMPLETED, 4096, tcproto.CodeOK}},
		{RequestID: 6, Kind: tcproto.ResponseBodyTransferResponse, Codes: []Code{0, 8},
			States: []tcproto.TaskState{tcproto.TaskStateCOMPLETED, tcproto.TaskStateTIMEOUT}, Summary: sum},
		{RequestID: 7, Kind: tcproto.ResponseBodyStatsResponse, Pool: []Counter{{"used", 5}}, Engine: []Counter{{"bytes", 9}},
			Conn: []Counter{{"blocks", 2}}, Transports: []Counter{{"uring.ring0.entries", 256}}, Connections: 3},
		{RequestID: 8, Status: tcproto.CodeBUSY, Message: []byte("busy")},
		{RequestID: 9, Kind: tcproto.ResponseBodyOpenRemoteResponse, Segment: 14, Size: 1 << 30, Epoch: 0xfeed},
		{RequestID: 10, Kind: tcproto.ResponseBodyExportSegmentResponse, Size: 4096},
		{RequestID: 11, Kind: tcproto.ResponseBodyPollNotificationsResponse,
			Notifications: []Notification{{[]byte("kv"), []byte("p1")}, {[]byte("kv2"), []byte("p2")}}},
		{RequestID: 12, Kind: tcproto.ResponseBodyPeersResponse, Peers: []PeerInfo{
			{ID: []byte("d2"), Addr: []byte("127.0.0.1:7400"), Epoch: 5, Connected: true, BytesIn: 1, BytesOut: 2, Errors: 3}}},
		{RequestID: 13, Kind: tcproto.ResponseBodySegmentsResponse, Segments: []SegmentInfo{
			{Name: []byte("kv"), Segment: 3, Size: 8, Rights: 3},
			{Name: []byte("kv"), Peer: []byte("d2"), Segment: 15, Size: 9, Rights: 1, Epoch: 7}}},
		{RequestID: 14, Kind: tcproto.ResponseBodyRdmaResponse, RDMA: sampleRDMA()},
		{RequestID: 15, Kind: tcproto.ResponseBodyRdmaResponse, RDMA: RDMAInfo{State: RDMAOff, Reason: "rdma = off"}},
	}
	var got Response
	for _, want := range cases {
		frame := EncodeResponse(b, &want)
		if err := DecodeResponse(frame[FrameHeader:], DecodeLimits{}, &got); err != nil {
			t.Fatalf("%s: %v", want.Kind, err)
		}
		g := got
		for _, p := range []*Response{&g, &want} {
			if len(p.BlockClasses) == 0 {
				p.BlockClasses = nil
			}
			if len(p.Offsets) == 0 {
				p.Offsets = nil
			}
			if len(p.Codes) == 0 {
				p.Codes = nil
			}
			if len(p.States) == 0 {
				p.States = nil
			}
			if len(p.Pool) == 0 {
				p.Pool = nil
			}
			if len(p.Engine) == 0 {
				p.Engine = nil
			}
			if len(p.Conn) == 0 {
				p.Conn = nil
			}
			if len(p.Transports) == 0 {
				p.Transports = nil
			}
			if len(p.Message) == 0 {
				p.Message = nil
			}
			if len(p.PeerAddr) == 0 {
				p.PeerAddr = nil
			}
			if len(p.Notifications) == 0 {
				p.Notifications = nil
			}
			if len(p.Peers) == 0 {
				p.Peers = nil
			}
			if len(p.Segments) == 0 {
				p.Segments = nil
			}
		}
		if !reflect.DeepEqual(g, want) {
			t.Fatalf("%s: decoded\n%+v\nwant\n%+v", want.Kind, g, want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	valid := func(m Request) []byte {
		return append([]byte(nil), EncodeRequest(b, &m)[FrameHeader:]...)
	}
	many := make([]xfer.Request, 20)
	for i := range many {
		many[i] = xfer.Request{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}
	}
	rootOOB := valid(Request{Kind: tcproto.RequestBodyPingRequest})
	binary.LittleEndian.PutUint32(rootOOB, 1<<30)
	unknown := valid(Request{Kind: tcproto.RequestBodyPingRequest})
	// Rewrite the body type byte: find the union type in the root table.
	var r tcproto.Request
	r.Init(unknown, flatbuffers.GetUOffsetT(unknown))
	if !r.MutateBodyType(200) {
		t.Fatal("cannot rewrite the body type")
	}
	lim := DecodeLimits{MaxRequests: 10, MaxString: 8, MaxOffsets: 4}
	cases := []struct {
		name string
		buf  []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"short", []byte{1, 2, 3}, ErrMalformed},
		{"root out of frame", rootOOB, ErrMalformed},
		{"zeros", make([]byte, 64), ErrMalformed},
		{"no body", valid(Request{Kind: tcproto.RequestBodyNONE}), ErrMalformed},
		{"unknown body", unknown, ErrMalformed},
		{"too many requests", valid(Request{Kind: tcproto.RequestBodySubmitRequest, Requests: many}), ErrLimit},
		{"empty submit", valid(Request{Kind: tcproto.RequestBodySubmitRequest}), ErrMalformed},
		{"long key", valid(Request{Ctx: Context{IdempotencyKey: []byte("0123456789")}, Kind: tcproto.RequestBodyStatsRequest}), ErrLimit},
		{"too many offsets", valid(Request{Kind: tcproto.RequestBodyFreeBlocksRequest, Offsets: []uint64{1, 2, 3, 4, 5}}), ErrLimit},
		{"too many blocks", valid(Request{Kind: tcproto.RequestBodyAllocBlocksRequest, N: 5, Size: 1}), ErrLimit},
		{"empty path", valid(Request{Kind: tcproto.RequestBodyRegisterFileRequest}), ErrMalformed},
		{"notify not positional", valid(Request{Kind: tcproto.RequestBodySubmitRequest, Requests: many[:3],
			Notify: [][]byte{[]byte("a"), nil}}), ErrMalformed},
		{"notify over 4 KiB", valid(Request{Kind: tcproto.RequestBodyTransferRequestBody, Requests: many[:1],
			Notify: [][]byte{make([]byte, MaxNotify+1)}}), ErrLimit},
		{"empty export name", valid(Request{Kind: tcproto.RequestBodyExportSegmentRequest, Rights: RightRead}), ErrMalformed},
		{"long remote name", valid(Request{Kind: tcproto.RequestBodyOpenRemoteRequest, Name: make([]byte, 400), Rights: RightRead}), ErrLimit},
		{"empty subscribe name", valid(Request{Kind: tcproto.RequestBodySubscribeRequest}), ErrMalformed},
	}
	var m Request
	for _, c := range cases {
		err := DecodeRequest(c.buf, lim, &m)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
		if CodeOf(err) == tcproto.CodeOK || CodeOf(err) == tcproto.CodeINTERNAL {
			t.Errorf("%s: maps to %s", c.name, CodeOf(err))
		}
	}
}

// TestDecodeTruncated feeds every prefix of every valid request: each must
// decode or fail with a typed error, never panic.
func TestDecodeTruncated(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	var m Request
	for _, want := range sampleRequests() {
		frame := append([]byte(nil), EncodeRequest(b, &want)[FrameHeader:]...)
		for n := 0; n < len(frame); n++ {
			err := DecodeRequest(frame[:n], DecodeLimits{}, &m)
			if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("%s cut at %d: untyped error %v", want.Kind, n, err)
			}
		}
	}
}

// TestDecodeCorrupted flips random bytes of valid requests.
func TestDecodeCorrupted(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	rng := rand.New(rand.NewPCG(1, 2))
	var m Request
	var r Response
	for _, want := range sampleRequests() {
		frame := append([]byte(nil), EncodeRequest(b, &want)[FrameHeader:]...)
		for i := 0; i < 2000; i++ {
			bad := append([]byte(nil), frame...)
			for j := 0; j < 1+rng.IntN(4); j++ {
				bad[rng.IntN(len(bad))] = byte(rng.Uint32())
			}
			if err := DecodeRequest(bad, DecodeLimits{}, &m); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("untyped error %v", err)
			}
			if err := DecodeResponse(bad, DecodeLimits{}, &r); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("untyped error %v", err)
			}
		}
	}
}

func TestDecodeRequestAllocs(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	for _, k := range []tcproto.RequestBody{tcproto.RequestBodyTaskStatusRequest, tcproto.RequestBodySubmitRequest, tcproto.RequestBodyPingRequest} {
		var src Request
		for _, s := range sampleRequests() {
			if s.Kind == k {
				src = s
			}
		}
		frame := append([]byte(nil), EncodeRequest(b, &src)[FrameHeader:]...)
		var m Request
		DecodeRequest(frame, DecodeLimits{}, &m)
		if n := testing.AllocsPerRun(100, func() { DecodeRequest(frame, DecodeLimits{}, &m) }); n != 0 {
			t.Errorf("%s: %v allocations per decode", k, n)
		}
	}
}

// FuzzDecodeRequest: no input may panic or escape the typed errors; what
// decodes must re-encode and decode to the same request.
func FuzzDecodeRequest(f *testing.F) {
	b := flatbuffers.NewBuilder(0)
	for _, m := range sampleRequests() {
		f.Add(append([]byte(nil), EncodeRequest(b, &m)[FrameHeader:]...))
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		var m Request
		err := DecodeRequest(buf, DecodeLimits{}, &m)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		frame := EncodeRequest(flatbuffers.NewBuilder(0), &m)
		var again Request
		if err := DecodeRequest(frame[FrameHeader:], DecodeLimits{}, &again); err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		if g, w := normalize(again), normalize(m); g.Kind != w.Kind || g.Ctx.RequestID != w.Ctx.RequestID ||
			len(g.Requests) != len(w.Requests) || len(g.Offsets) != len(w.Offsets) {
			t.Fatalf("round trip changed the request: %+v vs %+v", g, w)
		}
	})
}

// FuzzDecodeResponse: the client's decoder holds to the same rules.
func FuzzDecodeResponse(f *testing.F) {
	b := flatbuffers.NewBuilder(0)
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyTransferResponse,
		Codes: []Code{0, 1}, States: []tcproto.TaskState{3, 4}})[FrameHeader:]...))
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyStatsResponse,
		Pool: []Counter{{"a", 1}}})[FrameHeader:]...))
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyPollNotificationsResponse,
		Notifications: []Notification{{[]byte("kv"), []byte("n")}}})[FrameHeader:]...))
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyPeersResponse,
		Peers: []PeerInfo{{ID: []byte("d2"), Addr: []byte("a:1")}}})[FrameHeader:]...))
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodySegmentsResponse,
		Segments: []SegmentInfo{{Name: []byte("kv"), Peer: []byte("d2")}}})[FrameHeader:]...))
	f.Add(append([]byte(nil), EncodeResponse(b, &Response{Kind: tcproto.ResponseBodyRdmaResponse,
		RDMA: sampleRDMA()})[FrameHeader:]...))
	f.Fuzz(func(t *testing.T, buf []byte) {
		var m Response
		if err := DecodeResponse(buf, DecodeLimits{}, &m); err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
			t.Fatalf("untyped error %v", err)
		}
	})
}
