package plane

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma/link"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Config configures a Plane.
type Config struct {
	// Node configures the tcp node: this daemon's id, where it listens and
	// what it advertises, the cluster key, connections per peer, the
	// configured peers and the directory it finds them in.
	Node tcp.Config
	// Resolver, when set (the etcd directory, which is Node.Directory
	// too), decides per request lane how OpenRemote looks a peer up, and
	// learns from what the owners answer.
	Resolver Resolver
	// RDMA configures the RDMA side.
	RDMA RDMAConfig
	// Pools are the DRAM pools requests to peers move from and into; each
	// is registered for RDMA once, at start-up, for local use only.
	Pools []xfer.MemSegment
}

// RDMAConfig configures the plane's RDMA side (package rdma/link).
type RDMAConfig = link.Config

// Device is the RDMA device the plane runs on: *rdma.Device, or a device
// of an rdmatest fabric.
type Device = link.Device

// Plane is the daemon's end of the peer data plane: the tcp node (sessions
// with the other daemons, the transport remote targets go to when RDMA
// does not carry them), the exports it serves peers from, and the RDMA
// plane when a device is usable (one link per peer, the registrations of
// the pools, of client buffers and of the exports peers resolved). A
// notification rides its WRITE as the task's Notify, which the node (or
// the rdma link) reads from the task.
//
// Ownership and stop order: the daemon creates it (after the pools and the
// export table, before the engine) and stops it in two steps. Stop, right
// after the engine, closes the node: every dial, handshake and peer wait a
// control call or the RDMA plane may still sit in ends. Close, after the
// control server and the store and before the pools, stops the RDMA
// plane's goroutines (its worker and registration queue: see link.Links)
// and releases its links, registrations and device. The node's goroutines
// are its own (see package tcp).
type Plane struct {
	node    *tcp.Node
	exports *peer.Exports
	dir     Resolver // nil with the embedded directory
	log     *slog.Logger
	// rdma is the RDMA plane, or nil and noRDMA says why; rdmaOff is
	// whether it is off by config.
	rdma    *link.Links
	noRDMA  string
	rdmaOff bool

	stopOnce sync.Once
}

// New starts the tcp node over exports (the node listens when New
// returns) and the RDMA plane, when RDMA is on or auto and a device is
// usable. With RDMA on and none usable it fails with an error wrapping
// ErrRDMARequired.
func New(cfg Config, exports *peer.Exports, log *slog.Logger) (*Plane, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Plane{exports: exports, dir: cfg.Resolver, log: log}
	node, err := tcp.NewNode(cfg.Node, nodeExports{exports}, log)
	if err != nil {
		return nil, err
	}
	p.node = node
	ids := make([]string, len(cfg.Node.Peers))
	for i, pc := range cfg.Node.Peers {
		ids[i] = pc.ID + "=" + pc.Addr
	}
	log.Info("peer plane up", "daemon_id", cfg.Node.DaemonID, "listen", node.Addr(),
		"epoch", fmt.Sprintf("%#x", node.Epoch()), "peers", ids)
	rlog := cfg.RDMA.Log
	if rlog == nil {
		rlog = log
	}
	if p.rdma, p.noRDMA, err = link.New(cfg.RDMA, cfg.Pools, node, exports, rlog); err != nil {
		p.Stop()
		return nil, fmt.Errorf("%w: %v", ErrRDMARequired, err)
	}
	p.rdmaOff = cfg.RDMA.Mode == "off"
	return p, nil
}

// nodeExports is the export table as the tcp node serves peers from it.
type nodeExports struct{ *peer.Exports }

var _ tcp.Exporter = nodeExports{}

// Lookup implements tcp.Exporter: the export a peer's client reaches as
// a (peer.Exports.Resolve), with the rights its owner granted.
func (x nodeExports) Lookup(a tcp.Access) (xfer.MemSegment, tcp.Rights, error) {
	e, err := x.Resolve(a.Tenant, a.Owner, a.Name)
	if err != nil {
		return nil, 0, err
	}
	return e.Segment(), tcp.Rights(e.Rights()), nil
}

// Deliver implements tcp.Exporter: a notification rides a WRITE, so the
// export must grant write access now. The peer's token only says what the
// name granted when the token was issued: the name may since have been
// unexported and exported again read-only, within the token's life.
func (x nodeExports) Deliver(a tcp.Access, payload []byte) error {
	e, err := x.Resolve(a.Tenant, a.Owner, a.Name)
	if err != nil {
		return err
	}
	if e.Rights()&wire.RightWrite == 0 {
		return fmt.Errorf("%w: %q is not exported for writing", xfer.ErrPermission, a.Name)
	}
	return e.Deliver(payload)
}

// Node is the tcp node the plane runs on.
func (p *Plane) Node() *tcp.Node { return p.node }

// Stop closes the node: every request in flight fails, every connection
// closes. Call it after the engine.
func (p *Plane) Stop() {
	p.stopOnce.Do(func() {
		if err := p.node.Close(); err != nil {
			p.log.Warn("closing the peer plane", "err", err)
		}
	})
}

// Close stops the RDMA plane and releases what it holds (see Plane); it
// stops the node too when Stop was not called. Call it after the engine,
// the control server and the store, before the pools are unmapped.
func (p *Plane) Close() {
	if p.rdma != nil {
		p.rdma.Close()
	}
	p.Stop()
}

// Route is where a request whose target is a remote segment goes: the
// target peer's rdma link when RDMA carries it, else the tcp node. It
// does not allocate.
func (p *Plane) Route(local, target xfer.Segment) xfer.Transport {
	if p.rdma != nil {
		if l := p.rdma.Route(local, target); l != nil {
			return l
		}
	}
	return p.node
}

// OpenRemote opens segment on daemon peerID with rights (wire.RightRead |
// wire.RightWrite), for a client of ctx.Tenant: segment is the export of
// that tenant's name there when ctx.Owner is "" or that tenant, else the
// export of tenant ctx.Owner, which must grant ctx.Tenant (the open fails
// with xfer.ErrPermission otherwise). With TransportRDMA the segment is usable over RDMA
// when it returns (link up, registration resolved), or the open fails
// with peer.ErrUnavailable saying why; TransportTCP keeps its requests on tcp.
// With a Resolver the peer is first looked up as ctx's lane allows.
func (p *Plane) OpenRemote(ctx peer.OpenContext, peerID, segment string, rights, transport uint8) (peer.RemoteSegment, error) {
	a := tcp.Access{Tenant: peer.WireTenant(ctx.Tenant), Owner: peer.WireTenant(ctx.Owner), Name: segment}
	if a.Owner == a.Tenant {
		a.Owner = ""
	}
	if p.dir != nil {
		return p.openResolved(ctx, peerID, a, rights, transport)
	}
	r, err := p.open(peerID, a, rights, transport)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// open opens at the address the node knows.
func (p *Plane) open(peerID string, a tcp.Access, rights, transport uint8) (*tcp.Remote, error) {
	segment := a.Name
	if transport == wire.TransportRDMA && p.rdma == nil {
		p.log.Info("remote segment refused: transport rdma asked for, and this daemon has no RDMA",
			"peer", peerID, "name", segment, "why", p.noRDMA)
		return nil, fmt.Errorf("%w: %s/%s asked for transport rdma, and this daemon has no RDMA: %s",
			peer.ErrUnavailable, peerID, segment, p.noRDMA)
	}
	r, err := p.node.OpenAs(peerID, a, tcp.Rights(rights))
	if err != nil {
		return nil, nodeError(err)
	}
	if transport != wire.TransportAuto && p.rdma != nil {
		if err := p.rdma.Pin(r, transport); err != nil {
			_ = r.Close()
			p.log.Info("remote segment refused: transport rdma cannot be set up", "peer", peerID, "name", segment, "err", err)
			return nil, fmt.Errorf("%w: %s/%s with transport rdma: %w", peer.ErrUnavailable, peerID, segment, err)
		}
	}
	return r, nil
}

// nodeError adds the sentinel a client's code is mapped from to the
// node's errors that xfer's sentinels do not cover.
func nodeError(err error) error {
	switch {
	case errors.Is(err, tcp.ErrUnknownPeer), errors.Is(err, tcp.ErrNotFound):
		return fmt.Errorf("%w: %w", peer.ErrNotFound, err)
	case errors.Is(err, xfer.ErrInvalid), errors.Is(err, xfer.ErrPermission), errors.Is(err, xfer.ErrTimeout),
		errors.Is(err, xfer.ErrClosed):
		return err
	}
	return fmt.Errorf("%w: %w", peer.ErrUnavailable, err)
}

// Peers reports the peers the node knows.
func (p *Plane) Peers() []wire.PeerInfo {
	ps := p.node.Peers()
	out := make([]wire.PeerInfo, len(ps))
	for i, s := range ps {
		out[i] = wire.PeerInfo{ID: []byte(s.ID), Addr: []byte(s.Addr), Epoch: s.Epoch, Connected: s.Connected,
			BytesIn: s.BytesIn, BytesOut: s.BytesOut, Errors: s.Errors}
	}
	return out
}

// Member is this daemon as the directory lists it: its id, epoch, peer
// address, capabilities and, with RDMA, its addressing.
func (p *Plane) Member() directory.Member {
	m := directory.Member{ID: p.node.ID(), Epoch: p.node.Epoch(), Addr: p.node.Addr(), Caps: []string{"tcp", "notify"}}
	if p.rdma != nil {
		i := p.rdma.Info()
		m.RDMA = &directory.RDMAAddr{Device: i.Device, Port: i.Port, GID: i.GID, MTU: i.MTU}
		m.Caps = append(m.Caps, "rdma")
	}
	return m
}

// Counters appends the RDMA plane's counters to dst (nothing without
// RDMA).
func (p *Plane) Counters(dst []wire.Counter) []wire.Counter {
	if p.rdma == nil {
		return dst
	}
	return p.rdma.Counters(dst)
}

// Abandoned is what the plane still holds for one peer when a drain gives
// up: tcp requests queued and on the wire, tasks posted on its rdma link.
type Abandoned struct {
	Peer, Transport  string
	Queued, InFlight int
}

// Abandoned reports, from the engine's count of tasks still owed a Done
// per transport, what the plane holds per peer and transport, and how many
// tasks wait for a client buffer's RDMA registration.
func (p *Plane) Abandoned(outstanding map[xfer.Transport]int) (peers []Abandoned, waitingRegistration int) {
	for _, s := range p.node.Peers() {
		if s.Queued+s.InFlight > 0 {
			peers = append(peers, Abandoned{Peer: s.ID, Transport: "tcp", Queued: s.Queued, InFlight: s.InFlight})
		}
	}
	if p.rdma == nil {
		return peers, 0
	}
	byLink := map[string]int{}
	for tr, n := range outstanding {
		if peer, ok := link.PeerOf(tr); ok {
			byLink[peer] += n
		}
	}
	for _, peer := range slices.Sorted(maps.Keys(byLink)) {
		peers = append(peers, Abandoned{Peer: peer, Transport: "rdma", InFlight: byLink[peer]})
	}
	return peers, p.rdma.Waiting()
}

// RDMAOff is the RDMA report of a daemon whose peer plane runs no RDMA,
// saying why (control.RDMAReporter).
type RDMAOff string

// NoPlane is the report of a daemon without a peer plane.
const NoPlane RDMAOff = "no peer plane (peer_listen is not set): RDMA is set up over it"

// RDMAInfo reports RDMA off, and why.
func (r RDMAOff) RDMAInfo() wire.RDMAResponse {
	return wire.RDMAResponse{State: wire.RDMAOff, Reason: string(r)}
}

// RDMAInfo is what `tcctl rdma` shows (control.RDMAReporter): the RDMA
// plane's device, port and GID, the pools' registration and each peer's
// link; or, without an RDMA plane, whether RDMA is off or unavailable and
// why.
func (p *Plane) RDMAInfo() wire.RDMAResponse {
	switch {
	case p.rdma != nil:
		return p.rdma.Info()
	case p.rdmaOff:
		return wire.RDMAResponse{State: wire.RDMAOff, Reason: p.noRDMA}
	}
	return wire.RDMAResponse{State: wire.RDMAUnavailable, Reason: p.noRDMA}
}
