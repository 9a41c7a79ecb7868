package link

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// Owner-side enforcement of exports over RDMA. The pool is registered for
// local use only, so its keys let no peer in. Each export a peer resolves
// gets its own registration covering exactly the export's bytes, with
// remote read and write as the export's rights grant them: the device
// refuses anything else whatever the peer posts. When the export ends the
// owner tells the peers that resolved it (they move its requests to tcp,
// which refuses them) and then deregisters it, which revokes the keys: a
// request still racing the unexport fails with IBV_WC_REM_ACCESS_ERR.

// revokeWait bounds how long an unexport waits for the peers to confirm
// they dropped the export's keys before revoking them anyway.
const revokeWait = time.Second

// exportRegs are the registrations of exports peers resolved, by export.
type exportRegs struct {
	// mu guards m and serializes registering with revoking, so that an
	// export is never registered after its revocation.
	mu sync.Mutex
	m  map[*peer.Export]*exportReg
}

type exportReg struct {
	name  string
	reg   *rdma.Region
	peers map[string]struct{} // peers that were given the keys
}

// accessOf maps an export's granted rights to the remote access of its
// registration.
func accessOf(r tcp.Rights) rdma.Access {
	a := rdma.AccessLocal
	if r&tcp.RightRead != 0 {
		a |= rdma.AccessRemoteRead
	}
	if r&tcp.RightWrite != 0 {
		a |= rdma.AccessRemoteWrite
	}
	return a
}

// serveSegment answers a peer's question about the export named in req
// with its registration (rdma.RemoteRegion's encoding), registering it the
// first time it is asked for; the export's end revokes it.
func (p *Links) serveSegment(from string, _ uint64, req []byte) ([]byte, error) {
	name := string(req)
	x := p.exported.Get(name)
	if x == nil {
		return nil, fmt.Errorf("%w: no segment exported as %q", tcp.ErrNotFound, name)
	}
	rights := tcp.Rights(x.Rights())
	// The reference keeps the export from ending while it is registered:
	// its end waits for it, then revokes what was registered here.
	seg := x.Segment()
	if !seg.Acquire() {
		return nil, fmt.Errorf("%w: %q is being unexported", tcp.ErrNotFound, name)
	}
	defer seg.Release()
	b := seg.Bytes()
	if len(b) == 0 {
		return nil, errors.New("empty segment")
	}
	e := &p.exports
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.m[x]
	if r == nil {
		start := time.Now()
		reg, err := p.dev.RegisterAccess(b, accessOf(rights))
		if err != nil {
			return nil, fmt.Errorf("registering export %q: %w", name, err)
		}
		if !x.OnEnd(func() { p.exportEnded(x) }) {
			// Unexported while it registered: nobody gets these keys.
			_ = p.dev.Deregister(reg)
			return nil, fmt.Errorf("%w: %q is being unexported", tcp.ErrNotFound, name)
		}
		r = &exportReg{name: name, reg: reg, peers: map[string]struct{}{}}
		e.m[x] = r
		p.log.Info("export registered for rdma", "name", name, "bytes", len(b), "access", accessOf(rights).String(),
			"took", time.Since(start).Round(time.Microsecond).String())
	}
	r.peers[from] = struct{}{}
	return r.reg.Remote(0).MarshalBinary()
}

// exportEnded runs when an export the links registered ends (after the
// peer requests in its range drained): the peers that hold its keys drop
// them, then its registration is released, so that when the unexport
// answers no peer can reach the range any more. A plane that closed
// released it already.
func (p *Links) exportEnded(x *peer.Export) {
	e := &p.exports
	e.mu.Lock()
	r := e.m[x]
	delete(e.m, x)
	e.mu.Unlock()
	if r == nil {
		return
	}
	name := r.name
	var wg sync.WaitGroup
	for peer := range r.peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := p.node.Exchange(peer, revokeExchange, []byte(name), revokeWait); err != nil {
				p.log.Warn("peer did not confirm dropping an export's rdma keys; revoking them anyway",
					"peer", peer, "name", name, "err", err)
			}
		}()
	}
	wg.Wait()
	if err := p.dev.Deregister(r.reg); err != nil {
		p.log.Error("deregistering an unexported segment", "name", name, "err", err)
		return
	}
	p.stats.revoked.Add(1)
	p.log.Info("export's rdma registration revoked", "name", name, "peers", len(r.peers))
}

// serveRevoke is a peer's word that its export named in req ended: the
// link to that peer stops using the export's keys.
func (p *Links) serveRevoke(from string, _ uint64, req []byte) ([]byte, error) {
	if l := (*p.links.Load())[from]; l != nil {
		if n := l.dropSegments(string(req)); n > 0 {
			p.log.Info("peer revoked an export's rdma keys", "peer", from, "name", string(req), "segments", n)
		}
	}
	return nil, nil
}

// closeAll releases every export's registration (the links are closing; the
// transports are closed already).
func (e *exportRegs) closeAll(p *Links) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for seg, r := range e.m {
		if err := p.dev.Deregister(r.reg); err != nil {
			p.log.Warn("deregistering an export", "name", r.name, "err", err)
		}
		delete(e.m, seg)
	}
}

// dropSegments takes the link's keys back from its resolved segments
// exported as name: their requests go to tcp from now on. It returns how
// many it dropped.
func (l *rdmaLink) dropSegments(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for r, k := range l.segs {
		if r.Name() == name {
			r.Regs().Drop(xfer.SlotRDMA, k)
			delete(l.segs, r)
			n++
		}
	}
	return n
}
