package session

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestSubmitGroup: the worker gives the stream at most groupBytes of
// small requests per Submit, so that an inline copy answers in small
// bursts; large reads in a row go in one Submit; a large write goes alone.
// Sizes are reads; a negative size is a write of that many bytes.
func TestSubmitGroup(t *testing.T) {
	reqs := func(sizes ...int64) []xfer.StreamRequest {
		out := make([]xfer.StreamRequest, len(sizes))
		for i, s := range sizes {
			out[i].Req.Op, out[i].Req.Length = xfer.OpRead, uint64(s)
			if s < 0 {
				out[i].Req.Op, out[i].Req.Length = xfer.OpWrite, uint64(-s)
			}
		}
		return out
	}
	many := func(n int, size int64) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	for _, c := range []struct {
		name  string
		sizes []int64
		want  int
	}{
		{"16 x 64 KiB", many(16, 64<<10), 4},
		{"100 x 4 KiB", many(100, 4<<10), 64},
		{"under the bound", many(3, 4<<10), 3},
		{"one larger than the bound, then a small one", []int64{1 << 20, 4 << 10}, 1},
		{"large reads in a row go together", many(8, 1<<20), 8},
		{"a large write goes alone", many(8, -1<<20), 1},
		{"large reads stop before a large write", []int64{1 << 20, 1 << 20, -1 << 20, 1 << 20}, 2},
		{"small writes group like small reads", many(16, -64<<10), 4},
		{"small ones stop before a large one", []int64{4 << 10, 4 << 10, 1 << 20}, 2},
		{"small ones stop before a large write", []int64{-4 << 10, 4 << 10, -1 << 20}, 2},
		{"the bound exactly", many(2, 128<<10), 2},
		{"just past it", []int64{128 << 10, 128 << 10, 1}, 2},
		{"zero-length requests", many(5, 0), 5},
	} {
		if got := submitGroup(reqs(c.sizes...)); got != c.want {
			t.Errorf("%s: a group of %d, want %d", c.name, got, c.want)
		}
	}
}

// TestQueuePassFair: a queue whose client fills its ring with large
// requests does not keep its worker from the other queues it serves until
// all of them are submitted: a pass gives the stream one group, and a
// neighbour's no-op submitted meanwhile is answered before the large
// requests' last group reaches the transport.
func TestQueuePassFair(t *testing.T) {
	const large = 4 // writes of groupBytes each: one group apiece
	release, blocked := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var neighbour atomic.Pointer[queue.DaemonRing]
	var mu sync.Mutex     // guards answered (the client's mapping is another address: no order the race detector sees)
	var answered []uint64 // the neighbour's CQEs posted at each later submit of the large ones
	tr := xfertest.New(xfertest.Config{Inline: true, OnSubmit: func([]*xfer.Task) {
		if !first.Swap(true) {
			close(blocked)
			<-release
			return
		}
		_, _, posted := neighbour.Load().Counts()
		mu.Lock()
		answered = append(answered, posted)
		mu.Unlock()
	}})
	a, _ := newTestSession(t, tr)
	rx, err := reactor.New(reactor.Config{Workers: 1, Poll: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rx.Close)
	a.h.Reactors = rx
	b := New(a.h, 2, slog.New(slog.DiscardHandler))
	t.Cleanup(b.Close)
	t.Cleanup(a.Close)
	src, dst := xfer.SegmentID(100), xfer.SegmentID(101)
	a.buffers[src] = xfertest.SegmentOf(src, xfer.KindClient, make([]byte, groupBytes))
	a.buffers[dst] = xfertest.SegmentOf(dst, xfer.KindClient, make([]byte, groupBytes))

	open := func(s *Session) *queue.ClientRing {
		t.Helper()
		fd, bell, err := s.OpenQueue(&wire.OpenQueueRequest{SQEntries: 8}, &wire.Response{})
		if err != nil {
			t.Fatal(err)
		}
		if bell >= 0 {
			unix.Close(bell)
		}
		defer unix.Close(fd)
		g, _ := queue.NewGeometry(8, 0, 0)
		c, err := queue.Map(fd, g.Size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Unmap() })
		return c
	}
	ca, cb := open(a), open(b)
	for _, q := range b.queues {
		neighbour.Store(q.ring)
	}
	for i := range large {
		e := queue.SQE{Op: queue.OpWrite, UserData: uint64(i), Local: uint64(src), Target: uint64(dst), Length: groupBytes}
		if ok, err := ca.Stage(&e, nil); !ok || err != nil {
			t.Fatalf("stage %d: %v %v", i, ok, err)
		}
	}
	ca.Submit()
	<-blocked // the worker is in the pass that took the large writes
	if ok, err := cb.Stage(&queue.SQE{Op: queue.OpNop, UserData: 99}, nil); !ok || err != nil {
		t.Fatalf("stage the no-op: %v %v", ok, err)
	}
	cb.Submit()
	close(release)
	if err := ca.Wait(large, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cb.Wait(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answered) != large-1 || answered[len(answered)-1] != 1 {
		t.Fatalf("the neighbour's CQEs posted at each later submit of the large writes: %v; want its no-op answered before the last", answered)
	}
}
