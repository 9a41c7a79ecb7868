package link

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/xfer"
)

// Local registrations: the pools' (made once at start-up) and client
// buffers' (local access only: peers reach a buffer only through an
// export's own registration). Each lives in its segment's RDMA slot
// (xfer.SlotRDMA) as rdma.Keys the links own, where the router and the
// rdma transport read it with one atomic load and no table.
//
// The first request from a client's buffer to a peer goes over tcp and
// has the registration queue (regs.go) register the buffer; a request of
// a segment opened with transport rdma waits in that queue instead. Later
// requests from it move by RDMA. The registration lasts as long as the
// buffer's mapping: the buffer's teardown (its last reference dropped
// after it was unregistered, so no work request uses it any more)
// releases it, which deregisters it before the memory is unmapped. Close
// takes every registration back from its segment and deregisters it.
//
// A deregistration runs outside localRegs.mu (a large one takes as long
// as its registration did), with the registration marked leaving in m
// meanwhile: the counters and Info go on, a teardown that comes for a
// registration Close is deregistering waits for that one (its buffer is
// unmapped after), and Close waits for the teardowns' deregistrations in
// progress before the device closes.

// maxLocalRegs bounds the client buffers registered at once; past it a
// buffer's requests use tcp (logged).
const maxLocalRegs = 4096

// localRegs are the local registrations the links made, by the keys on
// their segment, for Close, Info and the counters.
type localRegs struct {
	// mu guards m, buffers and each entry's leaving. It is never held
	// while the device deregisters.
	mu      sync.Mutex
	m       map[*rdma.Keys]*localReg
	buffers int // entries of m that are client buffers and not leaving
	// releasing are the teardowns' deregistrations in progress (added
	// under mu when one takes its registration), which closeAll waits for.
	releasing releases
}

// localReg is one local registration.
type localReg struct {
	id   xfer.SegmentID
	regs *xfer.Regs // the segment's slots
	reg  *rdma.Region
	pool bool
	// leaving: a teardown or closeAll took it to deregister; it stays in
	// m until that is done, and released closes then.
	leaving  bool
	released chan struct{}
}

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

// localKeys are the keys the links put on local segment seg (a pool's or
// a client buffer's), or nil. It does not lock or allocate.
func (p *Links) localKeys(seg xfer.Segment) *rdma.Keys {
	if k := rdma.KeysOf(seg); k != nil && !k.Remote() && k.Owner() == any(p) {
		return k
	}
	return nil
}

// addLocal puts reg's keys in the RDMA slot regs of segment id and records
// them. False when the slot is taken or the segment was torn down: reg is
// then the caller's to deregister.
func (p *Links) addLocal(id xfer.SegmentID, regs *xfer.Regs, reg *rdma.Region, pool bool) bool {
	var k *rdma.Keys
	k = rdma.LocalKeys(reg, p, func() { p.dropLocal(k) })
	e := &p.locals
	// Recorded before the slot is set: from then on the segment's teardown
	// may release the keys, and dropLocal must find them.
	e.mu.Lock()
	if e.m == nil {
		e.m = map[*rdma.Keys]*localReg{}
	}
	e.m[k] = &localReg{id: id, regs: regs, reg: reg, pool: pool, released: make(chan struct{})}
	if !pool {
		e.buffers++
	}
	e.mu.Unlock()
	if regs.Set(xfer.SlotRDMA, k) {
		return true
	}
	e.mu.Lock()
	if r := e.m[k]; r != nil && !r.pool {
		e.buffers--
	}
	delete(e.m, k)
	e.mu.Unlock()
	return false
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
	if p.localKeys(seg) != nil {
		return true
	}
	b, regs := clientBuffer(seg)
	if b == nil || !b.Acquire() {
		return false // not a client buffer, or unregistered meanwhile
	}
	defer b.Release()
	if p.locals.registered() >= maxLocalRegs {
		p.log.Warn("client buffer cannot use rdma: too many buffers registered", "segment", id, "max", maxLocalRegs)
		return false
	}
	start := time.Now()
	reg, err := p.dev.RegisterAccess(b.Bytes(), rdma.AccessLocal)
	if err != nil {
		p.log.Warn("client buffer cannot use rdma: registering it failed", "segment", id, "bytes", b.Size(), "err", err)
		return false
	}
	// Set while the reference above is held: the teardown cannot have
	// run yet.
	if !p.addLocal(id, regs, reg, false) {
		p.log.Warn("client buffer cannot use rdma: its rdma slot is taken", "segment", id)
		if err := p.dev.Deregister(reg); err != nil {
			p.log.Error("deregistering a client buffer", "segment", id, "err", err)
		}
		return false
	}
	p.log.Info("client buffer registered for rdma", "segment", id, "bytes", b.Size(),
		"took", time.Since(start).Round(time.Microsecond).String())
	return true
}

// dropLocal is a segment's teardown releasing the keys k the links put on
// it: their registration is deregistered before it returns (the memory is
// unmapped after). When Close is deregistering it, the teardown waits for
// that; links that closed released it already.
func (p *Links) dropLocal(k *rdma.Keys) {
	e := &p.locals
	e.mu.Lock()
	r := e.m[k]
	switch {
	case r == nil:
		e.mu.Unlock()
		return
	case r.leaving:
		e.mu.Unlock()
		<-r.released
		return
	}
	e.takeLocked(r)
	e.releasing.add()
	e.mu.Unlock()
	defer e.releasing.done()
	err := p.dev.Deregister(r.reg)
	e.released(k, r)
	if err != nil {
		p.log.Error("deregistering a segment's rdma registration", "segment", r.id, "pool", r.pool, "err", err)
		return
	}
	p.log.Debug("segment's rdma registration released", "segment", r.id, "pool", r.pool)
}

// takeLocked marks r leaving (mu held): its deregistration is the
// caller's.
func (e *localRegs) takeLocked(r *localReg) {
	r.leaving = true
	if !r.pool {
		e.buffers--
	}
}

// released ends r's stay in m once its deregistration is done.
func (e *localRegs) released(k *rdma.Keys, r *localReg) {
	e.mu.Lock()
	delete(e.m, k)
	e.mu.Unlock()
	close(r.released)
}

// closeAll takes every registration back from its segment and releases it
// (the links are closing; their transports are closed already), one at a
// time outside mu, then waits for the deregistrations teardowns are
// making. A segment tearing down meanwhile deregisters its own
// registration unless closeAll took it already; then it waits for that one
// only.
func (e *localRegs) closeAll(p *Links) {
	// Nothing is added any more: the pools were registered at start-up
	// and the registration queue has stopped.
	e.mu.Lock()
	keys := slices.Collect(maps.Keys(e.m))
	e.mu.Unlock()
	for _, k := range keys {
		e.mu.Lock()
		r := e.m[k]
		if r == nil || r.leaving {
			e.mu.Unlock()
			continue // released, or a teardown is releasing it
		}
		// False when the segment's teardown took the slot first: it
		// comes to dropLocal, and waits there for this deregistration.
		r.regs.Drop(xfer.SlotRDMA, k)
		e.takeLocked(r)
		e.mu.Unlock()
		if err := p.dev.Deregister(r.reg); err != nil {
			p.log.Warn("deregistering a segment's rdma registration", "segment", r.id, "pool", r.pool, "err", err)
		}
		e.released(k, r)
	}
	e.releasing.wait(p.log, "segment teardowns")
}

// registered is how many client buffers are registered.
func (e *localRegs) registered() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buffers
}

// pools are the pools' registrations: how many bytes and MRs (Info).
func (e *localRegs) pools() (bytes uint64, mrs int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range e.m {
		if r.pool && !r.leaving {
			bytes += r.reg.Size()
			mrs += r.reg.Chunks()
		}
	}
	return bytes, mrs
}
