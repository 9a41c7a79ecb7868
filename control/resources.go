package control

import (
	"hash/fnv"
	"slices"
)

// blockSet is the pool blocks one connection holds: sorted start offsets
// and their sizes, so a request's range can be checked against them.
type blockSet struct {
	offs  []uint64
	sizes []uint64
}

func (s *blockSet) len() int { return len(s.offs) }

func (s *blockSet) add(off, size uint64) {
	i, _ := slices.BinarySearch(s.offs, off)
	s.offs = slices.Insert(s.offs, i, off)
	s.sizes = slices.Insert(s.sizes, i, size)
}

func (s *blockSet) remove(off uint64) bool {
	i, ok := slices.BinarySearch(s.offs, off)
	if !ok {
		return false
	}
	s.offs = slices.Delete(s.offs, i, i+1)
	s.sizes = slices.Delete(s.sizes, i, i+1)
	return true
}

// covers reports whether [off, off+n) lies inside one held block.
func (s *blockSet) covers(off, n uint64) bool {
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

// argsHash hashes what makes a mutating call: its kind, lane and arguments.
func argsHash(m *Request) uint64 {
	h := fnv.New64a()
	var b [8]byte
	u64 := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	u64(uint64(m.Kind))
	u64(uint64(len(m.Ctx.Lane)))
	h.Write(m.Ctx.Lane)
	u64(m.Size)
	u64(m.Segment)
	u64(uint64(m.N))
	u64(uint64(m.Capacity))
	u64(m.Batch)
	u64(uint64(m.TimeoutMS))
	u64(uint64(len(m.Name)))
	h.Write(m.Name)
	if m.Direct {
		u64(1)
	}
	u64(uint64(len(m.Offsets)))
	for _, o := range m.Offsets {
		u64(o)
	}
	u64(m.Offset)
	u64(m.Length)
	u64(uint64(m.Rights))
	u64(uint64(len(m.Notify)))
	for _, p := range m.Notify {
		u64(uint64(len(p)))
		h.Write(p)
	}
	u64(uint64(len(m.Requests)))
	for i := range m.Requests {
		r := &m.Requests[i]
		u64(uint64(r.Op))
		u64(uint64(r.Local))
		u64(r.LocalOffset)
		u64(uint64(r.Target))
		u64(r.TargetOffset)
		u64(r.Length)
	}
	return h.Sum64()
}

// coversRange reports whether [off, off+n) lies inside held blocks that
// follow each other without a gap.
func (s *blockSet) coversRange(off, n uint64) bool {
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
