package rdma

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// recorder is a Completer that checks every task ends exactly once.
type recorder struct {
	mu    sync.Mutex // guards the fields below
	ends  map[*xfer.Task]int
	n     map[*xfer.Task]uint64
	errs  map[*xfer.Task]error
	count int
	ch    chan struct{}
}

func newRecorder() *recorder {
	return &recorder{ends: map[*xfer.Task]int{}, n: map[*xfer.Task]uint64{}, errs: map[*xfer.Task]error{}, ch: make(chan struct{}, 1<<16)}
}

func (r *recorder) TaskDone(t *xfer.Task, n uint64, err error) {
	r.mu.Lock()
	r.ends[t]++
	r.n[t], r.errs[t] = n, err
	r.count++
	r.mu.Unlock()
	r.ch <- struct{}{}
}

// wait waits for k more ends.
func (r *recorder) wait(t *testing.T, k int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for range k {
		select {
		case <-r.ch:
		case <-timeout:
			t.Fatalf("timed out waiting for task ends")
		}
	}
}

func (r *recorder) check(t *testing.T, tasks []*xfer.Task) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, tk := range tasks {
		if r.ends[tk] != 1 {
			t.Errorf("task %d ended %d times", i, r.ends[tk])
		}
	}
}

type fakeSide struct {
	f   *fakeFabric
	qps []*fakeQP
	t   *Transport
}

func newFakeSide(t *testing.T, cfg Config) *fakeSide {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeSide{f: newFakeFabric()}
	var vs []qpVerbs
	for range cfg.QPs {
		q := s.f.newQP(cfg.SendDepth)
		s.qps = append(s.qps, q)
		vs = append(vs, q)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.t = newTransport("rdma", cfg, log, Addr{GID: GID{15: 1}, MTU: MTU1024}, fakeCQ{s.f}, vs, nil)
	return s
}

const (
	segLocal  xfer.SegmentID = 1
	segRemote xfer.SegmentID = 2
)

// fakePair is two transports over fakes, a connected to b, with a's
// segment 1 over la and segment 2 naming b's rb.
func fakePair(t *testing.T, cfg Config, la, rb []byte) (a, b *fakeSide) {
	t.Helper()
	a, b = newFakeSide(t, cfg), newFakeSide(t, cfg)
	t.Cleanup(func() { a.t.Close(); b.t.Close() })
	lt, err := newKeyTable(addrOf(la), uint64(len(la)), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	a.t.AddLocal(segLocal, &Region{keys: lt})
	rr := RemoteRegion{Name: 9, Addr: addrOf(rb), Size: uint64(len(rb)), ChunkSize: 1 << 16}
	rr.RKeys = make([]uint32, (len(rb)+1<<16-1)>>16)
	if err := a.t.AddRemote(segRemote, rr); err != nil {
		t.Fatal(err)
	}
	if err := a.t.Connect(Loopback{b.t}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func tasksOf(r *recorder, reqs ...xfer.Request) []*xfer.Task {
	out := make([]*xfer.Task, len(reqs))
	for i, q := range reqs {
		out[i] = &xfer.Task{Req: q}
		out[i].SetCompleter(r)
	}
	return out
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestFakeWriteReadSignalled(t *testing.T) {
	la, rb := make([]byte, 1<<20), make([]byte, 1<<20)
	copy(la, pattern(1<<20, 3))
	a, _ := fakePair(t, Config{QPs: 2, SignalEvery: 4}, la, rb)
	r := newRecorder()
	var reqs []xfer.Request
	for i := range 40 {
		// 40 writes of 12 KiB + 100 bytes: some cross a 64 KiB chunk.
		off := uint64(i) * (12<<10 + 100)
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: 12<<10 + 100})
	}
	tasks := tasksOf(r, reqs...)
	a.f.mu.Lock()
	postsBefore, postedBefore, signalsBefore := a.f.posts, a.f.posted, a.f.signals
	a.f.mu.Unlock()
	n, err := a.t.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	r.wait(t, len(tasks))
	r.check(t, tasks)
	for i, tk := range tasks {
		if r.n[tk] != tk.Req.Length || r.errs[tk] != nil {
			t.Fatalf("task %d: n %d err %v", i, r.n[tk], r.errs[tk])
		}
	}
	end := 40 * (12<<10 + 100)
	if !bytes.Equal(rb[:end], la[:end]) {
		t.Fatal("written bytes differ")
	}
	a.f.mu.Lock()
	posts, posted, signals := a.f.posts-postsBefore, a.f.posted-postedBefore, a.f.signals-signalsBefore
	a.f.mu.Unlock()
	if posts != 1 || posted <= 40 {
		t.Errorf("one Submit made %d posts of %d work requests; want 1 linked list of more than 40", posts, posted)
	}
	if want := posted/4 + min(posted%4, 1); signals != want {
		t.Errorf("%d signalled of %d (every 4th + last): got %d", want, posted, signals)
	}

	// Read it back into another part of the local segment.
	clear(la[512<<10:])
	rt := tasksOf(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: 512 << 10, Target: segRemote, Length: 256 << 10})
	if n, err := a.t.Submit(rt); n != 1 || err != nil {
		t.Fatalf("Submit read = %d, %v", n, err)
	}
	r.wait(t, 1)
	if !bytes.Equal(la[512<<10:768<<10], rb[:256<<10]) {
		t.Fatal("read bytes differ")
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

func TestFakeInvalidTasksEndTyped(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, Config{}, la, rb)
	r := newRecorder()
	tasks := tasksOf(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 0},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 10},
		xfer.Request{Op: xfer.OpRead, Local: 77, Target: segRemote, Length: 10},
		xfer.Request{Op: 0, Local: segLocal, Target: segRemote, Length: 10},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: 1 << 16, Target: segRemote, Length: 1},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 10},
	)
	// A valid WRITE carrying a notification: this transport has no channel
	// to send it on, so the task fails rather than moving without it.
	notified := tasks[len(tasks)-1]
	notified.Notify = []byte("x")
	n, err := a.t.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	r.wait(t, len(tasks))
	r.check(t, tasks)
	for i, tk := range tasks {
		err := r.errs[tk]
		switch {
		case i == 1 && err != nil:
			t.Errorf("valid task failed: %v", err)
		case tk == notified:
			if !errors.Is(err, xfer.ErrNotSupported) || r.n[tk] != 0 {
				t.Errorf("notified task: %d bytes, err = %v, want ErrNotSupported and nothing moved", r.n[tk], err)
			}
		case i != 1 && !errors.Is(err, xfer.ErrInvalid) && !errors.Is(err, ErrNotRegistered):
			t.Errorf("task %d: err = %v, want ErrInvalid or ErrNotRegistered", i, err)
		}
	}
}

func TestFakeQPErrorFailsInFlightAndRecovers(t *testing.T) {
	la, rb := pattern(1<<18, 1), make([]byte, 1<<18)
	a, b := fakePair(t, Config{QPs: 1}, la, rb)
	r := newRecorder()
	a.f.mu.Lock()
	a.f.hold = true
	conns := b.f.conns
	a.f.mu.Unlock()
	tasks := tasksOf(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 4096},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: 4096, Target: segRemote, TargetOffset: 4096, Length: 200 << 10},
	)
	if n, err := a.t.Submit(tasks); n != 2 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if err := a.t.failQP(0); err != nil {
		t.Fatal(err)
	}
	r.wait(t, 2)
	r.check(t, tasks)
	a.f.release(a.qps...) // the reconnect probe (maybe posted already) must run
	for i, tk := range tasks {
		var ce *CompletionError
		if err := r.errs[tk]; !errors.As(err, &ce) || ce.Status != WCWRFlushErr ||
			!strings.Contains(err.Error(), "IBV_WC_WR_FLUSH_ERR") || !errors.Is(err, ErrCompletion) {
			t.Errorf("task %d: err = %v, want IBV_WC_WR_FLUSH_ERR", i, err)
		}
		if r.n[tk] != 0 {
			t.Errorf("failed task %d reports %d bytes", i, r.n[tk])
		}
	}
	// The queue pair comes back through the peer, and works.
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.t.qps[0].mu.Lock()
		up := a.t.qps[0].state == qpUp
		a.t.qps[0].mu.Unlock()
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("queue pair not re-established")
		}
		time.Sleep(time.Millisecond)
	}
	b.f.mu.Lock()
	if b.f.conns == conns {
		t.Error("the peer's queue pair was not reconnected")
	}
	b.f.mu.Unlock()
	more := tasksOf(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 1 << 18})
	if n, err := a.t.Submit(more); n != 1 || err != nil {
		t.Fatalf("Submit after recovery = %d, %v", n, err)
	}
	r.wait(t, 1)
	if r.errs[more[0]] != nil || !bytes.Equal(la, rb) {
		t.Fatalf("after recovery: %v", r.errs[more[0]])
	}
}

func TestFakeQueueFullAndClose(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, Config{QPs: 1, SendDepth: 8, SubmitWait: 50 * time.Millisecond}, la, rb)
	r := newRecorder()
	a.f.mu.Lock()
	a.f.hold = true
	a.f.mu.Unlock()
	var reqs []xfer.Request
	for range 12 {
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 64})
	}
	tasks := tasksOf(r, reqs...)
	n, err := a.t.Submit(tasks)
	if n != 8 || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Submit into a full queue = %d, %v; want 8, ErrQueueFull", n, err)
	}
	// Close ends the held work (flushed) and waits for it.
	if err := a.t.Close(); err != nil {
		t.Fatal(err)
	}
	r.check(t, tasks[:8])
	r.mu.Lock()
	if r.count != 8 {
		t.Errorf("%d tasks ended, want the 8 dispatched", r.count)
	}
	for _, tk := range tasks[8:] {
		if r.ends[tk] != 0 {
			t.Error("a task that was not dispatched ended")
		}
	}
	for _, tk := range tasks[:8] {
		if r.errs[tk] == nil {
			t.Error("held task ended without error at Close")
		}
	}
	r.mu.Unlock()
	if n, err := a.t.Submit(tasks[8:]); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Errorf("Submit after Close = %d, %v", n, err)
	}
	if err := a.t.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestFakeConnectBadGID(t *testing.T) {
	a, b := newFakeSide(t, Config{}), newFakeSide(t, Config{})
	defer a.t.Close()
	defer b.t.Close()
	bad := badPeer{b.t}
	start := time.Now()
	err := a.t.Connect(bad)
	if !errors.Is(err, ErrConnect) {
		t.Fatalf("Connect to a bogus gid: %v, want ErrConnect", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("failing took %v", time.Since(start))
	}
}

// badPeer answers with an unusable GID.
type badPeer struct{ t *Transport }

func (p badPeer) Exchange(l ConnInfo) (ConnInfo, error) {
	c, err := p.t.Accept(l)
	c.GID = GID{0xde, 0xad}
	return c, err
}

func TestFakeSteadyStateAllocs(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, Config{QPs: 1}, la, rb)
	ch := make(chan struct{}, 64)
	c := chanCompleter(ch)
	tasks := make([]*xfer.Task, 16)
	for i := range tasks {
		tasks[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, TargetOffset: uint64(i) * 4096, Length: 4096}}
		tasks[i].SetCompleter(c)
	}
	run := func() {
		if n, err := a.t.Submit(tasks); n != len(tasks) || err != nil {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		for range tasks {
			<-ch
		}
	}
	run()
	// The fake's own completion list may grow once; steady state then.
	if allocs := testing.AllocsPerRun(50, run); allocs != 0 {
		t.Errorf("Submit + completion of 16 tasks: %v allocations, want 0", allocs)
	}
}

type chanCompleter chan struct{}

func (c chanCompleter) TaskDone(*xfer.Task, uint64, error) { c <- struct{}{} }
