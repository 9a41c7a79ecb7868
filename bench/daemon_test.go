package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

var (
	daemonBinOnce sync.Once
	daemonBin     string
	daemonBinErr  string
)

// buildDaemon builds tensorcastd into a temporary directory once per test
// binary. A daemon that does not build fails the test, with the compiler's
// output: it is a broken tree, never a missing feature.
func buildDaemon(t testing.TB) string {
	t.Helper()
	daemonBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tcbench-bin-")
		if err != nil {
			daemonBinErr = err.Error()
			return
		}
		bin := filepath.Join(dir, "tensorcastd")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/tensorcastd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			daemonBinErr = fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(out)))
			os.RemoveAll(dir)
			return
		}
		daemonBin = bin
	})
	if daemonBin == "" {
		t.Fatalf("building tensorcastd: %s", daemonBinErr)
	}
	return daemonBin
}

func spawnForTest(t *testing.T, jobs []*Job) *Daemon {
	t.Helper()
	bin := buildDaemon(t)
	d, err := SpawnDaemon(bin, PoolSizeFor(jobs), AllowedDirs(jobs), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	return d
}

func runAgainst(t *testing.T, d *Daemon, jobs []*Job) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := (&Runner{Env: &Env{Socket: d.Socket}}).Run(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	return res
}

func checkMoved(t *testing.T, res *Result) {
	t.Helper()
	for _, g := range res.Groups {
		for _, jr := range g.Jobs {
			j := jr.Job
			if j.RW.Reads() && (jr.Read.IOs == 0 || jr.Read.Lat.Count() != jr.Read.IOs) {
				t.Errorf("%s: no reads measured", j.Name)
			}
			if j.RW.Writes() && jr.Write.IOs == 0 {
				t.Errorf("%s: no writes measured", j.Name)
			}
			if !j.TimeBased && jr.Read.Bytes+jr.Write.Bytes != j.Size {
				t.Errorf("%s: moved %d bytes, want %d", j.Name, jr.Read.Bytes+jr.Write.Bytes, j.Size)
			}
		}
	}
}

// TestLocalEngineAgainstDaemon runs the local engine as a real client of a
// spawned tensorcastd, with every byte checked by crc32c: iodepth equal to
// and larger than the batch, requests that straddle pool blocks (bsrange),
// and two clones.
func TestLocalEngineAgainstDaemon(t *testing.T) {
	jobs := mustJobs(t, "--engine=local", "--verify=crc32c", "--size=8m",
		"--name=w-transfer", "--rw=write", "--bs=1m", "--iodepth=4", "--batch=4",
		"--name=r-pipelined", "--rw=randread", "--bs=64k", "--iodepth=16", "--batch=4",
		"--name=rw-straddle", "--rw=randrw", "--bsrange=4k-1m", "--iodepth=8", "--batch=2", "--numjobs=2", "--stonewall",
		"--name=r-timed", "--rw=read", "--bs=128k", "--iodepth=8", "--batch=8", "--runtime=300ms", "--time_based", "--stonewall")
	d := spawnForTest(t, jobs)
	res := runAgainst(t, d, jobs)
	checkMoved(t, res)
}

// TestLocalEngineVerifyCatchesCorruption corrupts the pool region behind the
// daemon's back and expects verify to fail.
func TestLocalEngineVerifyCatchesCorruption(t *testing.T) {
	jobs := mustJobs(t, "--name=r", "--engine=local", "--verify=crc32c", "--size=1m", "--rw=read", "--bs=64k")
	d := spawnForTest(t, jobs)
	eng, err := NewEngine(&Env{Socket: d.Socket}, jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(jobs[0], 0, eng)
	if err := w.open(); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	de := eng.(*daemonEngine)
	toff, _ := de.piece(3*64<<10+100, 1)
	de.pool[toff] ^= 0xff
	var stop atomic.Bool
	err = w.run(&stop)
	if err == nil || !strings.Contains(err.Error(), "verify") {
		t.Fatalf("run error = %v, want a verify failure", err)
	}
}

// TestUringEngineAgainstDaemon runs the uring engine (file segment ↔ pool
// blocks, O_DIRECT) through a spawned tensorcastd with crc32c verify.
func TestUringEngineAgainstDaemon(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "tcbench-uring-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	f := filepath.Join(dir, "u.dat")
	jobs := mustJobs(t, "--engine=uring", "--filename="+f, "--direct=1", "--verify=crc32c", "--size=8m",
		"--name=u-randread", "--rw=randread", "--bs=4k", "--iodepth=16", "--batch=4", "--numjobs=2",
		"--name=u-write", "--rw=write", "--bs=1m", "--iodepth=4", "--batch=4", "--stonewall",
		"--name=u-randrw", "--rw=randrw", "--bs=64k", "--iodepth=8", "--batch=2", "--stonewall")
	d := spawnForTest(t, jobs)
	res := runAgainst(t, d, jobs)
	checkMoved(t, res)
}

// TestUringFileNotAllowed: a daemon that does not allow the file's
// directory refuses it, and the error says where files may live.
func TestUringFileNotAllowed(t *testing.T) {
	f := filepath.Join(t.TempDir(), "u.dat")
	jobs := mustJobs(t, "--name=u", "--engine=uring", "--filename="+f, "--size=1m", "--bs=4k")
	bin := buildDaemon(t)
	d, err := SpawnDaemon(bin, PoolSizeFor(jobs), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	}()
	_, err = (&Runner{Env: &Env{Socket: d.Socket}}).Run(context.Background(), jobs)
	if err == nil || !strings.Contains(err.Error(), "allowed_files") {
		t.Fatalf("err = %v, want a refusal that names allowed_files", err)
	}
	if _, serr := os.Stat(f); serr == nil {
		t.Error("the daemon created a file where it was not allowed")
	}
}

// countingQueue wraps an engine's queue and records the most requests it
// had submitted and not yet reaped at once.
type countingQueue struct {
	q           queuer
	out, maxOut int
}

func (c *countingQueue) Submit(reqs []xfer.Request, ud []uint64) (int, error) {
	n, err := c.q.Submit(reqs, ud)
	c.out += n
	c.maxOut = max(c.maxOut, c.out)
	return n, err
}

func (c *countingQueue) Reap(out []client.Completion, min int, timeout time.Duration) (int, error) {
	n, err := c.q.Reap(out, min, timeout)
	c.out -= n
	return n, err
}

// TestUringEngineDepthThroughDaemon: iodepth 32 in batches of 8 runs on
// one connection with one queue to a spawned tensorcastd (the daemon
// counts the connection and the queue), all 32 requests are in the daemon
// at once, and closing the engine closes them.
func TestUringEngineDepthThroughDaemon(t *testing.T) {
	dir, err := os.MkdirTemp("/var/tmp", "tcbench-uring-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	jobs := mustJobs(t, "--name=depth", "--engine=uring", "--filename="+filepath.Join(dir, "d.dat"), "--direct=1",
		"--size=4m", "--rw=randread", "--bs=4k", "--iodepth=32", "--batch=8")
	d := spawnForTest(t, jobs)
	admin, err := client.Dial(d.Socket, client.Options{Name: "tcbench-test", NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	eng, err := NewEngine(&Env{Socket: d.Socket}, jobs[0])
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(jobs[0], 0, eng)
	if err := w.open(); err != nil {
		eng.Close()
		t.Fatal(err)
	}
	st, err := admin.Stats()
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	if st.Connections != 1+1 {
		t.Errorf("daemon counts %d connections with the engine open, want the engine's one + this one", st.Connections)
	}
	de := eng.(*daemonEngine)
	cq := &countingQueue{q: de.q}
	de.q = cq
	ios := make([]IO, 8)
	out := make([]Completion, 32)
	for round := 0; round < 20; round++ {
		for b := 0; b < 4; b++ {
			for k := range ios {
				s := b*8 + k
				ios[k] = IO{Op: OpRead, Slot: s, Offset: uint64(s*7%1024) * 4096, Length: 4096}
			}
			if n, err := eng.Submit(ios); n != 8 || err != nil {
				eng.Close()
				t.Fatalf("submit: n=%d err=%v", n, err)
			}
		}
		if n, err := eng.Reap(32, out); n != 32 || err != nil {
			eng.Close()
			t.Fatalf("reap: n=%d err=%v", n, err)
		}
		for _, c := range out {
			if c.Err != nil || c.N != 4096 {
				eng.Close()
				t.Fatalf("completion %+v", c)
			}
		}
	}
	if cq.maxOut != 32 {
		t.Errorf("at most %d requests in the daemon at once; want the whole iodepth, 32", cq.maxOut)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	var conns int
	testutil.Eventually(t, 5*time.Second, func() bool {
		st, err := admin.Stats()
		if err != nil {
			t.Fatal(err)
		}
		conns = st.Connections
		return conns == 1
	}, "the daemon counting 1 connection after Close (counts %v)", testutil.Lazy(func() int { return conns }))
}
