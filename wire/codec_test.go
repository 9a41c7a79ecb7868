package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// same reports whether two messages carry the same values; an absent and
// an empty slice count as the same, as they do on the wire.
func same(a, b any) bool { return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b) }

func encodeReq(m Request) []byte {
	return append([]byte(nil), EncodeRequest(flatbuffers.NewBuilder(0), &m)...)
}

func encodeResp(m Response) []byte {
	return append([]byte(nil), EncodeResponse(flatbuffers.NewBuilder(0), &m)...)
}

// TestRegistry: every body of the schema's unions has its message, named
// after its table, and a sample here.
func TestRegistry(t *testing.T) {
	var reqKinds []RequestKind
	for _, m := range sampleRequests() {
		reqKinds = append(reqKinds, m.Kind())
	}
	checkRegistry(t, "request", tcproto.EnumNamesRequestBody, requests, reqKinds)
	var respKinds []ResponseKind
	for _, m := range sampleResponses() {
		respKinds = append(respKinds, m.Kind())
	}
	checkRegistry(t, "response", tcproto.EnumNamesResponseBody, responses, respKinds)
}

func checkRegistry[K ~uint8, B any](t *testing.T, what string, schema map[K]string, makers []func() B, sampled []K) {
	t.Helper()
	if len(makers) != len(schema) {
		t.Errorf("%d %s kinds registered, the schema has %d", len(makers), what, len(schema))
	}
	for k, name := range schema {
		if k == 0 {
			continue
		}
		b, ok := reuse(new([]B), makers, k)
		if !ok {
			t.Errorf("%s %s has no message", what, name)
			continue
		}
		if got := reflect.TypeOf(b).Elem().Name(); !strings.EqualFold(got, name) {
			t.Errorf("%s %s is the Go type %s", what, name, got)
		}
		if !slices.Contains(sampled, k) {
			t.Errorf("%s %s has no sample", what, name)
		}
	}
}

func TestRequestRoundTrip(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	var got Request
	for _, want := range sampleRequests() {
		frame := EncodeRequest(b, &want)
		if n := binary.LittleEndian.Uint32(frame); int(n) != len(frame)-FrameHeader {
			t.Fatalf("%s: length prefix %d, body %d", want.Kind(), n, len(frame)-FrameHeader)
		}
		if err := DecodeRequest(frame[FrameHeader:], DecodeLimits{}, &got); err != nil {
			t.Fatalf("%s: %v", want.Kind(), err)
		}
		if !same(got.Ctx, want.Ctx) || !same(got.Body, want.Body) {
			t.Fatalf("%s: decoded\n%+v %+v\nwant\n%+v %+v", want.Kind(), got.Ctx, got.Body, want.Ctx, want.Body)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	var got Response
	for _, want := range sampleResponses() {
		frame := EncodeResponse(b, &want)
		if err := DecodeResponse(frame[FrameHeader:], DecodeLimits{}, &got); err != nil {
			t.Fatalf("%s: %v", want.Kind(), err)
		}
		if got.RequestID != want.RequestID || got.Status != want.Status || !bytes.Equal(got.Message, want.Message) ||
			!same(got.Body, want.Body) {
			t.Fatalf("%s: decoded\n%d %s %q %+v\nwant\n%d %s %q %+v", want.Kind(), got.RequestID, got.Status, got.Message, got.Body,
				want.RequestID, want.Status, want.Message, want.Body)
		}
	}
}

// TestFramesOfVersion1 decodes frames the protocol's first codec wrote
// (testdata/frames): a client or daemon built before this codec is read
// as it meant.
func TestFramesOfVersion1(t *testing.T) {
	reqs, resps := sampleRequests(), sampleResponses()
	files, err := filepath.Glob("testdata/frames/*.bin")
	if err != nil || len(files) != 57 {
		t.Fatalf("%d frames, %v", len(files), err)
	}
	var m Request
	var r Response
	for _, file := range files {
		frame, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var i int
		var kind string
		base := strings.TrimSuffix(filepath.Base(file), ".bin")
		if _, err := fmt.Sscanf(strings.ReplaceAll(base, "-", " "), "req %d %s", &i, &kind); err == nil {
			if err := DecodeRequest(frame[FrameHeader:], DecodeLimits{}, &m); err != nil {
				t.Fatalf("%s: %v", base, err)
			}
			if want := reqs[i]; m.Kind().String() != kind || !same(m.Ctx, want.Ctx) || !same(m.Body, want.Body) {
				t.Fatalf("%s: decoded %s %+v %+v, want %+v %+v", base, m.Kind(), m.Ctx, m.Body, want.Ctx, want.Body)
			}
			continue
		}
		if _, err := fmt.Sscanf(strings.ReplaceAll(base, "-", " "), "resp %d %s", &i, &kind); err != nil {
			t.Fatalf("%s: not a frame name", base)
		}
		if err := DecodeResponse(frame[FrameHeader:], DecodeLimits{}, &r); err != nil {
			t.Fatalf("%s: %v", base, err)
		}
		want := resps[i]
		if r.Kind().String() != kind || r.RequestID != want.RequestID || r.Status != want.Status ||
			!bytes.Equal(r.Message, want.Message) || !same(r.Body, want.Body) {
			t.Fatalf("%s: decoded %d %s %q %+v, want %d %s %q %+v", base, r.RequestID, r.Status, r.Message, r.Body,
				want.RequestID, want.Status, want.Message, want.Body)
		}
	}
}

// TestQueueMessagesMatchSchema reads the queue messages this codec writes
// with the accessors flatc generated from the schema, so a wrong slot
// cannot hide behind a codec that agrees with itself.
func TestQueueMessagesMatchSchema(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	frame := EncodeRequest(b, &Request{Ctx: Context{RequestID: 5}, Body: &OpenQueueRequest{SQEntries: 64, CQEntries: 256, DataSize: 4096}})
	r := tcproto.GetSizePrefixedRootAsRequest(frame, 0)
	var tab flatbuffers.Table
	if r.BodyType() != tcproto.RequestBodyOpenQueueRequest || !r.Body(&tab) {
		t.Fatalf("body %s", r.BodyType())
	}
	var oq tcproto.OpenQueueRequest
	oq.Init(tab.Bytes, tab.Pos)
	if oq.SqEntries() != 64 || oq.CqEntries() != 256 || oq.DataSize() != 4096 {
		t.Fatalf("OpenQueueRequest read as %d %d %d", oq.SqEntries(), oq.CqEntries(), oq.DataSize())
	}
	frame = EncodeRequest(b, &Request{Body: &CloseQueueRequest{Queue: 1<<40 | 9}})
	r = tcproto.GetSizePrefixedRootAsRequest(frame, 0)
	r.Body(&tab)
	var cq tcproto.CloseQueueRequest
	cq.Init(tab.Bytes, tab.Pos)
	if r.BodyType() != tcproto.RequestBodyCloseQueueRequest || cq.QueueId() != 1<<40|9 {
		t.Fatalf("CloseQueueRequest read as %s %d", r.BodyType(), cq.QueueId())
	}
	frame = EncodeResponse(b, &Response{RequestID: 5, Body: &OpenQueueResponse{Queue: 7, SQEntries: 64, CQEntries: 128,
		DataSize: 8192, Size: 1 << 21}})
	resp := tcproto.GetSizePrefixedRootAsResponse(frame, 0)
	resp.Body(&tab)
	var oqr tcproto.OpenQueueResponse
	oqr.Init(tab.Bytes, tab.Pos)
	if resp.BodyType() != tcproto.ResponseBodyOpenQueueResponse || resp.RequestId() != 5 || oqr.QueueId() != 7 ||
		oqr.SqEntries() != 64 || oqr.CqEntries() != 128 || oqr.DataSize() != 8192 || oqr.Size() != 1<<21 {
		t.Fatalf("OpenQueueResponse read as %s %d %d %d %d %d", resp.BodyType(), oqr.QueueId(), oqr.SqEntries(),
			oqr.CqEntries(), oqr.DataSize(), oqr.Size())
	}
	frame = EncodeResponse(b, &Response{RequestID: 6, Body: &CloseQueueResponse{}})
	if resp = tcproto.GetSizePrefixedRootAsResponse(frame, 0); resp.BodyType() != tcproto.ResponseBodyCloseQueueResponse {
		t.Fatalf("CloseQueueResponse read as %s", resp.BodyType())
	}
}

func TestDecodeRejects(t *testing.T) {
	many := make([]xfer.Request, 20)
	for i := range many {
		many[i] = xfer.Request{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}
	}
	body := func(b RequestBody) []byte { return encodeReq(Request{Body: b})[FrameHeader:] }
	rootOOB := body(&PingRequest{})
	binary.LittleEndian.PutUint32(rootOOB, 1<<30)
	unknown := body(&PingRequest{})
	if !tcproto.GetRootAsRequest(unknown, 0).MutateBodyType(200) {
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
		{"no body", encodeReq(Request{})[FrameHeader:], ErrMalformed},
		{"unknown body", unknown, ErrMalformed},
		{"too many requests", body(&SubmitRequest{Requests: many}), ErrLimit},
		{"empty submit", body(&SubmitRequest{}), ErrMalformed},
		{"empty transfer", body(&TransferRequestBody{}), ErrMalformed},
		{"long key", encodeReq(Request{Ctx: Context{IdempotencyKey: []byte("0123456789")}, Body: &StatsRequest{}})[FrameHeader:], ErrLimit},
		{"long lane", encodeReq(Request{Ctx: Context{Lane: []byte("0123456789")}, Body: &StatsRequest{}})[FrameHeader:], ErrLimit},
		{"too many offsets", body(&FreeBlocksRequest{Offsets: []uint64{1, 2, 3, 4, 5}}), ErrLimit},
		{"too many blocks", body(&AllocBlocksRequest{N: 5, Size: 1}), ErrLimit},
		{"empty path", body(&RegisterFileRequest{}), ErrMalformed},
		{"notify not positional", body(&SubmitRequest{Requests: many[:3], Notify: [][]byte{[]byte("a"), nil}}), ErrMalformed},
		{"notify longer than requests", body(&SubmitRequest{Requests: many[:1], Notify: [][]byte{nil, nil}}), ErrLimit},
		{"notify over 4 KiB", body(&TransferRequestBody{Requests: many[:1], Notify: [][]byte{make([]byte, MaxNotify+1)}}), ErrLimit},
		{"empty export name", body(&ExportSegmentRequest{Rights: RightRead}), ErrMalformed},
		{"too many grants", body(&ExportSegmentRequest{Name: []byte("kv"), Rights: RightRead, Grants: make([]string, MaxGrants+1)}), ErrLimit},
		{"long grant", body(&ExportSegmentRequest{Name: []byte("kv"), Rights: RightRead, Grants: []string{strings.Repeat("t", MaxTenant+1)}}), ErrLimit},
		{"long remote name", body(&OpenRemoteRequest{Name: make([]byte, 400), Rights: RightRead}), ErrLimit},
		{"empty subscribe name", body(&SubscribeRequest{}), ErrMalformed},
		{"long client name", body(&HelloRequest{ClientName: []byte("0123456789")}), ErrLimit},
	}
	var m Request
	for _, c := range cases {
		if err := DecodeRequest(c.buf, lim, &m); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
	}
	// A response with a body type but no body, or a body of no known type.
	noBody := encodeResp(Response{Status: tcproto.CodeOK})[FrameHeader:]
	if !tcproto.GetRootAsResponse(noBody, 0).MutateBodyType(tcproto.ResponseBodyPingResponse) {
		// The generated mutator needs the field present: write it.
		b := flatbuffers.NewBuilder(0)
		tcproto.ResponseStart(b)
		tcproto.ResponseAddBodyType(b, tcproto.ResponseBodyPingResponse)
		b.Finish(tcproto.ResponseEnd(b))
		noBody = b.FinishedBytes()
	}
	unknownResp := encodeResp(Response{Body: &PingResponse{}})[FrameHeader:]
	tcproto.GetRootAsResponse(unknownResp, 0).MutateBodyType(201)
	var r Response
	for name, buf := range map[string][]byte{"body type without a body": noBody, "unknown body": unknownResp} {
		if err := DecodeResponse(buf, DecodeLimits{}, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("response %s: err %v", name, err)
		}
	}
	if err := DecodeResponse(encodeResp(Response{RequestID: 4, Status: tcproto.CodeBUSY})[FrameHeader:], DecodeLimits{}, &r); err != nil ||
		r.Body != nil || r.Status != tcproto.CodeBUSY || r.RequestID != 4 {
		t.Errorf("error answer: %d %s %+v %v", r.RequestID, r.Status, r.Body, err)
	}
}

// TestDecodeTruncated feeds every prefix of every valid frame: each must
// decode or fail with a typed error, never panic.
func TestDecodeTruncated(t *testing.T) {
	var m Request
	var r Response
	check := func(what string, n int, err error) {
		if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
			t.Fatalf("%s cut at %d: untyped error %v", what, n, err)
		}
	}
	for _, s := range sampleRequests() {
		frame := encodeReq(s)[FrameHeader:]
		for n := 0; n < len(frame); n++ {
			check(s.Kind().String(), n, DecodeRequest(frame[:n], DecodeLimits{}, &m))
		}
	}
	for _, s := range sampleResponses() {
		frame := encodeResp(s)[FrameHeader:]
		for n := 0; n < len(frame); n++ {
			check(s.Kind().String(), n, DecodeResponse(frame[:n], DecodeLimits{}, &r))
		}
	}
}

// TestDecodeCorrupted flips random bytes of valid frames.
func TestDecodeCorrupted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var m Request
	var r Response
	var frames [][]byte
	for _, s := range sampleRequests() {
		frames = append(frames, encodeReq(s)[FrameHeader:])
	}
	for _, s := range sampleResponses() {
		frames = append(frames, encodeResp(s)[FrameHeader:])
	}
	for _, frame := range frames {
		for i := 0; i < 1000; i++ {
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

// TestSteadyStateAllocs: encoding and decoding the hot messages allocates
// nothing once a Request or Response has seen their kinds.
func TestSteadyStateAllocs(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	hot := map[RequestKind]bool{tcproto.RequestBodyTaskStatusRequest: true, tcproto.RequestBodySubmitRequest: true,
		tcproto.RequestBodyPingRequest: true, tcproto.RequestBodyWaitRequest: true, tcproto.RequestBodyTransferRequestBody: true}
	var m Request
	for _, src := range sampleRequests() {
		if !hot[src.Kind()] {
			continue
		}
		frame := encodeReq(src)[FrameHeader:]
		DecodeRequest(frame, DecodeLimits{}, &m)
		if n := testing.AllocsPerRun(100, func() { DecodeRequest(frame, DecodeLimits{}, &m) }); n != 0 {
			t.Errorf("decoding %s: %v allocations", src.Kind(), n)
		}
		EncodeRequest(b, &src)
		if n := testing.AllocsPerRun(100, func() { EncodeRequest(b, &src) }); n != 0 {
			t.Errorf("encoding %s: %v allocations", src.Kind(), n)
		}
	}
	hotResp := map[ResponseKind]bool{tcproto.ResponseBodyTaskStatusResponse: true, tcproto.ResponseBodySubmitResponse: true,
		tcproto.ResponseBodyPingResponse: true, tcproto.ResponseBodyWaitResponse: true, tcproto.ResponseBodyTransferResponse: true}
	var r Response
	for _, src := range sampleResponses() {
		if !hotResp[src.Kind()] {
			continue
		}
		frame := encodeResp(src)[FrameHeader:]
		DecodeResponse(frame, DecodeLimits{}, &r)
		if n := testing.AllocsPerRun(100, func() { DecodeResponse(frame, DecodeLimits{}, &r) }); n != 0 {
			t.Errorf("decoding %s: %v allocations", src.Kind(), n)
		}
		EncodeResponse(b, &src)
		if n := testing.AllocsPerRun(100, func() { EncodeResponse(b, &src) }); n != 0 {
			t.Errorf("encoding %s: %v allocations", src.Kind(), n)
		}
	}
}

// TestSetBody: SetRequest and SetResponse hand back a zeroed body, the same
// one each time for a kind, without allocating.
func TestSetBody(t *testing.T) {
	var m Request
	p := SetRequest[PingRequest](&m)
	p.Payload = []byte("x")
	if m.Body != RequestBody(p) || m.Kind() != tcproto.RequestBodyPingRequest {
		t.Fatalf("body %T", m.Body)
	}
	SetRequest[WaitRequest](&m).Batch = 9
	if again := SetRequest[PingRequest](&m); again != p || again.Payload != nil {
		t.Fatalf("second Set: %p %+v, first %p", again, again, p)
	}
	if n := testing.AllocsPerRun(100, func() {
		SetRequest[PingRequest](&m)
		SetRequest[WaitRequest](&m)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
	var r Response
	w := SetResponse[WaitResponse](&r)
	w.Summary.Total = 3
	r.Reset(11)
	if r.Body != nil || r.RequestID != 11 {
		t.Fatalf("reset: %+v", r)
	}
	if again := SetResponse[WaitResponse](&r); again != w || again.Summary.Total != 0 || r.Body != ResponseBody(w) {
		t.Fatalf("second Set: %+v", again)
	}
}

// TestEncodeBody: equal arguments give equal bytes whatever the context;
// any argument that differs changes them.
func TestEncodeBody(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	body := func(m Request) string { return string(EncodeBody(b, &m)) }
	base := Request{Ctx: Context{RequestID: 1}, Body: &OpenRemoteRequest{Name: []byte("d/kv"), Rights: RightRead}}
	retry := Request{Ctx: Context{RequestID: 2, IdempotencyKey: []byte("k")}, Body: &OpenRemoteRequest{Name: []byte("d/kv"), Rights: RightRead}}
	if body(base) != body(retry) {
		t.Fatal("a retry's arguments differ from the first call's")
	}
	for _, other := range []RequestBody{
		&OpenRemoteRequest{Name: []byte("d/kv"), Rights: RightRead, Transport: TransportTCP},
		&OpenRemoteRequest{Name: []byte("d/kw"), Rights: RightRead},
		&SubscribeRequest{Name: []byte("d/kv")},
	} {
		if body(base) == body(Request{Body: other}) {
			t.Errorf("%+v encodes as %+v", other, base.Body)
		}
	}
}

// FuzzDecodeRequest: no input may panic or escape the typed errors; what
// decodes re-encodes to a request that decodes the same.
func FuzzDecodeRequest(f *testing.F) {
	for _, m := range sampleRequests() {
		f.Add(encodeReq(m)[FrameHeader:])
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
		var again Request
		if err := DecodeRequest(encodeReq(m)[FrameHeader:], DecodeLimits{}, &again); err != nil {
			t.Fatalf("re-encoded request does not decode: %v", err)
		}
		if !same(again.Ctx, m.Ctx) || !same(again.Body, m.Body) {
			t.Fatalf("round trip changed the request: %+v %+v vs %+v %+v", again.Ctx, again.Body, m.Ctx, m.Body)
		}
	})
}

// FuzzDecodeResponse: the client's decoder holds to the same rules.
func FuzzDecodeResponse(f *testing.F) {
	for _, m := range sampleResponses() {
		f.Add(encodeResp(m)[FrameHeader:])
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		var m Response
		err := DecodeResponse(buf, DecodeLimits{}, &m)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrLimit) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		var again Response
		if err := DecodeResponse(encodeResp(m)[FrameHeader:], DecodeLimits{}, &again); err != nil {
			t.Fatalf("re-encoded response does not decode: %v", err)
		}
		if again.RequestID != m.RequestID || again.Status != m.Status || !bytes.Equal(again.Message, m.Message) ||
			!same(again.Body, m.Body) {
			t.Fatalf("round trip changed the response: %+v vs %+v", again.Body, m.Body)
		}
	})
}

// TestRDMADecodeLimits: the client's decoder holds strings and peer
// counts to its limits.
func TestRDMADecodeLimits(t *testing.T) {
	info := sampleRDMA()
	var m Response
	if err := DecodeResponse(encodeResp(Response{Body: info})[FrameHeader:], DecodeLimits{MaxItems: 1}, &m); !errors.Is(err, ErrLimit) {
		t.Fatalf("two peers under a limit of one: %v", err)
	}
	info.Device = strings.Repeat("d", 300)
	if err := DecodeResponse(encodeResp(Response{Body: info})[FrameHeader:], DecodeLimits{}, &m); !errors.Is(err, ErrLimit) {
		t.Fatalf("a 300-byte device name under the 256-byte string limit: %v", err)
	}
	info.Device, info.Reason = "rxe0", strings.Repeat("r", MaxRDMAReason+1)
	if err := DecodeResponse(encodeResp(Response{Body: info})[FrameHeader:], DecodeLimits{}, &m); !errors.Is(err, ErrLimit) {
		t.Fatalf("a reason over MaxRDMAReason: %v", err)
	}
}
