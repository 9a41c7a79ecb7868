package metrics

import (
	"bytes"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/tensorcast/tensorcast/internal/loghist"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func testRegistry(t *testing.T) *Registry {
	t.Helper()
	r := NewRegistry(BuildInfo{Version: "9.9.9", GoVersion: "go1.0", Revision: "abc123"})
	var h loghist.Hist
	h.Record(500)     // first bucket (<= 1.024 µs)
	h.Record(3000)    // <= 4.096 µs
	h.Record(3000)    // <= 4.096 µs
	h.Record(1 << 40) // beyond the last bound
	err := r.Register("test", SourceFunc(func(e *Emit) {
		e.Counter("tensorcast_test_requests_total", "Requests.", 7, L("transport", "local"))
		e.Counter("tensorcast_test_requests_total", "Requests.", 3, L("transport", "tcp"))
		e.Gauge("tensorcast_test_in_flight", "In flight.", 2)
		e.Bool("tensorcast_test_up", "Up.", true)
		var s loghist.Snapshot
		h.AddTo(&s)
		e.LatencyHistogram("tensorcast_test_latency_seconds", "Latency.", &s, L("transport", "local"))
	}))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func scrape(t *testing.T, r *Registry) string {
	t.Helper()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestExposition(t *testing.T) {
	out := scrape(t, testRegistry(t))
	for _, want := range []string{
		`tensorcast_build_info{goversion="go1.0",revision="abc123",version="9.9.9"} 1`,
		`tensorcast_test_requests_total{transport="local"} 7`,
		`tensorcast_test_requests_total{transport="tcp"} 3`,
		"# TYPE tensorcast_test_requests_total counter",
		"tensorcast_test_in_flight 2",
		"tensorcast_test_up 1",
		"# TYPE tensorcast_test_latency_seconds histogram",
		`tensorcast_test_latency_seconds_bucket{transport="local",le="1.024e-06"} 1`,
		`tensorcast_test_latency_seconds_bucket{transport="local",le="2.048e-06"} 1`,
		`tensorcast_test_latency_seconds_bucket{transport="local",le="4.096e-06"} 3`,
		`tensorcast_test_latency_seconds_bucket{transport="local",le="34.359738368"} 3`,
		`tensorcast_test_latency_seconds_bucket{transport="local",le="+Inf"} 4`,
		`tensorcast_test_latency_seconds_count{transport="local"} 4`,
		"go_goroutines ",
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want) {
			t.Errorf("exposition lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestPromtool lints the exposition with promtool (Debian's prometheus
// package) when it is installed.
func TestPromtool(t *testing.T) {
	path := testutil.Command(t, "promtool", "prometheus")
	lint(t, path, scrape(t, testRegistry(t)))
}

// lint runs promtool check metrics on an exposition.
func lint(t *testing.T, promtool, exposition string) {
	t.Helper()
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(exposition)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("promtool check metrics: %v\n%s\nexposition:\n%s", err, out, exposition)
	}
}

// TestInconsistentFamily: a name emitted with other label names fails that
// sample only, and the scrape says which source.
func TestInconsistentFamily(t *testing.T) {
	r := NewRegistry(BuildInfo{Version: "v", GoVersion: "g", Revision: "r"})
	if err := r.Register("bad", SourceFunc(func(e *Emit) {
		e.Counter("tensorcast_x_total", "X.", 1, L("a", "1"))
		e.Counter("tensorcast_x_total", "X.", 1, L("b", "1"))
	})); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("bad", SourceFunc(func(*Emit) {})); err == nil {
		t.Fatal("a second source under the same name was accepted")
	}
	err := r.WriteText(io.Discard)
	if err == nil || !strings.Contains(err.Error(), "source bad") || !strings.Contains(err.Error(), `label "b"`) {
		t.Fatalf("scrape error %v, want one naming source bad and label b", err)
	}
}

func TestSanitizeLabel(t *testing.T) {
	if got := SanitizeLabel("peer\n\x00é" + strings.Repeat("x", 200)); len(got) > 128 || !strings.HasPrefix(got, "peer___x") || strings.ContainsAny(got, "\n\x00") {
		t.Fatalf("SanitizeLabel = %q", got)
	}
}
