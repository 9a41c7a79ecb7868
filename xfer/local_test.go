package xfer_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

func fill(b []byte, seed uint64) {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	rand.NewChaCha8(key).Read(b)
}

// TestLocalCopyExact copies many sizes and offsets in both directions on
// the inline path and on the worker path (with chunks small enough to
// split), and checks every byte, including the ones around the range.
func TestLocalCopyExact(t *testing.T) {
	segSize := 2<<20 + 8192
	sizes := []uint64{1, 7, 4095, 4096, 4097, 65536, 256<<10 - 1, 256 << 10, 256<<10 + 1, 1<<20 + 13, 2<<20 + 5}
	if invariants.RaceEnabled {
		// Still splits on the worker path (64 KiB chunks); the larger
		// sizes run without -race.
		segSize = 256<<10 + 8192
		sizes = sizes[:len(sizes)-2]
	}
	offs := []uint64{0, 1, 4093}
	paths := []struct {
		name string
		cfg  xfer.LocalConfig
	}{
		{"default", xfer.LocalConfig{}},
		{"workers", xfer.LocalConfig{InlineBytes: -1, ChunkBytes: 64 << 10, Workers: 3, QueueLen: 4}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			l := xfer.NewLocal(p.cfg, nil)
			defer l.Close()
			f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l), withSize(segSize))
			id, _ := f.e.AllocateBatch(len(sizes) * len(offs) * 2)
			res := make([]error, 1)
			seed := uint64(1)
			for _, n := range sizes {
				for _, lo := range offs {
					to := (lo * 7) % 5000
					for _, op := range []xfer.Op{xfer.OpRead, xfer.OpWrite} {
						seed++
						fill(f.a.Bytes(), seed)
						fill(f.b.Bytes(), seed+1000)
						wantA := bytes.Clone(f.a.Bytes())
						wantB := bytes.Clone(f.b.Bytes())
						if op == xfer.OpRead {
							copy(wantA[lo:lo+n], wantB[to:to+n])
						} else {
							copy(wantB[to:to+n], wantA[lo:lo+n])
						}
						r := xfer.Request{Op: op, Local: 1, LocalOffset: lo, Target: 2, TargetOffset: to, Length: n}
						if err := f.e.Submit(id, []xfer.Request{r}, f.opts, res); err != nil || res[0] != nil {
							t.Fatalf("%+v: %v %v", r, err, res[0])
						}
						if _, err := f.e.Wait(id, time.Now().Add(10*time.Second)); err != nil {
							t.Fatal(err)
						}
						sum, _ := f.e.BatchStatus(id)
						if st := f.status(t, id, sum.Total-1); st.State != xfer.StateCompleted || st.Transferred != n {
							t.Fatalf("%+v: %+v", r, st)
						}
						if !bytes.Equal(f.a.Bytes(), wantA) || !bytes.Equal(f.b.Bytes(), wantB) {
							t.Fatalf("%s %+v: bytes differ", p.name, r)
						}
					}
				}
			}
			xfertest.CheckRefs(t, f.a, f.b)
		})
	}
}

// TestLocalManyTasks sends one submit of many tasks over the worker path
// and closes the transport right after: Close drains every queued chunk.
func TestLocalManyTasks(t *testing.T) {
	l := xfer.NewLocal(xfer.LocalConfig{ChunkBytes: 16 << 10, QueueLen: 8}, nil)
	const n, sz = 64, 33 << 10
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l), withSize(n*sz))
	fill(f.a.Bytes(), 7)
	reqs := make([]xfer.Request, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: uint64(i * sz), Target: 2, TargetOffset: uint64((n - 1 - i) * sz), Length: sz}
	}
	id, _ := f.e.AllocateBatch(n)
	res := make([]error, n)
	if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	sum, err := f.e.Wait(id, time.Now().Add(10*time.Second))
	if err != nil || sum.Completed != n {
		t.Fatalf("%+v %v", sum, err)
	}
	for i := 0; i < n; i++ {
		if !bytes.Equal(f.a.Bytes()[i*sz:(i+1)*sz], f.b.Bytes()[(n-1-i)*sz:(n-i)*sz]) {
			t.Fatalf("task %d: bytes differ", i)
		}
	}
	if err := f.e.Submit(id, nil, f.opts, nil); err != nil {
		t.Fatal(err)
	}
	if k, err := l.Submit([]*xfer.Task{{}}); k != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after Close: %d %v", k, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// plainSeg is a segment without memory: its Bytes is not a MemSegment's.
type plainSeg struct{ *xfertest.Segment }

func (s *plainSeg) Bytes() {}

// TestLocalRejects drives the transport without an engine: tasks it cannot
// do end with a typed error, never a panic.
func TestLocalRejects(t *testing.T) {
	l := xfer.NewLocal(xfer.LocalConfig{}, nil)
	defer l.Close()
	mem := xfertest.NewSegment(1, 100)
	nomem := &plainSeg{xfertest.SegmentOf(2, xfer.KindPool, nil)}
	cases := []struct {
		name string
		task xfer.Task
		want error
	}{
		{"not memory", xfer.Task{Req: xfer.Request{Op: xfer.OpRead, Length: 1}, Local: mem, Target: nomem}, xfer.ErrNotSupported},
		{"past end", xfer.Task{Req: xfer.Request{Op: xfer.OpRead, LocalOffset: 99, Length: 2}, Local: mem, Target: mem}, xfer.ErrOutOfBounds},
		{"huge", xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, TargetOffset: 1, Length: 1 << 62}, Local: mem, Target: mem}, xfer.ErrOutOfBounds},
		{"bad op", xfer.Task{Req: xfer.Request{Op: 7, Length: 1}, Local: mem, Target: mem}, xfer.ErrBadOp},
	}
	for i := range cases {
		c := &cases[i]
		d := xfertest.NewRecorder()
		c.task.SetCompleter(d)
		if k, err := l.Submit([]*xfer.Task{&c.task}); k != 1 || err != nil {
			t.Fatalf("%s: Submit %d %v", c.name, k, err)
		}
		d.Wait(t, 1)
		if got, err := d.Ends(&c.task), d.Err(&c.task); got != 1 || !errors.Is(err, c.want) {
			t.Fatalf("%s: %d Done, err %v, want %v", c.name, got, err, c.want)
		}
	}
}

func ExampleEngine() {
	reg := xfer.NewRegistry()
	pool := xfertest.NewSegment(reg.NextID(), 1<<20)
	client := xfertest.NewSegment(reg.NextID(), 1<<20)
	_ = reg.Add(pool)
	_ = reg.Add(client)
	local := xfer.NewLocal(xfer.LocalConfig{}, nil)
	e := xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(local), nil)
	id, _ := e.AllocateBatch(2)
	copy(client.Bytes(), "hello")
	res := make([]error, 2)
	_ = e.Submit(id, []xfer.Request{
		{Op: xfer.OpWrite, Local: client.ID(), Target: pool.ID(), TargetOffset: 4096, Length: 5},
		{Op: xfer.OpWrite, Local: client.ID(), Target: pool.ID(), TargetOffset: 1 << 20, Length: 5},
	}, xfer.SubmitOptions{Resolver: reg}, res)
	sum, _ := e.Wait(id, time.Time{})
	fmt.Println(sum.Completed, sum.Failed, res[1], string(pool.Bytes()[4096:4101]))
	_ = e.Free(id)
	_ = e.Close()
	_ = local.Close()
	// Output: 1 1 xfer: out of segment bounds hello
}

// TestLocalAllocs: the engine plus the local transport allocate nothing per
// request, on either path.
func TestLocalAllocs(t *testing.T) {
	for _, cfg := range []xfer.LocalConfig{{}, {InlineBytes: -1, ChunkBytes: 4096}} {
		limit := 0.0
		if invariants.RaceEnabled {
			limit = 1 // sync.Pool drops some of what Wait puts back
		}
		l := xfer.NewLocal(cfg, nil)
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l))
		reqs := f.reqs(16)
		res := make([]error, len(reqs))
		run := func() {
			id, err := f.e.AllocateBatch(len(reqs))
			if err != nil {
				panic(err)
			}
			if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
				panic(err)
			}
			if s, err := f.e.Wait(id, time.Time{}); err != nil || s.Completed != len(reqs) {
				panic(fmt.Sprint(s, err))
			}
			if err := f.e.Free(id); err != nil {
				panic(err)
			}
		}
		run()
		if a := testing.AllocsPerRun(100, run); a > limit {
			t.Errorf("%+v: %v allocations per batch of %d, want <= %v", cfg, a, len(reqs), limit)
		}
		l.Close()
		xfertest.CheckRefs(t, f.a, f.b)
	}
}

// TestLocalCloseRace closes the transport while clients submit: every task
// ends in one terminal state (Completed, or Failed with ErrClosed when the
// transport refused it) and every ref comes back.
func TestLocalCloseRace(t *testing.T) {
	for round := 0; round < 20; round++ {
		l := xfer.NewLocal(xfer.LocalConfig{InlineBytes: 1024, ChunkBytes: 4096, Workers: 2, QueueLen: 2}, nil)
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l))
		var wg sync.WaitGroup
		ids := make([]xfer.BatchID, 4)
		for c := range ids {
			ids[c], _ = f.e.AllocateBatch(64)
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := make([]error, 8)
				reqs := f.reqs(8)
				for j := 0; j < 8; j++ {
					// Each client writes its own part of the target.
					for k := range reqs {
						reqs[k].TargetOffset = uint64(c*4096 + j*512 + k*64)
					}
					if err := f.e.Submit(ids[c], reqs, f.opts, res); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%4) * 100 * time.Microsecond)
		l.Close()
		wg.Wait()
		for _, id := range ids {
			sum, err := f.e.Wait(id, time.Now().Add(5*time.Second))
			if err != nil || sum.Total != 64 || sum.Completed+sum.Failed != 64 {
				t.Fatalf("round %d: %+v %v", round, sum, err)
			}
			for i := 0; i < 64; i++ {
				if st := f.status(t, id, i); st.State == xfer.StateFailed && !errors.Is(st.Err, xfer.ErrClosed) {
					t.Fatalf("task %d: %+v", i, st)
				}
			}
			if err := f.e.Free(id); err != nil {
				t.Fatal(err)
			}
		}
		xfertest.CheckRefs(t, f.a, f.b)
		f.e.Close()
	}
}

// gatedLocal is a local transport whose workers wait before every chunk
// until release, and which counts the bytes its submitting goroutines copy
// on the worker path.
type gatedLocal struct {
	*xfer.Local
	gate chan struct{}
	once sync.Once
	here atomic.Uint64
}

func newGatedLocal(t *testing.T, cfg xfer.LocalConfig) *gatedLocal {
	g := &gatedLocal{Local: xfer.NewLocal(cfg, nil), gate: make(chan struct{})}
	xfer.SetLocalChunkHook(g.Local, func(worker bool, n uint64) {
		if worker {
			<-g.gate
			return
		}
		g.here.Add(n)
	})
	t.Cleanup(func() {
		g.release()
		g.Close()
	})
	return g
}

func (g *gatedLocal) release() { g.once.Do(func() { close(g.gate) }) }

// gatedCfg splits a large submit into many chunks; the submitter's help
// is InlineBytes.
var gatedCfg = xfer.LocalConfig{InlineBytes: 256 << 10, ChunkBytes: 64 << 10, Workers: 2, QueueLen: 4}

// TestLocalHelpBounded: a Submit of one task far larger than the inline
// bound returns once its goroutine (a reactor's thread, which serves other
// clients' queues) has copied at most InlineBytes; the workers copy the
// rest, and the task ends once, with every byte.
func TestLocalHelpBounded(t *testing.T) {
	const size = 64 << 20
	l := newGatedLocal(t, gatedCfg)
	src, dst := xfertest.NewSegment(1, size), xfertest.NewSegment(2, size)
	fill(src.Bytes(), 11)
	d := xfertest.NewRecorder()
	tk := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Length: size}, Local: src, Target: dst}
	tk.SetCompleter(d)
	if k, err := l.Submit([]*xfer.Task{tk}); k != 1 || err != nil {
		t.Fatalf("Submit: %d %v", k, err)
	}
	if here := l.here.Load(); here > uint64(gatedCfg.InlineBytes) {
		t.Errorf("the submitting goroutine copied %d bytes, bound %d", here, gatedCfg.InlineBytes)
	}
	if n := d.Count(); n != 0 {
		t.Errorf("the task ended %d times before the workers copied anything", n)
	}
	l.release()
	d.Wait(t, 1)
	if d.Ends(tk) != 1 || d.N(tk) != size || d.Err(tk) != nil {
		t.Fatalf("task ended %d times, %d bytes, %v", d.Ends(tk), d.N(tk), d.Err(tk))
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("bytes differ")
	}
}

// TestLocalCloseEndsBacklog closes the transport while the workers have
// not started on two large submits: Close waits for every chunk and every
// task ends once, complete.
func TestLocalCloseEndsBacklog(t *testing.T) {
	const part, parts = 8 << 20, 5
	l := newGatedLocal(t, gatedCfg)
	src, dst := xfertest.NewSegment(1, part*parts), xfertest.NewSegment(2, part*parts)
	fill(src.Bytes(), 12)
	d := xfertest.NewRecorder()
	tasks := make([]*xfer.Task, parts)
	for i := range tasks {
		off := uint64(i * part)
		tasks[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, LocalOffset: off, TargetOffset: off, Length: part}, Local: src, Target: dst}
		tasks[i].SetCompleter(d)
	}
	for _, batch := range [][]*xfer.Task{tasks[:parts-1], tasks[parts-1:]} {
		if k, err := l.Submit(batch); k != len(batch) || err != nil {
			t.Fatalf("Submit: %d %v", k, err)
		}
	}
	if here := l.here.Load(); here > 2*uint64(gatedCfg.InlineBytes) {
		t.Errorf("the submitting goroutine copied %d bytes in two calls, bound %d each", here, gatedCfg.InlineBytes)
	}
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	for {
		if _, err := l.Submit(nil); errors.Is(err, xfer.ErrClosed) {
			break
		}
		runtime.Gosched()
	}
	select {
	case <-closed:
		t.Fatal("Close returned while the workers had not copied the tasks")
	default:
	}
	if n := d.Count(); n != 0 {
		t.Fatalf("%d tasks ended before the workers copied anything", n)
	}
	l.release()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if n := d.Count(); n != parts {
		t.Fatalf("%d tasks ended when Close returned, want %d", n, parts)
	}
	for i, tk := range tasks {
		if d.Ends(tk) != 1 || d.N(tk) != part || d.Err(tk) != nil {
			t.Fatalf("task %d ended %d times, %d bytes, %v", i, d.Ends(tk), d.N(tk), d.Err(tk))
		}
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("bytes differ")
	}
}

// TestLocalBacklogConcurrent: submitters that keep the queue full put
// their tasks in the backlog side by side; the workers take them all and
// every task ends once with its bytes.
func TestLocalBacklogConcurrent(t *testing.T) {
	const submitters, calls, perCall, size = 4, 8, 2, 512 << 10
	const per = calls * perCall * size
	l := xfer.NewLocal(xfer.LocalConfig{InlineBytes: 64 << 10, ChunkBytes: 16 << 10, Workers: 2, QueueLen: 2}, nil)
	defer l.Close()
	src, dst := xfertest.NewSegment(1, submitters*per), xfertest.NewSegment(2, submitters*per)
	fill(src.Bytes(), 13)
	d := xfertest.NewRecorder()
	tasks := make([]*xfer.Task, submitters*calls*perCall)
	for i := range tasks {
		off := uint64(i * size)
		tasks[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, LocalOffset: off, TargetOffset: off, Length: size}, Local: src, Target: dst}
		tasks[i].SetCompleter(d)
	}
	var wg sync.WaitGroup
	for s := range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := tasks[s*calls*perCall : (s+1)*calls*perCall]
			for c := range calls {
				batch := mine[c*perCall : (c+1)*perCall]
				if k, err := l.Submit(batch); k != len(batch) || err != nil {
					t.Errorf("Submit: %d %v", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	d.Wait(t, len(tasks))
	d.Check(t, tasks)
	for i, tk := range tasks {
		if d.N(tk) != size || d.Err(tk) != nil {
			t.Fatalf("task %d: %d bytes, %v", i, d.N(tk), d.Err(tk))
		}
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("bytes differ")
	}
}

// TestLocalEmptyTaskInLargeSubmit: a task of no bytes in a Submit large
// enough for the workers ends at once, OK (it has no chunk whose copy
// would end it); the large one beside it ends as usual.
func TestLocalEmptyTaskInLargeSubmit(t *testing.T) {
	const size = 8 << 20
	l := xfer.NewLocal(xfer.LocalConfig{InlineBytes: 1 << 20, ChunkBytes: 1 << 20}, nil)
	t.Cleanup(func() { l.Close() })
	src, dst := xfertest.NewSegment(1, size), xfertest.NewSegment(2, size)
	fill(src.Bytes(), 13)
	d := xfertest.NewRecorder()
	empty := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite}, Local: src, Target: dst}
	big := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Length: size}, Local: src, Target: dst}
	empty.SetCompleter(d)
	big.SetCompleter(d)
	if k, err := l.Submit([]*xfer.Task{empty, big}); k != 2 || err != nil {
		t.Fatalf("Submit: %d %v", k, err)
	}
	d.Wait(t, 2)
	if d.Ends(empty) != 1 || d.N(empty) != 0 || d.Err(empty) != nil {
		t.Fatalf("the empty task ended %d times, %d bytes, %v", d.Ends(empty), d.N(empty), d.Err(empty))
	}
	if d.Ends(big) != 1 || d.N(big) != size || !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatalf("the large task ended %d times, %d bytes, %v", d.Ends(big), d.N(big), d.Err(big))
	}
}
