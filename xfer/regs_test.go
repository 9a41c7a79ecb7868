package xfer_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// countReg counts its releases.
type countReg struct{ n atomic.Int32 }

func (r *countReg) Release() { r.n.Add(1) }

// TestRegsSlots: a slot holds one registration; Drop hands it back
// unreleased; Teardown releases what the slots hold, once, and refuses
// later Sets.
func TestRegsSlots(t *testing.T) {
	var g xfer.Regs
	a, b, c := new(countReg), new(countReg), new(countReg)
	if g.Load(xfer.SlotURing) != nil || !g.Set(xfer.SlotURing, a) || g.Load(xfer.SlotURing) != xfer.Registration(a) {
		t.Fatal("an empty slot did not take a registration")
	}
	if g.Set(xfer.SlotURing, b) || g.Load(xfer.SlotURing) != xfer.Registration(a) {
		t.Fatal("a full slot took a second registration")
	}
	if g.Drop(xfer.SlotURing, b) || !g.Drop(xfer.SlotURing, a) || g.Load(xfer.SlotURing) != nil {
		t.Fatal("Drop of the slot's registration did not empty it, or Drop of another did")
	}
	if !g.Set(xfer.SlotURing, b) || !g.Set(xfer.SlotRDMA, c) {
		t.Fatal("Set after Drop failed")
	}
	g.Teardown()
	g.Teardown()
	if a.n.Load() != 0 || b.n.Load() != 1 || c.n.Load() != 1 {
		t.Fatalf("releases: dropped %d, slot 0 %d, slot 1 %d; want 0, 1, 1", a.n.Load(), b.n.Load(), c.n.Load())
	}
	if g.Set(xfer.SlotURing, a) || g.Load(xfer.SlotURing) != nil || g.Drop(xfer.SlotRDMA, c) {
		t.Fatal("slots changed after the teardown")
	}
}

// TestRegsDropRacesTeardown: whichever of Drop and Teardown wins, the
// registration is released exactly once.
func TestRegsDropRacesTeardown(t *testing.T) {
	for range 200 {
		var g xfer.Regs
		r := new(countReg)
		g.Set(xfer.SlotRDMA, r)
		var dropped atomic.Bool
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if g.Drop(xfer.SlotRDMA, r) {
				dropped.Store(true)
				r.Release()
			}
		}()
		go func() {
			defer wg.Done()
			g.Teardown()
		}()
		wg.Wait()
		if r.n.Load() != 1 {
			t.Fatalf("released %d times (dropped: %v)", r.n.Load(), dropped.Load())
		}
	}
}

// TestRegsLoadAllocs: the hot path's read allocates nothing.
func TestRegsLoadAllocs(t *testing.T) {
	var g xfer.Regs
	r := new(countReg)
	g.Set(xfer.SlotURing, r)
	seg := xfer.Segment(regSeg{&g})
	if n := testing.AllocsPerRun(100, func() {
		if xfer.RegsOf(seg).Load(xfer.SlotURing) != xfer.Registration(r) {
			t.Fatal("lost the registration")
		}
	}); n != 0 {
		t.Fatalf("Load: %v allocations", n)
	}
}

// regSeg is a segment that carries Regs.
type regSeg struct{ g *xfer.Regs }

func (s regSeg) ID() xfer.SegmentID { return 1 }
func (s regSeg) Kind() xfer.Kind    { return xfer.KindPool }
func (s regSeg) Size() uint64       { return 0 }
func (s regSeg) Acquire() bool      { return true }
func (s regSeg) Release()           {}
func (s regSeg) Regs() *xfer.Regs   { return s.g }
