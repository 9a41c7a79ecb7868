package wire

import (
	"errors"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/xfer"
)

// TestLimitErrorKeepsRequestID: a whole frame that breaks a decode limit
// fails with ErrLimit alone and leaves its request id readable, so the
// daemon can refuse that call and keep the connection; a malformed frame
// does not pass for one.
func TestLimitErrorKeepsRequestID(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	lim := DecodeLimits{MaxRequests: 8, MaxOffsets: 4}
	for _, c := range []struct {
		name string
		body RequestBody
	}{
		{"requests", &SubmitRequest{Batch: 1, Requests: make([]xfer.Request, 9)}},
		{"offsets", &FreeBlocksRequest{Offsets: make([]uint64, 5)}},
		{"transfer", &TransferRequestBody{Requests: make([]xfer.Request, 9)}},
	} {
		frame := EncodeRequest(b, &Request{Ctx: Context{RequestID: 77}, Body: c.body})
		var m Request
		m.Ctx.RequestID = 5 // stale: must not survive
		err := DecodeRequest(frame[FrameHeader:], lim, &m)
		if !errors.Is(err, ErrLimit) || errors.Is(err, ErrMalformed) {
			t.Fatalf("%s: %v, want ErrLimit alone", c.name, err)
		}
		if m.Ctx.RequestID != 77 {
			t.Fatalf("%s: request id %d after a limit error, want 77", c.name, m.Ctx.RequestID)
		}
	}
	var m Request
	m.Ctx.RequestID = 5
	err := DecodeRequest([]byte{1, 2, 3}, lim, &m)
	if !errors.Is(err, ErrMalformed) || errors.Is(err, ErrLimit) || m.Ctx.RequestID != 0 {
		t.Fatalf("malformed: %v, request id %d", err, m.Ctx.RequestID)
	}
}
