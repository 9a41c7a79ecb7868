//go:build linux

package reactor

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
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

func (r *fakeReaper) Bind(wake func()) { r.wake = wake }

func (r *fakeReaper) Reap() bool {
	n := r.pending.Swap(0)
	if n == 0 {
		return false
	}
	r.reaped.Add(n)
	r.reapTid.Store(int32(unix.Gettid()))
	return true
}

func (r *fakeReaper) Sleep() bool {
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
