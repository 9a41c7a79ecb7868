package reactor

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// pollQueue is a queue whose work, idleness and doorbell calls the test
// sets and reads.
type pollQueue struct {
	work bool // the next Serve does work
	// clk and cost: a Serve that does work takes cost on clk (a local
	// batch's copies made in the pass).
	clk   *testutil.Clock
	cost  time.Duration
	idle  bool
	bells int // Doorbell calls: the worker prepared a sleep
	word  atomic.Uint32
}

func (q *pollQueue) Serve() bool {
	did := q.work
	q.work = false
	if did && q.clk != nil {
		q.clk.Advance(q.cost)
	}
	return did
}
func (q *pollQueue) Doorbell() (*atomic.Uint32, uint32, bool) {
	q.bells++
	return &q.word, q.word.Load(), true
}
func (q *pollQueue) Awake()                       {}
func (q *pollQueue) Idle() bool                   { return q.idle }
func (q *pollQueue) EventfdDoorbell() (int, bool) { return -1, false }

// pollWaits is a host whose own work in flight the test sets.
type pollWaits struct {
	busy   bool
	polled int
	armed  int
}

func (h *pollWaits) FutexWait(*atomic.Uint32, uint32, uint32) { h.armed++ }
func (h *pollWaits) FDWait(int, uint32)                       {}
func (h *pollWaits) PollWait(int, uint32)                     {}
func (h *pollWaits) CancelWait(uint32) bool                   { return true }
func (h *pollWaits) Soon()                                    {}
func (h *pollWaits) Poll() bool {
	if h.busy {
		return false
	}
	h.polled++
	return true
}

// pollWorker is a worker polling for limit on clk, serving q.
func pollWorker(t *testing.T, limit time.Duration, clk *testutil.Clock, q *pollQueue) *Worker {
	t.Helper()
	w := newWorker(0)
	w.wake = func() {}
	w.poller.limit, w.poller.now = limit, clk.Now
	if err := w.attach(q); err != nil {
		t.Fatal(err)
	}
	w.Serve() // takes the queue in
	return w
}

// TestPollAfterLastAnswer: a worker whose pass answered its queue's last
// request in flight polls (declines the sleep, prepares no doorbell) until
// the next submission or its limit, then sleeps; it does not poll with a
// request in flight, nor while its ring has I/O of its own, nor after a
// pass that did nothing.
func TestPollAfterLastAnswer(t *testing.T) {
	clk := testutil.NewClock(time.Now())
	q := &pollQueue{idle: true}
	w := pollWorker(t, 50*time.Microsecond, clk, q)
	ws := &pollWaits{}

	// Nothing was done yet: no poll, a sleep.
	if !w.Sleep(ws) || q.bells != 1 || w.polls.Load() != 0 {
		t.Fatalf("idle worker: sleep prepared %d times, %d polls; want a sleep and no poll", q.bells, w.polls.Load())
	}
	w.Awake()

	// A pass answered the last request: the worker polls.
	q.work = true
	w.Serve()
	if w.Sleep(ws) || q.bells != 1 || w.polls.Load() != 1 {
		t.Fatalf("after the last answer: sleep prepared %d times, %d polls; want a poll and no sleep", q.bells-1, w.polls.Load())
	}
	// Within the limit it keeps polling; the next submission ends the
	// poll as found.
	clk.Advance(40 * time.Microsecond)
	w.Serve()
	if w.Sleep(ws) {
		t.Fatal("slept within the poll's limit")
	}
	q.work = true
	w.Serve()
	if w.poller.misses != 0 || !w.poller.start.IsZero() {
		t.Fatalf("a submission within the poll: misses %d, poll still under way %v", w.poller.misses, !w.poller.start.IsZero())
	}

	// A poll that reaches its limit ends missed, and the worker sleeps.
	if w.Sleep(ws) {
		t.Fatal("no poll after the answer")
	}
	clk.Advance(50 * time.Microsecond)
	w.Serve()
	if !w.Sleep(ws) || q.bells != 2 || w.pollMisses.Load() != 1 {
		t.Fatalf("poll past its limit: sleep prepared %d times, %d missed; want a sleep and one miss", q.bells-1, w.pollMisses.Load())
	}
	w.Awake()

	// A request still in flight (its end wakes the worker): no poll.
	q.work, q.idle = true, false
	w.Serve()
	if !w.Sleep(ws) || w.polls.Load() != 2 {
		t.Fatalf("request in flight: %d polls; want a sleep and no new poll", w.polls.Load())
	}
	w.Awake()
	// The ring's own I/O in flight: no poll either.
	q.work, q.idle, ws.busy = true, true, true
	w.Serve()
	if !w.Sleep(ws) || w.polls.Load() != 2 {
		t.Fatalf("ring busy: %d polls; want a sleep and no new poll", w.polls.Load())
	}
	w.Awake()
	if st := (&Pool{workers: []*Worker{w}}).Stats()[0]; st.Polls != 2 || st.PollMisses != 1 {
		t.Fatalf("stats %+v: want 2 polls, 1 missed", st)
	}
}

// TestPollBacksOff: after pollMisses polls in a row found nothing (a
// client that thinks between its batches), the worker polls one idle turn
// in pollProbe, and polls every turn again once a poll finds work.
func TestPollBacksOff(t *testing.T) {
	clk := testutil.NewClock(time.Now())
	q := &pollQueue{idle: true}
	w := pollWorker(t, 50*time.Microsecond, clk, q)
	ws := &pollWaits{}
	// turn is one request answered and what follows until the worker
	// sleeps; found says the client's next comes within the poll. It
	// reports whether the worker polled.
	turn := func(found bool) bool {
		t.Helper()
		q.work = true
		w.Serve()
		before := w.polls.Load()
		if w.Sleep(ws) {
			w.Awake()
			return false
		}
		if found {
			q.work = true
			w.Serve()
			return true
		}
		clk.Advance(time.Millisecond)
		w.Serve()
		if !w.Sleep(ws) {
			t.Fatal("no sleep after a poll past its limit")
		}
		w.Awake()
		return w.polls.Load() == before+1
	}
	for i := range pollMisses {
		if !turn(false) {
			t.Fatalf("turn %d: no poll before %d misses", i, pollMisses)
		}
	}
	polled := 0
	for range 2 * pollProbe {
		if turn(false) {
			polled++
		}
	}
	if polled != 2 {
		t.Fatalf("%d polls in %d idle turns after %d misses in a row, want 2 (one in %d)", polled, 2*pollProbe, pollMisses, pollProbe)
	}
	// A probe that finds work: polling every turn again.
	for i := 0; ; i++ {
		if i > pollProbe {
			t.Fatal("no probe within pollProbe turns")
		}
		q.work = true
		w.Serve()
		if !w.Sleep(ws) {
			q.work = true
			w.Serve() // found
			break
		}
		w.Awake()
	}
	for i := range 4 {
		if !turn(true) {
			t.Fatalf("turn %d after a probe found work: no poll", i)
		}
	}
}

// TestPollOff: a worker whose poll is off (Config.Poll negative) sleeps
// after every last answer.
func TestPollOff(t *testing.T) {
	p, err := New(Config{Workers: 1, Poll: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if l := p.workers[0].poller.limit; l != 0 {
		t.Fatalf("poll limit %v with Poll -1, want none", l)
	}
	clk := testutil.NewClock(time.Now())
	q := &pollQueue{idle: true}
	w := pollWorker(t, 0, clk, q)
	q.work = true
	w.Serve()
	if !w.Sleep(&pollWaits{}) || w.polls.Load() != 0 {
		t.Fatal("a worker without poll polled")
	}
	if err := (Config{Poll: MaxPoll + 1}).Validate(); err == nil {
		t.Fatal("a poll past MaxPoll was accepted")
	}
}

// TestPollShareBounded: a client that submits a little before each poll
// would end (every 40 µs here) cannot keep its worker polling for more
// than pollShare of each pollWindow: past it the worker sleeps at every
// idle turn, a doorbell waking it, until the next window.
func TestPollShareBounded(t *testing.T) {
	clk := testutil.NewClock(time.Now())
	q := &pollQueue{idle: true}
	w := pollWorker(t, 50*time.Microsecond, clk, q)
	ws := &pollWaits{}
	const step = 40 * time.Microsecond
	polled, slept := 0, 0
	q.work = true
	w.Serve() // a request answered
	for elapsed := time.Duration(0); elapsed < pollWindow-step; elapsed += step {
		// The worker is idle after answering: it polls or sleeps, and the
		// client's next request comes step later, found by the poll or
		// waking the sleep; the worker answers it at once.
		if w.Sleep(ws) {
			slept++
			w.Awake()
		} else {
			polled++
		}
		clk.Advance(step)
		q.work = true
		w.Serve()
	}
	want := int(pollShare / step)
	if polled < want-1 || polled > want+1 || slept == 0 {
		t.Fatalf("%d polls of %v and %d sleeps in one %v window: want about %d polls, then sleeps", polled, step, slept, pollWindow, want)
	}
	if st := (&Pool{workers: []*Worker{w}}).Stats()[0]; st.PollsCapped == 0 {
		t.Fatalf("stats %+v: no idle turn counted as capped", st)
	}
	// The next window: polls again.
	clk.Advance(pollWindow)
	q.work = true
	w.Serve()
	if w.Sleep(ws) {
		t.Fatal("no poll in the next window")
	}
}

// TestPollShareCountsOnlyPolling: the share bounds the time a worker
// polls, not the work of the pass that ends a poll. A client whose next
// batch comes 10 µs into each poll, a batch whose copies take its pass
// 200 µs, polls for 10 µs of every 210: a whole window without a sleep.
// (Counted to the pass's end, the share ran out halfway through the
// window, and the worker slept, a doorbell waking it, at every turn after.)
func TestPollShareCountsOnlyPolling(t *testing.T) {
	clk := testutil.NewClock(time.Now())
	q := &pollQueue{idle: true, clk: clk, cost: 200 * time.Microsecond}
	w := pollWorker(t, 50*time.Microsecond, clk, q)
	ws := &pollWaits{}
	const wait = 10 * time.Microsecond
	q.work = true
	w.Serve() // a batch answered
	turns := 0
	for start := clk.Now(); clk.Now().Sub(start) < pollWindow; turns++ {
		if w.Sleep(ws) {
			t.Fatalf("turn %d, %v into the window: slept (%d polls capped); want a poll at every turn",
				turns, clk.Now().Sub(start), w.pollsCapped.Load())
		}
		clk.Advance(wait)
		q.work = true
		w.Serve()
	}
	if got := w.polls.Load(); got != uint64(turns) {
		t.Fatalf("%d polls in %d turns", got, turns)
	}
	if w.poller.spent > time.Duration(turns)*wait {
		t.Fatalf("polls counted %v over %d turns of %v each", w.poller.spent, turns, wait)
	}
}

// cancelWaits is a ring's Waits that records what the worker arms and
// cancels.
type cancelWaits struct {
	pollWaits
	tokens, cancels []uint32
}

func (h *cancelWaits) FutexWait(_ *atomic.Uint32, _ uint32, token uint32) {
	h.tokens = append(h.tokens, token)
}

func (h *cancelWaits) CancelWait(token uint32) bool {
	h.cancels = append(h.cancels, token)
	return true
}

// TestDetachCancelsArmedFutexWait: a queue detached while its futex wait
// is armed on the worker's ring has that wait cancelled at the worker's
// next sleep. Its client can write the word back to the value armed after
// the closing queue's Kick, before the ring submits the wait: nothing
// would then end the wait, and every closed queue could leave one in the
// kernel for the daemon's life.
func TestDetachCancelsArmedFutexWait(t *testing.T) {
	w := newWorker(0)
	w.wake = func() {}
	q := &pollQueue{idle: true}
	if err := w.attach(q); err != nil {
		t.Fatal(err)
	}
	w.Serve() // takes the queue in
	ws := &cancelWaits{}
	if !w.Sleep(ws) || len(ws.tokens) != 1 {
		t.Fatalf("the queue's doorbell armed %d times, want once", len(ws.tokens))
	}
	w.Awake()
	done := make(chan struct{})
	go func() { defer close(done); w.detach(q) }()
	testutil.Eventually(t, 10*time.Second, w.changed.Load, "the detach waiting for the worker")
	w.Serve() // lets the queue go
	<-done
	w.Sleep(ws)
	if !slices.Equal(ws.cancels, ws.tokens) {
		t.Fatalf("cancelled %v at the sleep after the detach; want the wait armed for the queue, %v", ws.cancels, ws.tokens)
	}
}
