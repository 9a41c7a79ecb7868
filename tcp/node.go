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
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/ratelog"
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
	lim    limits

	// ln is the peer listener; the accept goroutine (acceptWG) takes its
	// connections and enrolls them in srv, the event loops of the
	// connections peers dialed. cli holds those of the connections this
	// node dialed.
	ln       net.Listener
	acceptWG sync.WaitGroup
	// inherited says ln came in Config.Listener, not from Listen.
	inherited bool
	srv       *gnet.Client
	cli       *gnet.Client

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
	// unsessioned logs the tasks a failed dial fails, a line an interval:
	// while a peer is down, every dial for its tasks fails, as often as
	// clients submit (100,000 lines an hour in a soak).
	unsessioned *ratelog.Log
	// renewWG counts token renewals in flight (tokens.go); Close waits.
	renewWG   sync.WaitGroup
	closeOnce sync.Once
	closed    atomic.Bool
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

	// hmu guards handlers and inline (the data exchanges' handlers).
	hmu      sync.RWMutex
	handlers map[string]exchHandler
	inline   map[string]InlineHandler
	// exchSem bounds the exchange handlers running at once, nestSem the
	// nested ones (HandleNested); exchWG counts them all (each is a
	// goroutine this node owns, joined by Close).
	exchSem, nestSem chan struct{}
	exchWG           sync.WaitGroup

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
func NewNode(cfg Config, exp Exporter, log *slog.Logger) (_ *Node, err error) {
	if cfg.Listener != nil {
		// Owned from here: closed on any failure before the node has it
		// (from then on stopServer closes it).
		defer func() {
			if err != nil && cfg.Listener != nil {
				cfg.Listener.Close()
			}
		}()
	}
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
		done:       make(chan struct{}),
		reaperDone: make(chan struct{}),
		idle:       make(chan struct{}, 1),
		peers:      make(map[string]*peer),
		remotes:    make(map[*Remote]struct{}),
		handlers:   make(map[string]exchHandler),
		inline:     make(map[string]InlineHandler),
		exchSem:    make(chan struct{}, MaxExchangeHandlers),
		nestSem:    make(chan struct{}, MaxExchangeHandlers),
	}
	n.unsessioned = ratelog.New(n.log, slog.LevelInfo, "tasks failed: no session with the peer", 0)
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.pendPool.New = func() any { return &pending{node: n} }
	n.taskPool.New = func() any { return new(taskState) }

	// Peers' connections are accepted here, not by a gnet engine: gnet's
	// acceptor hands each connection to an event loop as a queued task,
	// and one queued to a loop that has just stopped never runs, so its
	// descriptor stays open, known to nobody. Here the accept goroutine
	// enrolls each connection itself, waiting until a loop has it, and
	// stopServer stops the loops only once that goroutine has returned.
	// An inherited listener is served as it is: the connections in its
	// backlog are accepted like new ones (accept sets their keep-alive).
	var ln net.Listener
	if n.inherited = cfg.Listener != nil; n.inherited {
		ln = cfg.Listener // (a nil *TCPListener must not become a non-nil Listener)
	} else {
		lc := net.ListenConfig{KeepAliveConfig: peerKeepAliveConfig}
		if ln, err = lc.Listen(context.Background(), "tcp", cfg.Listen); err != nil {
			n.cancel()
			return nil, fmt.Errorf("tcp: listen on %s: %w", cfg.Listen, err)
		}
	}
	// The node owns the listener now (stopServer closes it), not the
	// deferred close above.
	cfg.Listener, n.cfg.Listener = nil, nil
	n.ln = ln
	bound := ln.Addr().String()
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
	opts := func(more ...gnet.Option) []gnet.Option {
		return append([]gnet.Option{
			gnet.WithNumEventLoop(loopsPerEngine()),
			gnet.WithReadBufferCap(readBufferCap),
			gnet.WithWriteBufferCap(256 << 10),
			gnet.WithLogger(gnetLogger{n.log}),
		}, more...)
	}
	// Accepted connections have TCP_NODELAY (Go sets it) and keep-alive
	// (lc) already; gnet is not asked to set them again, since a failure
	// there, after it duplicated the descriptor, would leak the duplicate.
	srv, err := gnet.NewClient(&srvHandler{n: n}, opts(gnet.WithTCPNoDelay(gnet.TCPDelay))...)
	if err == nil {
		if err = srv.Start(); err == nil {
			n.srv = srv
		}
	}
	if err != nil {
		n.stopServer()
		return nil, fmt.Errorf("tcp: start the event loops of inbound connections: %w", err)
	}
	n.cli, err = gnet.NewClient(&cliHandler{n: n}, opts(gnet.WithTCPNoDelay(gnet.TCPNoDelay), gnet.WithTCPKeepAlive(peerKeepAlive))...)
	if err == nil {
		err = n.cli.Start()
	}
	if err != nil {
		n.stopServer()
		return nil, fmt.Errorf("tcp: start client loops: %w", err)
	}
	go n.reaper()
	n.acceptWG.Add(1)
	go n.accept()
	n.log.Info("tcp node listening", "addr", bound, "advertise", n.addr, "epoch", fmt.Sprintf("%#x", epoch),
		"conns_per_peer", cfg.ConnsPerPeer, "slice", cfg.SliceSize)
	return n, nil
}

// Addr is the address peers dial.
func (n *Node) Addr() string { return n.addr }

// Epoch is this run's epoch.
func (n *Node) Epoch() uint64 { return n.epoch }

// RequestTimeout is what bounds an exchange given no timeout of its own
// (Config.RequestTimeout).
func (n *Node) RequestTimeout() time.Duration { return n.cfg.RequestTimeout }

// ID is this daemon's id.
func (n *Node) ID() string { return n.cfg.DaemonID }

// Directory is the directory the node finds peers in.
func (n *Node) Directory() directory.Directory { return n.dir }

// accept is the listener's goroutine: it takes each connection a peer
// dials and enrolls it in srv's event loops, which own it from then on
// (Enroll returns once a loop has opened it; it closes what it could not
// enroll). It returns when the listener is closed. stopServer waits for
// it before it stops those loops, so every accepted connection is either
// on a running loop, which closes it when it stops, or closed here.
func (n *Node) accept() {
	defer n.acceptWG.Done()
	var pause time.Duration
	for {
		nc, err := n.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, say: the connections wait in the
			// backlog; try again after a pause that grows to a second.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			n.refusals.note(n.log, "accepting a peer connection failed", time.Now(), "err", err.Error(), "retry_in", pause)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-n.done:
				t.Stop()
				return
			}
			continue
		}
		pause = 0
		if tc, ok := nc.(*net.TCPConn); ok && n.inherited {
			// Listen's ListenConfig sets it on the sockets it accepts; an
			// inherited listener has none.
			_ = tc.SetKeepAliveConfig(peerKeepAliveConfig)
		}
		if _, err := n.srv.Enroll(nc); err != nil {
			n.refusals.note(n.log, "enrolling a peer connection failed", time.Now(),
				"remote", nc.RemoteAddr().String(), "err", err.Error())
		}
	}
}

// stopServer stops taking peers' connections, in this order: close the
// listener (connections still in its backlog are reset by the kernel,
// unless a duplicate, DupListener's, keeps the socket open),
// wait for the accept goroutine, then stop the inbound event loops, which
// close every connection they hold.
func (n *Node) stopServer() {
	n.cancel()
	_ = n.ln.Close()
	n.acceptWG.Wait()
	if n.srv != nil {
		if err := n.srv.Stop(); err != nil {
			n.log.Warn("stopping the event loops of inbound connections", "err", err)
		}
	}
}

// DupListener returns a duplicate of the peer listener's descriptor
// (close-on-exec), for a daemon that takes over from this one: the socket
// stays open, its backlog holding what peers dial, after Close closes the
// node's own descriptor. The caller closes it.
func (n *Node) DupListener() (int, error) {
	sc, ok := n.ln.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("%w: the peer listener (%T) has no descriptor", ErrConfig, n.ln)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
	}
	return fd, nil
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
		n.unsessioned.Stop()
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

// loopsPerEngine is how many event loops each of the node's two gnet
// engines (inbound and outbound connections) runs: one per CPU the process
// may use.
func loopsPerEngine() int { return runtime.NumCPU() }

// EventLoops is how many goroutines a Node runs that sleep in epoll_wait, a
// system call that keeps the goroutine's Go processor until the runtime's
// monitor takes it back: the event loops of its two engines. The daemon
// runs as many Go processors beyond its CPUs (see cmd/tensorcastd).
func EventLoops() int { return 2 * loopsPerEngine() }

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
