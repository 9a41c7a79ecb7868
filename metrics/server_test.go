package metrics

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// startServer serves r with cfg on an ephemeral loopback port until the
// test ends.
func startServer(t *testing.T, r *Registry, cfg ServerConfig) *Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := Listen("127.0.0.1:0", r, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// get scrapes path on a connection of its own.
func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + s.Addr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestServer(t *testing.T) {
	s := startServer(t, testRegistry(t), ServerConfig{})
	code, body := get(t, s, "/metrics")
	if code != 200 || !strings.Contains(body, `tensorcast_test_requests_total{transport="local"} 7`) {
		t.Fatalf("GET /metrics: %d\n%s", code, body)
	}
	if code, _ := get(t, s, "/nothing"); code != 404 {
		t.Fatalf("GET /nothing: %d", code)
	}
	lint(t, testutil.Command(t, "promtool", "prometheus"), body)
}

func TestCloseWithoutStart(t *testing.T) {
	s, err := Listen("127.0.0.1:0", NewRegistry(ReadBuildInfo("v")), ServerConfig{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotShared: 32 scrapers, 5 scrapes each, within one snapshot
// interval make one rendering between them: the sources run once. Once the
// interval has passed, the next scrape renders again.
func TestSnapshotShared(t *testing.T) {
	clock := testutil.NewClock(time.Now())
	r := NewRegistry(BuildInfo{Version: "v", GoVersion: "g", Revision: "r"})
	var collects atomic.Int64
	if err := r.Register("counted", SourceFunc(func(e *Emit) {
		e.Counter("tensorcast_test_collects_total", "Collects.", float64(collects.Add(1)))
	})); err != nil {
		t.Fatal(err)
	}
	const scrapers, each = 32, 5
	// A client may dial anew before its last connection is back in its
	// pool: room for two each.
	s := startServer(t, r, ServerConfig{MaxConns: 2 * scrapers, SnapshotInterval: time.Second, Now: clock.Now})
	var wg sync.WaitGroup
	errs := make(chan error, scrapers)
	for range scrapers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 10 * time.Second}
			defer hc.CloseIdleConnections()
			for range each {
				resp, err := hc.Get("http://" + s.Addr() + "/metrics")
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.Contains(string(b), "tensorcast_test_collects_total 1\n") {
					errs <- errors.New("a scrape without the first rendering's sample:\n" + string(b))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := s.Stats(); collects.Load() != 1 || st.Renders != 1 || st.Scrapes != scrapers*each {
		t.Fatalf("%d scrapes by %d scrapers within one interval: %d collects, stats %+v; want 1 rendering", scrapers*each, scrapers, collects.Load(), st)
	}
	clock.Advance(999 * time.Millisecond)
	if _, body := get(t, s, "/metrics"); !strings.Contains(body, "tensorcast_test_collects_total 1\n") {
		t.Fatalf("a scrape within the interval rendered anew:\n%s", body)
	}
	clock.Advance(time.Millisecond)
	if _, body := get(t, s, "/metrics"); !strings.Contains(body, "tensorcast_test_collects_total 2\n") || s.Stats().Renders != 2 {
		t.Fatalf("a scrape past the interval did not render anew (%+v):\n%s", s.Stats(), body)
	}
}

// dialIdle opens a connection to s that sends nothing.
func dialIdle(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer waits for c's end from the server's side: a read that
// returns EOF (or a reset) rather than data. The deadline only keeps a
// broken server from hanging the test.
func closedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n > 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection not closed by the endpoint: read %d bytes, %v", n, err)
	}
}

// TestMaxConns: with MaxConns connections held, the next is closed at
// once and counted; when one of them goes, a scrape is served again.
func TestMaxConns(t *testing.T) {
	s := startServer(t, testRegistry(t), ServerConfig{MaxConns: 2, HeaderTimeout: time.Minute})
	a, _ := dialIdle(t, s), dialIdle(t, s)
	// Connections are accepted in order: once the third is refused, both
	// before it are held.
	closedByServer(t, dialIdle(t, s))
	if st := s.Stats(); st.Conns != 2 || st.Refused.MaxConns != 1 || st.Refused.Descriptors != 0 {
		t.Fatalf("stats with 2 connections held and one refused: %+v", st)
	}
	a.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return s.Stats().Conns == 1 }, "the endpoint letting go of a closed connection: %+v",
		testutil.Lazy(func() ServerStats { return s.Stats() }))
	if code, _ := get(t, s, "/metrics"); code != 200 {
		t.Fatalf("scrape after a place freed: %d", code)
	}
}

// TestHeaderTimeout: a connection that sends no request, or none after
// its answer, is closed after the header or the idle timeout.
func TestHeaderTimeout(t *testing.T) {
	s := startServer(t, testRegistry(t), ServerConfig{HeaderTimeout: 50 * time.Millisecond, IdleTimeout: 50 * time.Millisecond})
	closedByServer(t, dialIdle(t, s))

	c := dialIdle(t, s)
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("keep-alive scrape: %d close=%v %v", resp.StatusCode, resp.Close, err)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("data after the answer on an idle connection")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return s.Stats().Conns == 0 }, "idle connections closed: %+v",
		testutil.Lazy(func() ServerStats { return s.Stats() }))
}

// TestDescriptorBudget: a connection that would leave fewer than
// ReservedFDs descriptors to the process is refused, whatever MaxConns
// allows; with descriptors to spare it is served.
func TestDescriptorBudget(t *testing.T) {
	var open atomic.Int64
	const limit, reserve = 1024, 100
	s := startServer(t, testRegistry(t), ServerConfig{MaxConns: 1000, ReservedFDs: reserve,
		FDs: func(int) (int, int, bool) { return int(open.Load()), limit, true }})
	open.Store(limit - reserve + 1)
	closedByServer(t, dialIdle(t, s))
	if st := s.Stats(); st.Refused.Descriptors != 1 || st.Conns != 0 {
		t.Fatalf("stats after a refusal for descriptors: %+v", st)
	}
	open.Store(limit - reserve)
	if code, _ := get(t, s, "/metrics"); code != 200 {
		t.Fatalf("scrape with %d descriptors left: %d", reserve, code)
	}
}

// TestProcessFDs: the process's count is /proc/self/fd's, and its limit
// RLIMIT_NOFILE's.
func TestProcessFDs(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	// Other goroutines of the test binary open and close descriptors too:
	// a reading counts only between two listings that agree.
	var open, limit, want int
	var ok bool
	for range 1000 {
		fds, err := testutil.OpenFDs()
		if err != nil {
			t.Fatal(err)
		}
		open, limit, ok = processFDs(int(f.Fd()))
		again, err := testutil.OpenFDs()
		if err != nil {
			t.Fatal(err)
		}
		// OpenFDs' listing held one descriptor, as processFDs' does.
		if want = len(fds) - 1; len(again) == len(fds) {
			break
		}
	}
	if !ok || open != want || limit != int(rl.Cur) {
		t.Fatalf("processFDs = %d, %d, %v; want %d open of %d", open, limit, ok, want, rl.Cur)
	}
}
