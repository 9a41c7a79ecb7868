package reactor

import (
	"sync/atomic"
	"testing"
	"time"
)

// pendingQueue is a Queue whose Pending the test sets.
type pendingQueue struct {
	pending atomic.Bool
	polls   atomic.Int64
}

func (p *pendingQueue) Serve() bool                              { return false }
func (p *pendingQueue) Doorbell() (*atomic.Uint32, uint32, bool) { return nil, 0, true }
func (p *pendingQueue) Awake()                                   {}
func (p *pendingQueue) Pending() bool {
	p.polls.Add(1)
	return p.pending.Load()
}

// A worker starts without a spin; a short sleep teaches it one a little
// longer than that sleep, which catches work that comes within it; a
// spin that finds nothing halves the budget, and a sleep longer than the
// ceiling teaches nothing.
func TestWorkerSpinLearns(t *testing.T) {
	q := &pendingQueue{}
	w := newWorker(0)
	w.queues = []*served{{q: q}}

	q.pending.Store(true)
	if w.spinFor() || q.polls.Load() != 0 {
		t.Fatalf("a new worker spun (%d polls)", q.polls.Load())
	}
	w.spin.slept(4 * time.Microsecond)
	if b := w.spin.budget; b < 4*time.Microsecond || b > spinCeiling {
		t.Fatalf("budget %v after a 4µs sleep, want at least 4µs and at most %v", b, spinCeiling)
	}
	if !w.spinFor() {
		t.Fatal("the spin missed work that was pending")
	}
	if w.spins.Load() != 1 {
		t.Errorf("%d spins counted, want 1", w.spins.Load())
	}

	q.pending.Store(false)
	before := w.spin.budget
	start := time.Now()
	if w.spinFor() {
		t.Fatal("the spin found work where none was")
	}
	if d := time.Since(start); d < before {
		t.Errorf("a spin of budget %v ended after %v", before, d)
	}
	if w.spin.budget != before/2 {
		t.Errorf("budget %v after a miss, want %v", w.spin.budget, before/2)
	}
	after := w.spin.budget
	w.spin.slept(time.Millisecond)
	if w.spin.budget != after {
		t.Errorf("a 1ms sleep moved the budget from %v to %v", after, w.spin.budget)
	}
	for range 10 {
		w.spinFor()
	}
	if q.polls.Store(0); w.spinFor() || q.polls.Load() != 0 {
		t.Errorf("still spinning (budget %v) after 10 misses", w.spin.budget)
	}
}
