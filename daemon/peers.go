package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// peerPlane is the daemon's end of the peer data plane: the tcp node, the
// transport the router sends remote targets to, and the glue that lets the
// control server export segments to peers (tcp.Exporter) and open theirs
// (control.PeerPlane).
//
// Ownership: the daemon creates it in New (after the pool) and closes it in
// closeParts after the engine and before the other transports. The node's
// goroutines are its own (see package tcp); peerPlane starts none.
type peerPlane struct {
	node *tcp.Node
	tr   *peerTransport
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
	p.tr = &peerTransport{node: node, notes: make(map[xfer.Request]note)}
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
	if transport == control.TransportRDMA && p.rdma == nil {
		p.log.Info("remote segment refused: transport rdma asked for, and this daemon has no RDMA",
			"peer", peer, "name", segment, "why", p.noRDMA)
		return nil, fmt.Errorf("%w: %s/%s asked for transport rdma, and this daemon has no RDMA: %s",
			control.ErrUnavailable, peer, segment, p.noRDMA)
	}
	r, err := p.node.Open(peer, segment, tcp.Rights(rights))
	if err != nil {
		return nil, peerError(err)
	}
	if transport != control.TransportAuto && p.rdma != nil {
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

// AttachNotify implements control.PeerPlane.
func (p *peerPlane) AttachNotify(req xfer.Request, payload []byte, deadline time.Time) error {
	return p.tr.attach(req, payload, deadline)
}

// DetachNotify implements control.PeerPlane.
func (p *peerPlane) DetachNotify(req xfer.Request) { p.tr.take(req) }

// Peers implements control.PeerPlane.
func (p *peerPlane) Peers() []control.PeerInfo {
	ps := p.node.Peers()
	out := make([]control.PeerInfo, len(ps))
	for i, s := range ps {
		out[i] = control.PeerInfo{ID: []byte(s.ID), Addr: []byte(s.Addr), Epoch: s.Epoch, Connected: s.Connected,
			BytesIn: s.BytesIn, BytesOut: s.BytesOut, Errors: s.Errors}
	}
	return out
}

// Code implements control.PeerPlane.
func (p *peerPlane) Code(err error) (control.Code, bool) {
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

// note is a notification waiting for the task of its request.
type note struct {
	payload  []byte
	deadline time.Time
}

// peerTransport is the transport the router returns for remote targets:
// the node's, plus the hand-over of notifications. The control server
// attaches a notification to a request before the engine's submit; the
// engine dispatches on the submitting goroutine, so the task carrying that
// request is handed to the node with the notification set on it. A
// request with a notification is unique while attached (its target is a
// remote segment id that only one connection names, and that connection
// submits one call at a time and refuses duplicates within a call).
type peerTransport struct {
	node *tcp.Node
	// count is len(notes), read without mu so calls without notifications
	// take no lock.
	count atomic.Int64
	// mu guards notes.
	mu    sync.Mutex
	notes map[xfer.Request]note
}

var _ xfer.Transport = (*peerTransport)(nil)

func (t *peerTransport) attach(req xfer.Request, payload []byte, deadline time.Time) error {
	if len(payload) > tcp.MaxNotify {
		return fmt.Errorf("%w: notification of %d bytes (max %d)", xfer.ErrInvalid, len(payload), tcp.MaxNotify)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.notes[req]; dup {
		return fmt.Errorf("%w: a notification is attached to this request already", xfer.ErrInvalid)
	}
	t.notes[req] = note{payload: slices.Clone(payload), deadline: deadline}
	t.count.Add(1)
	return nil
}

func (t *peerTransport) take(req xfer.Request) (note, bool) {
	if t.count.Load() == 0 {
		return note{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.notes[req]
	if ok {
		delete(t.notes, req)
		t.count.Add(-1)
	}
	return n, ok
}

// Name implements xfer.Transport.
func (t *peerTransport) Name() string { return t.node.Name() }

// Submit implements xfer.Transport: it sets each task's notification on
// the node and hands the tasks over. A task whose notification cannot be
// set is ended with that error (never sent without it).
func (t *peerTransport) Submit(tasks []*xfer.Task) (int, error) {
	if t.count.Load() == 0 {
		return t.node.Submit(tasks)
	}
	done := 0
	for done < len(tasks) {
		i := done
		var failed error
		for ; i < len(tasks); i++ {
			nt, ok := t.take(tasks[i].Req)
			if !ok {
				continue
			}
			if err := t.node.SetNotify(tasks[i], nt.payload, nt.deadline); err != nil {
				failed = err
				break
			}
		}
		n, err := t.node.Submit(tasks[done:i])
		if err != nil {
			for _, x := range tasks[done+n : i] {
				t.node.ClearNotify(x)
			}
			return done + n, err
		}
		done = i
		if failed != nil {
			tasks[i].Done(0, failed)
			done = i + 1
		}
	}
	return len(tasks), nil
}

// Cancel implements xfer.Transport.
func (t *peerTransport) Cancel(task *xfer.Task) { t.node.Cancel(task) }

// Close implements xfer.Transport. The node is closed by the daemon (after
// the engine), not through the transport.
func (t *peerTransport) Close() error { return nil }
