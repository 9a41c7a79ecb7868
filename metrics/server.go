package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves a Registry over HTTP: /metrics, and a short index at /.
//
// Goroutines: Start runs one serving goroutine (and net/http one per
// connection); Close stops them: it closes the listener and every
// connection, then waits for the serving goroutine.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	log  *slog.Logger
	done chan struct{}
	// started is set by Start; Close then waits for the serving goroutine.
	started atomic.Bool
}

// Listen binds addr (host:port; port 0 picks one) for r. Nothing is served
// until Start.
func Listen(addr string, r *Registry, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.Handler(func(msg string, err error) { log.Warn(msg, "err", err) }))
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "tensorcastd metrics: /metrics (Prometheus text format)")
	})
	return &Server{
		ln:  ln,
		log: log,
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    16 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		},
		done: make(chan struct{}),
	}, nil
}

// Addr is the bound address (host:port).
func (s *Server) Addr() string { return s.ln.Addr().String() }

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
	return err
}

// promHandler is promhttp's handler with bounds: four scrapes at once, ten
// seconds each; a source error is logged and the rest still served.
func promHandler(g prometheus.Gatherer, errLog func(string, error)) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:            logFunc(errLog),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

type logFunc func(string, error)

func (f logFunc) Println(v ...any) { f("metrics scrape", fmt.Errorf("%s", fmt.Sprint(v...))) }
