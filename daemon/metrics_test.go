package daemon

import (
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// runDaemon runs d until the test ends.
func runDaemon(t *testing.T, d *Daemon) {
	t.Helper()
	testutil.Run(t, "daemon Run", d.Run)
}

// startClient runs a daemon on cfg, logging to log, until the test ends
// and returns it with a client of it named name.
func startClient(t *testing.T, cfg Config, log *slog.Logger, name string) (*Daemon, *client.Client) {
	t.Helper()
	d, err := New(cfg, log, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	c, err := client.Dial(cfg.Socket, client.Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return d, c
}

// allocBlocks allocates n pool blocks of size bytes on c.
func allocBlocks(t *testing.T, c *client.Client, n int, size uint64) []uint64 {
	t.Helper()
	offs, err := c.AllocBlocks(nil, n, size)
	if err != nil {
		t.Fatal(err)
	}
	return offs
}

func scrapeMetrics(t *testing.T, addr string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %s %v\n%s", resp.Status, err, b)
	}
	return string(b)
}

// sample returns the value of the series written exactly as series, or
// fails.
func sample(t *testing.T, exp, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(exp)
	if m == nil {
		t.Fatalf("no series %s in the scrape:\n%s", series, exp)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// TestMetricsAfterKnownWorkload runs a daemon, moves a known number of
// bytes through the local transport from a client, and checks the scrape's
// names, labels and exact counts; the exposition passes promtool when it
// is installed.
func TestMetricsAfterKnownWorkload(t *testing.T) {
	cfg := testConfig(t.TempDir())
	d, c := startClient(t, cfg, discardLogger(), "metrics-test")
	pool, _ := c.Pool()
	buf, offs := newBuffer(t, c, 1<<20), allocBlocks(t, c, 4, 64<<10)
	// 5 one-shot transfers of 4 requests of 64 KiB: 20 requests, 1310720 bytes.
	const calls, per, size = 5, 4, 64 << 10
	reqs := make([]xfer.Request, per)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: uint64(i * size), Target: pool.Segment,
			TargetOffset: offs[i], Length: size}
	}
	results := make([]error, per)
	for range calls {
		sum, err := c.Transfer(reqs, 5*time.Second, results)
		if err != nil || sum.Completed != per {
			t.Fatalf("transfer: %+v %v %v", sum, err, results)
		}
	}

	// And 7 requests through a queue: 3 copies and 4 no-ops.
	q, err := c.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.Submit(reqs[:3], []uint64{1, 2, 3}); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	for i := range 4 {
		q.Nop(uint64(10 + i))
	}
	cqes := make([]client.Completion, 8)
	for got := 0; got < 7; {
		n, err := q.Reap(cqes[got:], 1, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}

	exp := scrapeMetrics(t, d.MetricsAddr())
	want := map[string]float64{
		`tensorcast_transport_requests_total{transport="local"}`:            calls*per + 3,
		`tensorcast_transport_bytes_total{transport="local"}`:               (calls*per + 3) * size,
		`tensorcast_queues_open`:                                            1,
		`tensorcast_queues_opened_total`:                                    1,
		`tensorcast_queue_completions_total`:                                7,
		`tensorcast_queue_in_flight`:                                        0,
		`tensorcast_queue_unreaped`:                                         0,
		`tensorcast_queue_violations_total`:                                 0,
		`tensorcast_transport_in_flight{transport="local"}`:                 0,
		`tensorcast_transport_refused_total{transport="local"}`:             0,
		`tensorcast_engine_tasks_ended_total{state="completed"}`:            calls*per + 3,
		`tensorcast_engine_tasks_ended_total{state="failed"}`:               0,
		`tensorcast_engine_tasks{state="pending"}`:                          0,
		`tensorcast_engine_bytes_total`:                                     (calls*per + 3) * size,
		`tensorcast_control_clients`:                                        1,
		`tensorcast_control_requests_total{type="TransferRequestBody"}`:     calls,
		`tensorcast_control_requests_total{type="AllocBlocksRequest"}`:      1,
		`tensorcast_control_requests_total{type="RegisterBufferRequest"}`:   1,
		`tensorcast_pool_blocks{tenant="default"}`:                          4,
		`tensorcast_pool_size_bytes{tenant="default"}`:                      float64(cfg.PoolSize),
		`tensorcast_pool_class_blocks{block_size="65536",tenant="default"}`: 4,
		`tensorcast_control_tenant_clients{tenant="default"}`:               1,
		`tensorcast_healthy`:                                                1,
	}
	for series, v := range want {
		if got := sample(t, exp, series); got != v {
			t.Errorf("%s = %v, want %v", series, got, v)
		}
	}
	// The latency histogram is a sample of the submit calls (1 in
	// xfer.SampleEvery, each with all its requests): at most every request.
	lc := sample(t, exp, `tensorcast_transport_latency_seconds_count{transport="local"}`)
	if lc > calls*per+3 || sample(t, exp, `tensorcast_transport_latency_seconds_bucket{transport="local",le="+Inf"}`) != lc {
		t.Errorf("latency count %v, want at most %d and equal to the +Inf bucket", lc, calls*per+3)
	}
	if !strings.Contains(exp, "# HELP tensorcast_transport_latency_seconds") || !strings.Contains(exp, "for a sample of the submit calls: about 1 in "+strconv.Itoa(xfer.SampleEvery)) {
		t.Errorf("the latency histogram's help does not say it is sampled")
	}
	if strings.Contains(exp, `tensorcast_transport_errors_total{transport="local"`) {
		t.Errorf("errors counted for a workload without any:\n%s", exp)
	}
	for _, name := range []string{"tensorcast_build_info{", "tensorcast_pool_fragmentation_ratio{", "tensorcast_pool_thp_bytes{", "tensorcast_pool_used_bytes{", "go_goroutines ", "process_open_fds "} {
		if !strings.Contains(exp, name) {
			t.Errorf("scrape lacks %s", name)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", exp)
	}
	// Last: without promtool the checks above have run, and the test
	// skips here (fails where the machine provides the tools).
	cmd := exec.Command(testutil.Command(t, "promtool", "prometheus"), "check", "metrics")
	cmd.Stdin = strings.NewReader(exp)
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
