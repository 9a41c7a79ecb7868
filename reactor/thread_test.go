package reactor

import (
	"runtime"
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
	th := testThread(time.Now)
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

// testThread is an own-thread worker's thread on clock now, for a test
// that drives its sleeps itself (no goroutine).
func testThread(now func() time.Time) *thread {
	return &thread{done: make(chan struct{}), waits: make([]waitv, 0, maxWaits), tokens: make([]uint32, 0, maxWaits), now: now,
		yields: uring.NewYields(now(), runtime.Gosched)}
}

// TestThreadYieldsBeforeASlice: an own-thread worker about to sleep a
// slice (uring.BusySleep) passes through the Go scheduler first when its
// last pass there was more than a millisecond ago, so that the runtime's
// monitor never sees it 10 ms without one and takes its processor; an
// unbounded sleep (idle) does not yield, nor does a slice right after a
// yield.
func TestThreadYieldsBeforeASlice(t *testing.T) {
	realWait := waitFor
	defer func() { waitFor = realWait }()
	var got []string
	waitFor = func(_ []waitv, timeout time.Duration) { got = append(got, "wait "+timeout.String()) }
	clock := time.Unix(1000, 0)
	th := testThread(func() time.Time { return clock })
	th.yields = uring.NewYields(clock, func() { got = append(got, "yield") })
	w := newWorker(0)
	w.thread, w.wake = th, func() {}
	clock = clock.Add(4 * time.Millisecond) // a request's pass, under pollerYield after the last yield
	th.yields.At(clock, false)
	th.sleep(w, th.word.Load(), true) // then a slice: its end would be 12 ms after the yield
	clock = clock.Add(500 * time.Microsecond)
	th.sleep(w, th.word.Load(), true) // just yielded: a slice without another
	clock = clock.Add(time.Hour)
	th.sleep(w, th.word.Load(), false) // idle: unbounded, no yield
	want := []string{"yield", "wait " + uring.BusySleep.String(), "wait " + uring.BusySleep.String(), "wait -1ns"}
	if !slices.Equal(got, want) {
		t.Fatalf("the thread did %q, want %q", got, want)
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
	th := testThread(time.Now)
	w.thread, w.wake = th, func() {}
	th.sleep(w, th.word.Load(), true)
	th.sleep(w, th.word.Load(), false)
	if want := []time.Duration{uring.BusySleep, -1}; !slices.Equal(got, want) {
		t.Fatalf("sleep bounds %v, want %v (recent, then idle)", got, want)
	}
}

// TestLastWorkWindow: a worker counts as recently busy for uring.BusyWindow
// from its start and from the end of each run of passes that found work,
// not from the run's start (a run longer than the window still leaves a
// full window after it).
func TestLastWorkWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	w := uring.BusyWindow
	l := lastWork{at: t0}
	steps := []struct {
		worked bool // a pass found work before this idle pass
		after  time.Duration
		recent bool
	}{
		{false, w / 2, true},     // just started
		{false, w + 1, false},    // idle since the start for a window
		{true, 3 * w, true},      // a run of work ends at 3w
		{false, 3*w + w/2, true}, // idle half a window since
		{false, 4*w - 1, true},
		{false, 4 * w, false}, // a window since the run ended
		{true, 10 * w, true},
		{false, 11*w + 1, false},
	}
	for i, s := range steps {
		if s.worked {
			l.worked = true
		}
		if got := l.recent(at(s.after)); got != s.recent {
			t.Fatalf("step %d (worked %v, at start+%v): recent = %v, want %v", i, s.worked, s.after, got, s.recent)
		}
	}
}
