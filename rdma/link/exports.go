package link

import (
	"errors"
	"fmt"
	"strings"
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

// revokeQuiet is how long a peer that let revokeWait run out is not told
// of the next revocations (nor waited for), unless it resolves an export
// meanwhile. A client's exports end one after the other (its buffer goes,
// its connection closes: up to 64 of them), and a stalled peer that
// resolved them all would make it wait revokeWait for each. The keys are
// revoked anyway: such a peer learns it from its requests' failures.
const revokeQuiet = 30 * time.Second

// The exchange handlers of a tcp node are few (16 at once, beyond which
// the peer is answered busy), and a request for an export that registers
// holds one for as long as the registration takes: requests from many
// peers for a large export would fill them, and stall every other
// exchange with this daemon (links being set up, revocations,
// notifications). So the handlers that register an export or wait for one
// are bounded, in all and per export; a request beyond either bound is
// answered busyAnswer at once, which the requesting daemon takes as "ask
// again" (askRegion) and retries within its deadline.
const (
	// maxRegHandlers bounds the handlers registering an export or waiting
	// for an export's registration, across exports: half of the node's.
	maxRegHandlers = tcp.MaxExchangeHandlers / 2
	// maxExportWaiters bounds the handlers waiting for the registration
	// another request for the same export is making.
	maxExportWaiters = 2
)

// busyAnswer is the answer to a request for an export's registration
// beyond those bounds: the owner is registering, and the same request may
// succeed when asked again. It is a successful exchange, not a failure
// (the node would log each one), and no region's encoding begins as it
// does; a daemon before it reads it as a malformed region.
var busyAnswer = []byte("TCRB\x01")

// exportRegs are the registrations of exports peers resolved, by export.
//
// Registering an export pins and maps every page of it (seconds for GiBs
// under Soft-RoCE), so it runs outside mu: the export is reserved in
// pending under mu, registered without it, and published in m under mu
// again, where its end (exportEnded) finds it. Meanwhile the other
// exports' resolutions and revocations and the counters go on, and Close
// releases the other registrations before it waits for this one; a peer
// asking for the same export waits for that registration rather than
// making a second one (a few do; the others are answered busy and ask
// again: see maxExportWaiters). An export that ended, or links that closed, while
// it registered get no keys: the registration is released at once.
//
// An export's end takes its registration out of m into ending while it
// asks the peers to drop the keys (up to revokeWait), then deregisters
// it. Close takes over the registrations still in ending: it deregisters
// them at once (the keys are revoked that way too) and the end, when its
// wait is over, finds its registration released; Close waits for those
// an end is deregistering already. Either way the end returns only once
// the registration is released, and the device closes with none left.
type exportRegs struct {
	// mu guards the fields below. It is never held while the device
	// registers or deregisters.
	mu sync.Mutex
	m  map[*peer.Export]*exportReg
	// pending are the exports being registered, each with what its
	// registration ended with.
	pending map[*peer.Export]*pendingReg
	// ending are the registrations of exports that ended, while their end
	// asks the peers to drop the keys and nobody deregisters them yet.
	ending map[*exportReg]struct{}
	// handlers are the exchange handlers registering an export or
	// waiting for one (at most maxRegHandlers).
	handlers int
	// silent are the peers that did not confirm a revocation, since when
	// (see revokeQuiet).
	silent map[string]time.Time
	// closed: the links are closing; nothing is registered any more.
	closed bool
	// registering counts the registrations in progress (added under mu
	// while not closed), which closeAll waits for: each releases its
	// region itself when it finds the links closed.
	registering sync.WaitGroup
	// releasing are the ends' deregistrations in progress (added under mu
	// when an end takes its registration out of ending), which closeAll
	// waits for.
	releasing releases
}

type exportReg struct {
	name   string
	tenant string // the exporter's, in its wire form ("" for the default)
	reg    *rdma.Region
	peers  map[string]struct{} // peers that were given the keys
	// released closes once reg is deregistered, by the export's end or
	// by Close, which took it over.
	released chan struct{}
}

// pendingReg is an export's registration in progress: done closes when it
// ended, err then says why it failed (nil: it is in exportRegs.m, unless
// the export ended since).
type pendingReg struct {
	done chan struct{}
	err  error
	// waiters are the handlers waiting for it (at most
	// maxExportWaiters; exportRegs.mu guards it).
	waiters int
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

// serveSegment answers a peer that shows, in req, the token this daemon
// issued it for an export with the export's registration (see
// serveExport); a token that does not verify, or whose tenant the export
// no longer lets in, is refused with xfer.ErrPermission.
func (p *Links) serveSegment(from string, _ uint64, req []byte) ([]byte, error) {
	a, err := p.node.Verify(req, 0)
	if err != nil {
		return nil, err
	}
	x, err := p.exported.Resolve(a.Tenant, a.Owner, a.Name)
	if err != nil {
		return nil, err
	}
	return p.serveExport(from, x)
}

// serveSegmentByName answers a daemon before tenants, which asks for the
// export named in req without a token: only the default tenant's exports
// are served so (those daemons have no other).
func (p *Links) serveSegmentByName(from string, _ uint64, req []byte) ([]byte, error) {
	x := p.exported.Get(peer.DefaultTenant, string(req))
	if x == nil {
		return nil, fmt.Errorf("%w: no segment exported as %q", tcp.ErrNotFound, req)
	}
	return p.serveExport(from, x)
}

// serveExport answers with x's registration (rdma.RemoteRegion's
// encoding), registering it the first time a peer asks for it; the
// export's end revokes it. While it registers, up to maxExportWaiters
// other requests for it wait for it; beyond those, or beyond
// maxRegHandlers in all, a request is answered busyAnswer at once.
func (p *Links) serveExport(from string, x *peer.Export) ([]byte, error) {
	name := x.Name()
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
	waited := false
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		}
		if r := e.m[x]; r != nil {
			r.peers[from] = struct{}{}
			delete(e.silent, from) // it answers again
			remote := r.reg.Remote(0)
			e.mu.Unlock()
			return remote.MarshalBinary()
		}
		w := e.pending[x]
		if w == nil && waited {
			// Registered for a peer this one waited on, and ended since.
			e.mu.Unlock()
			return nil, fmt.Errorf("%w: %q is being unexported", tcp.ErrNotFound, name)
		}
		if e.handlers >= maxRegHandlers || (w != nil && w.waiters >= maxExportWaiters) {
			e.mu.Unlock()
			p.stats.exportsBusy.Add(1)
			return busyAnswer, nil
		}
		e.handlers++
		if w == nil {
			w = &pendingReg{done: make(chan struct{})}
			e.pending[x] = w
			e.registering.Add(1)
			e.mu.Unlock()
			return p.registerExport(from, x, w, b)
		}
		w.waiters++
		e.mu.Unlock()
		// Another peer's request registers x: its registration serves
		// this one too.
		<-w.done
		e.mu.Lock()
		e.handlers--
		e.mu.Unlock()
		if w.err != nil {
			return nil, w.err
		}
		waited = true
	}
}

// registerExport registers x's bytes b for the peer from, which reserved x
// in pending as w, without holding exportRegs.mu, and publishes the
// registration unless x ended or the links closed meanwhile (then it is
// released here, and nobody gets its keys).
func (p *Links) registerExport(from string, x *peer.Export, w *pendingReg, b []byte) ([]byte, error) {
	e := &p.exports
	defer e.registering.Done()
	name := x.Name()
	access := accessOf(tcp.Rights(x.Rights()))
	start := time.Now()
	reg, err := p.dev.RegisterAccess(b, access)
	took := time.Since(start)
	var resp []byte
	var dead *rdma.Region
	e.mu.Lock()
	delete(e.pending, x)
	e.handlers--
	switch {
	case err != nil:
		w.err = fmt.Errorf("registering export %q: %w", name, err)
	case e.closed:
		dead, w.err = reg, fmt.Errorf("rdma: %w", xfer.ErrClosed)
	case !x.OnEnd(func() { p.exportEnded(x) }):
		// Unexported while it registered: nobody gets these keys.
		dead, w.err = reg, fmt.Errorf("%w: %q is being unexported", tcp.ErrNotFound, name)
	default:
		// Published under mu with OnEnd's registration: an end that
		// runs from now on finds it in m.
		e.m[x] = &exportReg{name: name, tenant: peer.WireTenant(x.Tenant()), reg: reg, peers: map[string]struct{}{from: {}},
			released: make(chan struct{})}
		delete(e.silent, from) // it answers again
		resp, w.err = reg.Remote(0).MarshalBinary()
	}
	e.mu.Unlock()
	close(w.done)
	if dead != nil {
		if err := p.dev.Deregister(dead); err != nil {
			p.log.Error("deregistering an export nobody got the keys of", "name", name, "err", err)
		}
		return nil, w.err
	}
	if w.err != nil {
		return nil, w.err
	}
	p.log.Info("export registered for rdma", "name", name, "bytes", len(b), "access", access.String(),
		"took", took.Round(time.Microsecond).String())
	return resp, nil
}

// exportEnded runs when an export the links registered ends (after the
// peer requests in its range drained): the peers that hold its keys drop
// them (all but those that stalled on an earlier one: see revokeQuiet),
// then its registration is released, so that when the unexport answers no
// peer can reach the range any more. When the links close meanwhile,
// Close releases it and this waits for that; a plane that closed released
// it already.
func (p *Links) exportEnded(x *peer.Export) {
	e := &p.exports
	now := time.Now()
	e.mu.Lock()
	r := e.m[x]
	delete(e.m, x)
	var ask []string
	if r != nil {
		if e.ending == nil {
			e.ending = map[*exportReg]struct{}{}
		}
		e.ending[r] = struct{}{}
		for peer := range r.peers {
			if at, ok := e.silent[peer]; !ok || now.Sub(at) >= revokeQuiet {
				ask = append(ask, peer)
			}
		}
	}
	e.mu.Unlock()
	if r == nil {
		return
	}
	name := r.name
	which := []byte(r.tenant + "/" + name)
	var wg sync.WaitGroup
	for _, peer := range ask {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.node.Exchange(peer, revokeTenantExchange, which, revokeWait)
			if errors.Is(err, tcp.ErrNoHandler) {
				// A daemon before per-tenant revocation: it drops every
				// export of this name (more than it must, never less).
				_, err = p.node.Exchange(peer, revokeExchange, []byte(name), revokeWait)
			}
			if err != nil {
				p.log.Warn("peer did not confirm dropping an export's rdma keys; revoking them anyway",
					"peer", peer, "name", name, "tenant", logTenant(r.tenant), "err", err)
			}
			if errors.Is(err, xfer.ErrTimeout) {
				// Only a peer that let the wait run out costs the
				// next unexports anything.
				e.mu.Lock()
				if e.silent == nil {
					e.silent = map[string]time.Time{}
				}
				e.silent[peer] = time.Now()
				e.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	e.mu.Lock()
	_, mine := e.ending[r]
	delete(e.ending, r)
	if mine {
		e.releasing.add()
	}
	e.mu.Unlock()
	if !mine {
		<-r.released // Close took it over
		return
	}
	err := p.dev.Deregister(r.reg)
	close(r.released)
	e.releasing.done()
	if err != nil {
		p.log.Error("deregistering an unexported segment", "name", name, "err", err)
		return
	}
	p.stats.revoked.Add(1)
	p.log.Info("export's rdma registration revoked", "name", name, "tenant", logTenant(r.tenant), "peers", len(r.peers))
}

// serveRevoke is the word of a peer before per-tenant revocation that its
// export named in req ended: the link to that peer stops using the keys
// of every export of that name, whatever its tenant.
func (p *Links) serveRevoke(from string, _ uint64, req []byte) ([]byte, error) {
	p.dropRevoked(from, "", string(req), true)
	return nil, nil
}

// serveRevokeTenant is a peer's word that its export req names
// ("tenant/name", tenant in its wire form) ended: the link to that peer
// stops using that export's keys; another tenant's export of the same name
// keeps its own.
func (p *Links) serveRevokeTenant(from string, _ uint64, req []byte) ([]byte, error) {
	tenant, name, ok := strings.Cut(string(req), "/")
	if !ok || name == "" {
		return nil, fmt.Errorf("%w: a revocation %q is not tenant/name", xfer.ErrInvalid, req)
	}
	p.dropRevoked(from, tenant, name, false)
	return nil, nil
}

func (p *Links) dropRevoked(from, tenant, name string, anyTenant bool) {
	if l := (*p.links.Load())[from]; l != nil {
		if n := l.dropSegments(tenant, name, anyTenant); n > 0 {
			p.log.Info("peer revoked an export's rdma keys", "peer", from, "name", name,
				"tenant", logTenant(tenant), "segments", n)
		}
	}
}

// logTenant names a tenant in its wire form for a log line.
func logTenant(wireTenant string) string {
	if wireTenant == "" {
		return peer.DefaultTenant
	}
	return wireTenant
}

// closeAll releases every export's registration (the links are closing; the
// transports are closed already), those of exports whose end still asks
// the peers to drop the keys included, and waits for the registrations in
// progress, which release their own, and for the deregistrations the ends
// are making.
func (e *exportRegs) closeAll(p *Links) {
	e.mu.Lock()
	e.closed = true
	regs := make([]*exportReg, 0, len(e.m)+len(e.ending))
	for _, r := range e.m {
		regs = append(regs, r)
	}
	for r := range e.ending {
		regs = append(regs, r)
	}
	clear(e.m)
	clear(e.ending)
	e.mu.Unlock()
	for _, r := range regs {
		if err := p.dev.Deregister(r.reg); err != nil {
			p.log.Warn("deregistering an export", "name", r.name, "err", err)
		}
		close(r.released)
	}
	e.registering.Wait()
	e.releasing.wait(p.log, "unexports")
}

// dropSegments takes the link's keys back from its resolved segments
// exported as name by tenant (wire form; anyTenant: by any tenant): their
// requests go to tcp from now on. It returns how many it dropped.
func (l *rdmaLink) dropSegments(tenant, name string, anyTenant bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for r, k := range l.segs {
		if r.Name() == name && (anyTenant || exporterOf(r.Access()) == tenant) {
			r.Regs().Drop(xfer.SlotRDMA, k)
			delete(l.segs, r)
			n++
		}
	}
	return n
}

// exporterOf is the tenant (wire form) whose export a remote segment
// opened as a is: the one it names, else the opener's own.
func exporterOf(a tcp.Access) string {
	if a.Owner != "" {
		return a.Owner
	}
	return a.Tenant
}
