package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestStatsJSON(t *testing.T) {
	sock := startDaemon(t)
	code, out, errs := tcctl(t, nil, "--socket", sock, "stats", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var st statsJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if st.Connections != 1 || st.Pool["size"] != 8<<20 || st.Engine == nil || st.Connection == nil {
		t.Fatalf("stats --json: %+v", st)
	}
	if code, _, _ := tcctl(t, nil, "--socket", sock, "stats", "--yaml"); code != 2 {
		t.Fatalf("unknown stats flag: exit %d, want 2", code)
	}
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("socket = \"/run/a.sock\"\n\npool_size = \"1k\"\nrdma = \"sometimes\"\nfoo = 1\n"), 0o644)
	code, out, errs := tcctl(t, nil, "config", "check", bad)
	if code != 1 {
		t.Fatalf("exit %d for a bad file: %s %s", code, out, errs)
	}
	for _, want := range []string{bad + ":3: pool_size:", bad + ":4: rdma:", bad + ":5: foo: unknown key"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = tcctl(t, nil, "config", "check", "../../deploy/tensorcastd.toml")
	if code != 0 || !strings.HasSuffix(out, ": ok\n") {
		t.Fatalf("shipped config: exit %d\n%s", code, out)
	}
	if code, _, _ := tcctl(t, nil, "config", "lint", bad); code != 2 {
		t.Fatalf("config lint: exit %d, want 2", code)
	}
}

// hist builds a histogram sample from per-bucket (not cumulative) counts.
func histOf(bounds []float64, counts []uint64, sum float64) *dto.MetricFamily {
	var cum, total uint64
	var bs []*dto.Bucket
	for i, b := range bounds {
		cum += counts[i]
		bs = append(bs, &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(cum)})
	}
	total = cum
	return &dto.MetricFamily{Name: proto.String("tensorcast_transport_latency_seconds"), Type: dto.MetricType_HISTOGRAM.Enum(),
		Metric: []*dto.Metric{{Label: []*dto.LabelPair{{Name: proto.String("transport"), Value: proto.String("local")}},
			Histogram: &dto.Histogram{SampleCount: proto.Uint64(total), SampleSum: proto.Float64(sum), Bucket: bs}}}}
}

func counterOf(name string, v float64) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Type: dto.MetricType_COUNTER.Enum(),
		Metric: []*dto.Metric{{Label: []*dto.LabelPair{{Name: proto.String("transport"), Value: proto.String("local")}},
			Counter: &dto.Counter{Value: proto.Float64(v)}}}}
}

// TestRenderRates: rates are the difference of two scrapes over their
// interval; percentiles come from the difference of their histograms.
func TestRenderRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	bounds := []float64{1e-6, 2e-6, 4e-6, 8e-6}
	a := &snapshot{at: t0, fams: map[string]*dto.MetricFamily{
		"tensorcast_transport_requests_total":  counterOf("tensorcast_transport_requests_total", 100),
		"tensorcast_transport_bytes_total":     counterOf("tensorcast_transport_bytes_total", 1e6),
		"tensorcast_transport_latency_seconds": histOf(bounds, []uint64{100, 0, 0, 0}, 1e-4),
	}}
	// 2 s later: 400 more requests, 8 MB more, all of them between 2 and 4 µs.
	b := &snapshot{at: t0.Add(2 * time.Second), fams: map[string]*dto.MetricFamily{
		"tensorcast_transport_requests_total":  counterOf("tensorcast_transport_requests_total", 500),
		"tensorcast_transport_bytes_total":     counterOf("tensorcast_transport_bytes_total", 9e6),
		"tensorcast_transport_latency_seconds": histOf(bounds, []uint64{100, 0, 400, 0}, 1.3e-3),
	}}
	var out strings.Builder
	render(&out, a, b, "test", 2)
	row := regexp.MustCompile(`(?m)^\s*local\s+(\S+)\s+(\S+)\s+\S+\s+\S+\s+(\S+)\s+(\S+)`).FindStringSubmatch(out.String())
	if row == nil {
		t.Fatalf("no local row:\n%s", out.String())
	}
	if row[1] != "200" || row[2] != "4.0" {
		t.Fatalf("IOPS %s MB/s %s, want 200 and 4.0:\n%s", row[1], row[2], out.String())
	}
	if row[3] != "3.0µs" || row[4] != "4.0µs" {
		t.Fatalf("p50 %s p99 %s, want 3.0µs and 4.0µs (inside the 2-4 µs bucket):\n%s", row[3], row[4], out.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("a sample of the submit calls, about 1 in %d", xfer.SampleEvery)) {
		t.Fatalf("the frame does not say the transport percentiles are sampled:\n%s", out.String())
	}
	var first strings.Builder
	render(&first, nil, a, "test", 1)
	if !strings.Contains(first.String(), "since start") || !regexp.MustCompile(`(?m)^\s*local\s+-\s+-`).MatchString(first.String()) {
		t.Fatalf("first frame:\n%s", first.String())
	}
}

// startMetricsDaemon runs a real daemon with a metrics endpoint and
// returns its socket and metrics address.
func startMetricsDaemon(t *testing.T) (string, string) {
	t.Helper()
	d, cfg := startTensorcastd(t, func(c *daemon.Config) {
		c.MetricsAddress = "127.0.0.1:0"
		c.EBPF = "off"
	})
	return cfg.Socket, d.MetricsAddr()
}

// TestTopUnderTmux runs tcctl top in a real terminal (tmux), moves data
// through the daemon, and checks from the screen that the transport row
// appears with a rate and that the frame is redrawn in place.
func TestTopUnderTmux(t *testing.T) {
	testutil.Command(t, "tmux", "tmux")
	sock, maddr := startMetricsDaemon(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "tcctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fifo := filepath.Join(dir, "pane")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	server := fmt.Sprintf("tcctl-top-%d", os.Getpid())
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-L", server}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// The pane starts on a shell that waits for a line, so the pane's
	// output can be piped to the fifo before top draws anything.
	tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "40",
		"read go; exec "+bin+" top --metrics "+maddr+" --interval 200ms")
	t.Cleanup(func() { exec.Command("tmux", "-L", server, "kill-server").Run() })
	tmux("pipe-pane", "-t", "top", "-o", "cat > "+fifo)
	f, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tmux("send-keys", "-t", "top", "Enter")

	// Traffic for the local transport while top runs.
	c, err := client.Dial(sock, client.Options{Name: "top-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pool, _ := c.Pool()
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 1, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	moved := make(chan error, 1)
	go func() {
		reqs := []xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: offs[0], Length: 64 << 10}}
		res := make([]error, 1)
		for {
			select {
			case <-stop:
				moved <- nil
				return
			default:
			}
			if _, err := c.Transfer(reqs, 5*time.Second, res); err != nil {
				moved <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-moved; err != nil {
			t.Errorf("transfers: %v", err)
		}
	}()

	// Read what top writes to the terminal until frame 5 is drawn.
	frames := regexp.MustCompile(`frame (\d+)`)
	sc := bufio.NewScanner(f)
	sc.Split(bufio.ScanRunes)
	var seen strings.Builder
	deadline := time.AfterFunc(30*time.Second, func() { exec.Command("tmux", "-L", server, "kill-server").Run(); f.Close() })
	defer deadline.Stop()
	for sc.Scan() {
		seen.WriteString(sc.Text())
		if m := frames.FindAllStringSubmatch(seen.String(), -1); len(m) > 0 && m[len(m)-1][1] == "5" {
			break
		}
	}
	if !strings.Contains(seen.String(), "frame 5") {
		t.Fatalf("top drew no fifth frame; it wrote:\n%q", seen.String())
	}
	screen := tmux("capture-pane", "-p", "-t", "top")
	if n := strings.Count(screen, "tcctl top"); n != 1 {
		t.Fatalf("the screen shows %d headers, want one (redrawn in place):\n%s", n, screen)
	}
	m := frames.FindStringSubmatch(screen)
	if m == nil {
		t.Fatalf("no frame number on the screen:\n%s", screen)
	}
	if n, _ := strconv.Atoi(m[1]); n < 5 {
		t.Fatalf("screen is not at frame 5 or later:\n%s", screen)
	}
	row := regexp.MustCompile(`(?m)^\s*local\s+(\d+)\s+([0-9.]+)\s+`).FindStringSubmatch(screen)
	if row == nil || row[1] == "0" {
		t.Fatalf("no local transport row with a rate on the screen:\n%s", screen)
	}
	if !strings.Contains(screen, "TRANSPORT") || !strings.Contains(screen, "P99") {
		t.Fatalf("header row missing:\n%s", screen)
	}
}

func unlabeledOf(name string, v float64, gauge bool) *dto.MetricFamily {
	m := &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(v)}}
	typ := dto.MetricType_COUNTER
	if gauge {
		m = &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(v)}}
		typ = dto.MetricType_GAUGE
	}
	return &dto.MetricFamily{Name: proto.String(name), Type: typ.Enum(), Metric: []*dto.Metric{m}}
}

// TestRenderQueues: the queue row shows open queues, completion and wake
// rates from the difference of two scrapes, and the current depth.
func TestRenderQueues(t *testing.T) {
	t0 := time.Unix(1000, 0)
	snap := func(at time.Time, comp, wakes float64) *snapshot {
		return &snapshot{at: at, fams: map[string]*dto.MetricFamily{
			"tensorcast_queues_open":               unlabeledOf("tensorcast_queues_open", 2, true),
			"tensorcast_queue_in_flight":           unlabeledOf("tensorcast_queue_in_flight", 48, true),
			"tensorcast_queue_unreaped":            unlabeledOf("tensorcast_queue_unreaped", 3, true),
			"tensorcast_queue_completions_total":   unlabeledOf("tensorcast_queue_completions_total", comp, false),
			"tensorcast_queue_client_wakes_total":  unlabeledOf("tensorcast_queue_client_wakes_total", wakes, false),
			"tensorcast_queue_worker_sleeps_total": unlabeledOf("tensorcast_queue_worker_sleeps_total", 0, false),
		}}
	}
	var out strings.Builder
	render(&out, snap(t0, 1000, 10), snap(t0.Add(2*time.Second), 201000, 110), "test", 2)
	row := regexp.MustCompile(`(?m)^\s*2\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$`).FindStringSubmatch(out.String())
	if row == nil || row[1] != "100000" || row[2] != "48" || row[3] != "3" || row[4] != "50" || row[5] != "0" {
		t.Fatalf("queue row %q, want 100000 CQE/s, 48 in flight, 3 unreaped, 50 wakes/s, 0 sleeps/s:\n%s", row, out.String())
	}
}

// TestSnapshotRenderedAt: a scrape is dated by the daemon's rendering, so
// two scrapes of one rendering are seen as one and rates are over the
// renderings' interval.
func TestSnapshotRenderedAt(t *testing.T) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader("# TYPE tensorcast_metrics_rendered_timestamp_seconds gauge\ntensorcast_metrics_rendered_timestamp_seconds 1.7e+09\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	if s := newSnapshot(fams, now); !s.at.Equal(time.Unix(1_700_000_000, 0)) {
		t.Fatalf("snapshot at %v, want the rendering's time", s.at)
	}
	if s := newSnapshot(map[string]*dto.MetricFamily{}, now); !s.at.Equal(now) {
		t.Fatalf("snapshot without a rendering time at %v, want the scrape's", s.at)
	}
}
