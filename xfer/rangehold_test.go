package xfer_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// holdSeg is a counting segment that also tracks the ranges transfers hold on it,
// and can refuse new holds.
type holdSeg struct {
	*xfertest.Segment
	mu     sync.Mutex // guards the fields below
	held   map[[2]uint64]int
	refuse bool
	bad    bool // a DropRange without a matching HoldRange
}

var _ xfer.RangeHolder = (*holdSeg)(nil)

func newHoldSeg(id xfer.SegmentID) *holdSeg {
	return &holdSeg{Segment: xfertest.NewSegment(id, 1<<16), held: map[[2]uint64]int{}}
}

func (s *holdSeg) HoldRange(off, n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		return false
	}
	if s.Refs() <= 0 {
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
	if s.Refs() <= 0 {
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
		t.Fatalf("%s: segment %d saw an unmatched or misordered DropRange", what, s.ID())
	}
	if h := s.holds(); h != wantHolds {
		t.Fatalf("%s: segment %d holds %d ranges, want %d", what, s.ID(), h, wantHolds)
	}
}

func holdFixture(t *testing.T, tr xfer.Transport) (*fixture, *holdSeg, *holdSeg) {
	t.Helper()
	f := &fixture{e: xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), nil), reg: xfer.NewRegistry()}
	a, b := newHoldSeg(1), newHoldSeg(2)
	for _, s := range []xfer.Segment{a, b} {
		if err := f.reg.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	f.a, f.b = a.Segment, b.Segment
	f.opts = xfer.SubmitOptions{Resolver: f.reg}
	t.Cleanup(func() { f.e.Close() })
	return f, a, b
}

// TestRangeHoldsFollowTasks: a range is held from accept to the end of the
// task, on both sides, and dropped exactly once on every path.
func TestRangeHoldsFollowTasks(t *testing.T) {
	t.Run("completion", func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{})
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
		tr.Finish()
		a.check(t, "after completion", 0)
		b.check(t, "after completion", 0)
		if a.Refs() != 0 || b.Refs() != 0 {
			t.Fatalf("refs left: %d %d", a.Refs(), b.Refs())
		}
	})
	t.Run("partial dispatch", func(t *testing.T) {
		for k := 0; k <= 4; k++ {
			tr := xfertest.New(xfertest.Config{Limit: takeAtMost(k)})
			f, a, b := holdFixture(t, tr)
			id, _ := f.e.AllocateBatch(8)
			if err := f.e.Submit(id, f.reqs(4), f.opts, make([]error, 4)); err != nil {
				t.Fatal(err)
			}
			a.check(t, "undispatched rolled back", k)
			tr.Finish()
			a.check(t, "dispatched completed", 0)
			b.check(t, "dispatched completed", 0)
		}
	})
	t.Run("target refuses", func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{Inline: true})
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
		if a.Refs() != 0 || b.Refs() != 0 {
			t.Fatalf("refs left after refusal: %d %d", a.Refs(), b.Refs())
		}
	})
	t.Run("timeout then late done", func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{})
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
		tr.Finish()
		a.check(t, "late Done", 0)
	})
}
