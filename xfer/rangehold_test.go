package xfer

import (
	"sync"
	"testing"
	"time"
)

// holdSeg is a countSeg that also tracks the ranges transfers hold on it,
// and can refuse new holds.
type holdSeg struct {
	*countSeg
	mu     sync.Mutex // guards the fields below
	held   map[[2]uint64]int
	refuse bool
	bad    bool // a DropRange without a matching HoldRange
}

var _ RangeHolder = (*holdSeg)(nil)

func newHoldSeg(id SegmentID) *holdSeg {
	return &holdSeg{countSeg: newSeg(id, 1<<16), held: map[[2]uint64]int{}}
}

func (s *holdSeg) HoldRange(off, n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		return false
	}
	if s.refs.Load() <= 0 {
		s.bad = true // held before Acquire
	}
	s.held[[2]uint64{off, n}]++
	return true
}

func (s *holdSeg) DropRange(off, n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]uint64{off, n}
	if s.held[k] == 0 {
		s.bad = true
		return
	}
	if s.refs.Load() <= 0 {
		s.bad = true // dropped after Release
	}
	if s.held[k]--; s.held[k] == 0 {
		delete(s.held, k)
	}
}

func (s *holdSeg) holds() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.held {
		n += c
	}
	return n
}

func (s *holdSeg) check(t *testing.T, what string, wantHolds int) {
	t.Helper()
	s.mu.Lock()
	bad := s.bad
	s.mu.Unlock()
	if bad {
		t.Fatalf("%s: segment %d saw an unmatched or misordered DropRange", what, s.id)
	}
	if h := s.holds(); h != wantHolds {
		t.Fatalf("%s: segment %d holds %d ranges, want %d", what, s.id, h, wantHolds)
	}
}

func holdFixture(t *testing.T, tr Transport) (*fixture, *holdSeg, *holdSeg) {
	t.Helper()
	f := &fixture{e: NewEngine(Config{}, oneRouter{tr}, nil), reg: NewRegistry()}
	a, b := newHoldSeg(1), newHoldSeg(2)
	for _, s := range []Segment{a, b} {
		if err := f.reg.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	f.a, f.b = a.countSeg, b.countSeg
	f.opts = SubmitOptions{Resolver: f.reg}
	t.Cleanup(func() { f.e.Close() })
	return f, a, b
}

// TestRangeHoldsFollowTasks: a range is held from accept to the end of the
// task, on both sides, and dropped exactly once on every path.
func TestRangeHoldsFollowTasks(t *testing.T) {
	t.Run("completion", func(t *testing.T) {
		tr := &asyncTr{}
		f, a, b := holdFixture(t, tr)
		id, _ := f.e.AllocateBatch(8)
		res := make([]error, 4)
		if err := f.e.Submit(id, f.reqs(4), f.opts, res); err != nil {
			t.Fatal(err)
		}
		a.check(t, "in flight", 4)
		b.check(t, "in flight", 4)
		if err := f.e.Free(id); err == nil {
			t.Fatal("freed a batch whose ranges are in flight")
		}
		tr.finish(nil)
		a.check(t, "after completion", 0)
		b.check(t, "after completion", 0)
		if a.refs.Load() != 0 || b.refs.Load() != 0 {
			t.Fatalf("refs left: %d %d", a.refs.Load(), b.refs.Load())
		}
	})
	t.Run("partial dispatch", func(t *testing.T) {
		for k := 0; k <= 4; k++ {
			tr := &asyncTr{limit: k}
			if k == 0 {
				tr.limit = -1
			}
			f, a, b := holdFixture(t, tr)
			id, _ := f.e.AllocateBatch(8)
			if err := f.e.Submit(id, f.reqs(4), f.opts, make([]error, 4)); err != nil {
				t.Fatal(err)
			}
			a.check(t, "undispatched rolled back", k)
			tr.finish(nil)
			a.check(t, "dispatched completed", 0)
			b.check(t, "dispatched completed", 0)
		}
	})
	t.Run("target refuses", func(t *testing.T) {
		tr := &asyncTr{doneInline: true}
		f, a, b := holdFixture(t, tr)
		b.mu.Lock()
		b.refuse = true
		b.mu.Unlock()
		id, _ := f.e.AllocateBatch(8)
		res := make([]error, 2)
		if err := f.e.Submit(id, f.reqs(2), f.opts, res); err != nil {
			t.Fatal(err)
		}
		for i, err := range res {
			if err == nil {
				t.Fatalf("request %d accepted with its target range refused", i)
			}
		}
		a.check(t, "local side after the target refused", 0)
		b.check(t, "target refused", 0)
		if a.refs.Load() != 0 || b.refs.Load() != 0 {
			t.Fatalf("refs left after refusal: %d %d", a.refs.Load(), b.refs.Load())
		}
	})
	t.Run("timeout then late done", func(t *testing.T) {
		tr := &asyncTr{}
		f, a, _ := holdFixture(t, tr)
		id, _ := f.e.AllocateBatch(8)
		opts := f.opts
		opts.Deadline = time.Now().Add(20 * time.Millisecond)
		if err := f.e.Submit(id, f.reqs(3), opts, make([]error, 3)); err != nil {
			t.Fatal(err)
		}
		if s, _ := f.e.Wait(id, time.Now().Add(5*time.Second)); s.Timeout != 3 {
			t.Fatalf("summary %+v, want 3 timed out", s)
		}
		// Timed out, but the transport still owns the tasks: their bytes
		// may still move, so the ranges stay held until Done.
		a.check(t, "timed out, transport still owes Done", 3)
		tr.finish(nil)
		a.check(t, "late Done", 0)
	})
}
