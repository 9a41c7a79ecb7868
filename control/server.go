package control

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/internal/ratelog"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/session"
	"github.com/tensorcast/tensorcast/wire"
)

// Limits bound what one connection may hold and send: its session's
// limits.
type Limits = session.Limits

// Config configures a Server. Zero values take the defaults named per field.
type Config struct {
	Socket   string      // unix socket path (required)
	Mode     os.FileMode // socket file mode (default 0660)
	MaxFrame int         // largest frame body in bytes (default 1 MiB)
	MaxConns int         // concurrent connections (default 256)
	// MaxConnsPerUID bounds the connections of one uid, so that one local
	// user cannot take every connection (default MaxConns/4, at least 1;
	// at most MaxConns).
	MaxConnsPerUID int
	// AllowedUIDs and AllowedGIDs are the default tenant's users when
	// Deps.Tenants is empty (default: the daemon's uid and root); a gid
	// matches the peer's primary or any supplementary group. With
	// Deps.Tenants they must be empty: each tenant lists its users.
	AllowedUIDs []uint32
	AllowedGIDs []uint32
	// DeniedUIDs are refused whatever else says; root and the daemon's own
	// uid, let in by default, are kept out only by naming them here.
	DeniedUIDs []uint32
	// FrameTimeout bounds how long a frame may take to arrive once its
	// first byte has: a client that stops half-way through a frame is
	// disconnected. A connection with no partial frame may stay idle
	// (default 5s).
	FrameTimeout time.Duration
	// AcceptStall is how long accepting may keep failing (EMFILE and the
	// like, retried with back-off) before Health reports the server down
	// (default 30s).
	AcceptStall time.Duration
	// LogInterval is how often a kind of refusal or accept failure is
	// logged at most, with a count (default 10s).
	LogInterval time.Duration
	Limits      Limits
	DaemonID    string // reported by Hello
	Version     string // reported by Hello
	PeerAddr    string // reported by Hello: where the peer plane listens, if any
	// Listener, when set, is an already listening socket to serve on (one
	// inherited from systemd's socket activation) instead of creating
	// Socket; the server closes it but never removes its file.
	Listener *net.UnixListener
	// DefaultWait bounds Wait and Transfer calls that name no timeout and
	// no context deadline (default 30s).
	DefaultWait time.Duration
	// ReleaseWait is how long closing a connection waits for its busy
	// batches before abandoning them (default 1s).
	ReleaseWait time.Duration
	// AuditLevel is the level of the audit record of every mutating call
	// that changes what a connection holds (default Info). The data-path
	// calls (Submit, Transfer, AllocBlocks, FreeBlocks, AllocBatch,
	// FreeBatch), which an engine makes thousands of times a second, are
	// audited one level lower (Debug by default) so that they do not flood
	// the journal; their refusals are logged at Info or above regardless.
	AuditLevel slog.Level
}

func (c *Config) setDefaults() error {
	if c.Socket == "" {
		return fmt.Errorf("%w: Socket is empty", ErrConfig)
	}
	if c.Mode == 0 {
		c.Mode = 0o660
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = wire.DefaultMaxFrame
	}
	if c.MaxFrame < 64 || c.MaxFrame > 1<<30 {
		return fmt.Errorf("%w: MaxFrame %d (want 64..1GiB)", ErrConfig, c.MaxFrame)
	}
	if c.MaxConns == 0 {
		c.MaxConns = 256
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("%w: MaxConns %d", ErrConfig, c.MaxConns)
	}
	if c.MaxConnsPerUID == 0 {
		c.MaxConnsPerUID = max(1, c.MaxConns/4)
	}
	if c.MaxConnsPerUID < 0 || c.MaxConnsPerUID > c.MaxConns {
		return fmt.Errorf("%w: MaxConnsPerUID %d (want 1..MaxConns %d)", ErrConfig, c.MaxConnsPerUID, c.MaxConns)
	}
	if c.FrameTimeout == 0 {
		c.FrameTimeout = 5 * time.Second
	}
	if c.AcceptStall == 0 {
		c.AcceptStall = 30 * time.Second
	}
	if c.LogInterval == 0 {
		c.LogInterval = ratelog.Interval
	}
	if c.FrameTimeout < 0 || c.AcceptStall < 0 || c.LogInterval < 0 {
		return fmt.Errorf("%w: negative FrameTimeout, AcceptStall or LogInterval", ErrConfig)
	}
	l := &c.Limits
	for _, f := range []struct {
		p   *int
		def int
		n   string
	}{
		{&l.MaxBuffers, 64, "MaxBuffers"}, {&l.MaxBlocks, 65536, "MaxBlocks"},
		{&l.MaxBatches, 64, "MaxBatches"}, {&l.MaxBatchCapacity, 4096, "MaxBatchCapacity"},
		{&l.MaxRequests, 4096, "MaxRequests"}, {&l.MaxIdempotencyKeys, 1024, "MaxIdempotencyKeys"},
		{&l.MaxExports, 64, "MaxExports"}, {&l.MaxNotifications, 1024, "MaxNotifications"},
		{&l.MaxQueues, 16, "MaxQueues"}, {&l.MaxQueueEntries, 4096, "MaxQueueEntries"},
		{&l.MaxQueueData, 4 << 20, "MaxQueueData"},
	} {
		if *f.p == 0 {
			*f.p = f.def
		}
		if *f.p < 0 || *f.p > 1<<24 {
			return fmt.Errorf("%w: Limits.%s %d", ErrConfig, f.n, *f.p)
		}
	}
	if l.MaxBufferSize == 0 {
		l.MaxBufferSize = 64 << 30
	}
	if c.DefaultWait <= 0 {
		c.DefaultWait = 30 * time.Second
	}
	if c.ReleaseWait <= 0 {
		c.ReleaseWait = time.Second
	}
	return nil
}

// Server serves the control protocol on a unix socket.
//
// Goroutines: Start runs the accept loop; each accepted connection runs one
// serving goroutine. Close (or Drain) stops them in this order: close the
// listener (the accept loop returns; one backing off after a failed accept
// is woken by closing), close every connection (each serving goroutine's
// read fails, it releases what the connection holds and returns), then
// wait for all of them, then stop the refusal logs' timers.
type Server struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	dlim wire.DecodeLimits
	ln   *net.UnixListener

	// tenants are the configured tenants; admin is the one root and the
	// daemon's uid join when no tenant lists them (nil: no pool for them).
	tenants    []*tenant
	admin      *tenant
	needGroups bool // some tenant is chosen by gid: read peers' groups
	// ownReactors is the pool the server started for want of
	// Deps.Reactors, closed by Close; nil otherwise.
	ownReactors *reactor.Pool

	closing  chan struct{} // closed by Close: long waits give up
	draining atomic.Bool   // new requests are answered UNAVAILABLE
	// quiesced is closed by Quiesce or Close (quiesceOnce): waits for a
	// client's events (PollNotifications) end.
	quiesced    chan struct{}
	quiesceOnce sync.Once
	inflight    atomic.Int64  // requests being served
	idle        chan struct{} // signalled when inflight drops to 0 while draining
	nconns      atomic.Int64
	nextConn    atomic.Uint64
	reqs        requestCounts // requests decoded, by kind (reqcount.go)

	// acceptFailing is when the current run of failed accepts began (unix
	// nanoseconds), 0 while accepting works; acceptErr is the last error.
	acceptFailing atomic.Int64
	acceptErr     atomic.Pointer[error]
	// panics counts the requests whose handler panicked (handleSafe). A
	// recovered panic may have left a lock held or a structure half
	// changed, so the server is unhealthy from the first one: the
	// watchdog's restart brings the daemon back whole (L1 kept).
	panics atomic.Uint64
	// acceptFailures counts the accepts that failed for want of a
	// resource (each retry counts).
	acceptFailures atomic.Uint64

	// Rate-limited logs: refusals by reason, accept failures, frames that
	// did not complete in time.
	logs struct {
		setup, denied, maxConns, maxPerUID, draining *ratelog.Log
		acceptFail, acceptOK, frameTimeout           *ratelog.Log
		// What a client's frames can make a connection warn about.
		badFrame, undecodable, lostFDs, unexpectedFD, strayFDs, rdmaCut *ratelog.Log
		// idemForgotten: a connection's keyed calls went past
		// MaxIdempotencyKeys, so its oldest keys were forgotten;
		// idemRefused: a keyed call was refused its key.
		idemForgotten, idemRefused *ratelog.Log
	}

	wg sync.WaitGroup // accept loop and connection goroutines

	// exports is the daemon's export table (Deps.Exports); it has its own
	// locks.
	exports *peer.Exports
	// host is what the connections' sessions share; it has its own lock.
	host *session.Host
	// idem binds idempotency keys across connections (idem.go); it has
	// its own lock.
	idem *sharedIdem

	// mu guards the fields below.
	mu       sync.Mutex
	conns    map[*conn]struct{}
	perUID   map[uint32]int // connections being served, by uid
	closed   bool
	started  bool
	stopped  bool // the accept loop returned
	serveErr error
}

// NewServer checks cfg and deps, removes a stale socket file, creates the
// socket's directory and listens. Serving starts with Serve or Start.
func NewServer(cfg Config, deps Deps, log *slog.Logger) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Engine == nil || deps.Registry == nil {
		return nil, fmt.Errorf("%w: Deps needs Engine and Registry", ErrConfig)
	}
	tenants, admin, err := buildTenants(&cfg, &deps)
	if err != nil {
		return nil, err
	}
	if deps.MapBuffer == nil {
		deps.MapBuffer = session.MapShmBuffer
	}
	if deps.Exports == nil {
		deps.Exports = peer.NewExports(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      cfg,
		deps:     deps,
		log:      log,
		closing:  make(chan struct{}),
		idle:     make(chan struct{}, 1),
		conns:    make(map[*conn]struct{}),
		perUID:   make(map[uint32]int),
		exports:  deps.Exports,
		quiesced: make(chan struct{}),
		tenants:  tenants,
		admin:    admin,
		dlim: wire.DecodeLimits{
			MaxRequests: max(cfg.Limits.MaxRequests, cfg.Limits.MaxBatchCapacity),
			MaxOffsets:  cfg.Limits.MaxBlocks,
		},
	}
	s.needGroups = needGroups(tenants)
	spaces := len(tenants)
	if admin == nil {
		spaces++ // root and the daemon's uid, without a tenant
	}
	connKeys, spaceKeys := sharedIdemLimits(&cfg, spaces)
	s.idem = newSharedIdem(connKeys, spaceKeys, sharedIdemTTL, nil)
	s.host = &session.Host{
		Limits: cfg.Limits, MaxFrame: cfg.MaxFrame, DefaultWait: cfg.DefaultWait, ReleaseWait: cfg.ReleaseWait,
		Engine: deps.Engine, Registry: deps.Registry, MapBuffer: deps.MapBuffer, FileOpener: deps.FileOpener,
		Exports: deps.Exports, Peers: deps.Peers, Reactors: deps.Reactors,
		Closing: s.closing, Quiesced: s.quiesced, Draining: s.draining.Load,
		Log: log, LogInterval: cfg.LogInterval,
	}
	every := cfg.LogInterval
	s.logs.setup = ratelog.New(log, slog.LevelWarn, "connection setup failed", every)
	s.logs.denied = ratelog.New(log, slog.LevelWarn, "peer refused: not allowed", every)
	s.logs.maxConns = ratelog.New(log, slog.LevelWarn, "peer refused: at max_conns", every)
	s.logs.maxPerUID = ratelog.New(log, slog.LevelWarn, "peer refused: its uid is at max_conns_per_uid", every)
	s.logs.draining = ratelog.New(log, slog.LevelInfo, "peer refused: draining", every)
	s.logs.acceptFail = ratelog.New(log, slog.LevelError, "accept failing; retrying with back-off", every)
	s.logs.acceptOK = ratelog.New(log, slog.LevelInfo, "accepting again after failed accepts", every)
	s.logs.frameTimeout = ratelog.New(log, slog.LevelWarn, "closing connection: frame not completed in time", every)
	s.logs.badFrame = ratelog.New(log, slog.LevelWarn, "closing connection: bad frame", every)
	s.logs.undecodable = ratelog.New(log, slog.LevelWarn, "closing connection: undecodable request", every)
	s.logs.lostFDs = ratelog.New(log, slog.LevelWarn, "file descriptors sent with a request were lost: the daemon is out of file descriptors", every)
	s.logs.unexpectedFD = ratelog.New(log, slog.LevelWarn, "file descriptor with a request that takes none", every)
	s.logs.strayFDs = ratelog.New(log, slog.LevelWarn, "closing file descriptors sent without a frame", every)
	s.logs.rdmaCut = ratelog.New(log, slog.LevelWarn, "rdma answer cut short", every)
	s.logs.idemForgotten = ratelog.New(log, slog.LevelWarn,
		"idempotency keys forgotten: a connection is past max_idempotency_keys; a retry with a forgotten key runs again", every)
	s.logs.idemRefused = ratelog.New(log, slog.LevelInfo, "idempotency key refused", every)
	ln := cfg.Listener
	if ln == nil {
		if ln, err = listen(cfg.Socket, cfg.Mode); err != nil {
			return nil, err
		}
	}
	s.ln = ln
	if s.host.Reactors == nil {
		rx, err := reactor.New(reactor.Config{}, nil, log)
		if err != nil {
			return nil, errors.Join(err, ln.Close())
		}
		s.host.Reactors, s.ownReactors = rx, rx
	}
	return s, nil
}

// listen creates the socket's parent directory, removes a stale socket file
// (refusing to when a daemon still answers on it, or when the path is not a
// socket), listens and sets mode.
func listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%w: %s exists and is not a socket", ErrConfig, path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%w: %s", ErrAddrInUse, path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Addr is the socket path.
func (s *Server) Addr() string { return s.cfg.Socket }

// Start runs Serve on a goroutine the server owns; Close stops it.
func (s *Server) Start() {
	s.mu.Lock()
	if s.started || s.closed {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.acceptLoop()
	}()
}

// Serve accepts connections until Close or Drain; it returns nil then, or
// the accept error that stopped it.
func (s *Server) Serve() error {
	s.mu.Lock()
	if s.started || s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.started = true
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	return s.acceptLoop()
}

// Back-off of the accept loop after a temporary failure: doubling from
// acceptBackoffMin up to acceptBackoffMax while it keeps failing.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptLoop accepts until the listener closes. A temporary failure (out of
// fds or memory: EMFILE, ENFILE, ENOBUFS, ENOMEM) is retried with back-off,
// logged at most once per LogInterval; while accepting keeps failing for
// AcceptStall, Health says the server cannot serve. Any other error stops
// the loop, and Health says so.
func (s *Server) acceptLoop() error {
	var backoff time.Duration
	var retry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
	}()
	failures := 0
	for {
		uc, err := s.ln.AcceptUnix()
		if err == nil {
			if backoff > 0 {
				since := time.Unix(0, s.acceptFailing.Load())
				s.acceptFailing.Store(0)
				s.logs.acceptOK.Event(slog.Int("failed_accepts", failures),
					slog.Duration("failing_for", time.Since(since).Round(time.Millisecond)))
				backoff, failures = 0, 0
			}
			s.accept(uc)
			continue
		}
		if s.isClosed() || errors.Is(err, net.ErrClosed) {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if !temporaryAccept(err) {
			s.log.Error("accept failed; control server stops accepting", "err", err)
			s.acceptErr.Store(&err)
			s.mu.Lock()
			s.serveErr = err
			s.mu.Unlock()
			return err
		}
		failures++
		s.acceptFailures.Add(1)
		s.acceptErr.Store(&err)
		if backoff == 0 {
			s.acceptFailing.Store(time.Now().UnixNano())
			backoff = acceptBackoffMin
		} else {
			backoff = min(2*backoff, acceptBackoffMax)
		}
		s.logs.acceptFail.Event(slog.String("err", err.Error()), slog.Duration("backoff", backoff),
			slog.Int("connections", s.Connections()))
		if retry == nil {
			retry = time.NewTimer(backoff)
		} else {
			retry.Reset(backoff)
		}
		select {
		case <-retry.C:
		case <-s.closing:
			return nil
		}
	}
}

// temporaryAccept reports whether an accept error is one that passes when
// resources free up: out of file descriptors or memory, or a connection
// that went away before it was accepted.
func temporaryAccept(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.EINTR, syscall.EPROTO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Health is nil while the server can serve new clients. Otherwise it says
// why not: it was never started, its accept loop stopped on an error, or
// accepting has kept failing for longer than AcceptStall (the daemon then
// stops its watchdog keep-alives, so that systemd restarts it). After
// Close or Drain it answers ErrClosed.
func (s *Server) Health() error {
	s.mu.Lock()
	started, stopped, closed, serveErr := s.started, s.stopped, s.closed, s.serveErr
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case serveErr != nil:
		return fmt.Errorf("%w: accept loop stopped: %v", ErrUnavailable, serveErr)
	case !started || stopped:
		return fmt.Errorf("%w: not accepting", ErrUnavailable)
	}
	if n := s.panics.Load(); n > 0 {
		return fmt.Errorf("%w: %d requests panicked (see the log); what they held may be left inconsistent, so the daemon wants a restart",
			ErrUnavailable, n)
	}
	if since := s.acceptFailing.Load(); since != 0 {
		if d := time.Since(time.Unix(0, since)); d > s.cfg.AcceptStall {
			var last error
			if p := s.acceptErr.Load(); p != nil {
				last = *p
			}
			return fmt.Errorf("%w: accept failing for %s (accept_stall_timeout %s): %v",
				ErrUnavailable, d.Round(time.Millisecond), s.cfg.AcceptStall, last)
		}
	}
	return nil
}

// Panics is how many requests' handlers panicked (each answered INTERNAL).
func (s *Server) Panics() uint64 { return s.panics.Load() }

// AcceptFailures is how many accepts have failed for want of a resource
// (out of descriptors or memory) since the server started, each retry
// counted, and for how long accepting has been failing now: 0 while it
// works. Health turns unhealthy once failing passes AcceptStall.
func (s *Server) AcceptFailures() (total uint64, failing time.Duration) {
	if since := s.acceptFailing.Load(); since != 0 {
		failing = max(time.Since(time.Unix(0, since)), time.Nanosecond)
	}
	return s.acceptFailures.Load(), failing
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// accept checks the peer and starts its serving goroutine, or refuses it.
// Refusals are logged at most once per LogInterval and reason, with a
// count, so that a flood of them is a line per interval.
func (s *Server) accept(uc *net.UnixConn) {
	c, err := newConn(s, uc)
	if err != nil {
		s.logs.setup.Event(slog.String("err", err.Error()))
		uc.Close()
		return
	}
	who := []slog.Attr{slog.Int("pid", int(c.cred.Pid)), slog.Uint64("uid", uint64(c.cred.Uid)), slog.Uint64("gid", uint64(c.cred.Gid))}
	t, err := s.tenantOf(c.cred)
	if err != nil {
		s.logs.denied.Event(append(who, slog.String("why", err.Error()))...)
		c.refuse(ErrPermission)
		return
	}
	c.setTenant(t)
	if s.draining.Load() {
		s.logs.draining.Event(who...)
		c.refuse(ErrUnavailable)
		return
	}
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		c.refuse(ErrUnavailable)
		return
	case len(s.conns) >= s.cfg.MaxConns:
		s.mu.Unlock()
		s.logs.maxConns.Event(append(who, slog.Int("max_conns", s.cfg.MaxConns))...)
		c.refuse(ErrTooManyConns)
		return
	case s.perUID[c.cred.Uid] >= s.cfg.MaxConnsPerUID:
		s.mu.Unlock()
		s.logs.maxPerUID.Event(append(who, slog.Int("max_conns_per_uid", s.cfg.MaxConnsPerUID))...)
		c.refuse(ErrTooManyConns)
		return
	}
	s.conns[c] = struct{}{}
	s.perUID[c.cred.Uid]++
	s.nconns.Add(1)
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		if s.perUID[c.cred.Uid]--; s.perUID[c.cred.Uid] <= 0 {
			delete(s.perUID, c.cred.Uid)
		}
		s.mu.Unlock()
		s.nconns.Add(-1)
	}()
}

// Connections is the number of connections being served.
func (s *Server) Connections() int { return int(s.nconns.Load()) }

// beginRequest counts a request in flight; false means the server drains
// and the request must be answered UNAVAILABLE.
func (s *Server) beginRequest() bool {
	s.inflight.Add(1)
	if s.draining.Load() {
		s.endRequest()
		return false
	}
	return true
}

func (s *Server) endRequest() {
	if s.inflight.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// Drain is Quiesce, then Close: it stops accepting, answers new requests
// UNAVAILABLE, waits until the requests in flight are answered or ctx
// ends, then closes every connection (releasing what each holds). It
// returns ctx's error if ctx ended first.
func (s *Server) Drain(ctx context.Context) error {
	err := s.Quiesce(ctx)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

// Quiesce stops accepting, answers new requests UNAVAILABLE and waits
// until the requests in flight are answered or ctx ends (it returns ctx's
// error then). The connections stay open, with what they hold: Close ends
// them. It is the first half of a drain that has more to wait for (the
// transports) before the connections go.
func (s *Server) Quiesce(ctx context.Context) error {
	s.draining.Store(true)
	s.quiesceOnce.Do(func() { close(s.quiesced) })
	s.ln.Close()
	for s.inflight.Load() > 0 {
		select {
		case <-s.idle:
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close stops accepting, closes every connection, releases what they hold
// and waits for every goroutine of the server. It is safe to call more than
// once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.draining.Store(true)
	s.quiesceOnce.Do(func() { close(s.quiesced) })
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	for _, c := range conns {
		c.uc.Close()
	}
	s.wg.Wait()
	for _, l := range []*ratelog.Log{s.logs.setup, s.logs.denied, s.logs.maxConns, s.logs.maxPerUID, s.logs.draining,
		s.logs.acceptFail, s.logs.acceptOK, s.logs.frameTimeout,
		s.logs.badFrame, s.logs.undecodable, s.logs.lostFDs, s.logs.unexpectedFD, s.logs.strayFDs, s.logs.rdmaCut,
		s.logs.idemForgotten, s.logs.idemRefused} {
		l.Stop()
	}
	s.host.StopLogs()
	if s.ownReactors != nil {
		s.ownReactors.Close() // every session is closed: no queue is left
	}
	return err
}

// QueueTotals are the counters of every queue a server has served.
type QueueTotals = session.QueueTotals

// QueueTotals folds what closed queues left behind with the open ones'
// counters. It walks the connections and is meant for scrapes.
func (s *Server) QueueTotals() QueueTotals {
	s.mu.Lock()
	t := s.host.QueueTotals()
	for c := range s.conns {
		c.ss.AddQueueTotals(&t)
	}
	s.mu.Unlock()
	return t
}
