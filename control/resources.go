package control

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"sync"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/wire"
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

// idemEntry is the first answer to a mutating call with an idempotency key.
type idemEntry struct {
	hash  uint64
	frame []byte
}

// idemTable remembers answers by idempotency key, evicting the oldest.
type idemTable struct {
	m     map[string]idemEntry
	order []string
}

func (t *idemTable) get(key []byte) (idemEntry, bool) {
	e, ok := t.m[string(key)]
	return e, ok
}

func (t *idemTable) put(key []byte, e idemEntry, limit int) {
	if t.m == nil {
		t.m = make(map[string]idemEntry)
	}
	k := string(key)
	if _, ok := t.m[k]; !ok {
		t.order = append(t.order, k)
	}
	t.m[k] = e
	for len(t.order) > limit {
		delete(t.m, t.order[0])
		t.order = t.order[1:]
	}
}

// argsHash hashes what makes a mutating call: its kind, lane and
// arguments (the body's bytes as wire encodes them, equal for equal
// arguments). It builds in b.
func argsHash(b *flatbuffers.Builder, m *wire.Request) uint64 {
	h := fnv.New64a()
	h.Write(binary.LittleEndian.AppendUint64([]byte{byte(m.Kind())}, uint64(len(m.Ctx.Lane))))
	h.Write(m.Ctx.Lane)
	h.Write(wire.EncodeBody(b, m))
	return h.Sum64()
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
