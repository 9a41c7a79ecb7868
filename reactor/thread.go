package reactor

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/uring"
)

// thread is an own-thread worker's goroutine and its sleep: futex_waitv(2)
// on the doorbells its queues armed and on the worker's own wake word.
type thread struct {
	word atomic.Uint32 // the worker's wake word: kick changes it
	stop atomic.Bool
	done chan struct{}

	// Owned by the goroutine: this sleep's waits (Waits).
	waits  []waitv
	tokens []uint32
	soon   bool

	// Owned by the goroutine: its clock (time.Now, or a test's) and its
	// passes through the Go scheduler.
	now    func() time.Time
	yields uring.Yields
}

// maxWaits is how many words one futex_waitv takes (the kernel's
// FUTEX_WAITV_MAX), the worker's own word included.
const maxWaits = 128

// waitFor is waitAny, or a test's.
var waitFor = waitAny

// threadPoll bounds a sleep that could not arm every wait.
const threadPoll = time.Millisecond

func (w *Worker) startThread() error {
	t := &thread{done: make(chan struct{}), waits: make([]waitv, 0, maxWaits), tokens: make([]uint32, 0, maxWaits), now: time.Now}
	w.thread = t
	w.wake = t.kick
	go w.runThread()
	return nil
}

// kick wakes the goroutine if it sleeps (any goroutine may call it).
func (t *thread) kick() {
	t.word.Add(1)
	futexWake(&t.word)
}

// runThread is the worker's loop on its own locked thread: serve, and
// when a pass did nothing, sleep in one wait on every doorbell.
func (w *Worker) runThread() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t := w.thread
	defer close(t.done)
	busy := lastWork{at: t.now()}
	t.yields = uring.NewYields(busy.at, runtime.Gosched)
	for !t.stop.Load() {
		// The thread only makes system calls: see uring.YieldDue.
		t.yields.At(t.now(), false)
		tok := t.word.Load() // before the pass: a kick after it ends the wait at once
		if w.Serve() {
			busy.worked = true
			continue
		}
		t.sleep(w, tok, busy.recent(t.now()))
	}
	w.Stop()
}

// lastWork tells whether a worker had work within uring.BusyWindow: at is
// the end of its last run of passes that found work (its start, before
// any), worked says a pass found work since.
type lastWork struct {
	at     time.Time
	worked bool
}

// recent is called after a pass that found nothing, at now: a run of
// passes with work ends there, and the window counts from its end.
func (l *lastWork) recent(now time.Time) bool {
	if l.worked {
		l.at, l.worked = now, false
	}
	return now.Sub(l.at) < uring.BusyWindow
}

// sleep is one sleep of the thread after a pass that did nothing: one
// wait on its own word (expected at tok) and every doorbell w's Sleep
// arms, unless Sleep calls it off; at most uring.BusySleep when recent
// (the worker had work within uring.BusyWindow). Nothing stays armed
// after it, whether the thread slept or not: a wait of this thread is in
// force only during waitAny, so a doorbell Sleep armed before it called
// the sleep off (a later queue had work) must be armed again at the next
// sleep, not taken for armed already (the ring's waits, which outlive a
// sleep, are; see Worker.Sleep).
func (t *thread) sleep(w *Worker, tok uint32, recent bool) {
	t.waits, t.tokens, t.soon = t.waits[:0], t.tokens[:0], false
	t.waits = append(t.waits, waitvOf(&t.word, tok))
	if w.Sleep(t) {
		timeout := time.Duration(-1)
		switch {
		case t.soon:
			timeout = threadPoll
		case recent:
			timeout = uring.BusySleep
			t.yields.At(t.now(), true)
		}
		if !t.stop.Load() {
			waitFor(t.waits, timeout)
		}
		w.Awake()
	}
	for _, tk := range t.tokens {
		w.Fired(tk, 0)
	}
}

// FutexWait implements uring.Waits for the thread's next sleep.
func (t *thread) FutexWait(word *atomic.Uint32, v uint32, token uint32) {
	t.tokens = append(t.tokens, token)
	if len(t.waits) == maxWaits {
		t.soon = true
		return
	}
	t.waits = append(t.waits, waitvOf(word, v))
}

// FDWait implements uring.Waits: an own-thread worker has no ring to read
// an eventfd with (its pool never uses eventfd doorbells); the sleep is
// bounded instead.
func (t *thread) FDWait(fd int, token uint32) {
	t.tokens = append(t.tokens, token)
	t.soon = true
}

// PollWait implements uring.Waits: an own-thread worker has no ring to poll
// with (its reapers are given none, see Reaper); the sleep is bounded.
func (t *thread) PollWait(fd int, token uint32) {
	t.tokens = append(t.tokens, token)
	t.soon = true
}

// CancelWait implements uring.Waits: nothing stays armed across this
// thread's sleeps.
func (t *thread) CancelWait(uint32) bool { return true }

// Soon implements uring.Waits.
func (t *thread) Soon() { t.soon = true }

// Poll implements uring.Waits: an own-thread worker has nothing in the
// kernel but its sleep, so it may always poll.
func (t *thread) Poll() bool { return true }

func (w *Worker) stopThread() {
	t := w.thread
	t.stop.Store(true)
	t.kick()
	<-t.done
}
