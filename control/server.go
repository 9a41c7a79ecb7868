// Package control is tensorcastd's server of the client protocol: the
// unix-socket listener and its peer checks, the framing of each connection
// (reads with the fds that come along), the handlers of the messages that
// package wire decodes, and the per-connection resources and their release.
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
	"time"

	"github.com/tensorcast/tensorcast/wire"
)

// Limits bound what one connection may hold and send.
type Limits struct {
	MaxBuffers         int    // registered buffers and files (default 64)
	MaxBufferSize      uint64 // bytes of one registered buffer (default 64 GiB)
	MaxBlocks          int    // pool blocks held (default 65536)
	MaxBatches         int    // batches held (default 64)
	MaxBatchCapacity   int    // tasks per batch, and requests per Transfer (default 4096)
	MaxRequests        int    // requests per Submit (default 4096)
	MaxIdempotencyKeys int    // remembered idempotency keys, oldest evicted (default 1024)
	MaxExports         int    // exported segments, opened remote ones and subscriptions (default 64 each)
	MaxNotifications   int    // queued notifications; a full queue refuses more (default 1024)
	MaxQueues          int    // shared-memory queues open (default 16)
	MaxQueueEntries    int    // submission entries of one queue (default 4096; its completion ring may be up to 4x that)
	MaxQueueData       int    // bytes of one queue's data area (default 4 MiB)
}

// Config configures a Server. Zero values take the defaults named per field.
type Config struct {
	Socket      string      // unix socket path (required)
	Mode        os.FileMode // socket file mode (default 0660)
	MaxFrame    int         // largest frame body in bytes (default 1 MiB)
	MaxConns    int         // concurrent connections (default 256)
	AllowedUIDs []uint32    // peers allowed by uid (default: the daemon's uid and root)
	AllowedGIDs []uint32    // peers allowed by primary gid (default: none)
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
	if len(c.AllowedUIDs) == 0 {
		c.AllowedUIDs = []uint32{uint32(os.Getuid()), 0}
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
// listener (the accept loop returns), close every connection (each serving
// goroutine's read fails, it releases what the connection holds and
// returns), then wait for all of them.
type Server struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	dlim wire.DecodeLimits
	ln   *net.UnixListener

	closing   chan struct{} // closed by Close: long waits give up
	draining  atomic.Bool   // new requests are answered UNAVAILABLE
	inflight  atomic.Int64  // requests being served
	idle      chan struct{} // signalled when inflight drops to 0 while draining
	nconns    atomic.Int64
	nextConn  atomic.Uint64
	nextQueue atomic.Uint64
	reqs      requestCounts // requests decoded, by kind (reqcount.go)

	wg sync.WaitGroup // accept loop and connection goroutines

	// exp is the daemon's exported segments; it has its own lock.
	exp exportTable
	// idem binds idempotency keys across connections (idem.go); it has
	// its own lock.
	idem *sharedIdem

	// mu guards the fields below.
	mu    sync.Mutex
	conns map[*conn]struct{}
	// closedQueues are the counters closed queues left behind.
	closedQueues QueueTotals
	closed       bool
	started      bool
	serveErr     error
}

// NewServer checks cfg and deps, removes a stale socket file, creates the
// socket's directory and listens. Serving starts with Serve or Start.
func NewServer(cfg Config, deps Deps, log *slog.Logger) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Engine == nil || deps.Pool == nil || deps.Registry == nil {
		return nil, fmt.Errorf("%w: Deps needs Engine, Pool and Registry", ErrConfig)
	}
	if deps.MapBuffer == nil {
		deps.MapBuffer = ShmMapBuffer
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:     cfg,
		deps:    deps,
		log:     log,
		closing: make(chan struct{}),
		idle:    make(chan struct{}, 1),
		conns:   make(map[*conn]struct{}),
		exp:     exportTable{m: make(map[string]*export)},
		idem:    newSharedIdem(sharedIdemLimit(&cfg), sharedIdemTTL, nil),
		dlim: wire.DecodeLimits{
			MaxRequests: max(cfg.Limits.MaxRequests, cfg.Limits.MaxBatchCapacity),
			MaxOffsets:  cfg.Limits.MaxBlocks,
		},
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = listen(cfg.Socket, cfg.Mode); err != nil {
			return nil, err
		}
	}
	s.ln = ln
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

func (s *Server) acceptLoop() error {
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Error("accept failed; control server stops accepting", "err", err)
			s.mu.Lock()
			s.serveErr = err
			s.mu.Unlock()
			return err
		}
		s.accept(uc)
	}
}

// isClosing reports whether Close has started.
func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// accept checks the peer and starts its serving goroutine, or refuses it.
func (s *Server) accept(uc *net.UnixConn) {
	c, err := newConn(s, uc)
	if err != nil {
		s.log.Warn("connection setup failed", "err", err)
		uc.Close()
		return
	}
	if !s.allowed(c.cred.Uid, c.cred.Gid) {
		s.log.Warn("peer refused", "pid", c.cred.Pid, "uid", c.cred.Uid, "gid", c.cred.Gid)
		c.refuse(ErrPermission)
		return
	}
	if s.draining.Load() {
		c.refuse(ErrUnavailable)
		return
	}
	if s.nconns.Add(1) > int64(s.cfg.MaxConns) {
		s.nconns.Add(-1)
		s.log.Warn("peer refused: at MaxConns", "pid", c.cred.Pid, "max_conns", s.cfg.MaxConns)
		c.refuse(ErrTooManyConns)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.nconns.Add(-1)
		c.refuse(ErrUnavailable)
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.nconns.Add(-1)
	}()
}

func (s *Server) allowed(uid, gid uint32) bool {
	for _, u := range s.cfg.AllowedUIDs {
		if u == uid {
			return true
		}
	}
	for _, g := range s.cfg.AllowedGIDs {
		if g == gid {
			return true
		}
	}
	return false
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
	return err
}
