package xfer

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// Blocks are the blocks of a pool one holder owns (a client's session: the
// blocks it allocated), and the transfers in flight in each. Through a
// PoolView it is the RangeHolder of the holder's requests on the pool: the
// engine holds a request's range for as long as a transport may touch it,
// which is past a task's Timeout until the transport's Done. So:
//   - the holder frees a block only when no transfer holds it (TakeIdle,
//     which takes it out of the list in the same step: a client's
//     FreeBlocks answers BUSY otherwise), instead of handing memory still
//     being written to another client;
//   - a holder that goes away while holds remain (Abandon) leaves those
//     blocks allocated, and the last drop of each frees it.
//
// The holding lives here, beside the engine that calls it, so that a
// request's hold and drop run no code of the holder's package. Each block
// carries its own count of holds, beside its offset and size: a hold or a
// drop finds the block by one search and counts with one atomic add, under
// the list's lock shared; only the owner's changes to the list take it
// exclusively.
//
// The zero value is empty and ready; a Blocks must not be copied.
type Blocks struct {
	// mu guards the list: offs, sizes and holds, parallel and sorted by
	// offset, and closed, pool and log. Only the owner changes them (Add,
	// Remove, TakeIdle, Reset, Abandon, under mu) and it reads offs and
	// sizes without the lock (Len, Block, Find); others read the list
	// under mu shared (Covers, CoversRange, HoldRange, DropRange, Busy),
	// such as a queue's worker checking a request or a transport's Done.
	mu     sync.RWMutex
	offs   []uint64
	sizes  []uint64
	holds  []blockHold
	closed bool         // abandoned: no new holds; free blocks at their last drop
	pool   Freer        // where Abandon's blocks are freed
	log    *slog.Logger // where a failure to free one is said
}

// Freer frees a pool block by its offset (a pool: *shm.Pool).
type Freer interface {
	Free(off uint64) error
}

// blockHold is what a block's transfers in flight hold of it.
type blockHold struct {
	n int32 // transfers in flight in the block (atomic: adds under mu shared)
	// freeAtDrop: the holder is gone and the block is to be freed when its
	// last hold drops (set by Abandon, under mu).
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
	s.holds = slices.Insert(s.holds, i, blockHold{})
}

// Remove forgets the block at off; false when there is none. Its holds go
// with it: the holder removes a block no transfer holds (TakeIdle checks
// and removes at once).
func (s *Blocks) Remove(off uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearch(s.offs, off)
	if !ok {
		return false
	}
	s.removeLocked(i)
	return true
}

// TakeIdle forgets the block at off unless a transfer holds it, in one
// step: no hold can be taken on it after (a request racing the holder's
// free finds the block gone and is refused). It returns the block's size
// and whether it was taken; busy says it is held, and stays.
func (s *Blocks) TakeIdle(off uint64) (size uint64, taken, busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearch(s.offs, off)
	if !ok {
		return 0, false, false
	}
	if atomic.LoadInt32(&s.holds[i].n) > 0 {
		return s.sizes[i], false, true
	}
	size = s.sizes[i]
	s.removeLocked(i)
	return size, true, false
}

// removeLocked takes block i out of the list (s.mu held).
func (s *Blocks) removeLocked(i int) {
	s.offs = slices.Delete(s.offs, i, i+1)
	s.sizes = slices.Delete(s.sizes, i, i+1)
	s.holds = slices.Delete(s.holds, i, i+1)
}

// Reset forgets every block, but for those transfers still hold: they stay
// in the list until the Blocks is dropped, so that their last DropRange
// finds them (and, after Abandon, frees them).
func (s *Blocks) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for i := range s.offs {
		if atomic.LoadInt32(&s.holds[i].n) > 0 {
			s.offs[k], s.sizes[k], s.holds[k] = s.offs[i], s.sizes[i], s.holds[i]
			k++
		}
	}
	if k == 0 {
		s.offs, s.sizes, s.holds = nil, nil, nil
		return
	}
	s.offs, s.sizes, s.holds = s.offs[:k], s.sizes[:k], s.holds[:k]
}

// Covers reports whether [off, off+n) lies inside one held block.
func (s *Blocks) Covers(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.blockAt(off)
	if !ok {
		return false
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
	_, ok := s.coversRangeLocked(off, n)
	return ok
}

// blockAt is the index of the block that starts at or before off, the
// only one that can hold off (s.mu held, shared or not); false when off is
// before every block.
func (s *Blocks) blockAt(off uint64) (int, bool) {
	i, found := slices.BinarySearch(s.offs, off)
	if !found {
		if i == 0 {
			return 0, false
		}
		i--
	}
	return i, true
}

// coversRangeLocked reports whether [off, off+n) lies inside blocks that
// follow each other without a gap, and the index of the first (s.mu held,
// shared or not).
func (s *Blocks) coversRangeLocked(off, n uint64) (int, bool) {
	end := off + n
	if end < off {
		return 0, false
	}
	first, ok := s.blockAt(off)
	if !ok {
		return 0, false
	}
	pos := off
	for i := first; i < len(s.offs); i++ {
		if s.offs[i] > pos {
			return 0, false
		}
		if e := s.offs[i] + s.sizes[i]; e > pos {
			pos = e
		}
		if pos >= end {
			return first, true
		}
	}
	return 0, false
}

// HoldRange implements RangeHolder: every block [off, off+n) touches gets
// one more hold. It refuses a range not inside the held blocks (the holder
// checks it before submit too) and any hold after Abandon.
func (s *Blocks) HoldRange(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	i, ok := s.coversRangeLocked(off, n)
	if !ok {
		return false
	}
	for end := off + n; i < len(s.offs) && s.offs[i] < end; i++ {
		atomic.AddInt32(&s.holds[i].n, 1)
	}
	return true
}

// DropRange implements RangeHolder: the blocks [off, off+n) touches lose
// one hold each; a block of an abandoned holder is freed when its last
// hold drops.
func (s *Blocks) DropRange(off, n uint64) {
	var free []uint64
	s.mu.RLock()
	if i, ok := s.blockAt(off); ok {
		if s.offs[i]+s.sizes[i] <= off {
			i++ // ends before off: not one the hold counted (Remove took that one)
		}
		for end := off + n; i < len(s.offs) && s.offs[i] < end; i++ {
			v := atomic.AddInt32(&s.holds[i].n, -1)
			if invariants.Enabled && v < 0 {
				panic("xfer: invariant: a block's holds below zero")
			}
			if v == 0 && s.holds[i].freeAtDrop {
				free = append(free, s.offs[i])
			}
		}
	}
	pool, log := s.pool, s.log
	s.mu.RUnlock()
	for _, b := range free {
		if err := pool.Free(b); err != nil {
			log.Warn("freeing a pool block of a closed connection after its last transfer failed", "offset", b, "err", err)
		}
	}
}

// Busy reports whether transfers are still moving bytes in the block at
// off.
func (s *Blocks) Busy(off uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := slices.BinarySearch(s.offs, off)
	return ok && atomic.LoadInt32(&s.holds[i].n) > 0
}

// Abandon is the holder going away: no new holds. It returns the blocks
// that still have holds, which the caller must not free now; those for
// which freeLater says true are freed in pool by their last DropRange (a
// failure logged to log). The caller frees the others, then calls Reset.
func (s *Blocks) Abandon(freeLater func(off, size uint64) bool, pool Freer, log *slog.Logger) map[uint64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed, s.pool, s.log = true, pool, log
	held := make(map[uint64]bool)
	for i := range s.offs {
		// No drop runs meanwhile (s.mu): a count read here is the
		// block's until Abandon returns.
		if atomic.LoadInt32(&s.holds[i].n) > 0 {
			held[s.offs[i]] = true
			s.holds[i].freeAtDrop = freeLater(s.offs[i], s.sizes[i])
		}
	}
	return held
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
