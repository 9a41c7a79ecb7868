// Package deploy holds the tests of what deploy/ ships to run tensorcastd on
// a fleet: the alert rules and the Grafana dashboard here, the Helm chart
// in deploy/helm. It has no code of its own.
package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

const (
	rulesFile     = "prometheus/tensorcast-rules.yaml"
	rulesTestFile = "prometheus/tensorcast-rules_test.yaml"
	dashboardFile = "grafana/tensorcast.json"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// promtool is Debian's promtool (make deps installs it).
func promtool(t *testing.T) string { return testutil.Command(t, "promtool", "prometheus") }

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRules: the rules load, and promtool's unit tests fire and
// resolve each alert on synthetic series; every alert has a runbook and a
// unit test.
func TestAlertRules(t *testing.T) {
	pt := promtool(t)
	runTool(t, pt, "check", "rules", rulesFile)
	runTool(t, pt, "test", "rules", rulesTestFile)

	tested, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if strings.TrimSpace(r.Annotations["runbook"]) == "" || r.Annotations["summary"] == "" {
			t.Errorf("alert %s has no runbook or summary annotation", r.Alert)
		}
		if !strings.Contains(string(tested), "alertname: "+r.Alert+"\n") {
			t.Errorf("alert %s has no promtool unit test in %s", r.Alert, rulesTestFile)
		}
	}
}

type rule struct {
	Alert, Record, Expr, For string
	Labels, Annotations      map[string]string
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string
			Rules []rule
		}
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rs []rule
	for _, g := range f.Groups {
		rs = append(rs, g.Rules...)
	}
	if len(rs) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return rs
}

// query is one PromQL expression and where it comes from.
type query struct{ where, expr string }

// dashboardQueries returns every PromQL expression of the dashboard's
// panels (targets' expr, rows' panels included) and the metric names its
// variables' label_values queries read.
func dashboardQueries(t *testing.T) (qs []query, varMetrics []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels     []panel
		Templating struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage
			}
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
				}
				qs = append(qs, query{fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr})
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			if p.Type != "row" && p.Description == "" {
				t.Errorf("panel %q has no description", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	labelValues := regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
		}
		varMetrics = append(varMetrics, m[1])
	}
	return qs, varMetrics
}

type panel struct {
	Type, Title, Description string
	Targets                  []struct {
		RefID string `json:"refId"`
		Expr  string
	}
	Panels []panel
}

// grafanaVars stands in values for the dashboard's variables so that
// promtool can parse its expressions.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*", "$tenant", ".*")

// TestPromQLParses: every expression of the dashboard and the rules parses,
// as promtool check rules reads it (each one a recording rule).
func TestPromQLParses(t *testing.T) {
	pt := promtool(t)
	qs, _ := dashboardQueries(t)
	for _, r := range loadRules(t) {
		qs = append(qs, query{"rule " + r.Alert + r.Record, r.Expr})
	}
	type rec struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rs []rec
	for i, q := range qs {
		if strings.Contains(grafanaVars.Replace(q.expr), "$") {
			t.Errorf("%s: a variable the test does not know: %s", q.where, q.expr)
		}
		rs = append(rs, rec{fmt.Sprintf("tensorcast:query_%d", i), grafanaVars.Replace(q.expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "all", "rules": rs}}})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "queries.yaml")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(pt, "check", "rules", p).CombinedOutput()
	if err != nil {
		// promtool names the rule by index; map it back.
		msg := string(out)
		for i, q := range qs {
			msg = strings.ReplaceAll(msg, fmt.Sprintf("tensorcast:query_%d\"", i), fmt.Sprintf("tensorcast:query_%d\" (%s)", i, q.where))
		}
		t.Fatalf("promtool check rules: %v\n%s\n%s", err, msg, b)
	}
}

// metricName finds the daemon's metric names in PromQL: every series the
// dashboard and rules read is a tensorcast_ one, but up (Prometheus' own).
var metricName = regexp.MustCompile(`\btensorcast_[a-zA-Z0-9_]+\b`)

// stripStrings removes quoted strings (label values, legends) from PromQL.
var stripStrings = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// conditional are the metrics a daemon exports only under a condition the
// test's daemons cannot all meet here, with the condition. Each must still
// be a name the daemon's code emits (TestMetricsExist reads its source),
// so a rename fails the test even for these.
var conditional = map[string]string{
	// The eBPF views load only with CAP_BPF and CAP_PERFMON.
	"tensorcast_kernel_uring_latency_seconds_bucket": "the eBPF io_uring view (ebpf = auto with CAP_BPF and CAP_PERFMON)",
	// Per peer connection the kernel retransmitted on: none on loopback.
	"tensorcast_kernel_tcp_retransmits_total": "the eBPF tcp view and a retransmitted segment on a peer connection",
	// The etcd directory's, which daemon.TestDirectoryOpenUnlisted scrapes
	// beside a real etcd.
	"tensorcast_directory_cache_age_seconds":        withEtcd,
	"tensorcast_directory_staleness_budget_seconds": withEtcd,
	"tensorcast_directory_lookups_total":            withEtcd,
	"tensorcast_directory_hits_total":               withEtcd,
	"tensorcast_directory_fallbacks_total":          withEtcd,
	"tensorcast_directory_unavailable_total":        withEtcd,
	"tensorcast_directory_etcd_requests_total":      withEtcd,
	"tensorcast_directory_members":                  withEtcd,
}

const withEtcd = "directory = etcd"

// TestMetricsExist: every metric the dashboard and the rules read is in a
// scrape of two running daemons that moved bytes over every transport they
// have here (local, uring, tcp between them) and through the store (L1 and
// L2), or is one of the conditional names (eBPF, the etcd directory). RDMA has no names of its own:
// its requests are the transport metrics' transport="rdma" series.
func TestMetricsExist(t *testing.T) {
	used := map[string][]string{} // metric name -> where
	qs, vars := dashboardQueries(t)
	for _, r := range loadRules(t) {
		qs = append(qs, query{"rule " + r.Alert + r.Record, r.Expr})
	}
	for _, v := range vars {
		qs = append(qs, query{"variable query", v})
	}
	for _, q := range qs {
		for _, n := range metricName.FindAllString(stripStrings.ReplaceAllString(q.expr, ""), -1) {
			used[n] = append(used[n], q.where)
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in the dashboard and rules", len(used))
	}

	scraped := scrapeWithTraffic(t)
	emitted := emittedNames(t)
	var missing []string
	for n, where := range used {
		if scraped[n] {
			continue
		}
		if why, ok := conditional[n]; ok {
			if !emitted[strings.TrimSuffix(n, "_bucket")] {
				missing = append(missing, fmt.Sprintf("%s (conditional on %s, but no daemon source emits it; used by %s)", n, why, where[0]))
			}
			continue
		}
		missing = append(missing, fmt.Sprintf("%s (used by %s)", n, strings.Join(where, ", ")))
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not exported by a running daemon: %s", m)
	}
	for n := range conditional {
		if _, ok := used[n]; !ok {
			t.Errorf("conditional %s is not used by the dashboard or the rules: drop it from the list", n)
		}
	}
}

// emittedNames returns the metric names the daemon's source emits (string
// literals of the form "tensorcast_..." in daemon/ and metrics/).
func emittedNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	lit := regexp.MustCompile(`"(tensorcast_[a-z0-9_]+)"`)
	for _, dir := range []string{"../daemon", "../metrics"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				names[m[1]] = true
			}
		}
	}
	return names
}

// scrapeWithTraffic runs two daemons that are each other's peers, drives
// requests through local copies, io_uring file I/O (one of them misaligned,
// for an error), tcp to the peer, a shared-memory queue and the store (a
// durable put, so L2 too), and returns the sample names of both scrapes.
func scrapeWithTraffic(t *testing.T) map[string]bool {
	key := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(key, []byte("tensorcast deploy test key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d1 := startDaemon(t, "d1", key, daemon.PeerConfig{ID: "d2"})
	d2 := startDaemon(t, "d2", key, daemon.PeerConfig{ID: "d1", Addr: d1.PeerAddr()})

	exp := dial(t, d1, "exporter")
	ebuf, err := exp.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exp.ExportSegment("kv", ebuf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}

	c := dial(t, d2, "traffic")
	pool, ok := c.Pool()
	if !ok {
		t.Fatal("pool not mapped")
	}
	const blk = 64 << 10
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 2, blk)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := c.OpenRemote("d1/kv", client.RightWrite)
	if err != nil {
		t.Fatalf("opening the peer's export: %v", err)
	}
	file, _, err := c.RegisterFile(filepath.Join(d2.cfg.DataDir, "seg.bin"), true, 8<<20)
	if err != nil {
		t.Fatalf("RegisterFile (the io_uring file tier): %v", err)
	}
	res := make([]error, 1)
	for _, r := range []xfer.Request{
		{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: offs[0], Length: blk},               // local
		{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[0], Target: file, Length: blk},                  // uring
		{Op: xfer.OpWrite, Local: buf.ID, Target: remote.ID, Length: blk},                                         // tcp
		{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[1], Target: file, Length: blk},                   // uring
		{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[1], Target: file, TargetOffset: 7, Length: 4096}, // misaligned: an error
	} {
		sum, err := c.Transfer([]xfer.Request{r}, 10*time.Second, res)
		if err != nil {
			t.Fatalf("transfer %+v: %v", r, err)
		}
		if r.TargetOffset != 7 && (sum.Completed != 1 || res[0] != nil) {
			t.Fatalf("transfer %+v: %+v %v", r, sum, res[0])
		}
	}

	q, err := c.OpenQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.Submit([]xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: pool.Segment, TargetOffset: offs[0], Length: blk}}, []uint64{1}); n != 1 || err != nil {
		t.Fatalf("queue submit: %d %v", n, err)
	}
	cqes := make([]client.Completion, 1)
	if _, err := q.Reap(cqes, 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	if err := c.PutBytes([]byte("deploy/key"), make([]byte, 8192), true); err != nil {
		t.Fatalf("durable put (the store's L1 and L2): %v", err)
	}
	if _, err := c.GetBytes([]byte("deploy/key")); err != nil {
		t.Fatal(err)
	}

	names := map[string]bool{}
	for _, d := range []*running{d1, d2} {
		for n := range scrape(t, d.MetricsAddr()) {
			names[n] = true
		}
	}
	// What the test drove must show, or the scrape proves little.
	for _, n := range []string{"tensorcast_transport_requests_total", "tensorcast_peer_connected", "tensorcast_uring_ring_sqes_total",
		"tensorcast_store_writebacks_total", "tensorcast_queue_completions_total", "tensorcast_transport_errors_total"} {
		if !names[n] {
			t.Errorf("the scrape after traffic has no %s", n)
		}
	}
	return names
}

type running struct {
	*daemon.Daemon
	cfg daemon.Config
}

func startDaemon(t *testing.T, id, key string, peers ...daemon.PeerConfig) *running {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Defaults()
	cfg.DaemonID = id
	cfg.Socket = filepath.Join(dir, "tc.sock")
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.AllowedFiles = []string{cfg.DataDir}
	cfg.PoolSize = 32 << 20
	cfg.StoreL2Size = 64 << 20
	cfg.MetricsAddress = "127.0.0.1:0"
	cfg.PeerListen = "127.0.0.1:0"
	cfg.ClusterKeyFile = key
	cfg.Peers = peers
	cfg.RDMA = "off"
	cfg.EBPF = "off"
	if os.Geteuid() == 0 {
		cfg.EBPF = "auto" // the kernel views' names, where the kernel lets them load
	}
	cfg.DrainTimeout = daemon.Duration(2 * time.Second)
	r := &running{cfg: cfg}
	// The daemon's log is the test's output: shown when it fails.
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), func(string) string { return "" })
	if err != nil {
		t.Fatalf("daemon %s: %v", id, err)
	}
	r.Daemon = d
	testutil.Run(t, "daemon "+id, d.Run)
	return r
}

func dial(t *testing.T, d *running, name string) *client.Client {
	t.Helper()
	c, err := client.Dial(d.cfg.Socket, client.Options{Name: name, CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// scrape returns the sample names of one scrape of addr.
func scrape(t *testing.T, addr string) map[string]bool {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s %v", resp.Status, err)
	}
	names := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}
