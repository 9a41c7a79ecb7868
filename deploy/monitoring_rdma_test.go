package deploy

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestRDMAMetricsScraped is TestMetricsExist for the RDMA series, which
// only a host with an RDMA device produces (the Soft-RoCE VM of make
// test-rdma; it skips elsewhere, naming rdma): two daemons with rdma = on
// move bytes over their RDMA link, and every selector of the dashboard and
// the rules about RDMA (one whose text names rdma, or an RDMA alert's) has
// a sample in their scrapes that matches its name and its label matchers.
// The link state the RDMA panels show must be rdma, and the rdma
// transport's requests counted.
func TestRDMAMetricsScraped(t *testing.T) {
	testutil.Require(t, testutil.RDMA)
	sels := rdmaSelectors(t)
	if len(sels) < 3 {
		t.Fatalf("only %d RDMA selectors found in the dashboard and rules: %v", len(sels), sels)
	}

	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast deploy rdma test key")
	rdmaOn := func(c *daemon.Config) {
		c.RDMA = "on"
		c.RDMADevice = os.Getenv("RXE_DEV")
		c.PoolSize = 64 << 20
	}
	d1 := startDaemonWith(t, "d1", key, nil, rdmaOn, daemon.PeerConfig{ID: "d2"})
	d2 := startDaemonWith(t, "d2", key, nil, rdmaOn, daemon.PeerConfig{ID: "d1", Addr: d1.PeerAddr()})

	exp := dial(t, d1, "exporter")
	pi, ok := exp.Pool()
	if !ok {
		t.Fatal("exporter has no pool mapping")
	}
	const blk = 1 << 20
	eoffs, err := exp.AllocBlocks(nil, 1, blk)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exp.ExportSegment("kv", pi.Segment, eoffs[0], blk, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	c := dial(t, d2, "traffic")
	wi, ok := c.Pool()
	if !ok {
		t.Fatal("writer has no pool mapping")
	}
	offs, err := c.AllocBlocks(nil, 1, blk)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.OpenRemote("d1/kv", client.RightRead|client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	// Writes and reads until d2's scrape says the link to d1 is rdma and
	// the rdma transport counted requests (the first ones go over tcp
	// while the link comes up).
	res := make([]error, 1)
	var samples []sample
	testutil.Eventually(t, 30*time.Second, func() bool {
		for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
			r := xfer.Request{Op: op, Local: wi.Segment, LocalOffset: offs[0], Target: rs.ID, Length: blk}
			if sum, err := c.Transfer([]xfer.Request{r}, 10*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
				t.Fatalf("%v of %d bytes to d1: %v, %v, %+v", op, blk, err, res[0], sum)
			}
		}
		samples = scrapeSamples(t, d2.MetricsAddr())
		return value(samples, "tensorcast_peer_link_state", map[string]string{"peer": "d1", "state": "rdma"}) == "1" &&
			nonZero(samples, "tensorcast_transport_requests_total", regexp.MustCompile(`^rdma`))
	}, "d2's link to d1 on rdma, with rdma requests counted")
	samples = append(samples, scrapeSamples(t, d1.MetricsAddr())...)

	for _, s := range sels {
		if !s.matchesAny(samples) {
			t.Errorf("%s (used by %s): no sample of the two daemons' scrapes matches it", s.text, s.where)
			continue
		}
		t.Logf("scraped: %s", s)
	}
}

// promSelector is a metric selector of a PromQL expression: the name and
// its label matchers.
type promSelector struct {
	where, text, name string
	matchers          []labelMatcher
}

type labelMatcher struct {
	label, op string
	re        *regexp.Regexp // the value as a fully anchored regexp
}

var matcher = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)

// rdmaSelectors returns the selectors of the dashboard's and the rules'
// expressions that are about RDMA: those whose matchers name rdma, and
// every selector of an alert whose name says RDMA.
func rdmaSelectors(t *testing.T) []promSelector {
	t.Helper()
	qs, _ := dashboardQueries(t)
	alertQs := map[string]bool{}
	for _, r := range loadRules(t) {
		q := query{"rule " + r.Alert + r.Record, r.Expr}
		qs = append(qs, q)
		alertQs[q.where] = strings.Contains(r.Alert, "RDMA")
	}
	var out []promSelector
	for _, q := range qs {
		for _, m := range selector.FindAllStringSubmatch(q.expr, -1) {
			if !alertQs[q.where] && !strings.Contains(strings.ToLower(m[2]), "rdma") {
				continue
			}
			s := promSelector{where: q.where, text: m[0], name: m[1]}
			for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
				v := grafanaVars.Replace(lm[3])
				if lm[2] == "=" || lm[2] == "!=" {
					v = regexp.QuoteMeta(v)
				}
				re, err := regexp.Compile("^(?:" + v + ")$")
				if err != nil {
					t.Fatalf("%s: matcher %s: %v", q.where, lm[0], err)
				}
				s.matchers = append(s.matchers, labelMatcher{lm[1], lm[2], re})
			}
			out = append(out, s)
		}
	}
	return out
}

// matchesAny says whether a sample has the selector's name and satisfies
// its matchers.
func (s promSelector) matchesAny(samples []sample) bool {
	for _, sm := range samples {
		if sm.name != s.name {
			continue
		}
		ok := true
		for _, m := range s.matchers {
			hit := m.re.MatchString(sm.labels[m.label])
			if hit != (m.op == "=" || m.op == "=~") {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// value is the value of the sample named name with the labels want ("" when
// none has them).
func value(samples []sample, name string, want map[string]string) string {
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && s.labels[k] == v
		}
		if ok {
			return s.value
		}
	}
	return ""
}

// nonZero says whether a sample named name whose transport matches re has a
// value other than 0.
func nonZero(samples []sample, name string, re *regexp.Regexp) bool {
	for _, s := range samples {
		if s.name == name && re.MatchString(s.labels["transport"]) && s.value != "0" && s.value != "" {
			return true
		}
	}
	return false
}

func (s promSelector) String() string { return fmt.Sprintf("%s in %s", s.text, s.where) }
