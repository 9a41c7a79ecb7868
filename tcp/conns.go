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
