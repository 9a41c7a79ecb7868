package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"os"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func mustJobs(t *testing.T, args ...string) []*Job {
	t.Helper()
	_, jobs, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

func TestRunMemEngine(t *testing.T) {
	jobs := mustJobs(t, "--engine=mem", "--size=4m", "--verify=crc32c",
		"--name=seqread", "--rw=read", "--bs=64k", "--iodepth=4", "--batch=2",
		"--name=randrw", "--rw=randrw", "--rwmixread=70", "--bsrange=4k-64k", "--iodepth=8", "--batch=4", "--numjobs=2",
		"--name=timed", "--rw=randwrite", "--bs=4k", "--runtime=300ms", "--time_based", "--ramp_time=100ms", "--stonewall")
	r := &Runner{Interval: 20 * time.Millisecond}
	res, err := r.Run(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if len(res.Groups) != 2 || len(res.Groups[0].Jobs) != 3 || len(res.Groups[1].Jobs) != 1 {
		t.Fatalf("groups/jobs: %d groups", len(res.Groups))
	}
	seq := res.Groups[0].Jobs[0]
	if seq.Read.Bytes != 4<<20 || seq.Read.IOs != 64 || seq.Write.IOs != 0 || seq.Read.Lat.Count() != 64 {
		t.Errorf("seqread moved %d bytes in %d IOs (%d writes), want one pass of 4 MiB in 64", seq.Read.Bytes, seq.Read.IOs, seq.Write.IOs)
	}
	mix := res.Groups[0].Jobs[1]
	if mix.Read.Bytes+mix.Write.Bytes != 4<<20 || mix.Read.IOs == 0 || mix.Write.IOs == 0 {
		t.Errorf("randrw: %d+%d bytes, %d reads %d writes", mix.Read.Bytes, mix.Write.Bytes, mix.Read.IOs, mix.Write.IOs)
	}
	share := float64(mix.Read.IOs) / float64(mix.Read.IOs+mix.Write.IOs)
	if share < 0.55 || share > 0.85 {
		t.Errorf("randrw read share %.2f, want about 0.70", share)
	}
	timed := res.Groups[1].Jobs[0]
	if timed.Runtime < 300*time.Millisecond || timed.Runtime > 2*time.Second || timed.Write.IOs == 0 {
		t.Errorf("timed job ran %v with %d writes", timed.Runtime, timed.Write.IOs)
	}
	if g := res.Groups[0]; g.Read.IOs != seq.Read.IOs+mix.Read.IOs+res.Groups[0].Jobs[2].Read.IOs {
		t.Errorf("group read IOs %d do not add up", g.Read.IOs)
	}
}

// corruptEngine flips a byte of every read it returns.
type corruptEngine struct{ memEngine }

func (c *corruptEngine) Submit(ios []IO) (int, error) {
	n, err := c.memEngine.Submit(ios)
	for _, io := range ios[:n] {
		if io.Op == OpRead && io.Length > 0 {
			c.bufs[io.Slot][io.Length/2] ^= 0x40
		}
	}
	return n, err
}

func TestVerifyDetectsCorruption(t *testing.T) {
	engines["corrupt-test"] = func(*Env, *Job) (Engine, error) { return &corruptEngine{}, nil }
	defer delete(engines, "corrupt-test")
	jobs := mustJobs(t, "--name=a", "--engine=mem", "--rw=randread", "--bs=4k", "--size=1m", "--verify=crc32c")
	jobs[0].Engine = "corrupt-test"
	res, err := (&Runner{}).Run(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); !errors.Is(err, ErrVerify) {
		t.Fatalf("run error = %v, want ErrVerify", err)
	}
	if res.Groups[0].Read.Errors == 0 {
		t.Error("no read error counted")
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	jobs := mustJobs(t, "--name=a", "--engine=mem", "--rw=randread", "--bs=4k", "--size=1m", "--runtime=1h", "--time_based")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := (&Runner{}).Run(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	if res.Groups[0].Read.IOs == 0 {
		t.Error("nothing measured before the cancel")
	}
}

func TestUnavailableEngine(t *testing.T) {
	for _, args := range [][]string{
		{"--name=a", "--engine=uring", "--filename=/tmp/x"},
		{"--name=a", "--engine=tcp", "--target=peer/seg"},
		{"--name=a", "--engine=rdma", "--target=peer/seg"},
		{"--name=a", "--engine=store"},
	} {
		jobs := mustJobs(t, args...)
		if _, ok := engines[jobs[0].Engine]; ok {
			continue // the engine landed
		}
		_, err := (&Runner{}).Run(context.Background(), jobs)
		if !errors.Is(err, ErrEngineUnavailable) || !strings.Contains(err.Error(), `"`+jobs[0].Engine+`"`) {
			t.Errorf("%s: err = %v, want ErrEngineUnavailable naming the engine", jobs[0].Engine, err)
		}
	}
}

func runSmall(t *testing.T) *Result {
	t.Helper()
	jobs := mustJobs(t, "--engine=mem", "--size=2m", "--runtime=200ms", "--time_based",
		"--name=r", "--rw=randread", "--bs=4k", "--iodepth=2",
		"--name=w", "--rw=write", "--bs=64k")
	res, err := (&Runner{Interval: 20 * time.Millisecond}).Run(context.Background(), jobs)
	if err != nil || res.Err() != nil {
		t.Fatal(err, res.Err())
	}
	return res
}

// fioSchema mirrors fio's JSON field names independently of FioOutput, so a
// renamed tag in the report is caught.
type fioSchema struct {
	Version   *string `json:"fio version"`
	Timestamp *int64  `json:"timestamp"`
	Jobs      []struct {
		JobName *string         `json:"jobname"`
		GroupID *int            `json:"groupid"`
		Error   *int            `json:"error"`
		Options json.RawMessage `json:"job options"`
		Read    *fioSchemaDir   `json:"read"`
		Write   *fioSchemaDir   `json:"write"`
	} `json:"jobs"`
}

type fioSchemaLat struct {
	Min        *uint64            `json:"min"`
	Max        *uint64            `json:"max"`
	Mean       *float64           `json:"mean"`
	Stddev     *float64           `json:"stddev"`
	N          *uint64            `json:"N"`
	Percentile map[string]float64 `json:"percentile"`
}

type fioSchemaDir struct {
	IOBytes  *uint64       `json:"io_bytes"`
	BWBytes  *uint64       `json:"bw_bytes"`
	BW       *uint64       `json:"bw"`
	IOPS     *float64      `json:"iops"`
	Runtime  *int64        `json:"runtime"`
	TotalIOs *uint64       `json:"total_ios"`
	Clat     *fioSchemaLat `json:"clat_ns"`
	Lat      *fioSchemaLat `json:"lat_ns"`
	Slat     *fioSchemaLat `json:"slat_ns"`
}

func TestJSONReportFioFields(t *testing.T) {
	res := runSmall(t)
	var buf bytes.Buffer
	if err := WriteJSON(&buf, res, nil); err != nil {
		t.Fatal(err)
	}
	var doc fioSchema
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version == nil || doc.Timestamp == nil || len(doc.Jobs) != 2 {
		t.Fatalf("header or jobs missing: %s", buf.String()[:200])
	}
	for i, j := range doc.Jobs {
		if j.JobName == nil || j.GroupID == nil || j.Error == nil || *j.Error != 0 || j.Read == nil || j.Write == nil {
			t.Fatalf("job %d lacks fio fields", i)
		}
		d := j.Read
		jr := res.Groups[0].Jobs[i]
		stats := &jr.Read
		if i == 1 {
			d, stats = j.Write, &jr.Write
		}
		if d.IOBytes == nil || *d.IOBytes != stats.Bytes || d.TotalIOs == nil || *d.TotalIOs != stats.IOs || *d.IOBytes == 0 {
			t.Fatalf("job %d io_bytes/total_ios wrong", i)
		}
		wantBW := float64(stats.Bytes) / jr.Runtime.Seconds()
		if d.BWBytes == nil || d.BW == nil || d.IOPS == nil || d.Runtime == nil ||
			abs(float64(*d.BWBytes)-wantBW) > 0.01*wantBW || *d.BW != *d.BWBytes/1024 || *d.Runtime != jr.Runtime.Milliseconds() {
			t.Errorf("job %d bw_bytes/bw/iops/runtime wrong", i)
		}
		for name, l := range map[string]*fioSchemaLat{"clat_ns": d.Clat, "lat_ns": d.Lat} {
			if l == nil || l.Min == nil || l.Max == nil || l.Mean == nil || l.Stddev == nil || l.N == nil || *l.N != stats.IOs {
				t.Fatalf("job %d %s incomplete", i, name)
			}
			if len(l.Percentile) != len(Percentiles) {
				t.Fatalf("job %d %s has %d percentiles", i, name, len(l.Percentile))
			}
			for _, key := range []string{"1.000000", "50.000000", "99.000000", "99.500000", "99.990000"} {
				v, ok := l.Percentile[key]
				if !ok || v < float64(*l.Min) || v > float64(*l.Max) {
					t.Errorf("job %d %s percentile %q = %v (ok=%v) outside [min,max]", i, name, key, v, ok)
				}
			}
		}
		if d.Slat == nil || d.Slat.N == nil || *d.Slat.N != 0 {
			t.Errorf("job %d slat_ns missing, or recorded for a synchronous engine", i)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestNormalAndTerseReports(t *testing.T) {
	res := runSmall(t)
	var n, tr bytes.Buffer
	if err := WriteNormal(&n, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"r: (groupid=0", "read: IOPS=", "clat percentiles", "99.99th=[", "w: (groupid=0", "write: IOPS=", "Run status group 0", "READ: bw=", "WRITE: bw="} {
		if !strings.Contains(n.String(), want) {
			t.Errorf("normal report lacks %q:\n%s", want, n.String())
		}
	}
	if err := WriteTerse(&tr, res); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tr.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("terse: %d lines, want 2", len(lines))
	}
	f := strings.Split(lines[0], ";")
	// 5 header fields + 2 × (4 + 4 + 4 + 17 + 4 + 5) = 81.
	if len(f) != 81 || f[0] != "tc1" || f[2] != "r" {
		t.Fatalf("terse line has %d fields: %q", len(f), lines[0])
	}
	if f[5] == "0" {
		t.Error("terse read io_kbytes is 0")
	}
}

func TestPlot(t *testing.T) {
	res := runSmall(t)
	var b bytes.Buffer
	if err := WritePlot(&b, res); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if !strings.HasPrefix(s, "<svg") || !strings.HasSuffix(strings.TrimSpace(s), "</svg>") ||
		strings.Count(s, "<polyline") != 2 || !strings.Contains(s, "p99=") || strings.Count(s, `fill="#1f77b4"/>`) < 3 {
		t.Errorf("plot lacks its parts:\n%.600s", s)
	}
}

func TestProgressOffWhenNotTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(w) || ProgressWriter(w) != nil {
		t.Fatal("a pipe is taken for a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ProgressWriter(f) != nil {
		t.Fatal("a regular file is taken for a terminal")
	}
	pt, closePTY, err := openPTY()
	if err != nil {
		testutil.Missing(t, testutil.PTY, "no pseudo-terminal to check the positive case (/dev/ptmx: %v)", err)
	}
	defer closePTY()
	if !IsTerminal(pt) || ProgressWriter(pt) == nil {
		t.Fatal("a pseudo-terminal is not taken for a terminal")
	}
}

func TestProgressLine(t *testing.T) {
	jobs := mustJobs(t, "--name=a", "--engine=mem", "--rw=read", "--bs=4k", "--size=1m", "--runtime=1200ms", "--time_based")
	var b bytes.Buffer
	res, err := (&Runner{Progress: &b, Interval: 50 * time.Millisecond}).Run(context.Background(), jobs)
	if err != nil || res.Err() != nil {
		t.Fatal(err, res.Err())
	}
	s := b.String()
	if !strings.Contains(s, "\rJobs: 1: [") || !strings.Contains(s, "% done]") || !strings.Contains(s, "[eta 00m:0") ||
		!strings.Contains(s, "r=") {
		t.Errorf("progress output %q", s)
	}
}

// TestWorkerSteadyStateAllocs checks that the runner allocates nothing per
// request: a run of 4096 requests allocates no more than a handful of times.
func TestWorkerSteadyStateAllocs(t *testing.T) {
	jobs := mustJobs(t, "--name=a", "--engine=mem", "--rw=randrw", "--bs=4k", "--size=16m", "--iodepth=8", "--batch=4", "--verify=crc32c")
	eng, _ := NewEngine(nil, jobs[0])
	w := newWorker(jobs[0], 0, eng)
	if err := w.open(); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	var stop atomic.Bool
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	if err := w.run(&stop); err != nil {
		t.Fatal(err)
	}
	goruntime.ReadMemStats(&after)
	ios := w.res.Read.IOs + w.res.Write.IOs
	if ios != 4096 {
		t.Fatalf("%d requests, want 4096", ios)
	}
	t.Logf("%d allocations", after.Mallocs-before.Mallocs)
	if n := after.Mallocs - before.Mallocs; n > 64 {
		t.Errorf("%d allocations for %d requests", n, ios)
	}
}

// TestIOSize: io_size bytes move over and over a smaller region, in
// exactly io_size/bs IOs.
func TestIOSize(t *testing.T) {
	jobs := mustJobs(t, "--name=loop", "--engine=mem", "--rw=randread", "--bs=4k", "--size=64k", "--io_size=1m", "--iodepth=4")
	res, err := (&Runner{}).Run(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if j := res.Groups[0].Jobs[0]; j.Read.Bytes != 1<<20 || j.Read.IOs != 256 {
		t.Fatalf("io_size=1m over size=64k moved %d bytes in %d IOs, want 1 MiB in 256", j.Read.Bytes, j.Read.IOs)
	}
	if _, _, err := ParseArgs([]string{"--name=x", "--io_size=0"}); err == nil {
		t.Error("io_size=0 accepted")
	}
}
