// Package deploy holds the tests of what deploy/ ships to run tensorcastd on
// a fleet: the alert rules and the Grafana dashboard here, the Helm chart
// in deploy/helm. It has no code of its own.
package deploy

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
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
	checkFireAndResolve(t, tested)
}

// checkFireAndResolve: in the promtool unit tests, every alert of the
// rules fires (an evaluation expecting it) and then resolves (a later
// evaluation of the same test expecting none).
func checkFireAndResolve(t *testing.T, tested []byte) {
	t.Helper()
	var f struct {
		Tests []struct {
			Name  string
			Evals []struct {
				EvalTime  string           `json:"eval_time"`
				AlertName string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		}
	}
	if err := yaml.Unmarshal(tested, &f); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	fired, resolved := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		firedAt := map[string]time.Duration{}
		for _, e := range tc.Evals {
			at, err := time.ParseDuration(e.EvalTime)
			if err != nil {
				t.Fatalf("%s: test %q: eval_time %q: %v", rulesTestFile, tc.Name, e.EvalTime, err)
			}
			if len(e.ExpAlerts) > 0 {
				if _, ok := firedAt[e.AlertName]; !ok {
					firedAt[e.AlertName] = at
				}
				fired[e.AlertName] = true
				continue
			}
			if first, ok := firedAt[e.AlertName]; ok && at > first {
				resolved[e.AlertName] = true
			}
		}
	}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			continue
		}
		if !fired[r.Alert] {
			t.Errorf("no promtool unit test fires %s", r.Alert)
		}
		if !resolved[r.Alert] {
			t.Errorf("no promtool unit test resolves %s after it fired (a later eval_time with exp_alerts: [])", r.Alert)
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
// test's daemons may not meet here, with the condition (the directory's,
// only where etcd is not installed). Each must still
// be a name the daemon's code emits (TestMetricsExist reads its source),
// so a rename fails the test even for these.
var conditional = map[string]string{
	// The eBPF views load only with CAP_BPF and CAP_PERFMON.
	"tensorcast_kernel_uring_latency_seconds_bucket": "the eBPF io_uring view (ebpf = auto with CAP_BPF and CAP_PERFMON)",
	// Per peer connection the kernel retransmitted on: none on loopback.
	"tensorcast_kernel_tcp_retransmits_total": "the eBPF tcp view and a retransmitted segment on a peer connection",
	// The etcd directory's: scraped where etcd is installed (the daemons
	// then run with directory = etcd).
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
// scrape of two running daemons (directory = etcd where etcd is
// installed) that moved bytes over every transport they have here (local,
// uring, tcp between them), through the store (L1 and L2) and the store
// across hosts, or is one of the conditional names (eBPF; the etcd
// directory's without etcd). RDMA has no names of its own: its requests are
// the transport metrics' transport="rdma" series, its links'
// tensorcast_peer_link_state. And the panels that read per-tenant metrics
// follow the tenant variable (checkTenants).
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

	etcd := startEtcd(t)
	got := scrapeWithTraffic(t, etcd)
	emitted := emittedNames(t)
	var missing []string
	for n, where := range used {
		if got[n] != nil {
			continue
		}
		if why, ok := conditional[n]; ok && (why != withEtcd || etcd == nil) {
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
	checkTenants(t, qs, got)
}

// selector is a metric and its label matchers in PromQL.
var selector = regexp.MustCompile(`\b(tensorcast_[a-zA-Z0-9_]+)\b(\{[^}]*\})?`)

// byClause is an aggregation's by (...) or a vector matching's on (...).
var byClause = regexp.MustCompile(`\b(?:by|on)\s*\(([^)]*)\)`)

// checkTenants: a dashboard panel that reads a metric the daemon labels
// with its tenant (as the scrape shows) follows the tenant variable and
// keeps the tenant apart, in every aggregation of the query.
func checkTenants(t *testing.T, qs []query, got scraped) {
	t.Helper()
	tenantMetrics := 0
	for _, q := range qs {
		if !strings.HasPrefix(q.where, "panel ") {
			continue // the rules alert per series, whatever its labels
		}
		perTenant := false
		for _, m := range selector.FindAllStringSubmatch(q.expr, -1) {
			if !got[m[1]]["tenant"] {
				continue
			}
			perTenant = true
			if !strings.Contains(m[2], `tenant=~"$tenant"`) {
				t.Errorf("%s: %s has a tenant label, and the query does not follow $tenant: %s", q.where, m[1], q.expr)
			}
		}
		if !perTenant {
			continue
		}
		tenantMetrics++
		for _, b := range byClause.FindAllStringSubmatch(q.expr, -1) {
			if !slices.Contains(strings.Fields(strings.ReplaceAll(b[1], ",", " ")), "tenant") {
				t.Errorf("%s: reads a per-tenant metric, and by/on (%s) adds the tenants up: %s", q.where, b[1], q.expr)
			}
		}
	}
	if tenantMetrics < 10 {
		t.Errorf("only %d panel queries read a per-tenant metric; the scrape's tenant labels were not seen", tenantMetrics)
	}
}

const readme = "../README.md"

// TestReadmeListsPanels: the README's table of the dashboard's panels
// names every panel, in the dashboard's order under its row, with what it
// shows, and nothing else; and the README names every alert.
func TestReadmeListsPanels(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Panels []panel }
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var want []string
	row := ""
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				row = p.Title
				walk(p.Panels) // a collapsed row holds its panels
				continue
			}
			want = append(want, row+" / "+p.Title)
		}
	}
	walk(d.Panels)

	text, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	in := false
	row = ""
	for line := range strings.Lines(string(text)) {
		line = strings.TrimSpace(line)
		if line == "| row | panel | shows |" {
			if in || listed != nil {
				t.Fatal("two panel tables in the README")
			}
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("README panel table: %d cells in %q", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if strings.Trim(cells[0], "- ") == "" && strings.Trim(cells[1], "- ") == "" {
			continue // the header's rule
		}
		if cells[0] != "" {
			row = cells[0]
		}
		if cells[2] == "" {
			t.Errorf("README: panel %s / %s does not say what it shows", row, cells[1])
		}
		listed = append(listed, row+" / "+cells[1])
	}
	if !slices.Equal(listed, want) {
		t.Errorf("the README's panel table is not the dashboard's panels:\nREADME:    %q\ndashboard: %q", listed, want)
		for _, p := range want {
			if !slices.Contains(listed, p) {
				t.Errorf("README lacks panel %s", p)
			}
		}
		for _, p := range listed {
			if !slices.Contains(want, p) {
				t.Errorf("README lists %s, which the dashboard has not", p)
			}
		}
	}
	for _, r := range loadRules(t) {
		if r.Alert != "" && !strings.Contains(string(text), "`"+r.Alert+"`") {
			t.Errorf("the README does not name the alert %s", r.Alert)
		}
	}
}

// startEtcd runs etcd for the daemons' directory where it is installed,
// so the directory's metrics are scraped too; without it (and where
// TENSORCAST_TEST_PROVIDES does not list etcd) the daemons list each other
// as [[peers]] and the directory's names are only checked in the source.
func startEtcd(t *testing.T) *etcdtest.Server {
	if _, err := os.Stat(etcdtest.Binary); err != nil {
		provided, perr := testutil.Provided()
		if perr != nil {
			t.Fatal(perr)
		}
		if slices.Contains(provided, testutil.Etcd) {
			t.Fatalf("%s lists etcd, and %s is missing: %v", testutil.ProvidesEnv, etcdtest.Binary, err)
		}
		t.Logf("etcd is not installed (%v): the directory's metrics are not scraped", err)
		return nil
	}
	return etcdtest.Start(t)
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
// for an error), tcp to the peer, a shared-memory queue, the store (a
// durable put, so L2 too) and the store across hosts (a value one daemon
// holds read by the other), and returns the sample names of both scrapes
// with their labels.
func scrapeWithTraffic(t *testing.T, etcd *etcdtest.Server) scraped {
	key := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(key, []byte("tensorcast deploy test key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var d1, d2 *running
	if etcd != nil {
		// directory = etcd, as the chart's etcd.enabled: the daemons
		// find each other, and d1's export, there.
		d1 = startDaemon(t, "d1", key, etcd)
		d2 = startDaemon(t, "d2", key, etcd)
	} else {
		d1 = startDaemon(t, "d1", key, nil, daemon.PeerConfig{ID: "d2"})
		d2 = startDaemon(t, "d2", key, nil, daemon.PeerConfig{ID: "d1", Addr: d1.PeerAddr()})
	}

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
	var remote client.RemoteSegment
	// With the etcd directory d2 sees d1's export once its catalog does.
	testutil.Eventually(t, 20*time.Second, func() bool {
		remote, err = c.OpenRemote("d1/kv", client.RightWrite)
		return err == nil
	}, "d2 opening d1/kv: %v", testutil.Lazy(func() any { return err }))
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

	// The store across hosts: a value put on d1 and read on d2 is a
	// remote get, through d2's home lookup and d1's claim. The home learns
	// of the key from d1's announcement, which is asynchronous: d2 reads
	// until the value is found.
	d1c := dial(t, d1, "holder")
	val := []byte("a value only d1 holds, read by d2 across hosts")
	if err := d1c.PutBytes([]byte("deploy/remote"), val, false); err != nil {
		t.Fatalf("put on d1: %v", err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		got, err := c.GetBytes([]byte("deploy/remote"))
		return err == nil && string(got) == string(val)
	}, "d2 reading d1's value across hosts")

	names := scraped{}
	for _, d := range []*running{d1, d2} {
		for n, ls := range scrape(t, d.MetricsAddr()) {
			if names[n] == nil {
				names[n] = map[string]bool{}
			}
			maps.Copy(names[n], ls)
		}
	}
	// What the test drove must show, or the scrape proves little.
	for _, n := range []string{"tensorcast_transport_requests_total", "tensorcast_peer_connected", "tensorcast_uring_ring_sqes_total",
		"tensorcast_store_writebacks_total", "tensorcast_queue_completions_total", "tensorcast_transport_errors_total",
		"tensorcast_cluster_remote_gets_total", "tensorcast_cluster_remote_bytes_total"} {
		if names[n] == nil {
			t.Errorf("the scrape after traffic has no %s", n)
		}
	}
	return names
}

type running struct {
	*daemon.Daemon
	cfg daemon.Config
}

func startDaemon(t *testing.T, id, key string, etcd *etcdtest.Server, peers ...daemon.PeerConfig) *running {
	t.Helper()
	return startDaemonWith(t, id, key, etcd, nil, peers...)
}

// startDaemonWith is startDaemon with mut applied to the config last.
func startDaemonWith(t *testing.T, id, key string, etcd *etcdtest.Server, mut func(*daemon.Config), peers ...daemon.PeerConfig) *running {
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
	if etcd != nil {
		cfg.Directory = "etcd"
		cfg.EtcdEndpoints = etcd.Endpoints()
		cfg.EtcdPrefix = "/deploy/"
		cfg.EtcdLeaseTTL = daemon.Duration(2 * time.Second)
	}
	cfg.RDMA = "off"
	cfg.EBPF = "off"
	if os.Geteuid() == 0 {
		cfg.EBPF = "auto" // the kernel views' names, where the kernel lets them load
	}
	cfg.DrainTimeout = daemon.Duration(2 * time.Second)
	if mut != nil {
		mut(&cfg)
	}
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

// scraped is what a scrape held: each sample name with the label names
// its samples carry.
type scraped map[string]map[string]bool

// scrape returns the sample names of one scrape of addr, with their
// labels' names.
func scrape(t *testing.T, addr string) scraped {
	t.Helper()
	names := scraped{}
	for _, s := range scrapeSamples(t, addr) {
		if names[s.name] == nil {
			names[s.name] = map[string]bool{}
		}
		for l := range s.labels {
			names[s.name][l] = true
		}
	}
	return names
}

// sample is one line of a scrape: its name, labels and value.
type sample struct {
	name   string
	labels map[string]string
	value  string
}

// scrapeSamples returns the samples of one scrape of addr.
func scrapeSamples(t *testing.T, addr string) []sample {
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
	var out []sample
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.IndexAny(line, "{ ")
		if i <= 0 {
			continue
		}
		s := sample{name: line[:i], labels: map[string]string{}}
		rest := line[i:]
		if line[i] == '{' {
			end := strings.LastIndexByte(line, '}')
			for _, m := range label.FindAllStringSubmatch(line[i+1:max(end, i+1)], -1) {
				s.labels[m[1]] = m[2]
			}
			rest = line[max(end, i)+1:]
		}
		if f := strings.Fields(rest); len(f) > 0 {
			s.value = f[0]
		}
		out = append(out, s)
	}
	return out
}
