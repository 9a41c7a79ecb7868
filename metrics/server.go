package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/ratelog"
)

// ServerConfig bounds the endpoint. Anyone who can reach its address may
// connect, so everything a connection can hold is bounded here, and the
// endpoint gives way first when the process runs short of descriptors.
// Zero values take the defaults named per field.
type ServerConfig struct {
	// MaxConns is how many connections the endpoint holds at once; one
	// past it is accepted and closed at once (default 16).
	MaxConns int
	// HeaderTimeout bounds the time from a connection's accept to the end
	// of its first request's headers, and from the first byte of a later
	// request to the end of its headers (default 5s).
	HeaderTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait, once
	// answered, for its next request's first byte (default 30s).
	IdleTimeout time.Duration
	// SnapshotInterval is how long one rendering of the registry serves
	// scrapes: scrapes within it share it, so the sources run at most
	// once per interval whatever the number of scrapers (default 1s).
	SnapshotInterval time.Duration
	// ReservedFDs are descriptors the endpoint leaves to the rest of the
	// process (the control socket's clients, their memfds, the peers): a
	// connection is refused when fewer than ReservedFDs descriptors would
	// be left under RLIMIT_NOFILE (default 64).
	ReservedFDs int
	// FDs reports the descriptors the process has open and may have, for
	// ReservedFDs; fd is the accepted connection's. Default: the
	// process's (/proc/self/fd and RLIMIT_NOFILE); with ok false (not
	// Linux) only MaxConns bounds the endpoint.
	FDs func(fd int) (open, limit int, ok bool)
	// Now is the clock of the snapshots (default time.Now).
	Now func() time.Time
}

func (c *ServerConfig) setDefaults() error {
	if c.MaxConns == 0 {
		c.MaxConns = 16
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = 5 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 30 * time.Second
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = time.Second
	}
	if c.ReservedFDs == 0 {
		c.ReservedFDs = 64
	}
	if c.FDs == nil {
		c.FDs = processFDs
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxConns < 0 || c.HeaderTimeout < 0 || c.IdleTimeout < 0 || c.SnapshotInterval < 0 || c.ReservedFDs < 0 {
		return fmt.Errorf("metrics: negative MaxConns, HeaderTimeout, IdleTimeout, SnapshotInterval or ReservedFDs: %+v", *c)
	}
	return nil
}

// Server serves a Registry over HTTP: /metrics, and a short index at /.
//
// Goroutines: Start runs one serving goroutine (and net/http one per
// connection); Close stops them: it closes the listener and every
// connection, then waits for the serving goroutine.
type Server struct {
	ln   *limitListener
	srv  *http.Server
	snap *snapshotter
	log  *slog.Logger
	done chan struct{}
	// started is set by Start; Close then waits for the serving goroutine.
	started atomic.Bool
}

// ServerStats are the endpoint's own figures.
type ServerStats struct {
	Conns   int      // connections held now
	Refused Refusals // connections refused, by why
	Renders uint64   // renderings of the registry
	Scrapes uint64   // scrapes answered
}

// Refusals counts refused connections by why.
type Refusals struct {
	MaxConns    uint64 // the endpoint held MaxConns already
	Descriptors uint64 // fewer than ReservedFDs descriptors would have been left
}

// Listen binds addr (host:port; port 0 picks one) for r. Nothing is served
// until Start.
func Listen(addr string, r *Registry, cfg ServerConfig, log *slog.Logger) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	inner, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ln := &limitListener{Listener: inner, cfg: cfg,
		refusals: ratelog.New(log, slog.LevelWarn, "metrics connection refused", 0)}
	snap := &snapshotter{r: r, every: cfg.SnapshotInterval, now: cfg.Now, log: log}
	mux := http.NewServeMux()
	mux.Handle("/metrics", snap)
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "tensorcastd metrics: /metrics (Prometheus text format)")
	})
	return &Server{
		ln:   ln,
		snap: snap,
		log:  log,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: cfg.HeaderTimeout,
			ReadTimeout:       cfg.HeaderTimeout + 5*time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       cfg.IdleTimeout,
			MaxHeaderBytes:    16 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		done: make(chan struct{}),
	}, nil
}

// Addr is the bound address (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stats returns the endpoint's figures.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Conns:   int(s.ln.open.Load()),
		Refused: Refusals{MaxConns: s.ln.refusedCap.Load(), Descriptors: s.ln.refusedFDs.Load()},
		Renders: s.snap.renders.Load(),
		Scrapes: s.snap.scrapes.Load(),
	}
}

// Start serves on a goroutine the server owns.
func (s *Server) Start() {
	s.started.Store(true)
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics endpoint stopped", "err", err)
		}
	}()
}

// Close stops serving within a second (scrapes in progress get that long,
// then their connections are closed) and waits for the serving goroutine.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	if cerr := s.ln.Close(); err == nil && cerr != nil && !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	if s.started.Load() {
		<-s.done
	}
	s.ln.refusals.Stop()
	return err
}

// limitListener admits a connection only within the endpoint's budget:
// MaxConns held, and ReservedFDs descriptors left to the process. A
// refused one is closed at once, so it holds its descriptor for no longer
// than the accept.
type limitListener struct {
	net.Listener
	cfg      ServerConfig
	refusals *ratelog.Log

	open       atomic.Int64 // connections admitted and not closed
	refusedCap atomic.Uint64
	refusedFDs atomic.Uint64
}

// Accept returns the next admitted connection.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		why := l.admit(c)
		if why == "" {
			return &heldConn{Conn: c, l: l}, nil
		}
		c.Close()
		l.refusals.Event(slog.String("why", why), slog.String("remote", c.RemoteAddr().String()))
	}
}

// admit counts c in when the budget allows, else says why not.
func (l *limitListener) admit(c net.Conn) string {
	if n := l.open.Add(1); n > int64(l.cfg.MaxConns) {
		l.open.Add(-1)
		l.refusedCap.Add(1)
		return "metrics_max_conns (" + strconv.Itoa(l.cfg.MaxConns) + ") connections held"
	}
	if open, limit, ok := l.cfg.FDs(connFD(c)); ok && limit-open < l.cfg.ReservedFDs {
		l.open.Add(-1)
		l.refusedFDs.Add(1)
		return fmt.Sprintf("%d of %d descriptors open: the last %d are the control socket's", open, limit, l.cfg.ReservedFDs)
	}
	return ""
}

// heldConn is an admitted connection; closing it gives its place back once.
type heldConn struct {
	net.Conn
	l      *limitListener
	closed atomic.Bool
}

func (c *heldConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// snapshotter answers scrapes from one rendering of the registry, made at
// most once per interval: a scrape that finds the last one older renders
// anew, and scrapes that come while it does wait for it and share it. The
// sources, which read the data path's counters, so run at the interval's
// pace, not the scrapers'.
type snapshotter struct {
	r     *Registry
	every time.Duration
	now   func() time.Time
	log   *slog.Logger

	renders, scrapes atomic.Uint64

	// mu guards the fields below.
	mu      sync.Mutex
	cur     *snapshot // the last rendering, nil before the first
	pending *snapshot // the rendering in progress, nil when none
}

// snapshot is one rendering; body and at are set before done closes.
type snapshot struct {
	body []byte
	at   time.Time // when its rendering began
	done chan struct{}
}

// get returns a rendering no older than the interval, or the one in
// progress.
func (s *snapshotter) get() *snapshot {
	s.mu.Lock()
	if c := s.cur; c != nil && s.now().Sub(c.at) < s.every {
		s.mu.Unlock()
		return c
	}
	if p := s.pending; p != nil {
		s.mu.Unlock()
		<-p.done
		return p
	}
	p := &snapshot{at: s.now(), done: make(chan struct{})}
	s.pending = p
	s.mu.Unlock()

	s.renders.Add(1)
	var err error
	p.body, err = s.r.render()
	if err != nil {
		// What gathered is served; the source that failed is named.
		s.log.Warn("metrics scrape", "err", err)
	}
	s.mu.Lock()
	s.cur, s.pending = p, nil
	s.mu.Unlock()
	close(p.done)
	return p
}

func (s *snapshotter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	snap := s.get()
	s.scrapes.Add(1)
	h := w.Header()
	h.Set("Content-Type", textContentType)
	h.Set("Content-Length", strconv.Itoa(len(snap.body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(snap.body)
}
