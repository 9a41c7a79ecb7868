package rdma

import "github.com/tensorcast/tensorcast/xfer"

// RemoveLocal forgets segment id as the local side of requests; later
// requests naming it fail with ErrNotRegistered. Call it before the region
// it was added with is deregistered.
func (t *Transport) RemoveLocal(id xfer.SegmentID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.locals.Load()
	m := make(map[xfer.SegmentID]*keyTable, len(old))
	for k, v := range old {
		if k != id {
			m[k] = v
		}
	}
	t.locals.Store(&m)
}
