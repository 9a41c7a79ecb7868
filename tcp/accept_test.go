package tcp

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestCloseLeavesNoAcceptedConn: peers keep dialing a node while it
// closes; once Close has returned, no socket of this process may have the
// node's listening address as its own, listener or accepted connection.
// A connection accepted during the shutdown and handed to no event loop
// would stay open (CLOSE_WAIT on the dialer's side once it hangs up) and
// be found here. Several rounds, since the window is narrow.
func TestCloseLeavesNoAcceptedConn(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "cluster")
	for round := range 12 {
		n, err := NewNode(Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: kf}, newExporter(), nil)
		if err != nil {
			t.Fatal(err)
		}
		addr := n.Addr()
		var stop atomic.Bool
		var dials atomic.Int64
		var mu sync.Mutex // guards held
		var held []net.Conn
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						continue // refused once the listener is closed
					}
					dials.Add(1)
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			}()
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return dials.Load() >= 50 }, "50 dials to the node")
		n.Close()
		stop.Store(true)
		wg.Wait()
		if left := socketsOn(t, addr); len(left) > 0 {
			t.Errorf("round %d: after Close, %d sockets still on the node's address %s: %v (after %d dials)",
				round, len(left), addr, left, dials.Load())
		}
		for _, c := range held {
			c.Close()
		}
	}
}

// socketsOn lists this process's sockets whose own address is addr.
func socketsOn(t *testing.T, addr string) []string {
	t.Helper()
	ap, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := testutil.OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for name, link := range fds {
		fd, err := strconv.Atoi(name)
		if err != nil || len(link) < 7 || link[:7] != "socket:" {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		var ip net.IP
		port := -1
		switch a := sa.(type) {
		case *unix.SockaddrInet4:
			ip, port = net.IP(a.Addr[:]), a.Port
		case *unix.SockaddrInet6:
			ip, port = net.IP(a.Addr[:]), a.Port
		}
		if port == ap.Port && ip.Equal(ap.IP) {
			out = append(out, fmt.Sprintf("fd %d -> %s (%s)", fd, link, testutil.DescribeSocket(link)))
		}
	}
	return out
}

// TestInboundSocketOptions: a connection a peer dialed has TCP_NODELAY
// (small frames are not held back) and the peer keep-alive
// (peerKeepAlive), set by the listener, not by gnet.
func TestInboundSocketOptions(t *testing.T) {
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	r, err := a.Open(b.ID(), "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b.mu.Lock()
	p := b.peers[a.ID()]
	b.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inbound) != 2 {
		t.Fatalf("%s holds %d inbound connections from %s, want 2", b.ID(), len(p.inbound), a.ID())
	}
	for c := range p.inbound {
		for _, o := range []struct {
			name       string
			level, opt int
			want       int
		}{
			{"TCP_NODELAY", unix.IPPROTO_TCP, unix.TCP_NODELAY, 1},
			{"SO_KEEPALIVE", unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			{"TCP_KEEPIDLE", unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(peerKeepAlive / time.Second)},
			{"TCP_KEEPINTVL", unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(peerKeepAlive / 5 / time.Second)},
			{"TCP_KEEPCNT", unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 5},
		} {
			if v, err := unix.GetsockoptInt(c.fd, o.level, o.opt); err != nil || v != o.want {
				t.Errorf("inbound connection %v: %s = %d, %v; want %d", c.g.RemoteAddr(), o.name, v, err, o.want)
			}
		}
	}
}
