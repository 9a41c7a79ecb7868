package control

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestClientGoneMidWait: a client that closes its connection while a call
// of its waits for a batch or a notification, with a timeout far longer
// than the test, is released (its batches abandoned, its blocks and
// buffers freed) as soon as the daemon sees it gone, not when that
// timeout ends: what a client holds goes when its connection closes,
// whatever state it was in. A client that only shuts its writing side is
// still waiting for the answer, and gets it.
func TestClientGoneMidWait(t *testing.T) {
	const long = 3_600_000 // ms: far past the test's timeout
	hold := func(t *testing.T, e *env, c *rawClient) (xfer.SegmentID, uint64) {
		t.Helper()
		fd := newMemfd(t, 1<<16)
		seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, c.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)).Segment)
		unix.Close(fd)
		return seg, body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 1, Size: 16384})).Offsets[0]
	}
	hang := func(seg xfer.SegmentID, off uint64) []xfer.Request {
		return []xfer.Request{{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: hangLength}}
	}
	for _, tc := range []struct {
		name string
		call func(t *testing.T, c *rawClient, seg xfer.SegmentID, off uint64) wire.RequestBody
	}{
		{"transfer", func(t *testing.T, c *rawClient, seg xfer.SegmentID, off uint64) wire.RequestBody {
			return &wire.TransferRequestBody{TimeoutMS: long, Requests: hang(seg, off)}
		}},
		{"wait", func(t *testing.T, c *rawClient, seg xfer.SegmentID, off uint64) wire.RequestBody {
			b := body[wire.AllocBatchResponse](t, c.call(&wire.AllocBatchRequest{Capacity: 1})).Batch
			expectCode(t, c.call(&wire.SubmitRequest{Batch: b, Requests: hang(seg, off)}), tcproto.CodeOK)
			return &wire.WaitRequest{Batch: b, TimeoutMS: long}
		}},
		{"poll notifications", func(t *testing.T, c *rawClient, seg xfer.SegmentID, off uint64) wire.RequestBody {
			return &wire.PollNotificationsRequest{TimeoutMS: long}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, true)
			c := dialRaw(t, e.sock)
			seg, off := hold(t, e, c)
			c.sendBody(tc.call(t, c, seg, off))
			testutil.Eventually(t, testTimeout, func() bool { return e.srv.inflight.Load() != 0 }, "the call waiting")
			c.uc.Close()
			e.waitIdle()
		})
	}
	t.Run("half closed", func(t *testing.T) {
		e := newEnv(t, false)
		c := dialRaw(t, e.sock)
		c.sendBody(&wire.PollNotificationsRequest{TimeoutMS: 300})
		testutil.Eventually(t, testTimeout, func() bool { return e.srv.inflight.Load() != 0 }, "the call waiting")
		c.uc.CloseWrite()
		r, _, err := c.recv()
		if err != nil {
			t.Fatalf("a client that shut only its writing side got no answer: %v", err)
		}
		expectCode(t, r, tcproto.CodeOK)
		if strings.Contains(e.logBuf.String(), "client gone") {
			t.Fatal("a half-closed client was taken as gone")
		}
	})
}
