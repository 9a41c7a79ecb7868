package link

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Exchange kinds the links serve on the peer channel, beside
// rdma.ExchangeKind (queue-pair connection data): where an export lies and
// its keys, and the owner's word that an export's keys are revoked.
//
// The owner's word that an export ended names its tenant and its name
// (revokeTenantExchange, "tenant/name" with tenant in its wire form), so
// that a peer drops exactly the keys of that export and not those of
// another tenant's export of the same name; daemons before it take the
// name alone (revokeExchange) and drop every export of that name.
//
// A peer resolves an export by showing the capability token the owner
// issued when it opened the export over tcp (segmentTokenExchange): the
// owner verifies it and serves the export of the token's access, as its
// tcp node does for every request, so an export reaches over RDMA only
// the tenants that reach it over tcp. Daemons before tenants ask by name
// (segmentExchange), which reaches the default tenant's exports only.
const (
	segmentExchange      = "rdma.segment"
	segmentTokenExchange = "rdma.segment.token"
	revokeExchange       = "rdma.revoke"
	revokeTenantExchange = "rdma.revoke.tenant"
)

// Links is the daemon's RDMA end of the peer plane: the device, the pools'
// memory registrations (made once at start-up, for local use only: no peer
// can address a pool as a whole; kept in each pool's RDMA slot, see
// locals.go), one registration per export a peer asked
// for (with the export's rights as its remote access, dropped when the
// export ends; see exports.go), one outbound link per peer (a transport
// this daemon dials and submits on) and one accepting transport per peer
// (the peer's link lands there). Client buffers get a local registration
// when first used, kept on the buffer itself (locals.go).
//
// The peer plane asks Route for each remote target: a request whose local
// side is the pool or a registered client buffer and whose peer's link is
// up with the target segment resolved goes to that link; anything else
// goes to tcp and queues a job for the worker, which registers the buffer,
// connects the link over the peer channel and resolves the segment (asks
// its owner for the export's registration). Each peer's choice is logged
// once.
//
// Ownership: the peer plane creates it after its node and closes it (after
// the engine, the node and the control server, before the pools). It owns
// two goroutines, the worker and the registration queue's (regs.go), and
// the worker's runs of one peer's exchanges (at most one per peer, see
// worker), which end with their exchanges; Close stops them all
// (close(stop), close the queue, join), then closes the links' and the
// accepting transports, deregisters the exports and the pools (those of
// exports whose end is revoking them included), waits for the
// deregistrations unexports and segment teardowns are making and for the
// peers' accepts still making a transport (each closes its own), and
// closes the device, with nothing made from it left.
type Links struct {
	log  *slog.Logger
	dev  Device
	node *tcp.Node
	// exported is the daemon's export table, which peers resolve exports
	// in and deliver notifications to.
	exported *peer.Exports
	qps      int // queue pairs per link (rdma_qps)

	links atomic.Pointer[map[string]*rdmaLink] // copy on write, under mu

	jobs   chan *tcp.Remote
	regs   *regQueue      // client buffers to register (regs.go)
	prep   chan pinJob    // segments opened with transport rdma (pins.go)
	retire chan *rdmaLink // links whose peer runs a new epoch
	stop   chan struct{}
	wg     sync.WaitGroup

	// mu guards links' writers, accepted, said and closed.
	mu       sync.Mutex
	accepted map[string]acceptedPeer
	said     map[string]string // what was logged about each peer's transport
	closed   bool
	// accepting counts the accepts making a transport (added under mu
	// while not closed); Close waits for them before the device closes.
	accepting sync.WaitGroup

	// notesMu guards notes, the notified WRITEs' reusable notes
	// (notify.go).
	notesMu sync.Mutex
	notes   []*rdmaNote

	exports exportRegs
	locals  localRegs
	stats   rdmaStats
	// linkDown and localMissing fail requests of rdma-only segments
	// (pins.go).
	linkDown, localMissing *rdmaRefusal
}

type acceptedPeer struct {
	t     *rdma.Transport
	epoch uint64
}

// Config configures the links.
type Config struct {
	// Mode is "auto" (RDMA when a device is usable, else tcp, saying so),
	// "on" (New fails without a usable device) or "off".
	Mode string
	// Device and GID choose the device and its RoCE v2 GID ("": the first
	// active one, automatic); QPs is the queue pairs per peer link (0: 2).
	Device, GID string
	QPs         int
	// Open opens the device (default: rdma.Open); tests pass an
	// rdmatest fabric's.
	Open func(rdma.Config, *slog.Logger) (Device, error)
	// Log is the RDMA side's logger (default: the peer plane's).
	Log *slog.Logger
	// Homes are the reactor workers that post on the links and reap their
	// completions themselves (rdma.Config.Homes); nil: none.
	Homes *rdma.Homes
}

// Device is the RDMA device the links run on: *rdma.Device, or a device
// of an rdmatest fabric.
type Device interface {
	Name() string
	Port() int
	Addr() rdma.Addr
	RegisterAccess(mem []byte, access rdma.Access) (*rdma.Region, error)
	Deregister(r *rdma.Region) error
	NewTransport() (*rdma.Transport, error)
	Close() error
}

var _ Device = (*rdma.Device)(nil)

// New opens the device and registers the pools (one per tenant), or
// returns nil and why when RDMA is off or unusable here (logged once;
// peers then use tcp). With Mode on an unusable device is an error, which
// the peer plane reports as RDMA required.
func New(cfg Config, pools []xfer.MemSegment, node *tcp.Node, exports *peer.Exports, log *slog.Logger) (*Links, string, error) {
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
	dev, err := open(rdma.Config{Device: cfg.Device, GID: cfg.GID, QPs: cfg.QPs, Homes: cfg.Homes}, log)
	if err != nil {
		if cfg.Mode == "on" {
			return nil, "", fmt.Errorf("rdma = on, rdma_device = %q, rdma_gid = %q: %v", cfg.Device, cfg.GID, err)
		}
		log.Info("rdma unavailable: peers use tcp", "reason", err.Error())
		return nil, err.Error(), nil
	}
	p := newLinks(dev, node, exports, log)
	for _, pool := range pools {
		if err := p.registerPool(pool); err != nil {
			p.Close()
			if cfg.Mode == "on" {
				return nil, "", fmt.Errorf("rdma = on: registering pool %d: %v", pool.ID(), err)
			}
			log.Warn("rdma unavailable: registering a pool failed; peers use tcp", "segment", uint64(pool.ID()), "err", err)
			return nil, "registering the pool failed: " + err.Error(), nil
		}
	}
	p.qps = cfg.QPs
	return p, "", nil
}

// registerPool registers a pool for local use and puts its keys in the
// pool's RDMA slot, until Close.
func (p *Links) registerPool(pool xfer.MemSegment) error {
	regs := xfer.RegsOf(pool)
	if regs == nil {
		return fmt.Errorf("pool %d carries no registration slots", pool.ID())
	}
	start := time.Now()
	reg, err := p.dev.RegisterAccess(pool.Bytes()[:pool.Size()], rdma.AccessLocal)
	if err != nil {
		return err
	}
	if !p.addLocal(pool.ID(), regs, reg, true) {
		_ = p.dev.Deregister(reg)
		return fmt.Errorf("pool %d: its rdma slot is taken", pool.ID())
	}
	p.log.Info("pool registered for rdma (local access)", "device", p.dev.Name(), "segment", uint64(pool.ID()),
		"bytes", pool.Size(), "mrs", reg.Chunks(), "took", time.Since(start).Round(time.Microsecond).String())
	return nil
}

// newLinks wires the links over an opened device and starts their
// goroutines.
func newLinks(dev Device, node *tcp.Node, exports *peer.Exports, log *slog.Logger) *Links {
	p := &Links{
		log: log, dev: dev, node: node, exported: exports,
		jobs: make(chan *tcp.Remote, 64), prep: make(chan pinJob), retire: make(chan *rdmaLink, 16), stop: make(chan struct{}),
		accepted: map[string]acceptedPeer{}, said: map[string]string{},
		exports: exportRegs{m: map[*peer.Export]*exportReg{}, pending: map[*peer.Export]*pendingReg{}},
	}
	p.linkDown, p.localMissing = rdmaRefusals(&p.stats)
	p.regs = newRegQueue(log, p.registerLocal, p.routeRegistered)
	empty := map[string]*rdmaLink{}
	p.links.Store(&empty)
	_ = p.node.Handle(rdma.ExchangeKind, rdma.Acceptor(p.accept))
	_ = p.node.Handle(segmentExchange, p.serveSegmentByName)
	_ = p.node.Handle(segmentTokenExchange, p.serveSegment)
	_ = p.node.Handle(revokeExchange, p.serveRevoke)
	_ = p.node.Handle(revokeTenantExchange, p.serveRevokeTenant)
	_ = p.node.Handle(notifyExchange, p.serveNotify)
	p.wg.Add(2)
	go p.worker()
	go func() {
		defer p.wg.Done()
		p.regs.run()
	}()
	return p
}

// Route is the peer plane's question: the link to send a request between
// local and target over, or nil for tcp. It does not allocate.
func (p *Links) Route(local, target xfer.Segment) xfer.Transport {
	r, ok := target.(*tcp.Remote)
	if !ok {
		return nil
	}
	via := pinned(r)
	if via == wire.TransportTCP {
		p.stats.toTCP.Add(1)
		return nil
	}
	if p.localKeys(local) == nil {
		if via != wire.TransportRDMA {
			p.wantLocal(local)
			p.stats.toTCP.Add(1)
			return nil
		}
		// The client asked for rdma: the request waits for its buffer's
		// registration in the queue, off the submit path.
		if b, _ := clientBuffer(local); b == nil || p.regs.hasFailed(local.ID()) {
			return p.localMissing
		}
		return p.regs
	}
	// The link that resolved r left the owner's keys on it.
	if k := rdma.KeysOf(r); k != nil {
		if l, ok := k.Owner().(*rdmaLink); ok && l.p == p && l.epoch == r.Epoch() {
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
func (p *Links) routeRegistered(t *xfer.Task) xfer.Transport {
	tr := p.Route(t.Local, t.Target)
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

// Close stops the worker and closes every transport, the registrations and
// the device. Call it after the engine (no more submits) and before the
// pool is unmapped.
func (p *Links) Close() {
	p.mu.Lock()
	p.closed = true
	accepted := p.accepted
	p.accepted = map[string]acceptedPeer{}
	p.mu.Unlock()
	_ = p.node.Handle(rdma.ExchangeKind, nil)
	_ = p.node.Handle(segmentExchange, nil)
	_ = p.node.Handle(segmentTokenExchange, nil)
	_ = p.node.Handle(revokeExchange, nil)
	_ = p.node.Handle(revokeTenantExchange, nil)
	_ = p.node.Handle(notifyExchange, nil)
	close(p.stop)
	p.regs.close()
	p.wg.Wait()
	for peer, l := range *p.links.Load() {
		l.dropKeys()
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
	// An accept that made a transport meanwhile found the links closed
	// and closes it itself.
	p.accepting.Wait()
	if err := p.dev.Close(); err != nil {
		p.log.Warn("closing the rdma device", "err", err)
	}
}

// releases are deregistrations in progress that Close did not start and
// waits for before the device closes (a device with a region left fails
// to close).
type releases struct {
	wg sync.WaitGroup
	// mu guards n, the deregistrations in progress.
	mu sync.Mutex
	n  int
}

func (r *releases) add() {
	r.mu.Lock()
	r.n++
	r.wg.Add(1)
	r.mu.Unlock()
}

func (r *releases) done() {
	r.mu.Lock()
	r.n--
	r.mu.Unlock()
	r.wg.Done()
}

// wait waits for the deregistrations in progress (whose: for the log; a
// large one takes seconds). No add may start once wait has.
func (r *releases) wait(log *slog.Logger, whose string) {
	r.mu.Lock()
	n := r.n
	r.mu.Unlock()
	if n > 0 {
		log.Info("rdma: closing waits for deregistrations in progress", "whose", whose, "regions", n)
	}
	r.wg.Wait()
}

// Waiting is how many tasks wait for a client buffer's registration.
func (p *Links) Waiting() int { return p.regs.waiters() }

// PeerOf reports the peer whose link tr is, when tr is one of the links
// Route returns.
func PeerOf(tr xfer.Transport) (string, bool) {
	if l, ok := tr.(*rdmaLink); ok {
		return l.peer, true
	}
	return "", false
}
