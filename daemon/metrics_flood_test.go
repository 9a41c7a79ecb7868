package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// limitedDaemon is the tensorcastd binary run under a descriptor limit,
// with a fake systemd's notify socket and watchdog.
type limitedDaemon struct {
	cmd     *exec.Cmd
	sock    string
	metrics string // the metrics endpoint's address, "" when off
	log     *lockedBuffer
	notes   <-chan string
	exited  chan error
}

// startLimitedDaemon runs tensorcastd with RLIMIT_NOFILE nofile (soft and
// hard) and args after its socket and data directory, and waits for its
// READY. The test ends it with stop, or kills it.
func startLimitedDaemon(t *testing.T, nofile int, args ...string) *limitedDaemon {
	t.Helper()
	bin := buildDaemon(t)
	dir := t.TempDir()
	p := &limitedDaemon{sock: filepath.Join(dir, "tc.sock"), log: &lockedBuffer{}, exited: make(chan error, 1)}
	var notifyPath string
	notifyPath, p.notes = notifyChan(t)
	p.cmd = exec.Command("/bin/sh", append([]string{"-c", `ulimit -n ` + strconv.Itoa(nofile) + ` && exec "$0" "$@"`, bin,
		"--socket", p.sock, "--data-dir", filepath.Join(dir, "data"), "--pool-size", "16MiB",
		"--ebpf", "off", "--drain-timeout", "2s"}, args...)...)
	p.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notifyPath, "WATCHDOG_USEC=100000")
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", p.log)
		}
	})
	if msg := p.next(t); !strings.HasPrefix(msg, "READY=1") {
		t.Fatalf("first notify %q, want READY=1", msg)
	}
	ready := regexp.MustCompile(`msg="tensorcastd ready".* metrics=(\S+)`)
	var m []string
	testutil.Eventually(t, 10*time.Second, func() bool { m = ready.FindStringSubmatch(p.log.String()); return m != nil },
		"the ready line in the daemon's log:\n%s", p.log)
	if m[1] != "off" {
		p.metrics = m[1]
	}
	return p
}

// next is the daemon's next notify message.
func (p *limitedDaemon) next(t *testing.T) string {
	t.Helper()
	select {
	case m := <-p.notes:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no notify message in 10s")
		return ""
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *limitedDaemon) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("daemon exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not exit after SIGTERM")
	}
}

// scrapeOn scrapes over c, a keep-alive connection the test holds (one
// that needs no new descriptor in the daemon).
func scrapeOn(t *testing.T, c net.Conn, br *bufio.Reader) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: tensorcast\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("scrape on a held connection: %s close=%v %v", resp.Status, resp.Close, err)
	}
	return string(b)
}

// TestMetricsFloodKeepsControl: at a limit of 1,024 descriptors, 1,500
// idle connections to the metrics endpoint (whose connection cap is set
// out of the way) take none of the descriptors the control socket needs:
// the endpoint refuses them once the reserve is reached, 200 new control
// clients are served meanwhile, the watchdog keep-alives never stop and no
// accept fails. Afterwards the endpoint serves again and its counters say
// what it refused.
func TestMetricsFloodKeepsControl(t *testing.T) {
	const nofile, flood, clients = 1024, 1500, 200
	p := startLimitedDaemon(t, nofile, "--metrics-address", "127.0.0.1:0", "--metrics-max-conns", "4096",
		"--metrics-header-timeout", "1m", "--max-conns", "256", "--max-conns-per-uid", "256", "--accept-stall-timeout", "300ms")

	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range flood {
		c, err := net.Dial("tcp", p.metrics)
		if err != nil {
			t.Fatalf("metrics connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	// The daemon accepts in order: once this one is refused, every one
	// before it has been admitted or refused too.
	probe, err := net.Dial("tcp", p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	probe.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := probe.Read(make([]byte, 1)); n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a metrics connection past 1,500 idle ones at %d descriptors was not refused: %d bytes, %v", nofile, n, err)
	}
	probe.Close()

	for i := range clients {
		c, err := client.Dial(p.sock, client.Options{Name: fmt.Sprintf("during-flood-%d", i)})
		if err != nil {
			t.Fatalf("control client %d during the metrics flood: %v", i, err)
		}
		defer c.Close()
		if err := c.Ping(nil); err != nil {
			t.Fatalf("ping of control client %d during the metrics flood: %v", i, err)
		}
	}
	// The keep-alives go on: one after the clients were served, and
	// nothing but keep-alives since READY.
	for msg := p.next(t); msg != "WATCHDOG=1"; msg = p.next(t) {
		t.Fatalf("notify %q during the metrics flood, want only WATCHDOG=1", msg)
	}
	for len(p.notes) > 0 {
		if msg := <-p.notes; msg != "WATCHDOG=1" {
			t.Fatalf("notify %q during the metrics flood, want only WATCHDOG=1", msg)
		}
	}

	for _, c := range conns {
		c.Close()
	}
	conns = nil
	var exp string
	testutil.Eventually(t, 30*time.Second, func() bool {
		c, err := net.Dial("tcp", p.metrics)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: tensorcast\r\nConnection: close\r\n\r\n"); err != nil {
			return false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		b, err := io.ReadAll(resp.Body)
		exp = string(b)
		return err == nil && resp.StatusCode == 200
	}, "a scrape once the flood closed")
	if got := sample(t, exp, `tensorcast_metrics_refused_total{reason="descriptors"}`); got == 0 {
		t.Errorf("no metrics connection refused for descriptors")
	}
	if got := sample(t, exp, `tensorcast_metrics_refused_total{reason="max_conns"}`); got != 0 {
		t.Errorf("%v metrics connections refused for metrics_max_conns (4096): the reserve should have refused them", got)
	}
	for series, want := range map[string]float64{
		"tensorcast_control_accept_failures_total":  0,
		"tensorcast_control_accept_failing_seconds": 0,
		"tensorcast_healthy":                        1,
		"tensorcast_control_clients":                clients,
	} {
		if got := sample(t, exp, series); got != want {
			t.Errorf("%s = %v after the flood, want %v", series, got, want)
		}
	}
	p.stop(t)
	if log := p.log.String(); !strings.Contains(log, "metrics connection refused") || strings.Contains(log, "accept failing") {
		t.Errorf("the log does not say metrics connections were refused, or says accepting failed:\n%s", log)
	}
}

// TestConcurrentScrapersAndPings: 32 scrapers scrape without pause while a
// control client pings and new clients connect and ping. Every ping is
// answered and no accept fails; the scrapes share one rendering of the
// metrics (the snapshot interval is longer than the test), so the sources
// that read the data path's counters ran once for all of them.
func TestConcurrentScrapersAndPings(t *testing.T) {
	const scrapers, pings, newClients = 32, 500, 20
	cfg := testConfig(t.TempDir())
	cfg.MetricsMaxConns = 2 * scrapers // a client may dial anew before its last connection is back in its pool
	cfg.MetricsSnapshotInterval = Duration(time.Minute)
	d, c := startClient(t, cfg, discardLogger(), "pinger")

	stop := make(chan struct{})
	started := make(chan struct{}, scrapers)
	errs := make(chan error, scrapers)
	for range scrapers {
		go func() {
			hc := &http.Client{Timeout: 10 * time.Second}
			defer hc.CloseIdleConnections()
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				resp, err := hc.Get("http://" + d.MetricsAddr() + "/metrics")
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("scrape: %s", resp.Status)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				if i == 0 {
					started <- struct{}{}
				}
			}
		}()
	}
	for range scrapers {
		select {
		case <-started:
		case err := <-errs:
			t.Fatalf("a scraper stopped before its first scrape: %v", err)
		}
	}
	before := d.metricsSrv.Stats().Scrapes
	for i := range pings {
		if err := c.Ping(nil); err != nil {
			t.Fatalf("ping %d with %d scrapers: %v", i, scrapers, err)
		}
	}
	for i := range newClients {
		nc, err := client.Dial(cfg.Socket, client.Options{Name: fmt.Sprintf("new-%d", i)})
		if err != nil {
			t.Fatalf("new client %d with %d scrapers: %v", i, scrapers, err)
		}
		err = nc.Ping(nil)
		nc.Close()
		if err != nil {
			t.Fatalf("ping of new client %d: %v", i, err)
		}
	}
	during := d.metricsSrv.Stats().Scrapes - before
	close(stop)
	for range scrapers {
		if err := <-errs; err != nil {
			t.Fatalf("scraper: %v", err)
		}
	}
	st := d.metricsSrv.Stats()
	failures, _ := d.server.AcceptFailures()
	if during == 0 || st.Renders != 1 || failures != 0 || d.health() != nil {
		t.Fatalf("%d scrapes during the pings, endpoint %+v, %d failed accepts, health %v; want scrapes, 1 rendering, no failed accept",
			during, st, failures, d.health())
	}
	t.Logf("%d pings and %d new clients answered during %d scrapes by %d scrapers; %d rendering", pings, newClients, during, scrapers, st.Renders)
}
