package control

import (
	"encoding/binary"
	"slices"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// TestFrameAtTheLimit: a frame whose body is exactly MaxFrame bytes is
// served and the connection goes on; one whose body is a byte longer is
// refused RESOURCE_EXHAUSTED and the connection closed, while the daemon
// keeps serving the others.
func TestFrameAtTheLimit(t *testing.T) {
	at := slices.Clone(wire.EncodeRequest(flatbuffers.NewBuilder(4096),
		&wire.Request{Ctx: wire.Context{RequestID: 7}, Body: &wire.PingRequest{Payload: make([]byte, 4000)}}))
	maxFrame := len(at) - wire.FrameHeader // the limit is this frame's body
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.MaxFrame = maxFrame })
	// The same frame with a byte more, the limit's first byte past.
	over := append(slices.Clone(at), 0)
	binary.LittleEndian.PutUint32(over, uint32(maxFrame+1))
	c := dialRaw(t, e.sock)
	for range 2 {
		c.send(at)
		r, _, err := c.recv()
		if err != nil {
			t.Fatalf("a frame of exactly MaxFrame (%d) bytes: %v", maxFrame, err)
		}
		expectCode(t, r, tcproto.CodeOK)
	}
	d := dialRaw(t, e.sock)
	d.send(over)
	r, _, err := d.recv()
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, tcproto.CodeRESOURCE_EXHAUSTED)
	d.expectClosed()
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
}
