package tcp

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// ConnAddr is one authenticated connection with a peer.
type ConnAddr struct {
	Peer     string
	Outbound bool // this node dialed it
	// Local and Remote are the connection's addresses as this node sees
	// them.
	Local, Remote netip.AddrPort
}

// ConnAddrs reports every authenticated connection with a peer, for
// naming kernel-side per-connection figures (retransmits) by peer.
//
// A connection's addresses are read from its socket (getsockname and
// getpeername: an accepted connection's recorded local address is the
// listener's) while it is in its peer's session or inbound set under the
// peer's lock: both OnClose handlers take it out of there under that lock
// before the event loop closes the descriptor.
func (n *Node) ConnAddrs() []ConnAddr {
	n.mu.Lock()
	peers := make([]*peer, 0, len(n.peers))
	for _, p := range n.peers {
		peers = append(peers, p)
	}
	n.mu.Unlock()
	var out []ConnAddr
	add := func(p *peer, c *conn, outbound bool) {
		fd := c.g.Fd()
		ls, lerr := unix.Getsockname(fd)
		rs, rerr := unix.Getpeername(fd)
		l, lok := addrPort(ls)
		r, rok := addrPort(rs)
		if lerr == nil && rerr == nil && lok && rok {
			out = append(out, ConnAddr{Peer: p.id, Outbound: outbound, Local: l, Remote: r})
		}
	}
	for _, p := range peers {
		p.mu.Lock()
		for _, c := range p.sess {
			add(p, c, true)
		}
		for c := range p.inbound {
			add(p, c, false)
		}
		p.mu.Unlock()
	}
	return out
}

func addrPort(sa unix.Sockaddr) (netip.AddrPort, bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), true
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), true
	}
	return netip.AddrPort{}, false
}

// DropStalled closes this node's connections carrying its requests to
// peerID whose sockets are stalled (stalledTCP: bytes the peer has not
// acknowledged, retransmitted on a backed-off timer), and returns how many
// it closed. They leave the peer's session at once, so the next request
// dials afresh instead of finding only connections on their way out. It
// is for a caller that has just heard from the peer again after taking it
// for gone: a network cut leaves the connections open, and once it heals
// their bytes wait for TCP's next retransmission, backed off to seconds,
// while a new connection goes at once; long before RequestTimeout, after
// which the reaper would drop them itself. A connection whose bytes are
// acknowledged stays, however slow its answers (a busy handler, or a
// stopped process whose kernel still acknowledges), and so do the peer's
// connections to this node. The requests in flight on a closed one end
// with ErrConnLost when its event loop closes it.
func (n *Node) DropStalled(peerID, reason string) int {
	n.mu.Lock()
	p := n.peers[peerID]
	n.mu.Unlock()
	if p == nil {
		return 0
	}
	var drop []*conn
	p.mu.Lock()
	keep := p.sess[:0]
	for _, c := range p.sess {
		// The descriptor is open while c is in the session: OnClose
		// takes it out under p.mu before the event loop closes it.
		if !c.dropping && connStalled(c) {
			c.dropping = true
			drop = append(drop, c)
			continue
		}
		keep = append(keep, c)
	}
	clear(p.sess[len(keep):])
	p.sess = keep
	if len(drop) > 0 {
		p.wakeLocked() // a pump waiting on them dials instead
	}
	p.mu.Unlock()
	for _, c := range drop {
		p.errs.Add(1)
		n.log.Warn("dropping peer connection", append(c.logger(), "reason", reason)...)
		_ = c.g.Close()
	}
	return len(drop)
}

// connStalled reports whether c's socket is stalled (stalledTCP); c is in
// its peer's session, under the peer's lock. Tests replace it.
var connStalled = func(c *conn) bool {
	ti, err := unix.GetsockoptTCPInfo(c.g.Fd(), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && stalledTCP(ti)
}

// stalledTCP reports whether a socket's TCP state (TCP_INFO) says it is
// stalled: it has bytes the peer has not acknowledged and retransmits
// them on a timer that has backed off (or is retransmitting now). A
// socket held up by the peer's full receive window (zero-window probes)
// has nothing unacknowledged: not stalled.
func stalledTCP(ti *unix.TCPInfo) bool {
	return ti.Unacked > 0 && (ti.Backoff > 0 || ti.Retransmits > 0)
}
