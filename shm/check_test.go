//go:build linux

package shm

import (
	"fmt"
	"math/bits"
)

// check verifies the allocator's internal invariants; tests call it while
// no other goroutine uses the allocator.
func (a *allocator) check() error {
	free := map[int32]bool{}
	for i := 0; i < a.nfree; i++ {
		s := a.freeSlabs[i]
		if free[s] {
			return fmt.Errorf("slab %d twice on the free list", s)
		}
		free[s] = true
	}
	type tally struct {
		live, slabs, listed uint64
		requested           uint64
	}
	per := make([]tally, len(a.classes))
	for s := range a.slabs {
		sl := &a.slabs[s]
		ci := sl.class.Load()
		words := a.bits[uint64(s)*uint64(a.wps) : uint64(s+1)*uint64(a.wps)]
		var set uint64
		for _, w := range words {
			set += uint64(bits.OnesCount64(w))
		}
		if ci == noSlab {
			if !free[int32(s)] {
				return fmt.Errorf("slab %d held by no class and not on the free list", s)
			}
			if set != 0 {
				return fmt.Errorf("free slab %d has %d live bits", s, set)
			}
			continue
		}
		if free[int32(s)] {
			return fmt.Errorf("slab %d held by class %d and on the free list", s, ci)
		}
		c := &a.classes[ci]
		if uint64(sl.live) != set || sl.live != sl.bump-sl.top || sl.live == 0 || sl.live > c.per {
			return fmt.Errorf("slab %d: live %d, bits %d, bump %d, top %d, per %d", s, sl.live, set, sl.bump, sl.top, c.per)
		}
		if sl.listed != (sl.live < c.per) {
			return fmt.Errorf("slab %d: listed %v with %d of %d live", s, sl.listed, sl.live, c.per)
		}
		seen := map[uint16]bool{}
		base := uint64(s) * uint64(a.bps)
		for i := uint32(0); i < sl.top; i++ {
			b := a.stack[base+uint64(i)]
			if seen[b] || uint32(b) >= sl.bump || words[b/64]&(1<<(b%64)) != 0 {
				return fmt.Errorf("slab %d: bad free-stack entry %d", s, b)
			}
			seen[b] = true
		}
		for b := uint32(0); b < c.per; b++ {
			if words[b/64]&(1<<(b%64)) != 0 {
				per[ci].requested += uint64(a.req[base+uint64(b)])
			}
		}
		per[ci].live += uint64(sl.live)
		per[ci].slabs++
		if sl.listed {
			per[ci].listed++
		}
	}
	for ci := range a.classes {
		c := &a.classes[ci]
		t := per[ci]
		if t.live != c.live || t.slabs != uint64(c.slabs) || t.requested != c.requested {
			return fmt.Errorf("class %d: counters live %d slabs %d requested %d, slabs say %+v", ci, c.live, c.slabs, c.requested, t)
		}
		var n uint64
		prev := int32(noSlab)
		for s := c.partial; s != noSlab; s = a.slabs[s].next {
			if a.slabs[s].class.Load() != int32(ci) || a.slabs[s].prev != prev || !a.slabs[s].listed {
				return fmt.Errorf("class %d: partial list broken at slab %d", ci, s)
			}
			prev = s
			n++
			if n > uint64(len(a.slabs)) {
				return fmt.Errorf("class %d: partial list loops", ci)
			}
		}
		if n != t.listed {
			return fmt.Errorf("class %d: %d slabs on the partial list, %d listed", ci, n, t.listed)
		}
	}
	return nil
}
