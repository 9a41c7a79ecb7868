package session

import (
	"slices"
	"sync"
)

// blockSet is the pool blocks one connection holds: sorted start offsets
// and their sizes, so a request's range can be checked against them.
//
// Only the connection's serving goroutine changes it (add, remove, reset,
// under mu) and it reads it without the lock; the connection's queue
// workers check requests against it concurrently (covers, coversRange and
// the pool view's holds, under mu shared).
type blockSet struct {
	mu    sync.RWMutex
	offs  []uint64
	sizes []uint64
}

func (s *blockSet) len() int { return len(s.offs) }

func (s *blockSet) add(off, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearch(s.offs, off)
	s.offs = slices.Insert(s.offs, i, off)
	s.sizes = slices.Insert(s.sizes, i, size)
}

func (s *blockSet) remove(off uint64) bool {
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

// reset forgets every block.
func (s *blockSet) reset() {
	s.mu.Lock()
	s.offs, s.sizes = nil, nil
	s.mu.Unlock()
}

// covers reports whether [off, off+n) lies inside one held block.
func (s *blockSet) covers(off, n uint64) bool {
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

// coversRange reports whether [off, off+n) lies inside held blocks that
// follow each other without a gap.
func (s *blockSet) coversRange(off, n uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.coversRangeLocked(off, n)
}

// coversRangeLocked is coversRange with s.mu held (shared or not).
func (s *blockSet) coversRangeLocked(off, n uint64) bool {
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
