package link

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/xfer"
)

// Client buffers as the local side of RDMA requests. The first request
// from a client's buffer to a peer goes over tcp and has the registration
// queue (regs.go) register the buffer (local access only: peers reach
// it only through an export's own registration); a request of a segment
// opened with transport rdma waits in that queue instead. Later requests
// from it move by RDMA. The registration lives as long as the buffer's
// mapping: the buffer's teardown (its last reference dropped after it was
// unregistered, so no work request uses it any more) removes it from the
// links and releases it before the memory is unmapped.

// teardownHooker is a client buffer that runs a hook before it unmaps
// (shm.Buffer).
type teardownHooker interface {
	xfer.MemSegment
	SetTeardownHook(func())
}

// maxLocalRegs bounds the client buffers registered at once; past it a
// buffer's requests use tcp (logged).
const maxLocalRegs = 4096

// localRegs are the client buffers' registrations by segment id.
type localRegs struct {
	// m is read without a lock on the hot path; written under mu.
	m  atomic.Pointer[map[xfer.SegmentID]*rdma.Region]
	mu sync.Mutex
}

// localRegion is the registration requests from local segment id use: the
// pool's (a tenant's), a client buffer's, or nil.
func (p *Links) localRegion(id xfer.SegmentID) *rdma.Region {
	if r := p.pools[id]; r != nil {
		return r
	}
	if m := p.locals.m.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

// wantLocal queues seg for registration when it is a client buffer. It
// never blocks: a full queue is tried again by a later request.
func (p *Links) wantLocal(seg xfer.Segment) {
	if _, ok := seg.(teardownHooker); !ok {
		return
	}
	p.regs.want(seg)
}

// registerLocal registers a client buffer for local use and reports
// whether it is registered. Only the registration queue's goroutine calls
// it, so no two registrations of one buffer race; locals.mu is not held
// while the device registers (that takes seconds for a large buffer, and
// a buffer's teardown takes the lock).
func (p *Links) registerLocal(seg xfer.Segment) bool {
	id := seg.ID()
	if p.localRegion(id) != nil {
		return true
	}
	b, ok := seg.(teardownHooker)
	if !ok || !b.Acquire() {
		return false // not a client buffer, or unregistered meanwhile
	}
	defer b.Release()
	e := &p.locals
	e.mu.Lock()
	n := 0
	if m := e.m.Load(); m != nil {
		n = len(*m)
	}
	e.mu.Unlock()
	if n >= maxLocalRegs {
		p.log.Warn("client buffer cannot use rdma: too many buffers registered", "segment", id, "max", maxLocalRegs)
		return false
	}
	start := time.Now()
	reg, err := p.dev.RegisterAccess(b.Bytes(), rdma.AccessLocal)
	if err != nil {
		p.log.Warn("client buffer cannot use rdma: registering it failed", "segment", id, "bytes", b.Size(), "err", err)
		return false
	}
	e.mu.Lock()
	old := map[xfer.SegmentID]*rdma.Region{}
	if m := e.m.Load(); m != nil {
		old = *m
	}
	m := maps.Clone(old)
	m[id] = reg
	e.m.Store(&m)
	e.mu.Unlock()
	// Set while the reference above is held: the teardown cannot have
	// run yet.
	b.SetTeardownHook(func() { p.dropLocal(id) })
	p.log.Info("client buffer registered for rdma", "segment", id, "bytes", b.Size(),
		"took", time.Since(start).Round(time.Microsecond).String())
	return true
}

// dropLocal is a client buffer's teardown: its registration leaves every
// link and is released. A plane that closed released it already.
func (p *Links) dropLocal(id xfer.SegmentID) {
	e := &p.locals
	e.mu.Lock()
	var reg *rdma.Region
	if m := e.m.Load(); m != nil {
		if reg = (*m)[id]; reg != nil {
			nm := maps.Clone(*m)
			delete(nm, id)
			e.m.Store(&nm)
		}
	}
	e.mu.Unlock()
	if reg == nil {
		return
	}
	for _, l := range *p.links.Load() {
		l.forgetLocal(id)
	}
	if err := p.dev.Deregister(reg); err != nil {
		p.log.Error("deregistering a client buffer", "segment", id, "err", err)
		return
	}
	p.log.Debug("client buffer's rdma registration released", "segment", id)
}

// closeAll releases every client buffer's registration (the plane is
// closing; its transports are closed already).
func (e *localRegs) closeAll(p *Links) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.m.Load()
	if m == nil {
		return
	}
	for id, reg := range *m {
		if err := p.dev.Deregister(reg); err != nil {
			p.log.Warn("deregistering a client buffer", "segment", id, "err", err)
		}
	}
	e.m.Store(&map[xfer.SegmentID]*rdma.Region{})
}

// forgetLocal drops local segment id from the link's tables.
func (l *rdmaLink) forgetLocal(id xfer.SegmentID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := *l.ids.Load()
	if _, ok := ids[id]; !ok {
		return
	}
	m := maps.Clone(ids)
	delete(m, id)
	l.ids.Store(&m)
	l.tr.RemoveLocal(id)
}
