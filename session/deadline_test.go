package session

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestQueueRequestExpiredWaitingForASlot: a queue request taken while
// every stream slot is held (by requests that timed out and whose
// transport has not answered yet) waits for a slot; when its deadline
// passes meanwhile, it is answered DEADLINE_EXCEEDED in state Timeout once
// a slot frees, and no transport is given it, instead of being carried out
// after the client was past its deadline.
func TestQueueRequestExpiredWaitingForASlot(t *testing.T) {
	const stalled = 7 // a length the transport holds; every other completes inline
	tr := xfertest.New(xfertest.Config{Inline: true, Record: true, Hold: func(t *xfer.Task) bool { return t.Req.Length == stalled }})
	s, _ := newTestSession(t, tr)
	rx, err := reactor.New(reactor.Config{Workers: 1, Poll: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rx.Close)
	s.h.Reactors = rx
	t.Cleanup(s.Close)
	src, dst := xfer.SegmentID(100), xfer.SegmentID(101)
	s.buffers[src] = xfertest.SegmentOf(src, xfer.KindClient, make([]byte, 4096))
	s.buffers[dst] = xfertest.SegmentOf(dst, xfer.KindClient, make([]byte, 4096))
	fd, bell, err := s.OpenQueue(&wire.OpenQueueRequest{SQEntries: 8}, &wire.Response{})
	if err != nil {
		t.Fatal(err)
	}
	if bell >= 0 {
		unix.Close(bell)
	}
	g, _ := queue.NewGeometry(8, 0, 0)
	c, err := queue.Map(fd, g.Size)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unmap() })
	submit := func(ud uint64, length uint64, timeoutUS uint32) {
		t.Helper()
		e := queue.SQE{Op: queue.OpWrite, UserData: ud, Local: uint64(src), Target: uint64(dst), Length: length, TimeoutUS: timeoutUS}
		if ok, err := c.Stage(&e, nil); !ok || err != nil {
			t.Fatalf("stage %d: %v %v", ud, ok, err)
		}
		c.Submit()
	}
	cqes := make([]queue.CQE, 32)
	reap := func(n int) []queue.CQE {
		t.Helper()
		if err := c.Wait(n, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		return cqes[:c.Reap(cqes[:n])]
	}
	// Every stream slot (one per completion entry) goes to a request the
	// transport holds; each times out after a millisecond and is answered,
	// but keeps its slot until the transport's Done.
	for i := range g.CQEntries {
		submit(uint64(i), stalled, 1000)
		if i%g.SQEntries == g.SQEntries-1 {
			for _, e := range reap(int(g.SQEntries)) {
				if e.State != uint8(xfer.StateTimeout) {
					t.Fatalf("held request %d ended %+v, want Timeout", e.UserData, e)
				}
			}
		}
	}
	if tr.Held() != int(g.CQEntries) {
		t.Fatalf("%d held, want %d", tr.Held(), g.CQEntries)
	}
	// The late one is taken (its slot in the ring is free again) and waits
	// for a stream slot; its deadline, a microsecond, passes meanwhile.
	var ring *queue.DaemonRing
	for _, q := range s.queues {
		ring = q.ring
	}
	inflight := func() uint32 { n, _, _ := ring.Counts(); return n }
	submit(99, 64, 1)
	testutil.Eventually(t, 10*time.Second, func() bool { return inflight() == 1 },
		"the late request taken (in flight: %v)", testutil.Lazy(inflight))
	tr.Finish()
	got := reap(1)
	if len(got) != 1 || got[0].UserData != 99 || got[0].State != uint8(xfer.StateTimeout) || got[0].Code != uint32(tcproto.CodeDEADLINE_EXCEEDED) {
		t.Fatalf("the late request was answered %+v, want Timeout, DEADLINE_EXCEEDED", got)
	}
	for _, q := range tr.Requests() {
		if q.Length != stalled {
			t.Fatalf("the transport was given the expired request: %+v", q)
		}
	}
}
