package tcp

// The Node: NewNode (listener, client, reaper), its accessors, Close in
// the package's stop order, and what it reports about peers and the
// remote segments it opened.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/xfer"
)

// Exporter is what the daemon implements to serve peers.
type Exporter interface {
	// Lookup returns the segment local clients exported that a peer's
	// request for a reaches, and the rights its export grants; an error
	// wrapping xfer.ErrPermission when a's tenant may not reach it (the
	// peer is answered permission denied), any other error when there is
	// none (not found). Nothing is exported by default. It is asked at
	// open and again for every request, so an access ends with its
	// export. It must not block.
	Lookup(a Access) (xfer.MemSegment, Rights, error)
	// Deliver hands a notification to the client owning the export a
	// reaches, after the data of its WRITE has landed. It runs on an
	// event loop and must not block; payload is valid only during the
	// call. The writer gets a positive ACK only when Deliver returns nil.
	Deliver(a Access, payload []byte) error
}

// PeerStats is one peer as `tcctl peers` shows it.
type PeerStats struct {
	ID        string
	Addr      string
	Epoch     uint64
	Connected bool
	Conns     int // outbound connections in the session
	Inbound   int // authenticated connections the peer dialed
	Queued    int // tasks waiting for a session or for flow-control room
	InFlight  int // requests sent and not yet answered
	BytesIn   uint64
	BytesOut  uint64
	Errors    uint64
}

// RemoteInfo is one opened remote segment as `tcctl segments --remote`
// shows it.
type RemoteInfo struct {
	Peer    string
	Name    string
	ID      xfer.SegmentID
	Size    uint64
	Rights  Rights
	Epoch   uint64
	Expires time.Time
}

// Node is this daemon's end of the TCP data plane. It implements
// xfer.Transport.
type Node struct {
	cfg    Config
	log    *slog.Logger
	exp    Exporter
	dir    directory.Directory
	hsKey  []byte // handshake MAC key, derived from the cluster key
	tokKey []byte // token MAC key, derived from the cluster key
	epoch  uint64
	addr   string // advertised address
	bound  string // the listener's own address (closeStrays)
	lim    limits

	srvEng  gnet.Engine // set in OnBoot, before NewNode returns
	srvDone chan error
	cli     *gnet.Client

	done       chan struct{} // closed when Close starts
	reaperDone chan struct{}
	// ctx is canceled when Close starts; dials and handshakes run under it.
	ctx    context.Context
	cancel context.CancelFunc
	// pumpWG counts the peers' pump goroutines (pump.go); Close waits.
	pumpWG sync.WaitGroup
	// writerWG counts the writers of dialed connections (writer.go); Close
	// waits once the connections are closed.
	writerWG sync.WaitGroup
	// refusals rate-limits the log of refused peers.
	refusals refusalLog
	// renewWG counts token renewals in flight (tokens.go); Close waits.
	renewWG   sync.WaitGroup
	closeOnce sync.Once
	closed    atomic.Bool
	// ready is set once addr, dir and cli are in place; the listener turns
	// connections away before that.
	ready atomic.Bool
	// lifeMu orders Close against dialers: a dialer enrolls a connection
	// only under the read lock with closed false.
	lifeMu sync.RWMutex

	active atomic.Int64 // dispatched tasks not yet Done (see taskGone)
	// idle has a value when active fell to zero after Close began.
	idle   chan struct{}
	nextID atomic.Uint64
	segID  atomic.Uint64

	// mu guards peers, remotes and handshaking.
	mu          sync.Mutex
	peers       map[string]*peer
	remotes     map[*Remote]struct{}
	handshaking dueHeap[*conn] // inbound connections not yet authenticated, by handshake deadline

	// hmu guards handlers.
	hmu      sync.RWMutex
	handlers map[string]Handler
	// exchSem bounds the exchange handlers running at once; exchWG counts
	// them (each is a goroutine this node owns, joined by Close).
	exchSem chan struct{}
	exchWG  sync.WaitGroup

	pendPool sync.Pool
	taskPool sync.Pool

	// pumpTried, set by tests before the first Submit, runs on a pump
	// each time it tried to send a task, with what came of it, before it
	// takes p.mu again (pump.go). Nil outside tests.
	pumpTried func(p *peer, st sendState)
}

var _ xfer.Transport = (*Node)(nil)

// NewNode validates cfg, loads the cluster key, starts the listener and
// the client event loops, and returns a running Node.
func NewNode(cfg Config, exp Exporter, log *slog.Logger) (*Node, error) {
	if exp == nil {
		return nil, fmt.Errorf("%w: nil Exporter", ErrConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	key, err := readClusterKey(cfg.ClusterKeyFile)
	if err != nil {
		return nil, err
	}
	epoch := cfg.Epoch
	for epoch == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		epoch = binary.LittleEndian.Uint64(b[:])
	}
	n := &Node{
		cfg:        cfg,
		log:        log.With("component", "tcp", "daemon", cfg.DaemonID),
		exp:        exp,
		hsKey:      deriveKey(key, "tensorcast handshake v1"),
		tokKey:     deriveKey(key, "tensorcast token v1"),
		epoch:      epoch,
		lim:        limits{maxPayload: uint32(cfg.MaxFrame), maxMeta: 8192},
		srvDone:    make(chan error, 1),
		done:       make(chan struct{}),
		reaperDone: make(chan struct{}),
		idle:       make(chan struct{}, 1),
		peers:      make(map[string]*peer),
		remotes:    make(map[*Remote]struct{}),
		handlers:   make(map[string]Handler),
		exchSem:    make(chan struct{}, maxExchangeHandlers),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.pendPool.New = func() any { return &pending{node: n} }
	n.taskPool.New = func() any { return new(taskState) }

	opts := []gnet.Option{
		gnet.WithMulticore(true),
		gnet.WithReadBufferCap(readBufferCap),
		gnet.WithWriteBufferCap(256 << 10),
		gnet.WithLogger(gnetLogger{n.log}),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReuseAddr(true),
		gnet.WithTCPKeepAlive(peerKeepAlive),
	}
	booted := make(chan struct{})
	srv := &srvHandler{n: n, booted: booted}
	go func() {
		n.srvDone <- gnet.Run(srv, "tcp://"+cfg.Listen, opts...)
	}()
	select {
	case <-booted:
	case err := <-n.srvDone:
		n.cancel()
		return nil, fmt.Errorf("tcp: listen on %s: %w", cfg.Listen, err)
	}
	bound, err := n.boundAddr()
	if err != nil {
		// gnet calls OnBoot before it starts its event loops; one that
		// failed to start (out of descriptors, say) has closed the
		// listener, and Run's error, due at once, says why.
		t := time.NewTimer(time.Second)
		select {
		case rerr := <-n.srvDone:
			t.Stop()
			n.cancel()
			return nil, fmt.Errorf("tcp: listen on %s: the event loops did not start: %w (%v)", cfg.Listen, rerr, err)
		case <-t.C:
		}
		n.stopServer()
		return nil, err
	}
	n.bound = bound
	n.addr = cfg.Advertise
	if n.addr == "" {
		n.addr = bound
	}
	if cfg.Directory != nil {
		n.dir = cfg.Directory
		if err := n.dir.Update(directory.Peer{ID: cfg.DaemonID, Epoch: epoch}); err != nil {
			n.stopServer()
			return nil, err
		}
	} else {
		d, err := directory.NewEmbedded(directory.Peer{ID: cfg.DaemonID, Addr: n.addr, Epoch: epoch}, cfg.Peers)
		if err != nil {
			n.stopServer()
			return nil, fmt.Errorf("%w: Peers: %w", ErrConfig, err)
		}
		n.dir = d
	}
	n.cli, err = gnet.NewClient(&cliHandler{n: n}, opts...)
	if err == nil {
		err = n.cli.Start()
	}
	if err != nil {
		n.stopServer()
		return nil, fmt.Errorf("tcp: start client loops: %w", err)
	}
	n.ready.Store(true)
	go n.reaper()
	n.log.Info("tcp node listening", "addr", bound, "advertise", n.addr, "epoch", fmt.Sprintf("%#x", epoch),
		"conns_per_peer", cfg.ConnsPerPeer, "slice", cfg.SliceSize)
	return n, nil
}

// Addr is the address peers dial.
func (n *Node) Addr() string { return n.addr }

// Epoch is this run's epoch.
func (n *Node) Epoch() uint64 { return n.epoch }

// ID is this daemon's id.
func (n *Node) ID() string { return n.cfg.DaemonID }

// Directory is the directory the node finds peers in.
func (n *Node) Directory() directory.Directory { return n.dir }

func (n *Node) boundAddr() (string, error) {
	fd, err := n.srvEng.Dup()
	if err != nil {
		return "", fmt.Errorf("tcp: listener address: %w", err)
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "", os.NewSyscallError("getsockname", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), nil
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port)), nil
	}
	return "", fmt.Errorf("tcp: listener has unexpected address %T", sa)
}

func (n *Node) stopServer() {
	n.cancel()
	// Engine.Stop starts the shutdown and then polls for its end every
	// 500 ms; it gets a done context, and the end is awaited on Run's
	// return (Run returns once the event loops have stopped) instead.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := n.srvEng.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
		n.log.Warn("stopping peer listener", "err", err)
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-n.srvDone:
		if c := n.closeStrays(); c > 0 {
			n.log.Info("closed peer connections accepted while the listener stopped", "count", c)
		}
	case <-t.C:
		n.log.Error("peer listener's event loops did not stop within 10 s")
	}
}

// closeStrays closes what the stopped event loops leave open: a
// connection gnet accepted while it was stopping, whose hand-over to an
// event loop that had already exited never ran (gnet queues it as a task
// of that loop), so neither gnet nor the node knows it. Such sockets have
// the listener's address as their own; once Run has returned no part of
// the node uses one (the node's own dialed connections have other local
// addresses), so each is closed. It returns how many there were.
func (n *Node) closeStrays() int {
	host, ps, err := net.SplitHostPort(n.bound)
	if err != nil {
		return 0
	}
	lip, lport := net.ParseIP(host), 0
	if lport, err = strconv.Atoi(ps); err != nil || lip == nil {
		return 0
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	closed := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(l, "socket:") {
			continue
		}
		// Not a listener; SO_REUSEADDR is set on the listener and copied
		// to what it accepts, never set on the connections Go dials.
		if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc != 0 {
			continue
		}
		if ra, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR); err != nil || ra == 0 {
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
		if port == lport && (lip.IsUnspecified() || lip.Equal(ip)) {
			_ = unix.Close(fd)
			closed++
		}
	}
	return closed
}

// Name implements xfer.Transport.
func (n *Node) Name() string { return "tcp" }

// Close implements xfer.Transport: it stops new work, fails what is in
// flight with ErrClosed or ErrConnLost, closes every connection and returns
// when no task is outstanding. Safe to call more than once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.lifeMu.Lock()
		n.closed.Store(true)
		close(n.done)
		n.cancel()
		n.lifeMu.Unlock()
		<-n.reaperDone
		// The pumps see done (a dial in progress fails: its context is
		// canceled), so nothing is sent or dialed any more.
		n.pumpWG.Wait()
		queued := n.failQueued(xfer.ErrClosed)
		if err := n.cli.Stop(); err != nil {
			n.log.Warn("stopping client loops", "err", err)
		}
		// Every dialed connection is closed, which stopped its writer.
		n.writerWG.Wait()
		n.stopServer()
		// The event loops are stopped, so no handler starts any more.
		n.exchWG.Wait()
		n.renewWG.Wait()
		// Every connection is closed, so every request they carried has
		// failed, and every queued task too; what remains are Submit
		// calls on their way out, which find the node closed.
		// A value in idle may be from an earlier fall to zero (a Submit
		// counts a task before it finds the node closed): look again.
		limit := time.NewTimer(closeWait)
		defer limit.Stop()
	wait:
		for n.active.Load() > 0 {
			select {
			case <-n.idle:
			case <-limit.C:
				n.log.Error("tasks still outstanding after close", "count", n.active.Load())
				break wait
			}
		}
		n.log.Info("tcp node closed", "queued_tasks_failed", queued)
	})
	return nil
}

// closeWait bounds Close's wait for Submit calls on their way out.
const closeWait = time.Second

// taskGone counts a dispatched task (or one Submit counted and then
// refused) out of active, and tells a Close waiting for the last one.
func (n *Node) taskGone() {
	if n.active.Add(-1) == 0 && n.closed.Load() {
		select {
		case n.idle <- struct{}{}:
		default:
		}
	}
}

// peer returns the state of peer id, creating it when create is set.
func (n *Node) peer(id string, create bool) *peer {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[id]
	if p == nil && create {
		p = &peer{id: id, inbound: make(map[*conn]struct{}), kick: make(chan struct{}, 1),
			queued: make(map[*xfer.Task]*taskState)}
		n.peers[id] = p
	}
	return p
}

// Peers reports every known peer.
func (n *Node) Peers() []PeerStats {
	var out []PeerStats
	for _, dp := range n.dir.List() {
		if dp.Self {
			continue
		}
		s := PeerStats{ID: dp.ID, Addr: dp.Addr, Epoch: dp.Epoch}
		if p := n.peer(dp.ID, false); p != nil {
			p.mu.Lock()
			s.Conns, s.Inbound, s.Queued = len(p.sess), len(p.inbound), len(p.queued)
			for _, c := range p.sess {
				s.InFlight += len(c.reqs)
			}
			if p.epoch != 0 {
				s.Epoch = p.epoch
			}
			p.mu.Unlock()
			s.Connected = s.Conns > 0
			s.BytesIn, s.BytesOut, s.Errors = p.bytesIn.Load(), p.bytesOut.Load(), p.errs.Load()
		}
		out = append(out, s)
	}
	return out
}

// PeerBlob returns the opaque handshake data (RDMA connection data) the
// peer sent in its last handshake.
func (n *Node) PeerBlob(id string) ([]byte, bool) {
	p := n.peer(id, false)
	if p == nil {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.epoch == 0 {
		return nil, false
	}
	return append([]byte(nil), p.blob...), true
}

// Segments reports the remote segments opened through this node and not
// yet closed.
func (n *Node) Segments() []RemoteInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]RemoteInfo, 0, len(n.remotes))
	for r := range n.remotes {
		out = append(out, RemoteInfo{Peer: r.peer.id, Name: r.name, ID: r.id, Size: r.size, Rights: r.rights,
			Epoch: r.epoch, Expires: time.Unix(0, r.cred.Load().expiry)})
	}
	return out
}

// gnetLogger routes the event-loop library's log lines to the node's
// logger; its chatter goes to debug.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error(fmt.Sprintf(f, a...), "src", "gnet") }

// readBufferCap is the per-event-loop read buffer: one read syscall moves
// up to this much. The payload bytes a read brings with their frame's
// header are copied from it into their destination; the rest of a payload
// is read from the socket straight into it (conn.readDirect). So it is
// sized for many small frames at once (sixteen 4 KiB answers), not for
// large payloads, which it would only make copy more of.
var readBufferCap = 64 << 10
