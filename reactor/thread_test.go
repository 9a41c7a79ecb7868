package reactor

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorcast/tensorcast/uring"
)

// bellQueue is a pollQueue whose doorbell finds work (which calls the
// worker's sleep off) while busy is set.
type bellQueue struct {
	pollQueue
	busy bool
}

func (q *bellQueue) Doorbell() (*atomic.Uint32, uint32, bool) {
	q.bells++
	if q.busy {
		return nil, 0, false
	}
	return &q.word, q.word.Load(), true
}

// TestThreadRearmsAfterCalledOffSleep: an own-thread worker's sleep that
// armed queue a's doorbell and was then called off (queue b had work)
// waits on a's doorbell again at its next sleep. A wait of the thread is
// in force only while it sleeps: had a been taken for armed already, its
// client's ring would reach nobody, and the worker would sleep through it
// (TestLostWakeupManyQueues/poll/threads stalled so once in CI).
func TestThreadRearmsAfterCalledOffSleep(t *testing.T) {
	w := newWorker(0)
	th := &thread{done: make(chan struct{}), waits: make([]waitv, 0, maxWaits), tokens: make([]uint32, 0, maxWaits)}
	w.thread, w.wake = th, func() {}
	a, b := &bellQueue{}, &bellQueue{}
	for _, q := range []*bellQueue{a, b} {
		if err := w.attach(q); err != nil {
			t.Fatal(err)
		}
	}
	w.Serve() // takes the queues in, a first
	aWord := uint64(uintptr(unsafe.Pointer(&a.word)))
	waitsOnA := func() bool { return slices.ContainsFunc(th.waits, func(v waitv) bool { return v.uaddr == aWord }) }

	b.busy = true
	th.sleep(w, th.word.Load()+1, false) // a armed, then called off at b: no wait
	if !waitsOnA() || b.bells != 1 {
		t.Fatalf("the first sleep did not arm a before b called it off (a armed %v, b asked %d times)", waitsOnA(), b.bells)
	}
	b.busy = false
	// The thread's own word is not at the value expected: the wait
	// returns at once.
	th.sleep(w, th.word.Load()+1, false)
	if !waitsOnA() {
		t.Fatal("the sleep after a called-off one did not wait on a's doorbell: a ring of a's client reaches nobody")
	}
	for _, s := range w.slots {
		if s != nil && s.armed {
			t.Fatalf("a doorbell is taken for armed after the thread's sleep ended: %+v", s)
		}
	}
}

// TestThreadSleepBoundedWhileRecent: an own-thread worker that had work
// lately sleeps at most uring.BusySleep (the Go runtime's monitor then never
// takes its processor for a long system call), one idle for longer
// sleeps unbounded, and one that could not arm every wait threadPoll.
func TestThreadSleepBoundedWhileRecent(t *testing.T) {
	realWait := waitFor
	defer func() { waitFor = realWait }()
	var got []time.Duration
	waitFor = func(_ []waitv, timeout time.Duration) { got = append(got, timeout) }
	w := newWorker(0)
	th := &thread{done: make(chan struct{}), waits: make([]waitv, 0, maxWaits), tokens: make([]uint32, 0, maxWaits)}
	w.thread, w.wake = th, func() {}
	th.sleep(w, th.word.Load(), true)
	th.sleep(w, th.word.Load(), false)
	if want := []time.Duration{uring.BusySleep, -1}; !slices.Equal(got, want) {
		t.Fatalf("sleep bounds %v, want %v (recent, then idle)", got, want)
	}
}
