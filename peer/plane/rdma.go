package plane

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Exchange kinds the RDMA plane serves on the peer channel, beside
// rdma.ExchangeKind (queue-pair connection data): where an export lies and
// its keys, and the owner's word that an export's keys are revoked.
const (
	segmentExchange = "rdma.segment"
	revokeExchange  = "rdma.revoke"
)

// rdmaPlane is the daemon's RDMA end: the device, the pools' memory
// registrations (made once at start-up, for local use only: no peer can
// address a pool as a whole), one registration per export a peer asked
// for (with the export's rights as its remote access, dropped when the
// export ends; see rdma_exports.go), one outbound link per peer (a
// transport this daemon dials and submits on) and one accepting transport
// per peer (the peer's link lands there). Client buffers get a local
// registration when first used (rdma_locals.go).
//
// Plane.Route asks route for each remote target: a request whose local side
// is the pool or a registered client buffer and whose peer's link is up
// with the target segment resolved goes to that link; anything else goes to
// tcp and queues a job for the worker, which registers the buffer, connects
// the link over the peer channel and resolves the segment (asks its owner
// for the export's registration). Each peer's choice is logged once.
//
// Ownership: the Plane creates it after its node and closes it in
// Plane.Close (after the engine, the node and the control server, before
// the pools). It owns two goroutines, the worker and the registration
// queue's (rdma_regs.go); close stops them (close(stop), close the queue,
// join), then closes the links' and the accepting transports, deregisters
// the pools and closes the device.
type rdmaPlane struct {
	log *slog.Logger
	dev Device
	// pools are the tenants' pools' registrations by segment id, each
	// made once at start-up for local use (written by newPlane only).
	pools map[xfer.SegmentID]*rdma.Region
	node  *tcp.Node
	// exported is the daemon's export table, which peers resolve exports
	// in and deliver notifications to.
	exported *peer.Exports
	qps      int // queue pairs per link (rdma_qps)

	links atomic.Pointer[map[string]*rdmaLink] // copy on write, under mu

	jobs   chan *tcp.Remote
	regs   *regQueue      // client buffers to register (rdma_regs.go)
	prep   chan pinJob    // segments opened with transport rdma (rdma_pins.go)
	retire chan *rdmaLink // links whose peer runs a new epoch
	stop   chan struct{}
	wg     sync.WaitGroup

	// mu guards links' writers, accepted, said and closed.
	mu       sync.Mutex
	accepted map[string]acceptedPeer
	said     map[string]string // what was logged about each peer's transport
	closed   bool

	exports exportRegs
	locals  localRegs
	pins    pins
	stats   rdmaStats
	// linkDown and localMissing fail requests of rdma-only segments
	// (rdma_pins.go).
	linkDown, localMissing *rdmaRefusal
}

type acceptedPeer struct {
	t     *rdma.Transport
	epoch uint64
}

// rdmaLink is the transport the router returns for one peer's remote
// targets when RDMA carries them. A task carrying a notification moves by
// RDMA too; the notification follows on the peer channel (rdma_notify.go).
type rdmaLink struct {
	p     *rdmaPlane
	peer  string
	epoch uint64 // the peer's epoch the link was made with
	tr    *rdma.Transport
	tcp   *tcp.Node // where what rdma does not carry goes
	// segs maps the remote segments the link resolved to their owner's
	// registration of them (copy on write, under mu).
	segs atomic.Pointer[map[*tcp.Remote]rdma.RemoteRegion]
	// ids are the request segment ids the transport has tables for (copy
	// on write, under mu).
	ids atomic.Pointer[map[xfer.SegmentID]struct{}]
	mu  sync.Mutex
}

var _ xfer.Transport = (*rdmaLink)(nil)

// newRDMAPlane opens the device and registers the pools (one per tenant),
// or returns nil and why when RDMA is off or unusable here (logged once;
// peers then use tcp). With Mode on an unusable device is an error
// wrapping ErrRDMARequired.
func newRDMAPlane(cfg RDMAConfig, pools []xfer.MemSegment, node *tcp.Node, exports *peer.Exports, log *slog.Logger) (*rdmaPlane, string, error) {
	if cfg.Mode == "off" {
		log.Info("rdma off (rdma = off): peers use tcp")
		return nil, "rdma = off", nil
	}
	open := cfg.Open
	if open == nil {
		open = func(c rdma.Config, log *slog.Logger) (Device, error) {
			d, err := rdma.Open(c, log)
			if err != nil {
				return nil, err // not a non-nil Device holding a nil *rdma.Device
			}
			return d, nil
		}
	}
	dev, err := open(rdma.Config{Device: cfg.Device, GID: cfg.GID, QPs: cfg.QPs}, log)
	if err != nil {
		if cfg.Mode == "on" {
			return nil, "", fmt.Errorf("%w: rdma = on, rdma_device = %q, rdma_gid = %q: %v", ErrRDMARequired, cfg.Device, cfg.GID, err)
		}
		log.Info("rdma unavailable: peers use tcp", "reason", err.Error())
		return nil, err.Error(), nil
	}
	regs := make(map[xfer.SegmentID]*rdma.Region, len(pools))
	for _, pool := range pools {
		start := time.Now()
		reg, err := dev.RegisterAccess(pool.Bytes()[:pool.Size()], rdma.AccessLocal)
		if err != nil {
			for _, r := range regs {
				_ = dev.Deregister(r)
			}
			_ = dev.Close()
			if cfg.Mode == "on" {
				return nil, "", fmt.Errorf("%w: rdma = on: registering pool %d: %v", ErrRDMARequired, pool.ID(), err)
			}
			log.Warn("rdma unavailable: registering a pool failed; peers use tcp", "segment", uint64(pool.ID()), "err", err)
			return nil, "registering the pool failed: " + err.Error(), nil
		}
		regs[pool.ID()] = reg
		log.Info("pool registered for rdma (local access)", "device", dev.Name(), "segment", uint64(pool.ID()),
			"bytes", pool.Size(), "mrs", reg.Chunks(), "took", time.Since(start).Round(time.Microsecond).String())
	}
	p := newPlane(dev, regs, node, exports, log)
	p.qps = cfg.QPs
	return p, "", nil
}

// newPlane wires a plane over an opened device and registration and
// starts its worker.
func newPlane(dev Device, pools map[xfer.SegmentID]*rdma.Region, node *tcp.Node, exports *peer.Exports, log *slog.Logger) *rdmaPlane {
	p := &rdmaPlane{
		log: log, dev: dev, pools: pools, node: node, exported: exports,
		jobs: make(chan *tcp.Remote, 64), prep: make(chan pinJob), retire: make(chan *rdmaLink, 16), stop: make(chan struct{}),
		accepted: map[string]acceptedPeer{}, said: map[string]string{},
		exports: exportRegs{m: map[*peer.Export]*exportReg{}},
	}
	p.linkDown, p.localMissing = rdmaRefusals(&p.stats)
	p.regs = newRegQueue(log, p.registerLocal, p.routeRegistered)
	empty := map[string]*rdmaLink{}
	p.links.Store(&empty)
	_ = p.node.Handle(rdma.ExchangeKind, rdma.Acceptor(p.accept))
	_ = p.node.Handle(segmentExchange, p.serveSegment)
	_ = p.node.Handle(revokeExchange, p.serveRevoke)
	_ = p.node.Handle(notifyExchange, p.serveNotify)
	p.wg.Add(2)
	go p.worker()
	go func() {
		defer p.wg.Done()
		p.regs.run()
	}()
	return p
}

// route is the router's question: the link to send a request between
// local and target over, or nil for tcp. It does not allocate.
func (p *rdmaPlane) route(local, target xfer.Segment) xfer.Transport {
	r, ok := target.(*tcp.Remote)
	if !ok {
		return nil
	}
	via := p.pinned(r)
	if via == wire.TransportTCP {
		p.stats.toTCP.Add(1)
		return nil
	}
	if p.localRegion(local.ID()) == nil {
		if via != wire.TransportRDMA {
			p.wantLocal(local)
			p.stats.toTCP.Add(1)
			return nil
		}
		// The client asked for rdma: the request waits for its buffer's
		// registration in the queue, off the submit path.
		if _, ok := local.(teardownHooker); !ok || p.regs.hasFailed(local.ID()) {
			return p.localMissing
		}
		return p.regs
	}
	l := (*p.links.Load())[r.Peer()]
	if l != nil && l.epoch == r.Epoch() {
		if _, ok := (*l.segs.Load())[r]; ok {
			return l
		}
	}
	select {
	case p.jobs <- r:
	default:
	}
	if via == wire.TransportRDMA {
		return p.linkDown
	}
	p.stats.toTCP.Add(1)
	return nil
}

// routeRegistered is where a task that waited for its buffer's
// registration goes once the registration ended: where route sends it
// now (a buffer still unregistered fails it rather than waiting again).
func (p *rdmaPlane) routeRegistered(t *xfer.Task) xfer.Transport {
	tr := p.route(t.Local, t.Target)
	switch {
	case tr == xfer.Transport(p.regs):
		return p.localMissing
	case tr == nil:
		return p.node // an auto segment: tcp carries it
	}
	return tr
}

// linkRetry is how long a peer whose link could not be made stays on tcp
// before the next attempt (a new epoch retries at once).
const linkRetry = 30 * time.Second

// worker connects links and resolves segments that route asked for (the
// registration queue registers client buffers). A peer whose link failed stays on tcp for
// linkRetry; a segment that cannot be resolved (its owner could not
// register it) or a buffer that could not be registered stays on tcp while
// the rest of its peer's requests use rdma.
func (p *rdmaPlane) worker() {
	defer p.wg.Done()
	type failure struct {
		epoch uint64
		at    time.Time
	}
	failedPeer := map[string]failure{}      // peer → its last failed link
	failedSeg := map[*tcp.Remote]struct{}{} // segments left on tcp
	tick := time.NewTicker(linkCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-tick.C:
			p.checkLinks()
			p.prunePins()
			p.regs.expire(now)
		case j := <-p.prep:
			j.done <- p.prepare(j.r)
		case l := <-p.retire:
			p.retireLink(l, "the peer runs a new epoch")
		case r := <-p.jobs:
			if f, ok := failedPeer[r.Peer()]; ok && f.epoch == r.Epoch() && time.Since(f.at) < linkRetry {
				continue
			}
			if _, ok := failedSeg[r]; ok {
				continue
			}
			l, err := p.link(r.Peer(), r.Epoch())
			if err != nil {
				failedPeer[r.Peer()] = failure{r.Epoch(), time.Now()}
				p.say(r.Peer(), "tcp", err.Error())
				continue
			}
			if err := p.resolve(l, r); err != nil {
				if len(failedSeg) >= 4096 {
					for k := range failedSeg {
						if closedRemote(k) {
							delete(failedSeg, k)
						}
					}
				}
				failedSeg[r] = struct{}{}
				p.log.Info("remote segment uses tcp", "peer", r.Peer(), "segment", r.Name(), "why", err.Error())
				continue
			}
			p.say(r.Peer(), "rdma", "queue pairs up over the peer channel")
		}
	}
}

// linkCheckEvery is how often the worker compares the links with the peer
// plane's view of their peers.
const linkCheckEvery = 250 * time.Millisecond

// checkLinks retires the links whose peer lost its tcp session or runs
// another epoch. A dead peer's queue pairs may not report the loss for a
// long time (each work request waits out the transport's retries), so the
// peer channel is the witness: closing the link fails what it has posted
// at once, and later requests go to tcp, which fails them or, once the
// peer is back, gets a new link made.
func (p *rdmaPlane) checkLinks() {
	links := *p.links.Load()
	if len(links) == 0 {
		return
	}
	for _, s := range p.node.Peers() {
		l := links[s.ID]
		switch {
		case l == nil:
		case s.Epoch != l.epoch:
			p.retireLink(l, "the peer runs a new epoch")
		case !s.Connected:
			p.retireLink(l, "the peer's tcp session is gone")
		}
	}
}

// retireLink drops a link: requests to its segments go to tcp (which
// refuses those of an old epoch), and a later use makes a new link.
func (p *rdmaPlane) retireLink(l *rdmaLink, why string) {
	p.mu.Lock()
	old := *p.links.Load()
	if old[l.peer] != l || p.closed {
		p.mu.Unlock()
		return
	}
	m := maps.Clone(old)
	delete(m, l.peer)
	p.links.Store(&m)
	p.mu.Unlock()
	_ = l.tr.Close()
	p.mu.Lock()
	delete(p.said, l.peer)
	p.mu.Unlock()
	p.stats.linksClosed.Add(1)
	p.log.Info("rdma link closed", "peer", l.peer, "epoch", fmt.Sprintf("%#x", l.epoch), "why", why)
}

// epochChannel is a link's peer channel: exchanges pinned to the epoch the
// link was made with, so that its queue pairs never reconnect to a
// restarted peer (whose pool and keys are new); a stale epoch retires the
// link.
type epochChannel struct{ l *rdmaLink }

func (c epochChannel) Exchange(peer, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	p := c.l.p
	resp, err := p.node.ExchangeAt(peer, c.l.epoch, kind, req, timeout)
	if errors.Is(err, tcp.ErrStaleEpoch) {
		select {
		case p.retire <- c.l:
		default:
		}
	}
	return resp, err
}

// link returns peer's link of epoch, connecting it when there is none.
func (p *rdmaPlane) link(peer string, epoch uint64) (*rdmaLink, error) {
	if l := (*p.links.Load())[peer]; l != nil && l.epoch == epoch {
		return l, nil
	}
	return p.connect(peer, epoch)
}

// resolve asks r's owner for its registration of r (address, size, keys)
// and records it.
func (p *rdmaPlane) resolve(l *rdmaLink, r *tcp.Remote) error {
	if _, ok := (*l.segs.Load())[r]; ok {
		return nil
	}
	resp, err := p.node.ExchangeAt(r.Peer(), l.epoch, segmentExchange, []byte(r.Name()), 0)
	if err != nil {
		return err
	}
	var reg rdma.RemoteRegion
	if err := reg.UnmarshalBinary(resp); err != nil {
		return err
	}
	if reg.Size != r.Size() {
		return fmt.Errorf("registration of %d bytes for a %d-byte segment", reg.Size, r.Size())
	}
	l.mu.Lock()
	m := maps.Clone(*l.segs.Load())
	maps.DeleteFunc(m, func(k *tcp.Remote, _ rdma.RemoteRegion) bool { return closedRemote(k) })
	m[r] = reg
	l.segs.Store(&m)
	l.mu.Unlock()
	return nil
}

// closedRemote reports whether r was closed (its holder let it go).
func closedRemote(r *tcp.Remote) bool {
	if !r.Acquire() {
		return true
	}
	r.Release()
	return false
}

// connect makes the link to peer at epoch, replacing an older one.
func (p *rdmaPlane) connect(peer string, epoch uint64) (*rdmaLink, error) {
	tr, err := p.dev.NewTransport()
	if err != nil {
		return nil, err
	}
	for id, reg := range p.pools {
		tr.AddLocal(id, reg)
	}
	l := &rdmaLink{p: p, peer: peer, epoch: epoch, tr: tr, tcp: p.node}
	start := time.Now()
	if err := tr.Connect(rdma.ChannelPeer{Ch: epochChannel{l}, ID: peer}); err != nil {
		_ = tr.Close()
		return nil, err
	}
	segs, ids := map[*tcp.Remote]rdma.RemoteRegion{}, map[xfer.SegmentID]struct{}{}
	l.segs.Store(&segs)
	l.ids.Store(&ids)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = tr.Close()
		return nil, xfer.ErrClosed
	}
	m := maps.Clone(*p.links.Load())
	prev := m[peer]
	m[peer] = l
	p.links.Store(&m)
	p.mu.Unlock()
	if prev != nil {
		// The peer restarted: its old queue pairs lead nowhere.
		_ = prev.tr.Close()
	}
	p.stats.linksMade.Add(1)
	p.log.Info("rdma link up", "peer", peer, "epoch", fmt.Sprintf("%#x", epoch), "took", time.Since(start).Round(time.Microsecond).String())
	return l, nil
}

// say logs, once per peer and change, which transport carries its
// requests and why.
func (p *rdmaPlane) say(peer, transport, why string) {
	p.mu.Lock()
	was := p.said[peer]
	p.said[peer] = transport
	p.mu.Unlock()
	if was == transport {
		return
	}
	if transport == "rdma" {
		p.log.Info("peer requests from the pool use rdma", "peer", peer, "why", why)
	} else {
		p.log.Info("peer requests use tcp", "peer", peer, "why", why)
	}
}

// accept is the acceptor's lookup: the transport a peer's link lands on,
// made on first use and remade when the peer restarts.
func (p *rdmaPlane) accept(from string, epoch uint64) (*rdma.Transport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, xfer.ErrClosed
	}
	a, ok := p.accepted[from]
	if ok && a.epoch == epoch {
		return a.t, nil
	}
	t, err := p.dev.NewTransport()
	if err != nil {
		return nil, err
	}
	if ok {
		_ = a.t.Close()
	}
	p.accepted[from] = acceptedPeer{t: t, epoch: epoch}
	p.log.Info("rdma: accepting a peer's queue pairs", "peer", from, "epoch", fmt.Sprintf("%#x", epoch))
	return t, nil
}

// close stops the worker and closes every transport, the registration and
// the device. Call it after the engine (no more submits) and before the
// pool is unmapped.
func (p *rdmaPlane) close() {
	p.mu.Lock()
	p.closed = true
	accepted := p.accepted
	p.accepted = map[string]acceptedPeer{}
	p.mu.Unlock()
	_ = p.node.Handle(rdma.ExchangeKind, nil)
	_ = p.node.Handle(segmentExchange, nil)
	_ = p.node.Handle(revokeExchange, nil)
	_ = p.node.Handle(notifyExchange, nil)
	close(p.stop)
	p.regs.close()
	p.wg.Wait()
	for peer, l := range *p.links.Load() {
		if err := l.tr.Close(); err != nil {
			p.log.Warn("closing rdma link", "peer", peer, "err", err)
		}
	}
	for peer, a := range accepted {
		if err := a.t.Close(); err != nil {
			p.log.Warn("closing rdma transport accepting a peer", "peer", peer, "err", err)
		}
	}
	p.exports.closeAll(p)
	p.locals.closeAll(p)
	for id, reg := range p.pools {
		if err := p.dev.Deregister(reg); err != nil {
			p.log.Warn("deregistering a pool", "segment", uint64(id), "err", err)
		}
	}
	if err := p.dev.Close(); err != nil {
		p.log.Warn("closing the rdma device", "err", err)
	}
}

// Name implements xfer.Transport.
func (l *rdmaLink) Name() string { return "rdma" }

// Cancel implements xfer.Transport: posted RDMA work is not withdrawn; a
// task the link handed to tcp and still waiting in the node's queue ends
// at once (the node ignores tasks it does not hold).
func (l *rdmaLink) Cancel(t *xfer.Task) {
	l.tr.Cancel(t)
	l.tcp.Cancel(t)
}

// Close implements xfer.Transport; the plane closes the link's transport.
func (l *rdmaLink) Close() error { return nil }

// Submit implements xfer.Transport: runs of tasks go to the rdma transport,
// a task carrying a notification on its own (submitNotified), and tasks the
// remote segment's rights refuse end at once with xfer.ErrPermission.
// Tasks the rdma transport does not take because it closed or has no
// queue pair up go to tcp.
func (l *rdmaLink) Submit(tasks []*xfer.Task) (int, error) {
	done := 0
	for done < len(tasks) {
		i := done
		route := l.classify(tasks[i])
		for i++; i < len(tasks) && l.classify(tasks[i]) == route; i++ {
		}
		var n int
		var err error
		switch route {
		case viaNotify:
			n, err = l.submitNotified(tasks[done])
		case viaTCP:
			n, err = l.tcp.Submit(tasks[done:i])
			l.p.stats.toTCP.Add(uint64(n))
		case viaDown:
			n, err = l.p.linkDown.Submit(tasks[done:i])
		case viaRefuse:
			l.p.stats.refused.Add(uint64(i - done))
			for _, t := range tasks[done:i] {
				t.Done(0, fmt.Errorf("%w: %s/%s opened with rights %v", xfer.ErrPermission, l.peer, t.Target.(*tcp.Remote).Name(), t.Target.(*tcp.Remote).Rights()))
			}
			n = i - done
		default:
			// Count before handing them over: a dispatched task may end,
			// and be reused, before Submit returns; those it did not
			// dispatch are still the caller's.
			b := lengths(tasks[done:i])
			n, err = l.tr.Submit(tasks[done:i])
			l.p.stats.posted(n, b-lengths(tasks[done+n:i]))
			if err != nil && (errors.Is(err, xfer.ErrClosed) || errors.Is(err, rdma.ErrQPDown)) {
				// The link was retired under us, or none of its queue
				// pairs is up: what it did not take goes to tcp.
				var m int
				m, err = l.fallback(tasks[done+n : i])
				n += m
			}
		}
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

const (
	viaRDMA = iota
	viaTCP
	viaRefuse
	viaNotify
	viaDown // opened with transport rdma, which cannot carry it now
)

// fallback sends to tcp what the rdma transport did not take, except the
// tasks of segments opened with transport rdma, which fail.
func (l *rdmaLink) fallback(ts []*xfer.Task) (int, error) {
	if l.p.pins.n.Load() == 0 {
		return l.tcp.Submit(ts)
	}
	done := 0
	for done < len(ts) {
		i := done
		for i < len(ts) && !l.rdmaOnly(ts[i]) {
			i++
		}
		if i > done {
			n, err := l.tcp.Submit(ts[done:i])
			done += n
			if err != nil {
				return done, err
			}
			continue
		}
		n, _ := l.p.linkDown.Submit(ts[done : done+1])
		done += n
	}
	return done, nil
}

// rdmaOnly reports whether t's target was opened with transport rdma.
func (l *rdmaLink) rdmaOnly(t *xfer.Task) bool {
	r, ok := t.Target.(*tcp.Remote)
	return ok && l.p.pinned(r) == wire.TransportRDMA
}

// classify picks where one task goes, adding the rdma transport's tables
// for its segment ids the first time they are seen.
func (l *rdmaLink) classify(t *xfer.Task) int {
	r, ok := t.Target.(*tcp.Remote)
	if !ok {
		return viaTCP
	}
	need := tcp.RightRead
	if t.Req.Op == xfer.OpWrite {
		need = tcp.RightWrite
	}
	if r.Rights()&need == 0 {
		return viaRefuse
	}
	reg, ok := (*l.segs.Load())[r]
	if !ok {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // not resolved, or revoked by its owner
	}
	via := viaRDMA
	if t.Notify != nil {
		via = viaNotify
	}
	ids := *l.ids.Load()
	_, lok := ids[t.Req.Local]
	_, tok := ids[t.Req.Target]
	if lok && tok {
		return via
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := (*l.segs.Load())[r]; !ok {
		return viaTCP
	}
	if err := l.tr.AddRemote(t.Req.Target, reg); err != nil {
		return viaTCP
	}
	lr := l.p.localRegion(t.Req.Local)
	if lr == nil {
		if l.rdmaOnly(t) {
			return viaDown
		}
		return viaTCP // a client buffer whose registration went away
	}
	l.tr.AddLocal(t.Req.Local, lr)
	m := maps.Clone(*l.ids.Load())
	m[t.Req.Local], m[t.Req.Target] = struct{}{}, struct{}{}
	l.ids.Store(&m)
	return via
}
