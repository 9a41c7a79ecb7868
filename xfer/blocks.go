package xfer

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
)

// Blocks are the blocks of a pool one holder owns (a client's session: the
// blocks it allocated), and the transfers in flight in each. Through a
// PoolView it is the RangeHolder of the holder's requests on the pool: the
// engine holds a request's range for as long as a transport may touch it,
// which is past a task's Timeout until the transport's Done. So:
//   - the holder frees a block only when Busy says no transfer holds it
//     (a client's FreeBlocks answers BUSY otherwise), instead of handing
//     memory still being written to another client;
//   - a holder that goes away while holds remain (Abandon) leaves those
//     blocks allocated, and the last drop of each frees it.
//
// The holding lives here, beside the engine that calls it, so that a
// request's hold and drop run no code of the holder's package.
//
// The zero value is empty and ready; a Blocks must not be copied.
type Blocks struct {
	// mu guards offs and sizes (sorted by offset). Only the owner changes
	// them (Add, Remove, Reset, under mu) and it reads them without the
	// lock (Len, Block, Find); others read them under mu shared (Covers,
	// CoversRange, HoldRange), such as a queue's worker checking a request.
	mu    sync.RWMutex
	offs  []uint64
	sizes []uint64

	// hmu guards the fields below; DropRange runs on transports'
	// goroutines. Lock order: mu (shared), then hmu.
	hmu    sync.Mutex
	holds  []blockHold // sorted by off: blocks with transfers in flight
	closed bool        // abandoned: no new holds; free blocks at their last drop
	pool   Freer       // where Abandon's blocks are freed
	log    *slog.Logger
}

// Freer frees a pool block by its offset (a pool: *shm.Pool).
type Freer interface {
	Free(off uint64) error
}

// blockHold counts the transfers in flight in one block.
type blockHold struct {
	off, size uint64
	n         int32
	// freeAtDrop: the holder is gone and the block is to be freed when its
	// last hold drops.
	freeAtDrop bool
}

// Len is how many blocks are held (the owner's goroutine).
func (s *Blocks) Len() int { return len(s.offs) }

// Block is the i-th block by offset, 0 <= i < Len (the owner's
// goroutine).
func (s *Blocks) Block(i int) (off, size uint64) { return s.offs[i], s.sizes[i] }

// Find is the size of the block that starts at off, and whether there is
// one (the owner's goroutine).
func (s *Blocks) Find(off uint64) (size uint64, ok bool) {
	i, ok := slices.BinarySearch(s.offs, off)
	if !ok {
		return 0, false
	}
	return s.sizes[i], true
}

// Add records the block [off, off+size).
func (s *Blocks) Add(off, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearch(s.offs, off)
	s.offs = slices.Insert(s.offs, i, off)
	s.sizes = slices.Insert(s.sizes, i, size)
}

// Remove forgets the block at off; false when there is none.
func (s *Blocks) Remove(off uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearch(s.offs, off)
	if !ok {
		return false
	}
	s.offs = slices.Delete(s.offs, i, i+1)
	s.sizes = slices.Delete(s.sizes, i, i+1)
	return true
}

// Reset forgets every block.
func (s *Blocks) Reset() {
	s.mu.Lock()
	s.offs, s.sizes = nil, nil
	s.mu.Unlock()
}

// Covers reports whether [off, off+n) lies inside one held block.
func (s *Blocks) Covers(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, found := slices.BinarySearch(s.offs, off)
	if !found {
		if i == 0 {
			return false
		}
		i--
	}
	end := off + n
	if end < off {
		return false
	}
	return end <= s.offs[i]+s.sizes[i]
}

// CoversRange reports whether [off, off+n) lies inside held blocks that
// follow each other without a gap.
func (s *Blocks) CoversRange(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.coversRangeLocked(off, n)
}

// coversRangeLocked is CoversRange with s.mu held (shared or not).
func (s *Blocks) coversRangeLocked(off, n uint64) bool {
	end := off + n
	if end < off {
		return false
	}
	i, found := slices.BinarySearch(s.offs, off)
	if !found {
		if i == 0 {
			return false
		}
		i--
	}
	pos := off
	for ; i < len(s.offs); i++ {
		if s.offs[i] > pos {
			return false
		}
		if e := s.offs[i] + s.sizes[i]; e > pos {
			pos = e
		}
		if pos >= end {
			return true
		}
	}
	return false
}

// HoldRange implements RangeHolder: every block [off, off+n) touches gets
// one more hold. It refuses a range not inside the held blocks (the holder
// checks it before submit too) and any hold after Abandon.
func (s *Blocks) HoldRange(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.coversRangeLocked(off, n) {
		return false
	}
	end := off + n
	s.hmu.Lock()
	defer s.hmu.Unlock()
	if s.closed {
		return false
	}
	i, found := slices.BinarySearch(s.offs, off)
	if !found {
		i--
	}
	for ; i < len(s.offs) && s.offs[i] < end; i++ {
		b := s.offs[i]
		j, ok := s.holdIndex(b)
		if !ok {
			s.holds = slices.Insert(s.holds, j, blockHold{off: b, size: s.sizes[i]})
		}
		s.holds[j].n++
	}
	return true
}

// DropRange implements RangeHolder: the blocks [off, off+n) touches lose
// one hold each; a block of an abandoned holder is freed when its last
// hold drops.
func (s *Blocks) DropRange(off, n uint64) {
	end := off + n
	var free []uint64
	s.hmu.Lock()
	i, _ := s.holdIndex(off)
	if i == len(s.holds) || s.holds[i].off > off {
		i--
	}
	for i >= 0 && i < len(s.holds) && s.holds[i].off < end {
		if s.holds[i].n--; s.holds[i].n > 0 {
			i++
			continue
		}
		if s.holds[i].freeAtDrop {
			free = append(free, s.holds[i].off)
		}
		s.holds = slices.Delete(s.holds, i, i+1)
	}
	pool, log := s.pool, s.log
	s.hmu.Unlock()
	for _, b := range free {
		if err := pool.Free(b); err != nil {
			log.Warn("freeing a pool block of a closed connection after its last transfer failed", "offset", b, "err", err)
		}
	}
}

// Busy reports whether transfers are still moving bytes in the block at
// off.
func (s *Blocks) Busy(off uint64) bool {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	_, ok := s.holdIndex(off)
	return ok
}

// Abandon is the holder going away: no new holds. It returns the blocks
// that still have holds, which the caller must not free now; those for
// which freeLater says true are freed in pool by their last DropRange (a
// failure logged to log). The caller frees the others, then calls Reset.
func (s *Blocks) Abandon(freeLater func(off, size uint64) bool, pool Freer, log *slog.Logger) map[uint64]bool {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.closed, s.pool, s.log = true, pool, log
	held := make(map[uint64]bool, len(s.holds))
	for i := range s.holds {
		h := &s.holds[i]
		held[h.off] = true
		h.freeAtDrop = freeLater(h.off, h.size)
	}
	return held
}

// holdIndex finds the hold of the block at off in s.holds (s.hmu held):
// its index and true, or where it would go and false.
func (s *Blocks) holdIndex(off uint64) (int, bool) {
	return slices.BinarySearchFunc(s.holds, off, func(h blockHold, o uint64) int { return cmp.Compare(h.off, o) })
}

// PoolView is one holder's view of a pool: the pool segment itself (its
// id, memory, references and registrations) with the holder's Blocks as
// its RangeHolder. A request on it holds its range in the holder's blocks;
// every other call is the pool's.
type PoolView struct {
	MemSegment
	*Blocks
}

var (
	_ MemSegment  = (*PoolView)(nil)
	_ RangeHolder = (*PoolView)(nil)
	_ Registered  = (*PoolView)(nil)
)

// Regs implements Registered: the pool's registrations (its io_uring fixed
// buffers), which the view's requests use, since it shares the pool's
// memory. Nil when the pool carries none.
func (v *PoolView) Regs() *Regs { return RegsOf(v.MemSegment) }
