// Command benchdrv drives the uring transport the way fio drives a file:
// one job, a fixed queue depth, random or sequential offsets, for a fixed
// time. scripts/bench-uring.sh runs it side by side with fio.
//
// Completions resubmit their own task from Task.Done (on the ring's
// poller), so, like fio, one thread both submits and reaps.
//
// Output is one line of key=value pairs: ops, bytes, seconds, iops, mbps,
// cpu_user, cpu_sys (seconds of CPU for the whole process).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/xfer"
)

type pool struct {
	mem  []byte
	refs atomic.Int64
	regs xfer.Regs // its fixed-buffer registration
}

func (p *pool) ID() xfer.SegmentID { return 2 }
func (p *pool) Kind() xfer.Kind    { return xfer.KindPool }
func (p *pool) Size() uint64       { return uint64(len(p.mem)) }
func (p *pool) Acquire() bool      { p.refs.Add(1); return true }
func (p *pool) Release()           { p.refs.Add(-1) }
func (p *pool) Bytes() []byte      { return p.mem }
func (p *pool) Regs() *xfer.Regs   { return &p.regs }

// job is the Completer: each Done accounts the task and resubmits it at a
// new offset until the deadline.
type job struct {
	tr       *uring.Transport
	random   bool
	bs       uint64
	span     uint64 // file bytes used
	stop     atomic.Bool
	ops      atomic.Uint64
	errs     atomic.Uint64
	live     atomic.Int64
	finished chan struct{}
	seq      atomic.Uint64
	rng      *rand.Rand // used only on the poller (Done) and before start
	firstErr atomic.Pointer[error]
	one      [][]*xfer.Task // per-task 1-element slices for Submit
}

func (j *job) nextOffset() uint64 {
	if j.random {
		return j.rng.Uint64N(j.span/j.bs) * j.bs
	}
	return (j.seq.Add(1) - 1) * j.bs % j.span
}

func (j *job) TaskDone(t *xfer.Task, n uint64, err error) {
	if err != nil {
		j.errs.Add(1)
		e := err
		j.firstErr.CompareAndSwap(nil, &e)
	} else {
		j.ops.Add(1)
	}
	if err == nil && !j.stop.Load() {
		t.Req.TargetOffset = j.nextOffset()
		idx := int(t.Req.LocalOffset / j.bs)
		if n, _ := j.tr.Submit(j.one[idx]); n == 1 {
			return
		}
	}
	if j.live.Add(-1) == 0 {
		close(j.finished)
	}
}

func main() {
	var (
		path    = flag.String("file", "", "file to use (must exist, laid out)")
		rw      = flag.String("rw", "randread", "randread, randwrite, read or write")
		bs      = flag.Uint64("bs", 4096, "block size in bytes")
		depth   = flag.Int("iodepth", 32, "requests in flight")
		runtime = flag.Duration("runtime", 10*time.Second, "how long to run")
		fixed   = flag.Bool("fixed", false, "registered buffers and files")
		size    = flag.Uint64("size", 0, "bytes of the file to use (0: all)")
		direct  = flag.Bool("direct", true, "O_DIRECT")
		batch   = flag.Int("batch", 0, "Config.Batch: completions reaped, and requests submitted, per poller step (0: the default)")
		taskrun = flag.String("taskrun", "auto", "ring setup: auto, defer (SINGLE_ISSUER|DEFER_TASKRUN), coop (COOP_TASKRUN) or none")
	)
	flag.Parse()
	if err := run(*path, *rw, *bs, *depth, *runtime, *fixed, *size, *direct, *taskrun, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "benchdrv:", err)
		os.Exit(1)
	}
}

func run(path, rw string, bs uint64, depth int, runtime time.Duration, fixed bool, size uint64, direct bool, taskrun string, batch int) error {
	if path == "" || bs == 0 || depth < 1 {
		return fmt.Errorf("need -file, -bs > 0 and -iodepth >= 1")
	}
	op := xfer.OpRead
	random := false
	switch rw {
	case "randread":
		random = true
	case "randwrite":
		random, op = true, xfer.OpWrite
	case "read":
	case "write":
		op = xfer.OpWrite
	default:
		return fmt.Errorf("unknown -rw %q", rw)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	cfg := uring.Config{
		Entries:        uint32(depth),
		AllowedDirs:    []string{filepath.Dir(abs)},
		NoFixedBuffers: !fixed,
		NoFixedFiles:   !fixed,
		Batch:          batch,
	}
	switch taskrun {
	case "auto":
	case "defer":
		cfg.SingleIssuer, cfg.DeferTaskrun = uring.On, uring.On
	case "coop":
		cfg.DeferTaskrun, cfg.CoopTaskrun = uring.Off, uring.On
	case "none":
		cfg.SingleIssuer, cfg.DeferTaskrun, cfg.CoopTaskrun = uring.Off, uring.Off, uring.Off
	default:
		return fmt.Errorf("unknown -taskrun %q", taskrun)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr, err := uring.New(cfg, log)
	if err != nil {
		return err
	}
	defer tr.Close()
	f, err := tr.OpenFile(1, abs, uring.FileOptions{Direct: direct, Size: size})
	if err != nil {
		return err
	}
	defer f.Close()
	mem, err := unix.Mmap(-1, 0, int(bs)*depth, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*31 + 7)
	}
	p := &pool{mem: mem}
	if fixed {
		if err := tr.RegisterBuffers(p); err != nil {
			return err
		}
	}
	j := &job{tr: tr, random: random, bs: bs, span: f.Size() / bs * bs, finished: make(chan struct{}),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 42))}
	if j.span < bs {
		return fmt.Errorf("file smaller than one block")
	}
	tasks := make([]*xfer.Task, depth)
	j.one = make([][]*xfer.Task, depth)
	for i := range tasks {
		t := &xfer.Task{
			Req:   xfer.Request{Op: op, Local: p.ID(), LocalOffset: uint64(i) * bs, Target: f.ID(), TargetOffset: j.nextOffset(), Length: bs},
			Local: p, Target: f,
		}
		t.SetCompleter(j)
		tasks[i] = t
		j.one[i] = tasks[i : i+1]
	}
	j.live.Store(int64(depth))

	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	if n, err := tr.Submit(tasks); n != len(tasks) {
		return fmt.Errorf("submit: %d of %d: %w", n, len(tasks), err)
	}
	time.Sleep(runtime)
	j.stop.Store(true)
	<-j.finished
	elapsed := time.Since(start).Seconds()
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	if e := j.firstErr.Load(); e != nil {
		return fmt.Errorf("%d requests failed, first: %w", j.errs.Load(), *e)
	}
	ops := j.ops.Load()
	bytes := ops * bs
	user := tvSec(ru1.Utime) - tvSec(ru0.Utime)
	sys := tvSec(ru1.Stime) - tvSec(ru0.Stime)
	feat := tr.Features()
	var enters, wakeups uint64
	for _, s := range tr.Stats() {
		enters += s.Enters
		wakeups += s.Wakeups
	}
	fmt.Printf("ops=%d bytes=%d seconds=%.3f iops=%.0f mbps=%.1f cpu_user=%.3f cpu_sys=%.3f fixed_buffers=%v defer_taskrun=%v coop_taskrun=%v enters_per_op=%.3f wakeups_per_op=%.3f\n",
		ops, bytes, elapsed, float64(ops)/elapsed, float64(bytes)/elapsed/1e6, user, sys, feat.FixedBuffers && fixed, feat.DeferTaskrun,
		feat.CoopTaskrun, float64(enters)/float64(max(ops, 1)), float64(wakeups)/float64(max(ops, 1)))
	return nil
}

func tvSec(tv unix.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }
