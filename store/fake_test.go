package store

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// fakeFile is an in-memory file segment: it outlives stores opened on it,
// as a file outlives a process.
type fakeFile struct {
	id    xfer.SegmentID
	align uint32
	mu    sync.Mutex // guards data
	data  []byte
	// null: a file of size bytes that holds nothing (reads give zeros,
	// writes vanish), for measuring the index without the bytes.
	null bool
	size uint64
	refs atomic.Int64
}

var (
	_ xfer.Segment = (*fakeFile)(nil)
	_ aligner      = (*fakeFile)(nil)
)

func newFakeFile(size int) *fakeFile {
	return &fakeFile{id: 900, align: 4096, data: make([]byte, size)}
}

func (f *fakeFile) ID() xfer.SegmentID { return f.id }
func (f *fakeFile) Kind() xfer.Kind    { return xfer.KindFile }
func (f *fakeFile) Size() uint64 {
	if f.null {
		return f.size
	}
	return uint64(len(f.data))
}
func (f *fakeFile) Acquire() bool                      { f.refs.Add(1); return true }
func (f *fakeFile) Release()                           { f.refs.Add(-1) }
func (f *fakeFile) Alignment() (offset, memory uint32) { return f.align, f.align }

// fakeTr is a transport over fakeFiles with fault injection. By default it
// moves bytes and completes each task inside Submit.
type fakeTr struct {
	mu sync.Mutex // guards the fields below
	// async queues dispatched tasks until release; otherwise they end
	// inside Submit.
	async bool
	queue []*xfer.Task
	// lifo releases the queue newest first.
	lifo bool
	// accept > 0 dispatches at most accept tasks per Submit, then refuses
	// the rest with xfer.ErrClosed. 0 means no limit.
	accept int
	// fail, when it returns an error, ends the task with it (no bytes
	// move).
	fail func(t *xfer.Task) error
	// lie, when set, replaces Submit's return values: the tasks it says it
	// took (n) are handled as usual, the rest left alone.
	lie func(n int, err error) (int, error)
	// inSubmit runs inside every Submit, before it returns.
	inSubmit func()
	closed   bool

	submits, done atomic.Int64
	writes, reads atomic.Int64
}

var _ xfer.Transport = (*fakeTr)(nil)

func (f *fakeTr) Name() string      { return "fake" }
func (f *fakeTr) Cancel(*xfer.Task) {}
func (f *fakeTr) Close() error {
	f.mu.Lock()
	f.closed = true
	q := f.queue
	f.queue = nil
	f.mu.Unlock()
	for _, t := range q {
		f.done.Add(1)
		t.Done(0, xfer.ErrClosed)
	}
	return nil
}

func (f *fakeTr) Submit(ts []*xfer.Task) (int, error) {
	f.submits.Add(1)
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return 0, xfer.ErrClosed
	}
	n, err := len(ts), error(nil)
	if f.accept > 0 && n > f.accept {
		n, err = f.accept, xfer.ErrClosed
	}
	if f.lie != nil {
		n, err = f.lie(n, err)
	}
	take := max(0, min(n, len(ts)))
	async, hook := f.async, f.inSubmit
	if async {
		f.queue = append(f.queue, ts[:take]...)
	}
	f.mu.Unlock()
	if !async {
		for _, t := range ts[:take] {
			f.exec(t)
		}
	}
	if hook != nil {
		hook()
	}
	return n, err
}

// exec moves a task's bytes and ends it.
func (f *fakeTr) exec(t *xfer.Task) {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	f.done.Add(1)
	if fail != nil {
		if err := fail(t); err != nil {
			t.Done(0, err)
			return
		}
	}
	q := t.Req
	file, ok := t.Target.(*fakeFile)
	mem, ok2 := t.Local.(xfer.MemSegment)
	if !ok || !ok2 {
		t.Done(0, fmt.Errorf("%w: fake: bad segments", xfer.ErrInvalid))
		return
	}
	a := uint64(file.align)
	if q.TargetOffset%a != 0 || q.Length%a != 0 || q.LocalOffset%a != 0 {
		t.Done(0, fmt.Errorf("%w: fake: misaligned %+v", xfer.ErrInvalid, q))
		return
	}
	b := mem.Bytes()
	if file.null {
		if q.Op == xfer.OpRead {
			clear(b[q.LocalOffset : q.LocalOffset+q.Length])
		}
		t.Done(q.Length, nil)
		return
	}
	if q.TargetOffset+q.Length > uint64(len(file.data)) || q.LocalOffset+q.Length > uint64(len(b)) {
		t.Done(0, fmt.Errorf("%w: fake: out of bounds %+v", xfer.ErrInvalid, q))
		return
	}
	file.mu.Lock()
	if q.Op == xfer.OpWrite {
		copy(file.data[q.TargetOffset:q.TargetOffset+q.Length], b[q.LocalOffset:q.LocalOffset+q.Length])
		f.writes.Add(1)
	} else {
		copy(b[q.LocalOffset:q.LocalOffset+q.Length], file.data[q.TargetOffset:q.TargetOffset+q.Length])
		f.reads.Add(1)
	}
	file.mu.Unlock()
	t.Done(q.Length, nil)
}

// release ends every queued task (async mode).
func (f *fakeTr) release() int {
	n := 0
	for {
		f.mu.Lock()
		q := f.queue
		f.queue = nil
		lifo := f.lifo
		f.mu.Unlock()
		if len(q) == 0 {
			return n
		}
		if lifo {
			slices.Reverse(q)
		}
		for _, t := range q {
			f.exec(t)
			n++
		}
	}
}

func (f *fakeTr) set(fn func(f *fakeTr)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// isHeaderWrite reports whether t writes a block, region or super header
// (one sector of staging memory that is not all zero).
func isHeaderWrite(t *xfer.Task) bool {
	return t.Req.Op == xfer.OpWrite && t.Req.Local == stagingID && !isZeroWrite(t)
}

// isZeroWrite reports whether t zeroes a header sector.
func isZeroWrite(t *xfer.Task) bool {
	if t.Req.Op != xfer.OpWrite || t.Req.Local != stagingID {
		return false
	}
	b := t.Local.(xfer.MemSegment).Bytes()[t.Req.LocalOffset : t.Req.LocalOffset+t.Req.Length]
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func isValueWrite(t *xfer.Task) bool {
	return t.Req.Op == xfer.OpWrite && t.Req.Local != stagingID
}

var errInjected = errors.New("injected I/O error")

const (
	poolID    xfer.SegmentID = 1
	stagingID xfer.SegmentID = 2
)

// testEnv is a store over a real pool and, optionally, a fake L2.
type testEnv struct {
	t    testing.TB
	pool *shm.Pool
	file *fakeFile
	tr   *fakeTr
	cfg  Config
	l2   *L2
	s    *Store
	clk  *fakeClock
}

type envOpt func(e *testEnv)

func withL2(size int) envOpt {
	return func(e *testEnv) {
		e.file = newFakeFile(size)
		e.tr = &fakeTr{}
		e.l2 = &L2{Transport: e.tr, File: e.file, StagingID: stagingID, RegionSize: 1 << 20}
	}
}

func withCfg(fn func(c *Config)) envOpt { return func(e *testEnv) { fn(&e.cfg) } }

func newEnv(t testing.TB, poolSize uint64, opts ...envOpt) *testEnv {
	t.Helper()
	pool, err := shm.NewPool(shm.PoolConfig{ID: poolID, Size: poolSize, Hugepages: shm.HugepagesOff,
		MinBlock: 4096, MaxBlock: 256 << 10}, nil)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	e := &testEnv{t: t, pool: pool, clk: newFakeClock()}
	e.cfg.Clock = e.clk
	for _, o := range opts {
		o(e)
	}
	t.Cleanup(func() {
		if e.s != nil {
			e.s.Close()
		}
		if err := pool.Close(); err != nil {
			t.Errorf("pool close: %v", err)
		}
	})
	e.open()
	return e
}

// open (re)opens the store on the env's pool and file.
func (e *testEnv) open() {
	e.t.Helper()
	s, err := New(e.cfg, e.pool, e.l2)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.s = s
}

// reopen closes the store and opens a new one on the same file, as a
// restart does.
func (e *testEnv) reopen() {
	e.t.Helper()
	if err := e.s.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	e.s = nil
	if b := e.pool.Stats().Blocks; b != 0 {
		e.t.Fatalf("%d pool blocks still allocated after Close", b)
	}
	e.open()
}

// fakeClock is a Clock advanced by hand; AfterFunc callbacks run in
// Advance's goroutine.
type fakeClock struct {
	mu     sync.Mutex // guards the fields below
	now    int64
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      int64
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{} }

func (c *fakeClock) Now() time0 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return epoch.Add(dur(c.now))
}

func (c *fakeClock) AfterFunc(d dur, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now + int64(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock and runs every timer that came due, in order.
func (c *fakeClock) Advance(d dur) {
	c.mu.Lock()
	c.now += int64(d)
	now := c.now
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case t.at <= now:
			t.stopped = true
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}
