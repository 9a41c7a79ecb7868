package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// fakeFile is an in-memory file segment: it outlives stores opened on it,
// as a file outlives a process.
type fakeFile struct {
	id    xfer.SegmentID
	align uint32
	mu    sync.Mutex // guards data
	data  []byte
	// null: a file of size bytes that holds nothing (reads give zeros,
	// writes vanish), for measuring the index without the bytes; but
	// for head, its first bytes, which it keeps.
	null bool
	size uint64
	head []byte
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

// fakeL2 is the store tests' L2 device: the shared xfertest transport,
// carrying out each task as a read or write of a fakeFile. By default it
// ends each task inside Submit; with Inline off it holds them until
// release. A Limit refuses the rest of a Submit with xfer.ErrClosed.
type fakeL2 struct {
	*xfertest.Transport
	writes, reads atomic.Int64
	// onWrite, when set, sees every write as it lands (under the file's
	// lock, so in the order they land): its file offset and bytes.
	onWrite func(off uint64, b []byte)
}

func newFakeL2() *fakeL2 {
	d := &fakeL2{}
	d.Transport = xfertest.New(xfertest.Config{Name: "fake", Inline: true, LimitErr: xfer.ErrClosed, Move: d.move})
	return d
}

// move moves a task's bytes between its memory and its fakeFile.
func (d *fakeL2) move(t *xfer.Task) (uint64, error) {
	q := t.Req
	file, ok := t.Target.(*fakeFile)
	mem, ok2 := t.Local.(xfer.MemSegment)
	if !ok || !ok2 {
		return 0, fmt.Errorf("%w: fake: bad segments", xfer.ErrInvalid)
	}
	a := uint64(file.align)
	if q.TargetOffset%a != 0 || q.Length%a != 0 || q.LocalOffset%a != 0 {
		return 0, fmt.Errorf("%w: fake: misaligned %+v", xfer.ErrInvalid, q)
	}
	b := mem.Bytes()
	if file.null {
		file.mu.Lock()
		defer file.mu.Unlock()
		local := b[q.LocalOffset : q.LocalOffset+q.Length]
		var head []byte
		if q.TargetOffset < uint64(len(file.head)) {
			head = file.head[q.TargetOffset:]
		}
		if q.Op == xfer.OpRead {
			clear(local[copy(local, head):])
			d.reads.Add(1)
		} else {
			copy(head, local)
			d.writes.Add(1)
		}
		return q.Length, nil
	}
	if q.TargetOffset+q.Length > uint64(len(file.data)) || q.LocalOffset+q.Length > uint64(len(b)) {
		return 0, fmt.Errorf("%w: fake: out of bounds %+v", xfer.ErrInvalid, q)
	}
	file.mu.Lock()
	if q.Op == xfer.OpWrite {
		copy(file.data[q.TargetOffset:q.TargetOffset+q.Length], b[q.LocalOffset:q.LocalOffset+q.Length])
		d.writes.Add(1)
		if d.onWrite != nil {
			d.onWrite(q.TargetOffset, b[q.LocalOffset:q.LocalOffset+q.Length])
		}
	} else {
		copy(b[q.LocalOffset:q.LocalOffset+q.Length], file.data[q.TargetOffset:q.TargetOffset+q.Length])
		d.reads.Add(1)
	}
	file.mu.Unlock()
	return q.Length, nil
}

// release carries out every held task, and those held while it runs, until
// none is left, and returns how many it ended.
func (d *fakeL2) release() int {
	n := 0
	for {
		k := d.Finish()
		if k == 0 {
			return n
		}
		n += k
	}
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
	tr   *fakeL2
	cfg  Config
	l2   *L2
	s    *Store
	clk  *fakeClock
}

type envOpt func(e *testEnv)

func withL2(size int) envOpt {
	return func(e *testEnv) {
		e.file = newFakeFile(size)
		e.tr = newFakeL2()
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

// fakeClock is the shared test clock as a store Clock: AfterFunc calls run
// in Advance's goroutine.
type fakeClock struct{ *testutil.Clock }

var _ Clock = (*fakeClock)(nil)

func newFakeClock() *fakeClock { return &fakeClock{testutil.NewClock(epoch)} }

func (c fakeClock) AfterFunc(d dur, f func()) Timer { return c.Clock.AfterFunc(d, f) }
