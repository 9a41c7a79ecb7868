package control

import (
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/uring"
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

// TestStoreFlushGivesWay: a StoreFlush waits as long as its client asked
// (here an hour) for writebacks that do not end (the L2 device holds
// them), yet ends when the server closes, so that the daemon's drain is
// bounded, and when its client hangs up, so that the connection is
// released.
func TestStoreFlushGivesWay(t *testing.T) {
	for _, how := range []string{"server closes", "client hangs up"} {
		t.Run(how, func(t *testing.T) {
			var gate *gatedL2
			e := newStoreEnvWrapped(t, true, store.Config{L1Capacity: 1 << 20}, func(u *uring.Transport) xfer.Transport {
				gate = &gatedL2{Transport: u}
				return gate
			})
			gate.hold()
			t.Cleanup(func() {
				if err := gate.open(); err != nil {
					t.Error(err)
				}
			})
			cl, err := client.Dial(e.sock, client.Options{Name: "flush"})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.PutBytes([]byte("dirty"), []byte("a value written back never"), false); err != nil {
				t.Fatal(err)
			}
			// Past a few slices of its wait, its own timeout still ends it.
			if err := cl.StoreFlush(600 * time.Millisecond); !errors.Is(err, client.ErrDeadlineExceeded) {
				t.Fatalf("a flush that cannot end within its timeout: %v", err)
			}
			c := dialRaw(t, e.sock)
			c.sendBody(&wire.StoreFlushRequest{TimeoutMS: 3_600_000})
			testutil.Eventually(t, testTimeout, func() bool { return e.srv.inflight.Load() != 0 }, "the flush waiting")
			if how == "client hangs up" {
				c.uc.Close()
				testutil.Eventually(t, testTimeout, func() bool { return e.srv.Connections() == 1 },
					"the flushing client's connection released (%d served)", testutil.Lazy(e.srv.Connections))
				return
			}
			closed := make(chan error, 1)
			go func() { closed <- e.srv.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(testTimeout):
				t.Fatalf("the server's Close still waits for a flush after %v", testTimeout)
			}
		})
	}
}
