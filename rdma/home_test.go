//go:build linux

package rdma_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// Completions polled by the reactor that posted, over rdmatest: a task a
// Home submitted ends in that Home's Reap (on its worker's thread), and
// nowhere else; a queue pair error, a worker that stops and Close each end
// every task once.

// homePair is fakePair with homes: a's transport knows n homes.
func homePair(t *testing.T, n int, cfg rdma.Config) (a, b *side, hs *rdma.Homes, la, rb []byte) {
	t.Helper()
	hs = rdma.NewHomes(n, cfg.PollSpin)
	cfg.Homes = hs
	la, rb = pattern(1<<18, 3), make([]byte, 1<<18)
	a, b = fakePair(t, cfg, la, rb)
	return a, b, hs, la, rb
}

func writes(n int, size uint64) []xfer.Request {
	var reqs []xfer.Request
	for i := range n {
		off := uint64(i) * size
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: size})
	}
	return reqs
}

func homed(tasks []*xfer.Task, h uint32) []*xfer.Task {
	for _, tk := range tasks {
		tk.Home = h
	}
	return tasks
}

// TestHomeTasksEndInTheirHomesReap: what home 1 submitted completes in the
// queue pair's completion queue and stays there, unended, until that home
// reaps; what no home submitted is reaped by the transport's goroutine.
func TestHomeTasksEndInTheirHomesReap(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 2, rdma.Config{QPs: 1})
	h := hs.Home(0)
	var kicks atomic.Int32
	h.Bind(func() { kicks.Add(1) }, false)
	r := newRecorder()
	tasks := homed(a.tasks(r, writes(3, 4096)...), 1)
	if n, err := a.t.Submit(tasks); n != 3 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	// The fake device completes at Post: the completions wait for home 1.
	if r.Count() != 0 {
		t.Fatalf("%d tasks ended before their home reaped", r.Count())
	}
	if !h.Reap() {
		t.Fatal("Reap found nothing")
	}
	if r.Count() != 3 {
		t.Fatalf("%d of 3 tasks ended in their home's Reap", r.Count())
	}
	r.Check(t, tasks)
	if h.Reaped() == 0 || hs.Home(1).Reaped() != 0 {
		t.Errorf("reaped: home 1 %d, home 2 %d; want all on home 1", h.Reaped(), hs.Home(1).Reaped())
	}
	// No home: the transport's goroutine ends it without any Reap.
	before := h.Reaped()
	more := a.tasks(r, writes(1, 4096)...)
	if n, err := a.t.Submit(more); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return r.Count() == 4 }, "the task of no home ended")
	if h.Reaped() != before {
		t.Error("a task no home submitted was reaped by a home")
	}
	// Home 1 again: it claims the idle queue pair back.
	again := homed(a.tasks(r, writes(1, 4096)...), 1)
	if n, err := a.t.Submit(again); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { h.Reap(); return r.Count() == 5 }, "home 1's second task ended")
	if h.Reaped() == before {
		t.Errorf("home 1 did not reap its second task (reaped %d, before %d)", h.Reaped(), before)
	}
}

// TestHomeQPErrorEndsEachOnce: a queue pair error with a home's work in
// flight: the home reaps the error and the flushes, each task ends once
// with its own error, and the queue pair comes back for the home.
func TestHomeQPErrorEndsEachOnce(t *testing.T) {
	a, _, hs, la, rb := homePair(t, 1, rdma.Config{QPs: 1})
	h := hs.Home(0)
	h.Bind(func() {}, false)
	r := newRecorder()
	a.dev.Hold()
	tasks := homed(a.tasks(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 4096},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: 4096, Target: segRemote, TargetOffset: 4096, Length: 200 << 10},
		xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segRemote, Length: 512},
	), 1)
	if n, err := a.t.Submit(tasks); n != 3 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	a.dev.FailQueuePairs()
	testutil.Eventually(t, 5*time.Second, func() bool { h.Reap(); return r.Count() == 3 }, "the home reaped the flushed tasks")
	r.Check(t, tasks)
	for i, tk := range tasks {
		var ce *rdma.CompletionError
		if err := r.Err(tk); !errors.As(err, &ce) || ce.Status != rdma.WCWRFlushErr {
			t.Errorf("task %d: err = %v, want IBV_WC_WR_FLUSH_ERR", i, err)
		}
	}
	if h.Reaped() == 0 {
		t.Error("the flushes were not reaped by the home that posted")
	}
	a.dev.Release() // the reconnect probe runs
	copy(rb, make([]byte, len(rb)))
	more := homed(a.tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 1 << 18}), 1)
	// Submit waits for the reconnector (SubmitWait), reaping meanwhile.
	if n, err := a.t.Submit(more); n != 1 || err != nil {
		t.Fatalf("Submit after recovery = %d, %v", n, err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { h.Reap(); return r.Count() == 4 }, "the task after recovery ended")
	if err := r.Err(more[0]); err != nil || string(la) != string(rb) {
		t.Fatalf("after recovery: %v", err)
	}
	r.Check(t, append(tasks, more...))
}

// TestHomeCloseWithWorkInFlight: Close with a home's work in flight and a
// home that never reaps again (its worker is stuck or gone): the
// transport takes the queue pair back, its goroutine reaps the flushes,
// and every task ends once with the device's error, well before the
// drain's bound (ConnectTimeout), which would end them with ErrClosed.
func TestHomeCloseWithWorkInFlight(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 2, ConnectTimeout: time.Minute})
	hs.Home(0).Bind(func() {}, false)
	r := newRecorder()
	a.dev.Hold()
	tasks := homed(a.tasks(r, writes(8, 4096)...), 1)
	if n, err := a.t.Submit(tasks); n != 8 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	start := time.Now()
	if err := a.t.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("Close took %v with the home's work in flight", took)
	}
	r.Check(t, tasks)
	for i, tk := range tasks {
		var ce *rdma.CompletionError
		if err := r.Err(tk); !errors.As(err, &ce) {
			t.Errorf("task %d: err = %v, want the flush reaped (not the drain's bound)", i, err)
		}
	}
	if hs.Home(0).Reaped() != 0 {
		t.Error("the home reaped after Close took its queue pairs back")
	}
	if hs.Home(0).Reap() {
		t.Error("the home still reaps a closed transport's queue pair")
	}
}

// TestHomeStopHandsItsWorkBack: a worker that stops (Home.Stop) leaves
// its work in flight to the transport's goroutine, which ends it; later
// tasks naming that home are reaped by the transport too.
func TestHomeStopHandsItsWorkBack(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 1})
	h := hs.Home(0)
	h.Bind(func() {}, false)
	r := newRecorder()
	a.dev.Hold()
	tasks := homed(a.tasks(r, writes(4, 4096)...), 1)
	if n, err := a.t.Submit(tasks); n != 4 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	h.Reap() // the home owns the queue pair now
	h.Stop()
	a.dev.Release()
	r.Wait(t, 4)
	r.Check(t, tasks)
	late := homed(a.tasks(r, writes(1, 4096)...), 1)
	if n, err := a.t.Submit(late); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	r.Wait(t, 1)
	if h.Reaped() != 0 {
		t.Errorf("a stopped home reaped %d completions", h.Reaped())
	}
}

// TestHomeSleepArmsAndIsWoken: a home with work in flight polls for its
// spin time, then arms; the completion's event then wakes it (the
// worker's wake), and its Reap ends the task.
func TestHomeSleepArmsAndIsWoken(t *testing.T) {
	// A spin longer than the test: the home keeps its worker polling.
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 1, PollSpin: time.Hour})
	a.dev.Hold()
	r := newRecorder()
	if n, err := a.t.Submit(homed(a.tasks(r, writes(1, 4096)...), 1)); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if hs.Home(0).Sleep(nil) {
		t.Error("the home slept at once with its work in flight, within its spin")
	}
	a.dev.Release()
	testutil.Eventually(t, 5*time.Second, func() bool { hs.Home(0).Reap(); return r.Count() == 1 }, "the spinning home's task ended")

	// No spin: the home arms at once, and the completion wakes it.
	a, _, hs, _, _ = homePair(t, 1, rdma.Config{QPs: 1, PollSpin: -1})
	h := hs.Home(0)
	var kicks atomic.Int32
	h.Bind(func() { kicks.Add(1) }, false)
	r = newRecorder()
	a.dev.Hold()
	tasks := homed(a.tasks(r, writes(1, 4096)...), 1)
	if n, err := a.t.Submit(tasks); n != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if !h.Sleep(nil) {
		t.Fatal("the home without spin refused to sleep with nothing completed")
	}
	if kicks.Load() != 0 {
		t.Fatal("woken before anything completed")
	}
	a.dev.Release()
	testutil.Eventually(t, 5*time.Second, func() bool { return kicks.Load() > 0 }, "the completion woke the home's worker")
	if r.Count() != 0 {
		t.Fatal("the task ended before its home reaped it")
	}
	if !h.Reap() || r.Count() != 1 {
		t.Fatalf("Reap after the wake-up: %d ended", r.Count())
	}
	if !h.Sleep(nil) {
		t.Error("a home with nothing in flight refused to sleep")
	}
}

// tidQueue is a reactor queue whose Serve submits the tasks handed to it
// to an rdma transport, from the worker's thread.
type tidQueue struct {
	tr   *rdma.Transport
	efd  int          // its eventfd doorbell (0: none)
	tid  atomic.Int32 // the worker's thread
	mu   sync.Mutex
	todo []*xfer.Task
	word atomic.Uint32
}

func (q *tidQueue) Serve() bool {
	q.tid.Store(int32(unix.Gettid()))
	q.mu.Lock()
	ts := q.todo
	q.todo = nil
	q.mu.Unlock()
	if len(ts) == 0 {
		return false
	}
	if n, err := q.tr.Submit(ts); n != len(ts) || err != nil {
		panic("submit from the worker failed")
	}
	return true
}

func (q *tidQueue) Doorbell() (*atomic.Uint32, uint32, bool) {
	v := q.word.Load()
	q.mu.Lock()
	empty := len(q.todo) == 0
	q.mu.Unlock()
	return &q.word, v, empty
}

func (q *tidQueue) Awake() {}

// Idle: the queue keeps no count of its tasks in flight; saying so keeps
// the worker from polling through them.
func (q *tidQueue) Idle() bool { return false }

// EventfdDoorbell: the queue's eventfd when it has one (a hosted pool's
// worker reads it), else none (a pool of own threads).
func (q *tidQueue) EventfdDoorbell() (int, bool) {
	if q.efd > 0 {
		return q.efd, true
	}
	return -1, false
}

func (q *tidQueue) give(ts []*xfer.Task) {
	q.mu.Lock()
	q.todo = append(q.todo, ts...)
	q.mu.Unlock()
	q.word.Add(1)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&q.word)), 1, 1<<30, 0, 0, 0) //nolint:errcheck
	if q.efd > 0 {
		one := [8]byte{1}
		unix.Write(q.efd, one[:]) //nolint:errcheck
	}
}

// TestHomeOnReactorWorker: through a real reactor worker (its own thread):
// every task the worker submits ends on that same OS thread, reaped by its
// Home in the worker's loop, one after the other as a depth-1 client
// submits them, whether the worker spins or sleeps in between.
func TestHomeOnReactorWorker(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 2})
	pool, err := reactor.New(reactor.Config{Workers: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.AddReaper(0, hs.Home(0)); err != nil {
		t.Fatal(err)
	}
	q := &tidQueue{tr: a.t}
	w := pool.Pick()
	if err := pool.Attach(w, q); err != nil {
		t.Fatal(err)
	}
	defer pool.Detach(w, q)
	var mu sync.Mutex
	tids := map[int]int{}
	ended := make(chan struct{}, 1)
	done := xfertest.Func(func(*xfer.Task, uint64, error) {
		mu.Lock()
		tids[unix.Gettid()]++
		mu.Unlock()
		ended <- struct{}{}
	})
	for i := range 50 {
		ts := homed(a.tasks(done, writes(1, 4096)...), pool.Home(w))
		s0 := pool.Stats()[0].Sleeps
		q.give(ts)
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("task %d did not end", i)
		}
		// Nothing in flight: the worker sleeps before the next one.
		testutil.Eventually(t, 5*time.Second, func() bool { return pool.Stats()[0].Sleeps > s0 }, "the worker sleeps after task %d", i)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tids) != 1 || tids[int(q.tid.Load())] != 50 {
		t.Errorf("tasks ended on threads %v; want all 50 on the worker's %d", tids, q.tid.Load())
	}
	if hs.Home(0).Reaped() == 0 {
		t.Error("the worker's home reaped nothing")
	}
}

// TestHomePollsOnTheWorkersRing: a worker hosted on an io_uring ring
// polls the completion channel of the queue pair it posted on (rdmatest's
// channel is an eventfd, as a device's is a file) on its own ring: each
// depth-1 task, completing while the worker sleeps, ends on the worker's
// thread after the poll fired, and the queue pair's goroutine neither
// takes the event nor wakes the worker. Tasks no worker posted, on the
// same queue pair in between, are reaped by the goroutine, which watches
// the channel again while it owns the queue pair; the worker claims it
// back after.
func TestHomePollsOnTheWorkersRing(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 1, PollSpin: -1}) // no spin: every task sleeps
	pool, q := hostedHome(t, hs, a.t)
	h, w := hs.Home(0), 0
	var mu sync.Mutex
	tids := map[int]int{}
	ended := make(chan struct{}, 1)
	done := xfertest.Func(func(*xfer.Task, uint64, error) {
		mu.Lock()
		tids[unix.Gettid()]++
		mu.Unlock()
		ended <- struct{}{}
	})
	const n = 60
	for i := range n {
		if i == n/2 {
			// A task of no worker: the goroutine claims the idle queue
			// pair, reaps it, and the worker claims it back below.
			r := newRecorder()
			if k, err := a.t.Submit(a.tasks(r, writes(1, 4096)...)); k != 1 || err != nil {
				t.Fatalf("Submit of no home = %d, %v", k, err)
			}
			r.Wait(t, 1)
		}
		a.dev.Hold()
		st := a.dev.Stats()
		q.give(homed(a.tasks(done, writes(1, 4096)...), pool.Home(w)))
		testutil.Eventually(t, 5*time.Second, func() bool { return a.dev.Stats().Posts > st.Posts }, "task %d posted", i)
		if i == 0 || i == n/2 {
			// The worker claimed the queue pair from its goroutine with
			// this post: until the goroutine, woken by the claim, waits
			// again without the channel, it may still take the event and
			// wake the worker (as claimLocked says). Once it has, it never
			// does.
			testutil.Eventually(t, 5*time.Second, func() bool { return a.dev.Stats().BlindWaits > st.BlindWaits },
				"the queue pair's goroutine leaving the channel to the worker after task %d's claim", i)
		}
		a.dev.Release() // completes now, from this goroutine
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("task %d did not end (polled %d, woken %d)", i, h.Polled(), h.Woken())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tids) != 1 || tids[int(q.tid.Load())] != n {
		t.Errorf("tasks ended on threads %v; want all %d on the worker's %d", tids, n, q.tid.Load())
	}
	if h.Polled() < n/2 {
		t.Errorf("the channel's poll fired %d times for %d tasks", h.Polled(), n)
	}
	if h.Woken() != 0 {
		t.Errorf("the queue pair's goroutine woke the worker %d times: it watched the channel the worker polls", h.Woken())
	}
	t.Logf("%d tasks: polled %d, reaped %d", n, h.Polled(), h.Reaped())
}

// hostedHome is a pool of one worker hosted on an io_uring ring (eventfd
// doorbells) whose reaper is hs's home 0, serving one tidQueue on tr.
func hostedHome(t *testing.T, hs *rdma.Homes, tr *rdma.Transport) (*reactor.Pool, *tidQueue) {
	t.Helper()
	ring, err := uring.New(uring.Config{Rings: 1, AllowedDirs: []string{t.TempDir()}}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	pool, err := reactor.New(reactor.Config{Workers: 1, Doorbell: reactor.DoorbellEventfd}, ring, nil)
	if err != nil {
		ring.Close()
		t.Fatal(err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	q := &tidQueue{tr: tr, efd: efd}
	// Cleanups run last first: the queue goes, then the worker (which
	// hands its queue pairs back), then the transports (homePair's).
	t.Cleanup(func() { pool.Close(); ring.Close(); unix.Close(efd) })
	if err := pool.AddReaper(0, hs.Home(0)); err != nil {
		t.Fatal(err)
	}
	w := pool.Pick()
	if err := pool.Attach(w, q); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Detach(w, q) })
	return pool, q
}

// TestHomeHandsOverUnderLoad: one queue pair, a hosted worker posting at
// depth 1, a goroutine posting tasks of no worker at depth 1 beside it,
// and a device completing at random moments: the queue pair changes hands
// (claims both ways, posts beside the other's work) thousands of times,
// the watcher of its channel with it, and every task of both ends, once.
// A completion that nobody is woken for stops the test at its bound.
func TestHomeHandsOverUnderLoad(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 1, PollSpin: -1})
	pool, q := hostedHome(t, hs, a.t)
	n := 2000
	if testing.Short() {
		n = 300
	}
	stop := make(chan struct{})
	var dev sync.WaitGroup
	dev.Add(1)
	go func() { // the device: work waits a moment, then completes at once
		defer dev.Done()
		for {
			select {
			case <-stop:
				a.dev.Release()
				return
			default:
			}
			a.dev.Hold()
			for range 50 {
				runtime.Gosched()
			}
			a.dev.Release()
		}
	}()
	defer func() { close(stop); dev.Wait() }()
	errs := make(chan error, 2)
	go func() { // tasks of no worker
		r := newRecorder()
		for i := range n {
			if k, err := a.t.Submit(a.tasks(r, writes(1, 4096)...)); k != 1 || err != nil {
				errs <- fmt.Errorf("Submit of no home %d = %d, %v", i, k, err)
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for r.Count() != i+1 {
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("task %d of no home did not end", i)
					return
				}
				runtime.Gosched()
			}
		}
		errs <- nil
	}()
	go func() { // the worker's
		ended := make(chan error, 1)
		done := xfertest.Func(func(_ *xfer.Task, _ uint64, err error) { ended <- err })
		for i := range n {
			q.give(homed(a.tasks(done, writes(1, 4096)...), pool.Home(0)))
			select {
			case err := <-ended:
				if err != nil {
					errs <- fmt.Errorf("worker's task %d: %v", i, err)
					return
				}
			case <-time.After(10 * time.Second):
				errs <- fmt.Errorf("worker's task %d did not end (polled %d, woken %d)", i, hs.Home(0).Polled(), hs.Home(0).Woken())
				return
			}
		}
		errs <- nil
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d + %d tasks: the home reaped %d, its poll fired %d times, goroutines woke it %d times",
		n, n, hs.Home(0).Reaped(), hs.Home(0).Polled(), hs.Home(0).Woken())
}

// TestHomeSteadyStateAllocs: a home's submission and its reap allocate
// nothing per request once warm.
func TestHomeSteadyStateAllocs(t *testing.T) {
	a, _, hs, _, _ := homePair(t, 1, rdma.Config{QPs: 1})
	h := hs.Home(0)
	h.Bind(func() {}, false)
	ch := make(xfertest.Chan, 64)
	tasks := make([]*xfer.Task, 16)
	for i := range tasks {
		tasks[i] = a.tasks(ch, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, TargetOffset: uint64(i) * 4096, Length: 4096})[0]
		tasks[i].Home = 1
	}
	run := func() {
		if n, err := a.t.Submit(tasks); n != len(tasks) || err != nil {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		if !h.Reap() {
			t.Fatal("the home reaped nothing")
		}
		for range tasks {
			<-ch
		}
	}
	run()
	if allocs := testing.AllocsPerRun(50, run); allocs != 0 {
		t.Errorf("a home's Submit + Reap of 16 tasks: %v allocations, want 0", allocs)
	}
}
