package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// peerPlane is the daemon's end of the peer data plane: the tcp node (the
// transport the router sends remote targets to when RDMA does not carry
// them) and the glue that lets the control server export segments to peers
// (tcp.Exporter) and open theirs (control.PeerPlane). A notification rides
// its WRITE as the task's Notify, which the node (or the rdma link) reads
// from the task.
//
// Ownership: the daemon creates it in New (after the pool) and closes it
// right after the engine (drain.go: closing the node ends every dial,
// handshake and peer wait that a control call or the RDMA plane may still
// sit in), before the control server and the other transports. The node's
// goroutines are its own (see package tcp); peerPlane starts none.
type peerPlane struct {
	node *tcp.Node
	log  *slog.Logger
	// srv is the control server; nil until New has built it, so peer
	// requests that arrive before then find nothing exported.
	srv atomic.Pointer[control.Server]
	// rdma is the RDMA plane, or nil and noRDMA says why; New sets them
	// before the control server serves.
	rdma   *rdmaPlane
	noRDMA string
}

var (
	_ tcp.RightsExporter = (*peerPlane)(nil)
	_ control.PeerPlane  = (*peerPlane)(nil)
)

func newPeerPlane(cfg Config, dir directory.Directory, log *slog.Logger) (*peerPlane, error) {
	p := &peerPlane{log: log}
	peers := make([]directory.Peer, len(cfg.Peers))
	for i, pc := range cfg.Peers {
		peers[i] = directory.Peer{ID: pc.ID, Addr: pc.Addr}
	}
	node, err := tcp.NewNode(tcp.Config{
		DaemonID:       cfg.DaemonID,
		Listen:         cfg.PeerListen,
		Advertise:      cfg.PeerAdvertise,
		ClusterKeyFile: cfg.ClusterKeyFile,
		ConnsPerPeer:   cfg.PeerConns,
		SliceSize:      int(cfg.PeerSliceSize),
		Peers:          peers,
		Directory:      dir,
	}, p, log)
	if err != nil {
		return nil, fmt.Errorf("peer plane (peer_listen = %q, cluster_key_file = %q): %w", cfg.PeerListen, cfg.ClusterKeyFile, err)
	}
	p.node = node
	ids := make([]string, len(cfg.Peers))
	for i, pc := range cfg.Peers {
		ids[i] = pc.ID + "=" + pc.Addr
	}
	log.Info("peer plane up", "daemon_id", cfg.DaemonID, "listen", node.Addr(),
		"epoch", fmt.Sprintf("%#x", node.Epoch()), "peers", ids)
	return p, nil
}

// close stops the node: every request in flight fails, every connection
// closes.
func (p *peerPlane) close() {
	if err := p.node.Close(); err != nil {
		p.log.Warn("closing the peer plane", "err", err)
	}
}

// Lookup implements tcp.Exporter over the control server's exports.
func (p *peerPlane) Lookup(name string) (xfer.MemSegment, error) {
	s := p.srv.Load()
	if s == nil {
		return nil, fmt.Errorf("%w: %q (not serving yet)", tcp.ErrNotFound, name)
	}
	return s.Lookup(name)
}

// Granted implements tcp.RightsExporter: a peer may open an export only
// with the rights its owner granted when exporting it.
func (p *peerPlane) Granted(name string) (tcp.Rights, bool) {
	s := p.srv.Load()
	if s == nil {
		return 0, false
	}
	r, ok := s.Granted(name)
	return tcp.Rights(r), ok
}

// Deliver implements tcp.Exporter: the notification goes to the
// connections subscribed to name; an error makes the writer's task fail.
func (p *peerPlane) Deliver(name string, payload []byte) error {
	s := p.srv.Load()
	if s == nil {
		return fmt.Errorf("%w: %q (not serving yet)", tcp.ErrNotFound, name)
	}
	return s.Deliver(name, payload)
}

// OpenRemote implements control.PeerPlane. With TransportRDMA the segment
// is usable over RDMA when it returns (link up, registration resolved), or
// the open fails UNAVAILABLE saying why.
func (p *peerPlane) OpenRemote(peer, segment string, rights, transport uint8) (control.RemoteSegment, error) {
	if transport == wire.TransportRDMA && p.rdma == nil {
		p.log.Info("remote segment refused: transport rdma asked for, and this daemon has no RDMA",
			"peer", peer, "name", segment, "why", p.noRDMA)
		return nil, fmt.Errorf("%w: %s/%s asked for transport rdma, and this daemon has no RDMA: %s",
			control.ErrUnavailable, peer, segment, p.noRDMA)
	}
	r, err := p.node.Open(peer, segment, tcp.Rights(rights))
	if err != nil {
		return nil, peerError(err)
	}
	if transport != wire.TransportAuto && p.rdma != nil {
		if err := p.rdma.pin(r, transport); err != nil {
			_ = r.Close()
			p.log.Info("remote segment refused: transport rdma cannot be set up", "peer", peer, "name", segment, "err", err)
			return nil, fmt.Errorf("%w: %s/%s with transport rdma: %w", control.ErrUnavailable, peer, segment, err)
		}
	}
	return r, nil
}

// peerError adds the control sentinel a client's code is mapped from to
// the node's errors that xfer's sentinels do not cover.
func peerError(err error) error {
	switch {
	case errors.Is(err, tcp.ErrUnknownPeer), errors.Is(err, tcp.ErrNotFound):
		return fmt.Errorf("%w: %w", control.ErrNotFound, err)
	case errors.Is(err, xfer.ErrInvalid), errors.Is(err, xfer.ErrPermission), errors.Is(err, xfer.ErrTimeout),
		errors.Is(err, xfer.ErrClosed):
		return err
	}
	return fmt.Errorf("%w: %w", control.ErrUnavailable, err)
}

// Peers implements control.PeerPlane.
func (p *peerPlane) Peers() []wire.PeerInfo {
	ps := p.node.Peers()
	out := make([]wire.PeerInfo, len(ps))
	for i, s := range ps {
		out[i] = wire.PeerInfo{ID: []byte(s.ID), Addr: []byte(s.Addr), Epoch: s.Epoch, Connected: s.Connected,
			BytesIn: s.BytesIn, BytesOut: s.BytesOut, Errors: s.Errors}
	}
	return out
}

// Code implements control.PeerPlane.
func (p *peerPlane) Code(err error) (wire.Code, bool) {
	switch {
	case errors.Is(err, tcp.ErrNotFound), errors.Is(err, tcp.ErrUnknownPeer):
		return tcproto.CodeNOT_FOUND, true
	case errors.Is(err, tcp.ErrNotifyRejected):
		return tcproto.CodeFAILED_PRECONDITION, true
	case errors.Is(err, tcp.ErrConnLost), errors.Is(err, tcp.ErrAuth), errors.Is(err, tcp.ErrRefused),
		errors.Is(err, tcp.ErrStaleEpoch), errors.Is(err, tcp.ErrProtocol), errors.Is(err, tcp.ErrFrame):
		return tcproto.CodeUNAVAILABLE, true
	}
	return 0, false
}
