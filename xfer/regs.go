package xfer

import (
	"sync"
	"sync/atomic"
)

// RegSlot names a transport's registration slot on a segment: each
// transport that registers memory (io_uring fixed buffers, RDMA memory
// regions) has one, fixed at build time.
type RegSlot uint8

const (
	// SlotURing holds io_uring's fixed-buffer registration.
	SlotURing RegSlot = iota
	// SlotRDMA holds a segment's RDMA keys (rdma.Keys): a local
	// segment's memory registration, or the keys a remote segment's owner
	// registered it with.
	SlotRDMA

	numRegSlots
)

// Registration is what a transport registered over a segment's memory.
// Release undoes it. Regs runs it at most once: at the segment's teardown,
// on the goroutine that drops the segment's last reference (possibly a
// transport's completion path, so it must not wait for one), unless the
// transport took its registration back first with Drop. Its dynamic type
// must be comparable (a pointer): Drop compares.
type Registration interface {
	Release()
}

// Regs is a segment's per-transport registrations: a small fixed array
// with one slot per RegSlot, so that a transport's hot path finds its
// registration with one atomic load, no lock and no map. Set and Drop are
// cold (a registration is made or taken back); Teardown, which the
// segment's owner calls just before its memory goes away, empties every
// slot and releases each registration once. The zero value is ready; a Regs
// must not be copied.
type Regs struct {
	slots [numRegSlots]atomic.Pointer[regBox]
	// mu serializes Set, Drop and Teardown, and guards closed.
	mu     sync.Mutex
	closed bool // torn down: Set fails
}

// regBox holds a registration in a slot.
type regBox struct{ r Registration }

// Load is slot s's registration, or nil. It does not lock or allocate.
func (g *Regs) Load(s RegSlot) Registration {
	if b := g.slots[s].Load(); b != nil {
		return b.r
	}
	return nil
}

// Set puts r in slot s. It returns false, keeping nothing, when the slot
// holds a registration already or the segment was torn down; r is then the
// caller's to release.
func (g *Regs) Set(s RegSlot, r Registration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.slots[s].Load() != nil {
		return false
	}
	g.slots[s].Store(&regBox{r: r})
	return true
}

// Drop empties slot s if it holds r and reports whether it did; r's
// release is then the caller's, and Teardown will not run it. False means
// the slot holds another registration or none: Teardown released r, or
// is releasing it.
func (g *Regs) Drop(s RegSlot, r Registration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.slots[s].Load(); b == nil || b.r != r {
		return false
	}
	g.slots[s].Store(nil)
	return true
}

// Teardown empties every slot and releases their registrations, each
// once, in slot order; later Sets fail. A second call does nothing.
func (g *Regs) Teardown() {
	var out [numRegSlots]Registration
	g.mu.Lock()
	g.closed = true
	for i := range g.slots {
		if b := g.slots[i].Swap(nil); b != nil {
			out[i] = b.r
		}
	}
	g.mu.Unlock()
	for _, r := range out {
		if r != nil {
			r.Release()
		}
	}
}

// Registered is a segment that carries per-transport registrations.
type Registered interface {
	Regs() *Regs
}

// RegsOf is seg's registrations, or nil when seg carries none.
func RegsOf(seg Segment) *Regs {
	if r, ok := seg.(Registered); ok {
		return r.Regs()
	}
	return nil
}
