package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DirStats are one direction's (read or write) figures of a job clone or a
// group.
type DirStats struct {
	IOs    uint64
	Bytes  uint64
	Errors uint64
	Lat    Histogram // submit to completion
	Clat   Histogram // submit returned to completion
	Slat   Histogram // time inside Submit
}

func (d *DirStats) merge(o *DirStats) {
	d.IOs += o.IOs
	d.Bytes += o.Bytes
	d.Errors += o.Errors
	d.Lat.Merge(&o.Lat)
	d.Clat.Merge(&o.Clat)
	d.Slat.Merge(&o.Slat)
}

// Sample is a point of the bandwidth log: cumulative bytes at T after the
// measured phase started.
type Sample struct {
	T          time.Duration
	ReadBytes  uint64
	WriteBytes uint64
}

// JobResult is one clone (numjobs) of one job.
type JobResult struct {
	Job     *Job
	Clone   int
	Runtime time.Duration // measured phase (after ramp_time)
	Read    DirStats
	Write   DirStats
	Samples []Sample
	Err     error
}

// GroupResult aggregates the jobs of one reporting group.
type GroupResult struct {
	ID      int
	Jobs    []*JobResult
	Runtime time.Duration // the longest clone's
	Read    DirStats
	Write   DirStats
}

// Result is a whole run.
type Result struct {
	Start  time.Time
	Groups []*GroupResult
}

// Err returns the first clone error of the run, if any.
func (r *Result) Err() error {
	var errs []error
	for _, g := range r.Groups {
		for _, j := range g.Jobs {
			if j.Err != nil {
				errs = append(errs, fmt.Errorf("job %s.%d: %w", j.Job.Name, j.Clone, j.Err))
			}
		}
	}
	return errors.Join(errs...)
}

// Runner runs jobs group after group.
type Runner struct {
	Env      *Env
	Logger   *slog.Logger
	Progress io.Writer     // live progress line; nil for none
	Interval time.Duration // bandwidth sample interval; 0 is 100 ms
}

// Run runs jobs (grouped by Job.Group, in order) and returns their results.
// Canceling ctx stops the running group early: its clones drain what is in
// flight and report what they measured.
func (r *Runner) Run(ctx context.Context, jobs []*Job) (*Result, error) {
	if len(jobs) == 0 {
		return nil, ErrNoJobs
	}
	for _, j := range jobs {
		if err := EngineAvailable(j.Engine); err != nil {
			return nil, fmt.Errorf("job %s: %w", j.Name, err)
		}
	}
	res := &Result{Start: time.Now()}
	for start := 0; start < len(jobs); {
		end := start
		for end < len(jobs) && jobs[end].Group == jobs[start].Group {
			end++
		}
		g, err := r.runGroup(ctx, jobs[start].Group, jobs[start:end])
		if err != nil {
			return res, err
		}
		res.Groups = append(res.Groups, g)
		start = end
		if ctx.Err() != nil {
			break
		}
	}
	return res, nil
}

func (r *Runner) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// runGroup owns the group's worker goroutines and its sampler: workers stop
// on their own end condition or when stop is set (ctx canceled); the
// sampler stops when every worker has returned; runGroup returns after both.
func (r *Runner) runGroup(ctx context.Context, id int, jobs []*Job) (*GroupResult, error) {
	var workers []*worker
	for _, j := range jobs {
		for c := 0; c < j.NumJobs; c++ {
			eng, err := NewEngine(r.Env, j)
			if err != nil {
				closeAll(workers)
				return nil, fmt.Errorf("job %s: %w", j.Name, err)
			}
			w := newWorker(j, c, eng)
			if err := w.open(); err != nil {
				eng.Close()
				closeAll(workers)
				return nil, fmt.Errorf("job %s.%d: open engine %s: %w", j.Name, c, eng.Name(), err)
			}
			workers = append(workers, w)
		}
	}
	r.logger().Debug("group starting", "group", id, "clones", len(workers))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.res.Err = w.run(&stop)
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()

	interval := r.Interval
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	prog := newProgress(r.Progress, workers)
	tick := time.NewTicker(interval)
	lastProg := time.Now()
loop:
	for {
		select {
		case <-allDone:
			break loop
		case <-ctx.Done():
			stop.Store(true)
			<-allDone
			break loop
		case now := <-tick.C:
			for _, w := range workers {
				w.sample(now)
			}
			if prog != nil && now.Sub(lastProg) >= 500*time.Millisecond {
				prog.update(now)
				lastProg = now
			}
		}
	}
	tick.Stop()
	if prog != nil {
		prog.finish()
	}
	g := &GroupResult{ID: id}
	for _, w := range workers {
		w.sample(time.Now())
		if err := w.eng.Close(); err != nil {
			r.logger().Warn("closing engine", "job", w.job.Name, "clone", w.res.Clone, "err", err)
			if w.res.Err == nil {
				w.res.Err = fmt.Errorf("close engine: %w", err)
			}
		}
		g.Jobs = append(g.Jobs, &w.res)
		g.Read.merge(&w.res.Read)
		g.Write.merge(&w.res.Write)
		g.Runtime = max(g.Runtime, w.res.Runtime)
	}
	return g, nil
}

func closeAll(ws []*worker) {
	for _, w := range ws {
		w.eng.Close()
	}
}

// worker runs one clone of a job on its own engine. Its counters are read
// by the sampler goroutine (atomics); everything else belongs to the
// worker's goroutine until it returns.
type worker struct {
	job *Job
	eng Engine
	res JobResult
	rng *rand.Rand

	align   uint64 // offset alignment of random IO
	step    uint64 // block size granularity within bsrange
	seqOff  uint64
	free    []int
	ios     []IO
	comps   []Completion
	subAt   []int64 // per slot: time before Submit (ns since base)
	subEnd  []int64 // per slot: time Submit returned
	ops     []IO    // per slot: the request in flight
	base    time.Time
	scratch []byte

	// Read by the sampler while the worker runs.
	readBytes  atomic.Uint64
	writeBytes atomic.Uint64
	issued     atomic.Uint64 // requests issued in the measured phase (for ETA)
	measuring  atomic.Int64  // unix ns when the measured phase began, 0 before
	sampled    []Sample      // owned by the sampler until the worker is done
}

func newWorker(j *Job, clone int, eng Engine) *worker {
	w := &worker{job: j, eng: eng}
	w.res.Job = j
	w.res.Clone = clone
	w.rng = rand.New(rand.NewPCG(j.RandSeed, uint64(clone)+1))
	w.align = j.BSMin
	w.step = 1
	if j.BSMin%512 == 0 {
		w.step = 512
	}
	return w
}

func (w *worker) open() error {
	j := w.job
	if err := w.eng.Open(EngineSpec{Job: j, Worker: w.res.Clone, Slots: j.IODepth, SlotSize: j.BSMax, Region: j.Size}); err != nil {
		return err
	}
	n := j.IODepth
	w.free = make([]int, n)
	for i := range w.free {
		w.free[i] = n - 1 - i
	}
	w.ios = make([]IO, 0, j.Batch)
	w.comps = make([]Completion, n)
	w.subAt = make([]int64, n)
	w.subEnd = make([]int64, n)
	w.ops = make([]IO, n)
	if j.Verify != "" {
		w.scratch = make([]byte, j.BSMax)
	}
	for s := 0; s < n; s++ {
		fillPattern(w.eng.Buffer(s)[:j.BSMax], j.RandSeed^0xb0f, uint64(s)*j.BSMax)
	}
	needPattern := j.RW.Reads() || j.Verify != ""
	if p, ok := w.eng.(Prefiller); ok {
		if err := p.Prefill(j.RandSeed, needPattern); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	} else if needPattern {
		if err := w.prefill(); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
	}
	return nil
}

// prefill writes the pattern over the whole region so reads return known
// bytes. It is not measured.
func (w *worker) prefill() error {
	j := w.job
	chunk := j.BSMax
	var c [1]Completion
	for off := uint64(0); off < j.Size; off += chunk {
		n := min(chunk, j.Size-off)
		fillPattern(w.eng.Buffer(0)[:n], j.RandSeed, off)
		if _, err := w.eng.Submit([]IO{{Op: OpWrite, Slot: 0, Offset: off, Length: n}}); err != nil {
			return err
		}
		got, err := w.eng.Reap(1, c[:])
		if err != nil {
			return err
		}
		if got != 1 || c[0].Err != nil {
			return fmt.Errorf("%w: prefill write at %d: %v", ErrIO, off, c[0].Err)
		}
	}
	return nil
}

// next fills io with the next request's op, offset and length.
func (w *worker) next(io *IO) {
	j := w.job
	n := j.BSMin
	if j.BSMax != j.BSMin {
		n = j.BSMin + w.rng.Uint64N((j.BSMax-j.BSMin)/w.step+1)*w.step
	}
	switch j.RW {
	case RWRead, RWRandRead:
		io.Op = OpRead
	case RWWrite, RWRandWrite:
		io.Op = OpWrite
	default:
		io.Op = OpWrite
		if w.rng.IntN(100) < j.RWMixRead {
			io.Op = OpRead
		}
	}
	if j.RW.Random() {
		slots := (j.Size - n) / w.align
		io.Offset = w.rng.Uint64N(slots+1) * w.align
	} else {
		if w.seqOff+n > j.Size {
			w.seqOff = 0
		}
		io.Offset = w.seqOff
		w.seqOff += n
	}
	io.Length = n
}

func (w *worker) now() int64 { return int64(time.Since(w.base)) }

// run keeps iodepth requests in flight, batch at a time, until the job's end
// condition or stop; it then drains what is in flight.
func (w *worker) run(stop *atomic.Bool) error {
	j := w.job
	w.base = time.Now()
	sync := false
	if s, ok := w.eng.(Synchronous); ok {
		sync = s.Synchronous()
	}
	measureFrom := int64(j.RampTime)
	var deadline int64 = -1
	if j.Runtime > 0 {
		deadline = measureFrom + int64(j.Runtime)
	}
	if measureFrom == 0 {
		w.measuring.Store(w.base.UnixNano())
	}
	// The measured phase lasts runtime from when it really began.
	measureStart := int64(0)
	var budget uint64 // bytes still to issue in the measured phase; unused when time based
	sizeBound := !j.TimeBased
	budget = j.Size
	if j.IOSize > 0 {
		budget = j.IOSize
	}
	inflight := 0
	measuring := measureFrom == 0
	var firstErr error
	stopping := false
	for {
		t := w.now()
		if !measuring && t >= measureFrom {
			measuring = true
			measureStart = t
			if j.Runtime > 0 {
				deadline = t + int64(j.Runtime)
			}
			w.measuring.Store(w.base.Add(time.Duration(t)).UnixNano())
			w.readBytes.Store(0)
			w.writeBytes.Store(0)
		}
		if !stopping && (stop.Load() || (deadline >= 0 && t >= deadline) || (measuring && sizeBound && budget == 0)) {
			stopping = true
		}
		if stopping && inflight == 0 {
			break
		}
		// Submit batches while one is free (or what is left of the budget
		// when nothing is in flight), so iodepth requests are in flight
		// before the worker waits for completions.
		for !stopping && len(w.free) > 0 && (len(w.free) >= j.Batch || inflight == 0) {
			want := min(j.Batch, len(w.free))
			w.ios = w.ios[:0]
			for k := 0; k < want; k++ {
				if measuring && sizeBound && budget == 0 {
					break
				}
				var io IO
				w.next(&io)
				if measuring && sizeBound {
					if io.Length > budget {
						io.Length = budget
					}
					budget -= io.Length
				}
				io.Slot = w.free[len(w.free)-1]
				w.free = w.free[:len(w.free)-1]
				if io.Op == OpWrite && j.Verify != "" {
					fillPattern(w.eng.Buffer(io.Slot)[:io.Length], j.RandSeed, io.Offset)
				}
				w.ios = append(w.ios, io)
			}
			if len(w.ios) == 0 {
				break
			}
			t0 := w.now()
			n, err := w.eng.Submit(w.ios)
			t1 := w.now()
			for k := 0; k < n; k++ {
				s := w.ios[k].Slot
				w.subAt[s], w.subEnd[s], w.ops[s] = t0, t1, w.ios[k]
			}
			inflight += n
			for k := n; k < len(w.ios); k++ {
				w.free = append(w.free, w.ios[k].Slot)
			}
			if measuring {
				w.issued.Add(uint64(n))
			}
			if err != nil {
				firstErr = fmt.Errorf("%w: submit: %w", ErrIO, err)
				stopping = true
			}
			if n < len(w.ios) {
				break
			}
		}
		if inflight == 0 {
			continue
		}
		// The next submission waits for Batch free slots: reap that many
		// in one wait (fio's iodepth_batch_complete_min, which the
		// baseline is given), not one at a time.
		want := 1
		if !stopping && len(w.free) < j.Batch {
			want = max(1, min(j.Batch-len(w.free), inflight, len(w.comps)))
		}
		got, err := w.eng.Reap(want, w.comps)
		if err != nil {
			// The engine cannot reap: what is in flight is lost to it.
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: reap: %w", ErrIO, err)
			}
			break
		}
		tEnd := w.now()
		for k := 0; k < got; k++ {
			c := w.comps[k]
			if c.Slot < 0 || c.Slot >= len(w.ops) {
				if firstErr == nil {
					firstErr = fmt.Errorf("%w: engine completed unknown slot %d", ErrIO, c.Slot)
				}
				continue
			}
			inflight--
			w.free = append(w.free, c.Slot)
			io := w.ops[c.Slot]
			d := &w.res.Read
			ctr := &w.readBytes
			if io.Op == OpWrite {
				d, ctr = &w.res.Write, &w.writeBytes
			}
			if c.Err == nil && c.N != io.Length {
				c.Err = fmt.Errorf("short transfer: %d of %d bytes", c.N, io.Length)
			}
			if c.Err == nil && j.Verify != "" {
				c.Err = w.verify(io)
			}
			if c.Err != nil {
				d.Errors++
				if firstErr == nil {
					firstErr = fmt.Errorf("%w: %s at offset %d: %w", ErrIO, io.Op, io.Offset, c.Err)
				}
				stopping = true
				continue
			}
			if !measuring || w.subAt[c.Slot] < measureStart {
				continue
			}
			d.IOs++
			d.Bytes += io.Length
			ctr.Add(io.Length)
			d.Lat.Record(uint64(tEnd - w.subAt[c.Slot]))
			if sync {
				d.Clat.Record(uint64(tEnd - w.subAt[c.Slot]))
			} else {
				d.Clat.Record(uint64(tEnd - w.subEnd[c.Slot]))
				d.Slat.Record(uint64(w.subEnd[c.Slot] - w.subAt[c.Slot]))
			}
		}
	}
	if measuring {
		start := time.Unix(0, w.measuring.Load())
		w.res.Runtime = time.Since(start)
	}
	return firstErr
}

// verify checks a completed request with crc32c: a read against the pattern
// the region holds, a write against where it landed (when the engine can
// show it) .
func (w *worker) verify(io IO) error {
	j := w.job
	buf := w.eng.Buffer(io.Slot)[:io.Length]
	exp := w.scratch[:io.Length]
	fillPattern(exp, j.RandSeed, io.Offset)
	want := crc32.Checksum(exp, castagnoli)
	var got uint32
	if io.Op == OpRead {
		got = crc32.Checksum(buf, castagnoli)
	} else {
		p, ok := w.eng.(Peeker)
		if !ok {
			return nil
		}
		b, err := p.Peek(io.Offset, io.Length)
		if err != nil {
			return err
		}
		got = crc32.Checksum(b, castagnoli)
	}
	if got != want {
		return fmt.Errorf("%w: crc32c %08x, want %08x (%s of %d bytes at %d)", ErrVerify, got, want, io.Op, io.Length, io.Offset)
	}
	return nil
}

// sample appends a bandwidth point; only the group's sampler calls it.
func (w *worker) sample(now time.Time) {
	m := w.measuring.Load()
	if m == 0 {
		return
	}
	w.sampled = append(w.sampled, Sample{T: now.Sub(time.Unix(0, m)), ReadBytes: w.readBytes.Load(), WriteBytes: w.writeBytes.Load()})
	w.res.Samples = w.sampled
}

// fillPattern writes the verify pattern for the region bytes starting at
// off into b: every byte is a function of the seed and its offset, so any
// block can be checked on its own.
func fillPattern(b []byte, seed, off uint64) {
	i := 0
	for i < len(b) && (off+uint64(i))&7 != 0 {
		a := off + uint64(i)
		b[i] = byte(mix(seed^(a>>3)) >> (8 * (a & 7)))
		i++
	}
	for ; i+8 <= len(b); i += 8 {
		v := mix(seed ^ ((off + uint64(i)) >> 3))
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		a := off + uint64(i)
		b[i] = byte(mix(seed^(a>>3)) >> (8 * (a & 7)))
	}
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
