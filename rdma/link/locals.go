package link

import (
	"maps"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/xfer"
)

// Client buffers as the local side of RDMA requests. The first request
// from a client's buffer to a peer goes over tcp and has the registration
// queue (regs.go) register the buffer (local access only: peers reach
// it only through an export's own registration); a request of a segment
// opened with transport rdma waits in that queue instead. Later requests
// from it move by RDMA. The registration lives in the buffer's RDMA slot
// (xfer.SlotRDMA) as long as the buffer's mapping: the buffer's teardown
// (its last reference dropped after it was unregistered, so no work
// request uses it any more) releases it, which removes it from the links
// and deregisters it before the memory is unmapped.

// maxLocalRegs bounds the client buffers registered at once; past it a
// buffer's requests use tcp (logged).
const maxLocalRegs = 4096

// localRegs are the client buffers' registrations the links made, for
// Close and the counters; the hot path reads each from its buffer's slot.
type localRegs struct {
	// mu guards m.
	mu sync.Mutex
	m  map[*localReg]struct{}
}

// localReg is a client buffer's registration, in the buffer's RDMA slot.
type localReg struct {
	p    *Links
	id   xfer.SegmentID
	regs *xfer.Regs // the buffer's slots
	reg  *rdma.Region
}

var _ xfer.Registration = (*localReg)(nil)

// Release implements xfer.Registration: the buffer's teardown.
func (r *localReg) Release() { r.p.dropLocal(r) }

// clientBuffer is seg as a client buffer that can carry an RDMA
// registration, or nil.
func clientBuffer(seg xfer.Segment) (xfer.MemSegment, *xfer.Regs) {
	b, ok := seg.(xfer.MemSegment)
	if !ok || seg.Kind() != xfer.KindClient {
		return nil, nil
	}
	regs := xfer.RegsOf(seg)
	if regs == nil {
		return nil, nil
	}
	return b, regs
}

// localRegion is the registration requests from local segment seg use: the
// pool's (a tenant's), a client buffer's, or nil. It does not lock or
// allocate.
func (p *Links) localRegion(seg xfer.Segment) *rdma.Region {
	if r := p.pools[seg.ID()]; r != nil {
		return r
	}
	if regs := xfer.RegsOf(seg); regs != nil {
		if r, ok := regs.Load(xfer.SlotRDMA).(*localReg); ok && r.p == p {
			return r.reg
		}
	}
	return nil
}

// wantLocal queues seg for registration when it is a client buffer. It
// never blocks: a full queue is tried again by a later request.
func (p *Links) wantLocal(seg xfer.Segment) {
	if b, _ := clientBuffer(seg); b == nil {
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
	if p.localRegion(seg) != nil {
		return true
	}
	b, regs := clientBuffer(seg)
	if b == nil || !b.Acquire() {
		return false // not a client buffer, or unregistered meanwhile
	}
	defer b.Release()
	e := &p.locals
	e.mu.Lock()
	n := len(e.m)
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
	r := &localReg{p: p, id: id, regs: regs, reg: reg}
	e.mu.Lock()
	if e.m == nil {
		e.m = map[*localReg]struct{}{}
	}
	e.m[r] = struct{}{}
	e.mu.Unlock()
	// Set while the reference above is held: the teardown cannot have
	// run yet.
	if !regs.Set(xfer.SlotRDMA, r) {
		p.log.Warn("client buffer cannot use rdma: its rdma slot is taken", "segment", id)
		p.dropLocal(r)
		return false
	}
	p.log.Info("client buffer registered for rdma", "segment", id, "bytes", b.Size(),
		"took", time.Since(start).Round(time.Microsecond).String())
	return true
}

// dropLocal is a client buffer's teardown: its registration leaves every
// link and is released. Links that closed released it already.
func (p *Links) dropLocal(r *localReg) {
	e := &p.locals
	e.mu.Lock()
	_, ok := e.m[r]
	delete(e.m, r)
	e.mu.Unlock()
	if !ok {
		return
	}
	for _, l := range *p.links.Load() {
		l.forgetLocal(r.id)
	}
	if err := p.dev.Deregister(r.reg); err != nil {
		p.log.Error("deregistering a client buffer", "segment", r.id, "err", err)
		return
	}
	p.log.Debug("client buffer's rdma registration released", "segment", r.id)
}

// closeAll takes every client buffer's registration back from its buffer
// and releases it (the links are closing; their transports are closed
// already).
func (e *localRegs) closeAll(p *Links) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for r := range e.m {
		// A buffer tearing down meanwhile finds r gone from m.
		r.regs.Drop(xfer.SlotRDMA, r)
		if err := p.dev.Deregister(r.reg); err != nil {
			p.log.Warn("deregistering a client buffer", "segment", r.id, "err", err)
		}
	}
	clear(e.m)
}

// registered is how many client buffers are registered.
func (e *localRegs) registered() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.m)
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
