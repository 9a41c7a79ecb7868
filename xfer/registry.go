package xfer

import (
	"sync"
	"sync/atomic"
)

// Resolver maps a request's segment ids to segments. The engine calls it
// twice per request on the submit path, so it must be safe for concurrent
// use and must not allocate.
type Resolver interface {
	Resolve(id SegmentID) (Segment, bool)
}

// Registry is a concurrent id → Segment map. Lookups read an immutable
// snapshot without a lock; Add and Remove copy it (segments are registered
// rarely, looked up on every request).
type Registry struct {
	// mu serializes writers (Add, Remove); readers never take it.
	mu sync.Mutex
	// m is the current snapshot; a published map is never modified.
	m atomic.Pointer[map[SegmentID]Segment]
	// next is the last id NextID handed out or Add saw, whichever is larger.
	next atomic.Uint64
}

var _ Resolver = (*Registry)(nil)

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	m := map[SegmentID]Segment{}
	r.m.Store(&m)
	return r
}

// Add registers s under s.ID(). The id must be non-zero (ErrInvalid) and
// not registered yet (ErrExists). A nil s is ErrInvalid.
func (r *Registry) Add(s Segment) error {
	if s == nil || s.ID() == 0 {
		return ErrInvalid
	}
	id := s.ID()
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.m.Load()
	if _, ok := old[id]; ok {
		return ErrExists
	}
	m := make(map[SegmentID]Segment, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[id] = s
	r.m.Store(&m)
	// Keep NextID from ever handing out an id that was added by hand.
	for {
		cur := r.next.Load()
		if uint64(id) <= cur || r.next.CompareAndSwap(cur, uint64(id)) {
			break
		}
	}
	return nil
}

// Remove unregisters id and returns the segment it named. The caller still
// owns the segment (and closes it); tasks already holding a reference keep
// it alive until they end.
func (r *Registry) Remove(id SegmentID) (Segment, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.m.Load()
	s, ok := old[id]
	if !ok {
		return nil, false
	}
	m := make(map[SegmentID]Segment, len(old))
	for k, v := range old {
		if k != id {
			m[k] = v
		}
	}
	r.m.Store(&m)
	return s, true
}

// Resolve returns the segment registered under id. It takes no lock and
// does not allocate.
func (r *Registry) Resolve(id SegmentID) (Segment, bool) {
	s, ok := (*r.m.Load())[id]
	return s, ok
}

// NextID allocates a fresh segment id: non-zero, monotonic, never reused
// and never one that Add has seen.
func (r *Registry) NextID() SegmentID {
	return SegmentID(r.next.Add(1))
}

// Len is the number of registered segments.
func (r *Registry) Len() int { return len(*r.m.Load()) }
