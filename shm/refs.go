package shm

import "sync/atomic"

// closingBit marks a refs state as closing; the low bits count references.
const closingBit = uint64(1) << 63

// refs counts the references that keep a mapping alive and decides, exactly
// once, who tears it down: Close when no reference is held, otherwise the
// Release that drops the last one.
type refs struct {
	// state is closingBit | count, read and written only with sync/atomic.
	state atomic.Uint64
}

// acquire takes a reference unless the owner is closing.
func (r *refs) acquire() bool {
	for {
		s := r.state.Load()
		if s&closingBit != 0 {
			return false
		}
		if r.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// release drops a reference and reports whether the caller must tear down
// (the owner is closing and this was the last reference). An unmatched
// release is a caller bug, as with sync.WaitGroup, and panics.
func (r *refs) release() (teardown bool) {
	s := r.state.Add(^uint64(0))
	if s&^closingBit == ^closingBit {
		panic("shm: Release without a matching Acquire")
	}
	return s == closingBit
}

// close marks the owner closing. first reports whether this call did it;
// teardown whether the caller must tear down now (no reference held).
func (r *refs) close() (first, teardown bool) {
	old := r.state.Or(closingBit)
	if old&closingBit != 0 {
		return false, false
	}
	return true, old == 0
}

// closing reports whether close was called.
func (r *refs) closing() bool { return r.state.Load()&closingBit != 0 }
