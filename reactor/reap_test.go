//go:build linux

package reactor

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/uring"
)

// fakeReaper is a transport's completions as a worker reaps them: pending
// completions come from another goroutine (complete), which wakes the
// worker only when the reaper armed for its sleep.
type fakeReaper struct {
	wake    func()
	pending atomic.Int32
	armed   atomic.Bool
	reaped  atomic.Int32
	reapTid atomic.Int32
	spin    atomic.Int32 // Sleep refuses this many more times
	stopped atomic.Int32
	stopTid atomic.Int32
}

func (r *fakeReaper) Bind(wake func(), _ bool) { r.wake = wake }

func (r *fakeReaper) Fired(uint32, int32) {}

func (r *fakeReaper) Reap() bool {
	n := r.pending.Swap(0)
	if n == 0 {
		return false
	}
	r.reaped.Add(n)
	r.reapTid.Store(int32(unix.Gettid()))
	return true
}

func (r *fakeReaper) Sleep(ReaperWaits) bool {
	if r.spin.Load() > 0 {
		r.spin.Add(-1)
		return false
	}
	r.armed.Store(true)
	return r.pending.Load() == 0
}

func (r *fakeReaper) Stop() {
	r.stopped.Add(1)
	r.stopTid.Store(int32(unix.Gettid()))
}

// complete is a completion arriving: the worker is woken if it armed.
func (r *fakeReaper) complete() {
	r.pending.Add(1)
	if r.armed.Swap(false) {
		r.wake()
	}
}

// TestReaperInTheWorkersSleep: a worker (on its own thread, and hosted on
// a ring) reaps after its passes, sleeps only when its reaper agrees (a
// spinning reaper keeps it awake), and is woken by its reaper's
// completion, every time.
func TestReaperInTheWorkersSleep(t *testing.T) {
	pools(t, 1, func(t *testing.T, p *Pool) {
		r := &fakeReaper{}
		r.spin.Store(100)
		if err := p.AddReaper(0, r); err != nil {
			t.Fatal(err)
		}
		if err := p.AddReaper(1, r); err == nil {
			t.Error("AddReaper to a worker that does not exist succeeded")
		}
		// While the reaper spins the worker makes passes without sleeping.
		testutil.Eventually(t, 5*time.Second, func() bool { return r.spin.Load() == 0 }, "the spin ran out")
		testutil.Eventually(t, 5*time.Second, func() bool { return p.Stats()[0].Sleeps > 0 }, "the worker sleeps")
		if s := p.Stats()[0]; s.Passes < 100 {
			t.Errorf("%d passes while the reaper refused 100 sleeps", s.Passes)
		}
		for i := 1; i <= 20; i++ {
			testutil.Eventually(t, 5*time.Second, r.armed.Load, "the worker armed its reaper (%d)", i)
			r.complete()
			testutil.Eventually(t, 5*time.Second, func() bool { return r.reaped.Load() == int32(i) }, "completion %d reaped", i)
		}
	})
}

// TestReaperStopsWithItsWorker: a worker that stops stops its reapers
// once, on its own thread, and takes no more.
func TestReaperStopsWithItsWorker(t *testing.T) {
	p, err := New(Config{Workers: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &fakeReaper{}
	if err := p.AddReaper(0, r); err != nil {
		t.Fatal(err)
	}
	r.complete() // not armed: the worker finds it after its next pass
	p.Pick()
	e, _, _ := newQueue(t, 1, 8)
	if err := p.Attach(0, e); err != nil { // a pass that takes the reaper in
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return r.reaped.Load() == 1 }, "the reaper's first completion reaped")
	tid := r.reapTid.Load()
	p.Detach(0, e)
	p.Close()
	if r.stopped.Load() != 1 || r.stopTid.Load() != tid {
		t.Errorf("reaper stopped %d times on thread %d; want once on the worker's %d", r.stopped.Load(), r.stopTid.Load(), tid)
	}
	if err := p.AddReaper(0, &fakeReaper{}); err == nil {
		t.Error("AddReaper to a stopped worker succeeded")
	}
}

// pollReaper is a transport whose completions raise an event on a
// channel, an eventfd standing for an RDMA completion channel: the worker
// polls it on its ring (the reaper's Sleep arms the poll, once, until it
// fires), and on the wake-up the reaper takes the event, reaps, and arms
// again. No goroutine wakes the worker: only the ring's poll can.
type pollReaper struct {
	ch      int
	polls   bool
	pending atomic.Int32 // completions waiting (the "CQ")
	armed   atomic.Bool  // the "ibv_req_notify_cq": the next completion raises an event
	polling bool         // a poll of ch is on the ring (worker-owned)
	fired   bool
	tokens  []uint32 // tokens Fired reported (worker-owned)
	reaped  atomic.Int32
	taken   atomic.Int32 // events taken
	gen     uint32
}

func (r *pollReaper) Bind(_ func(), polls bool) { r.polls = polls }

func (r *pollReaper) Reap() bool {
	if r.fired {
		r.fired = false
		var b [8]byte
		if n, _ := unix.Read(r.ch, b[:]); n == 8 {
			r.taken.Add(1)
		}
	}
	n := r.pending.Swap(0)
	r.reaped.Add(n)
	return n > 0
}

func (r *pollReaper) Sleep(ws ReaperWaits) bool {
	if ws == nil {
		panic("a hosted worker's reaper was given no waits")
	}
	r.armed.Store(true)
	if !r.polling {
		r.polling = true
		r.gen++
		ws.PollWait(r.ch, r.token())
	}
	return r.pending.Load() == 0 // a completion before the arm raised no event
}

// token is the poll's: its generation, and 5 in the low bits.
func (r *pollReaper) token() uint32 { return (r.gen<<4 | 5) & (1<<ReaperTokenBits - 1) }

func (r *pollReaper) Fired(token uint32, res int32) {
	r.tokens = append(r.tokens, token)
	if token == r.token() && res > 0 {
		r.polling, r.fired = false, true
	}
}

func (r *pollReaper) Stop() {}

// complete is a completion arriving on the device: an event on the
// channel when armed, nothing else.
func (r *pollReaper) complete() {
	r.pending.Add(1)
	if r.armed.Swap(false) {
		one := [8]byte{1}
		unix.Write(r.ch, one[:]) //nolint:errcheck
	}
}

// TestReaperPollsItsChannelOnTheRing: a hosted worker's reaper arms a poll
// of its completion channel (an eventfd here) on the worker's ring; each
// completion's event ends the worker's sleep through that poll alone, the
// reaper's token comes back to it unchanged, and a second reaper on the
// same worker keeps tokens of its own.
func TestReaperPollsItsChannelOnTheRing(t *testing.T) {
	tr, err := uring.New(uring.Config{Rings: 1, AllowedDirs: []string{t.TempDir()}}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	p, err := New(Config{Workers: 1, Doorbell: DoorbellEventfd}, tr, nil)
	if err != nil {
		tr.Close()
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			p.Close()
			tr.Close()
		}
	}()
	ch, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ch)
	other := &fakeReaper{}
	if err := p.AddReaper(0, other); err != nil {
		t.Fatal(err)
	}
	r := &pollReaper{ch: ch}
	if err := p.AddReaper(0, r); err != nil {
		t.Fatal(err)
	}
	if !r.polls {
		t.Fatal("a hosted worker's reaper was bound without polls")
	}
	const n = 200
	for i := 1; i <= n; i++ {
		testutil.Eventually(t, 5*time.Second, r.armed.Load, "the worker armed for completion %d", i)
		r.complete()
		testutil.Eventually(t, 5*time.Second, func() bool { return r.reaped.Load() == int32(i) }, "completion %d reaped", i)
	}
	if r.taken.Load() < n/2 {
		t.Errorf("%d events taken for %d completions: the poll did not wake the worker", r.taken.Load(), n)
	}
	// Read on the worker's thread once it stopped: tokens are its.
	p.Close()
	tr.Close()
	closed = true
	for _, tk := range r.tokens {
		if tk>>ReaperTokenBits != 0 || tk&0xf != 5 {
			t.Fatalf("the reaper's poll came back with token %#x, not one it armed", tk)
		}
	}
	if other.reaped.Load() != 0 {
		t.Error("the other reaper saw completions")
	}
}
