package tcp

// Dialing a peer: finding it (peerFor), connecting its sessions (dial,
// dialOne) and adopting what its hello says (peerSeen).

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/xfer"
)

func (n *Node) peerFor(id string) (*peer, error) {
	if _, ok := n.dir.Lookup(id); !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPeer, id)
	}
	return n.peer(id, true), nil
}

// dial opens the peer's session: ConnsPerPeer connections, each dialed and
// authenticated within HandshakeTimeout. Only the peer's pump calls it.
func (n *Node) dial(p *peer) error {
	dp, ok := n.dir.Lookup(p.id)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPeer, p.id)
	}
	if dp.Addr == "" {
		return fmt.Errorf("%w: %q has no address yet (it is accepted when it dials in, and tells its address then)", ErrUnknownPeer, p.id)
	}
	conns := make([]*conn, 0, n.cfg.ConnsPerPeer)
	closeAll := func() {
		for _, c := range conns {
			_ = c.g.Close()
		}
	}
	var hs hello
	for i := 0; i < n.cfg.ConnsPerPeer; i++ {
		c, h, err := n.dialOne(p, dp.Addr)
		if err == nil && i > 0 && h.epoch != hs.epoch {
			_ = c.g.Close()
			err = fmt.Errorf("%w: peer %s changed epoch while we dialed", ErrProtocol, p.id)
		}
		if err != nil {
			closeAll()
			p.errs.Add(1)
			return err
		}
		hs = h
		conns = append(conns, c)
	}
	p.mu.Lock()
	old := p.adoptEpochLocked(hs.epoch)
	p.blob = hs.blob
	p.slice.Store(int64(min(n.cfg.SliceSize, int(hs.maxFrame), int(min(hs.window, 1<<30)))))
	for _, c := range conns {
		if !c.closed {
			p.sess = append(p.sess, c)
		}
	}
	p.wakeLocked()
	p.mu.Unlock()
	n.peerSeen(p, hs.addr, hs.epoch, old)
	n.log.Info("peer session open", "peer", p.id, "addr", dp.Addr, "epoch", fmt.Sprintf("%#x", hs.epoch), "conns", len(conns))
	return nil
}

// peerSeen closes what a new epoch replaced and records the epoch.
func (n *Node) peerSeen(p *peer, addr string, epoch uint64, old []*conn) {
	if len(old) > 0 {
		n.log.Info("peer has a new epoch: its old session is closed", "peer", p.id, "epoch", fmt.Sprintf("%#x", epoch), "closed_conns", len(old))
	}
	for _, c := range old {
		_ = c.g.Close()
	}
	upd := directory.Peer{ID: p.id, Epoch: epoch}
	if dp, known := n.dir.Lookup(p.id); known && dp.Addr == "" {
		// Listed without an address: the one it advertises is where to
		// dial it.
		upd.Addr = addr
	}
	if err := n.dir.Update(upd); err != nil {
		n.log.Warn("directory update", "peer", p.id, "err", err)
	}
}

// dialOne connects, authenticates and hands the connection to the event
// loops.
func (n *Node) dialOne(p *peer, addr string) (*conn, hello, error) {
	d := net.Dialer{Timeout: n.cfg.HandshakeTimeout, KeepAliveConfig: peerKeepAliveConfig}
	nc, err := d.DialContext(n.ctx, "tcp", addr)
	if err != nil {
		if n.closed.Load() {
			return nil, hello{}, xfer.ErrClosed
		}
		return nil, hello{}, fmt.Errorf("%w: dial %s at %s: %w", ErrConnLost, p.id, addr, err)
	}
	// Close interrupts a handshake the peer never answers.
	stop := context.AfterFunc(n.ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	hs, err := n.clientHandshake(nc, p)
	stop()
	if err != nil {
		nc.Close()
		if n.closed.Load() {
			return nil, hs, xfer.ErrClosed
		}
		return nil, hs, err
	}
	c := &conn{n: n, role: roleClient, created: time.Now(), peer: p, epoch: hs.epoch, remote: nc.RemoteAddr().String(), reqs: make(map[uint64]*pending),
		window: min(n.cfg.MaxInflightBytes, int64(min(hs.window, 1<<62))), wkick: make(chan struct{}, 1)}
	// The writer's own descriptor, taken before gnet takes the socket
	// (writer.go).
	if c.wfd, err = writerFD(nc); err != nil {
		nc.Close()
		return nil, hs, fmt.Errorf("%w: connection to %s: %w", ErrConnLost, p.id, err)
	}
	n.lifeMu.RLock()
	if n.closed.Load() {
		n.lifeMu.RUnlock()
		nc.Close()
		c.closeWriterFD()
		return nil, hs, xfer.ErrClosed
	}
	_, err = n.cli.EnrollContext(nc, c)
	if err != nil || c.g == nil {
		n.lifeMu.RUnlock()
		c.closeWriterFD()
		return nil, hs, fmt.Errorf("%w: enroll connection to %s: %v", ErrConnLost, p.id, err)
	}
	n.writerWG.Add(1)
	go c.writer()
	n.lifeMu.RUnlock()
	return c, hs, nil
}

func (h *cliHandler) OnOpen(g gnet.Conn) ([]byte, gnet.Action) {
	if c, ok := g.Context().(*conn); ok {
		c.g, c.fd = g, g.Fd()
	}
	return nil, gnet.None
}
