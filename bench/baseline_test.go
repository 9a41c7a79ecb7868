package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestRunBaselineMem(t *testing.T) {
	jobs := mustJobs(t, "--name=copy", "--engine=mem", "--rw=read", "--bs=1m", "--size=16m", "--runtime=200ms", "--time_based", "--goal=>=0.5")
	br, last, err := RunBaseline(context.Background(), &Runner{}, jobs[0], 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(br.Tensorcast) != 3 || len(br.Ref) != 3 || last == nil || br.Metric != "bw_bytes" {
		t.Fatalf("baseline: %+v", br)
	}
	if br.TensorcastMedian <= 0 || br.ReferenceMedian <= 0 || abs(br.Ratio-br.TensorcastMedian/br.ReferenceMedian) > 1e-9 {
		t.Fatalf("medians/ratio: %+v", br)
	}
	var md bytes.Buffer
	if err := WriteBaselineMarkdown(&md, []BaselineResult{br}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "| copy | mem |") || !strings.Contains(md.String(), ">=0.5") {
		t.Errorf("markdown table: %s", md.String())
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {nil, 0}, {[]float64{7}, 7}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestMemcpyLoop(t *testing.T) {
	jobs := mustJobs(t, "--name=m", "--engine=local", "--rw=write", "--bs=64k", "--size=8m", "--runtime=100ms", "--time_based")
	bw, iops, err := MemcpyLoop(context.Background(), jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	// What it measures is checked for consistency, not for speed: a floor
	// on throughput fails on a loaded machine and proves nothing.
	if bw <= 0 || abs(iops*65536-bw) > 0.01*bw {
		t.Errorf("memcpy loop: %v B/s, %v copies/s", bw, iops)
	}
}

func TestInProcessRegionLimit(t *testing.T) {
	jobs := mustJobs(t, "--name=big", "--engine=mem", "--size=16g", "--bs=1m", "--numjobs=1")
	if _, _, err := MemcpyLoop(context.Background(), jobs[0]); !errors.Is(err, ErrBadValue) {
		t.Errorf("memcpy of 16 GiB: %v", err)
	}
	_, err := (&Runner{}).Run(context.Background(), jobs)
	if !errors.Is(err, ErrBadValue) {
		t.Errorf("mem engine of 16 GiB: %v", err)
	}
}

func TestParseFioJSONPrefixAndErrors(t *testing.T) {
	doc := []byte("note: both iodepth >= 1 and synchronous I/O engine are selected\n" +
		`{"fio version":"fio-3.x","jobs":[{"jobname":"j","groupid":0,"error":0,"read":{"io_bytes":4096,"bw_bytes":1000,"bw":0,"iops":2.5,"runtime":10,"clat_ns":{"min":1,"max":9,"mean":5,"stddev":1,"N":2,"percentile":{"50.000000":5}}},"write":{"io_bytes":0}}]}`)
	out, err := ParseFioJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	if out.Jobs[0].Read.BWBytes != 1000 || out.Jobs[0].Read.ClatNs.Percentile["50.000000"] != 5 {
		t.Errorf("decoded %+v", out.Jobs[0].Read)
	}
	for _, bad := range []string{"", "no json here", `{"jobs":[]}`, `{"jobs":[{`} {
		if _, err := ParseFioJSON([]byte(bad)); !errors.Is(err, ErrToolOutput) {
			t.Errorf("ParseFioJSON(%q) = %v, want ErrToolOutput", bad, err)
		}
	}
	if _, err := ParseIperf3JSON([]byte(`{"error":"unable to connect"}`)); !errors.Is(err, ErrToolOutput) {
		t.Errorf("iperf3 error document: %v", err)
	}
	if v, err := ParseIperf3JSON([]byte(`{"end":{"sum_received":{"bits_per_second":8e9}}}`)); err != nil || v != 8e9 {
		t.Errorf("iperf3 document: %v, %v", v, err)
	}
}

// TestFioReal runs the real fio with the arguments a uring job maps to and
// decodes its JSON with the same struct tcbench writes.
func TestFioReal(t *testing.T) {
	testutil.Command(t, "fio", "fio")
	f := filepath.Join(t.TempDir(), "fio.dat")
	jobs := mustJobs(t, "--name=ref", "--engine=uring", "--filename="+f, "--direct=1", "--rw=randread", "--bs=4k",
		"--size=4m", "--iodepth=8", "--batch=4", "--runtime=300ms", "--time_based")
	args := FioArgs(jobs[0])
	for _, want := range []string{"--ioengine=io_uring", "--filename=" + f, "--bs=4096", "--iodepth=8", "--direct=1", "--rw=randread",
		"--iodepth_batch_submit=4", "--iodepth_batch_complete_min=4"} {
		if !contains(args, want) {
			t.Fatalf("fio args %q lack %q", args, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := RunFio(ctx, args)
	if err != nil {
		t.Fatal(err)
	}
	r := out.Jobs[0].Read
	if !strings.HasPrefix(out.FioVersion, "fio-") || r.IOPS <= 0 || r.BWBytes == 0 || r.ClatNs.N == 0 ||
		len(r.ClatNs.Percentile) == 0 || r.ClatNs.Percentile["99.000000"] < r.ClatNs.Min {
		t.Fatalf("fio report not understood: version %q read %+v", out.FioVersion, r)
	}
	iops, err := fioFigure(out, "iops")
	if err != nil || iops != r.IOPS+out.Jobs[0].Write.IOPS {
		t.Errorf("fioFigure = %v, %v", iops, err)
	}
	os.Remove(f)
}

func contains(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

func TestIperf3Real(t *testing.T) {
	testutil.Command(t, "iperf3", "iperf3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bps, err := RunIperf3(ctx, 1, 128<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if bps < 1e8 {
		t.Errorf("iperf3 loopback %v bit/s", bps)
	}
}

func TestToolMissingSaysMakeDeps(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	jobs := mustJobs(t, "--name=u", "--engine=uring", "--filename=/tmp/x")
	_, err := referenceFor(nil, jobs[0], "iops")
	if !errors.Is(err, ErrToolMissing) || !strings.Contains(err.Error(), "fio") || !strings.Contains(err.Error(), "make deps") {
		t.Errorf("missing fio: %v", err)
	}
	jobs = mustJobs(t, "--name=t", "--engine=tcp", "--target=p/s", "--bs=1m", "--iodepth=4")
	if _, err := referenceFor(nil, jobs[0], "bw_bytes"); !errors.Is(err, ErrToolMissing) || !strings.Contains(err.Error(), "iperf3") {
		t.Errorf("missing iperf3: %v", err)
	}
	// One small request at a time is judged against a ping-pong, which
	// needs no tool.
	jobs = mustJobs(t, "--name=t1", "--engine=tcp", "--target=p/s", "--bs=4k", "--iodepth=1")
	if ref, err := referenceFor(nil, jobs[0], "iops"); err != nil || !strings.Contains(ref.name, "ping-pong") {
		t.Errorf("tcp at depth 1: %v, %v; want the raw TCP ping-pong", ref, err)
	}
	jobs = mustJobs(t, "--name=r", "--engine=rdma", "--target=p/s", "--rw=write")
	if _, err := referenceFor(nil, jobs[0], "bw_bytes"); !errors.Is(err, ErrToolMissing) || !strings.Contains(err.Error(), "ib_write_bw") {
		t.Errorf("missing perftest: %v", err)
	}
}

// TestPingPong runs the ping-pong references against this test binary as
// the far side (TestMain serves when asked): round trips happen, and the
// histogram holds one latency per round trip.
func TestPingPong(t *testing.T) {
	for _, network := range []string{"unix", "tcp"} {
		rate, h, err := PingPong(context.Background(), network, 4096, 200*time.Millisecond)
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if rate <= 0 || h.Count() == 0 || float64(h.Count()) < rate*0.1 || h.Percentile(50) == 0 {
			t.Fatalf("%s: %.0f round trips/s, %d latencies, p50 %d", network, rate, h.Count(), h.Percentile(50))
		}
	}
}
