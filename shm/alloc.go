package shm

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// Limits on the allocator's geometry: block indices inside a slab are
// uint16, requested sizes uint32, slab indices int32.
const (
	maxBlocksPerSlab = 1 << 16
	maxMaxBlock      = 1 << 30
	maxSlabs         = 1<<31 - 1
)

// noSlab ends a class's list of partial slabs and marks a free slab's class.
const noSlab = -1

// slab is the metadata of one MaxBlock-sized piece of the pool. Its fields
// other than class are guarded by the mutex of the class that holds it.
type slab struct {
	// class is the index of the holding class, or noSlab when the slab is
	// free. It is written under the holding class's mutex and read without
	// it (atomically) by Free and BlockSize to find that mutex.
	class atomic.Int32
	live  uint32 // live blocks in the slab
	top   uint32 // depth of the slab's stack of freed block indices
	bump  uint32 // next never-allocated block index
	// prev and next link the class's list of slabs with a free block;
	// listed says whether the slab is on it.
	prev, next int32
	listed     bool
}

// class is one power-of-two size class.
type class struct {
	// mu guards the fields below and every slab whose class is this one
	// (its slab struct, free stack, live bits and requested sizes).
	mu        sync.Mutex
	partial   int32  // head of the list of held slabs with a free block
	live      uint64 // live blocks
	slabs     uint32 // slabs held
	requested uint64 // sum of the requested sizes of live blocks

	shift uint   // log2 of the block size (immutable)
	per   uint32 // blocks per slab (immutable)

	_ [64]byte // keep neighbouring classes' mutexes off one cache line
}

// allocator is the pool's block allocator. All its metadata is allocated by
// newAllocator; alloc and free only index into it.
type allocator struct {
	size     uint64
	minShift uint
	maxShift uint
	bps      uint32 // MinBlock units (the most blocks) per slab
	wps      uint32 // live-bitmap words per slab

	classes []class
	slabs   []slab
	// stack holds each slab's freed block indices: slab s owns
	// stack[s*bps:(s+1)*bps].
	stack []uint16
	// req holds the requested size of each live block: block b of slab s
	// at req[s*bps+b].
	req []uint32
	// bits has one bit per live block: slab s owns bits[s*wps:(s+1)*wps].
	bits []uint64

	// slabMu guards freeSlabs and nfree. Lock order: a class's mu, then
	// slabMu.
	slabMu    sync.Mutex
	freeSlabs []int32 // stack of free slab indices; the top is freeSlabs[nfree-1]
	nfree     int
}

// newAllocator sets up an allocator over size bytes (a multiple of maxBlock)
// with power-of-two block sizes minBlock..maxBlock, already validated.
func newAllocator(size, minBlock, maxBlock uint64) *allocator {
	minShift := uint(bits.TrailingZeros64(minBlock))
	maxShift := uint(bits.TrailingZeros64(maxBlock))
	nslabs := size >> maxShift
	bps := uint32(1) << (maxShift - minShift)
	a := &allocator{
		size:      size,
		minShift:  minShift,
		maxShift:  maxShift,
		bps:       bps,
		wps:       (bps + 63) / 64,
		classes:   make([]class, maxShift-minShift+1),
		slabs:     make([]slab, nslabs),
		stack:     make([]uint16, nslabs*uint64(bps)),
		req:       make([]uint32, nslabs*uint64(bps)),
		freeSlabs: make([]int32, nslabs),
		nfree:     int(nslabs),
	}
	a.bits = make([]uint64, nslabs*uint64(a.wps))
	for i := range a.classes {
		c := &a.classes[i]
		c.partial = noSlab
		c.shift = minShift + uint(i)
		c.per = uint32(1) << (maxShift - c.shift)
	}
	for i := range a.slabs {
		a.slabs[i].class.Store(noSlab)
		// Slab 0 on top, so a fresh pool fills from the start.
		a.freeSlabs[i] = int32(len(a.slabs) - 1 - i)
	}
	return a
}

// classOf returns the index of the smallest class that fits size, which is
// in 1..maxBlock.
func (a *allocator) classOf(size uint64) int {
	return bits.Len64((size - 1) >> a.minShift)
}

func (a *allocator) checkSize(size uint64) error {
	if size == 0 {
		return ErrInvalidSize
	}
	if size > 1<<a.maxShift {
		return fmt.Errorf("%w: %d bytes, largest block is %d", ErrTooLarge, size, uint64(1)<<a.maxShift)
	}
	return nil
}

// alloc returns the offset of a free block of at least size bytes.
func (a *allocator) alloc(size uint64) (uint64, error) {
	if err := a.checkSize(size); err != nil {
		return 0, err
	}
	ci := a.classOf(size)
	c := &a.classes[ci]
	c.mu.Lock()
	if c.partial == noSlab {
		s := a.takeSlab()
		if s == noSlab {
			c.mu.Unlock()
			return 0, ErrPoolExhausted
		}
		a.attach(c, ci, s)
	}
	off := a.pop(c, size)
	c.mu.Unlock()
	return off, nil
}

// allocN fills offs with len(offs) blocks of at least size bytes, or takes
// none.
func (a *allocator) allocN(size uint64, offs []uint64) error {
	if err := a.checkSize(size); err != nil {
		return err
	}
	if len(offs) == 0 {
		return nil
	}
	ci := a.classOf(size)
	c := &a.classes[ci]
	c.mu.Lock()
	n := uint64(len(offs))
	if held := uint64(c.slabs)*uint64(c.per) - c.live; n > held {
		need := (n - held + uint64(c.per) - 1) / uint64(c.per)
		a.slabMu.Lock()
		if nfree := uint64(a.nfree); need > nfree {
			a.slabMu.Unlock()
			c.mu.Unlock()
			return fmt.Errorf("%w: %d blocks of %d bytes asked, room for %d", ErrPoolExhausted,
				n, uint64(1)<<c.shift, held+nfree*uint64(c.per))
		}
		for range need {
			a.nfree--
			a.attach(c, ci, a.freeSlabs[a.nfree])
		}
		a.slabMu.Unlock()
	}
	for i := range offs {
		offs[i] = a.pop(c, size)
	}
	c.mu.Unlock()
	return nil
}

// takeSlab pops one free slab, or returns noSlab.
func (a *allocator) takeSlab() int32 {
	a.slabMu.Lock()
	defer a.slabMu.Unlock()
	if a.nfree == 0 {
		return noSlab
	}
	a.nfree--
	return a.freeSlabs[a.nfree]
}

// attach gives free slab s to class c (index ci), whose mu is held.
func (a *allocator) attach(c *class, ci int, s int32) {
	sl := &a.slabs[s]
	sl.live, sl.top, sl.bump = 0, 0, 0
	sl.class.Store(int32(ci))
	c.slabs++
	a.link(c, s)
}

// link pushes slab s onto c's partial list.
func (a *allocator) link(c *class, s int32) {
	sl := &a.slabs[s]
	sl.prev, sl.next, sl.listed = noSlab, c.partial, true
	if c.partial != noSlab {
		a.slabs[c.partial].prev = s
	}
	c.partial = s
}

// unlink removes slab s from c's partial list.
func (a *allocator) unlink(c *class, s int32) {
	sl := &a.slabs[s]
	if sl.prev != noSlab {
		a.slabs[sl.prev].next = sl.next
	} else {
		c.partial = sl.next
	}
	if sl.next != noSlab {
		a.slabs[sl.next].prev = sl.prev
	}
	sl.prev, sl.next, sl.listed = noSlab, noSlab, false
}

// pop takes a block from c's first partial slab, which must exist; c.mu is
// held.
func (a *allocator) pop(c *class, size uint64) uint64 {
	s := c.partial
	sl := &a.slabs[s]
	base := uint64(s) * uint64(a.bps)
	var b uint32
	if sl.top > 0 {
		sl.top--
		b = uint32(a.stack[base+uint64(sl.top)])
	} else {
		b = sl.bump
		sl.bump++
	}
	sl.live++
	if invariants.Enabled && (sl.live > c.per || sl.bump > c.per || sl.live != sl.bump-sl.top ||
		a.bits[uint64(s)*uint64(a.wps)+uint64(b/64)]&(1<<(b%64)) != 0) {
		panic(fmt.Sprintf("shm: allocator corrupt: slab %d block %d live %d bump %d top %d per %d",
			s, b, sl.live, sl.bump, sl.top, c.per))
	}
	if sl.live == c.per {
		a.unlink(c, s)
	}
	a.bits[uint64(s)*uint64(a.wps)+uint64(b/64)] |= 1 << (b % 64)
	a.req[base+uint64(b)] = uint32(size)
	c.live++
	c.requested += size
	return uint64(s)<<a.maxShift | uint64(b)<<c.shift
}

// locate finds the live block at off: its class (locked on success, the
// caller unlocks), slab and block index.
func (a *allocator) locate(off uint64) (c *class, s int32, b uint32, ok bool) {
	if off >= a.size {
		return nil, 0, 0, false
	}
	s = int32(off >> a.maxShift)
	sl := &a.slabs[s]
	ci := sl.class.Load()
	if ci == noSlab {
		return nil, 0, 0, false
	}
	c = &a.classes[ci]
	c.mu.Lock()
	// A slab holding a live block cannot change class, so a slab that
	// changed since the load above did not hold the block at off.
	if sl.class.Load() != ci {
		c.mu.Unlock()
		return nil, 0, 0, false
	}
	in := off & (1<<a.maxShift - 1)
	if in&(1<<c.shift-1) != 0 {
		c.mu.Unlock()
		return nil, 0, 0, false
	}
	b = uint32(in >> c.shift)
	if a.bits[uint64(s)*uint64(a.wps)+uint64(b/64)]&(1<<(b%64)) == 0 {
		c.mu.Unlock()
		return nil, 0, 0, false
	}
	return c, s, b, true
}

// free returns the block at off.
func (a *allocator) free(off uint64) error {
	c, s, b, ok := a.locate(off)
	if !ok {
		return fmt.Errorf("%w: offset %d", ErrBadFree, off)
	}
	sl := &a.slabs[s]
	base := uint64(s) * uint64(a.bps)
	if invariants.Enabled && (sl.live == 0 || c.live == 0 || sl.top >= sl.bump || sl.bump > c.per) {
		panic(fmt.Sprintf("shm: allocator corrupt: free in slab %d live %d top %d bump %d per %d class live %d",
			s, sl.live, sl.top, sl.bump, c.per, c.live))
	}
	a.bits[uint64(s)*uint64(a.wps)+uint64(b/64)] &^= 1 << (b % 64)
	c.live--
	c.requested -= uint64(a.req[base+uint64(b)])
	sl.live--
	if sl.live == 0 {
		// The slab's last block: hand the slab back for any class.
		if sl.listed {
			a.unlink(c, s)
		}
		// Pushed before c.mu is dropped, so a Stats snapshot never sees
		// the slab in neither place.
		sl.class.Store(noSlab)
		c.slabs--
		a.slabMu.Lock()
		a.freeSlabs[a.nfree] = s
		a.nfree++
		a.slabMu.Unlock()
		c.mu.Unlock()
		return nil
	}
	a.stack[base+uint64(sl.top)] = uint16(b)
	sl.top++
	if !sl.listed {
		a.link(c, s)
	}
	c.mu.Unlock()
	return nil
}

// blockSize returns the class size of the live block at off.
func (a *allocator) blockSize(off uint64) (uint64, bool) {
	c, _, _, ok := a.locate(off)
	if !ok {
		return 0, false
	}
	size := uint64(1) << c.shift
	c.mu.Unlock()
	return size, true
}

// ClassStats describes one size class.
type ClassStats struct {
	BlockSize  uint64 // bytes per block
	Live       uint64 // live blocks
	Slabs      uint64 // slabs held by the class
	FreeBlocks uint64 // unused blocks in the class's slabs
}

// PoolStats is a snapshot of the pool and its allocator.
type PoolStats struct {
	Size      uint64 // pool bytes
	Used      uint64 // bytes in live blocks (at their class size)
	Requested uint64 // bytes the live blocks were asked for
	Blocks    uint64 // live blocks
	FreeBytes uint64 // Size - Used: free slabs plus free blocks in held slabs
	Slabs     uint64 // slabs in the pool
	FreeSlabs uint64 // slabs held by no class
	// Fragmentation is the fraction (0..1) of the bytes in slabs held by
	// classes that carries no requested data: the internal waste of live
	// blocks (class size minus requested size) plus the free blocks of held
	// slabs, over the held slabs' bytes. Zero when no slab is held.
	Fragmentation float64
	Hugepages     bool // the pool is backed by hugepages
	// THPBytes are the pool's bytes placed on transparent huge pages when
	// it was made (PoolConfig.Hugepages "auto" without hugepages); 0 for a
	// pool adopted from an earlier daemon, whose pages are not looked at.
	THPBytes uint64
	Classes  []ClassStats // one per size class, smallest first
}

// stats takes a consistent snapshot: every class mutex in order, then slabMu.
func (a *allocator) stats() PoolStats {
	st := PoolStats{
		Size:    a.size,
		Slabs:   uint64(len(a.slabs)),
		Classes: make([]ClassStats, len(a.classes)),
	}
	for i := range a.classes {
		a.classes[i].mu.Lock()
	}
	a.slabMu.Lock()
	st.FreeSlabs = uint64(a.nfree)
	a.slabMu.Unlock()
	var held uint64
	for i := range a.classes {
		c := &a.classes[i]
		cs := ClassStats{
			BlockSize:  1 << c.shift,
			Live:       c.live,
			Slabs:      uint64(c.slabs),
			FreeBlocks: uint64(c.slabs)*uint64(c.per) - c.live,
		}
		st.Classes[i] = cs
		st.Blocks += c.live
		st.Used += c.live << c.shift
		st.Requested += c.requested
		held += uint64(c.slabs) << a.maxShift
		c.mu.Unlock()
	}
	st.FreeBytes = st.Size - st.Used
	if held > 0 {
		st.Fragmentation = float64(held-st.Requested) / float64(held)
	}
	return st
}
