//go:build linux

package uring

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestMain checks that the package's tests leak no goroutine, descriptor or
// ring.
func TestMain(m *testing.M) {
	testutil.Main(m, testutil.Warm(func() { probe() })) // the cached probe is process-wide, not a leak
}

// memSeg is the shared counting segment over anonymous, page-aligned
// memory (which O_DIRECT needs); mem is its bytes.
type memSeg struct {
	*xfertest.Segment
	mem []byte
}

func newMemSeg(t testing.TB, id xfer.SegmentID, size int) *memSeg {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap %d: %v", size, err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return &memSeg{Segment: xfertest.SegmentOf(id, xfer.KindPool, mem), mem: mem}
}

// recorder is a fake xfer.Completer: it counts every Done per task and
// keeps the last result.
type recorder struct {
	mu      sync.Mutex // guards the maps
	calls   map[*xfer.Task]int
	n       map[*xfer.Task]uint64
	errs    map[*xfer.Task]error
	doneCh  chan struct{} // one send per Done, when non-nil
	onDone  func(t *xfer.Task, n uint64, err error)
	noMaps  bool // count only (allocation tests)
	doneCnt atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{calls: map[*xfer.Task]int{}, n: map[*xfer.Task]uint64{}, errs: map[*xfer.Task]error{}}
}

func (r *recorder) TaskDone(t *xfer.Task, n uint64, err error) {
	if !r.noMaps {
		r.mu.Lock()
		r.calls[t]++
		r.n[t] = n
		r.errs[t] = err
		r.mu.Unlock()
	}
	r.doneCnt.Add(1)
	if r.onDone != nil {
		r.onDone(t, n, err)
	}
	if r.doneCh != nil {
		r.doneCh <- struct{}{}
	}
}

func (r *recorder) result(t *xfer.Task) (calls int, n uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[t], r.n[t], r.errs[t]
}

// waitDone waits until count tasks have ended.
func (r *recorder) waitDone(t testing.TB, count int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for r.doneCnt.Load() < count {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d tasks ended within %v", r.doneCnt.Load(), count, timeout)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func newTask(rec xfer.Completer, op xfer.Op, local xfer.MemSegment, loff uint64, f *File, foff, length uint64) *xfer.Task {
	t := &xfer.Task{
		Req:    xfer.Request{Op: op, Local: local.ID(), LocalOffset: loff, Target: f.ID(), TargetOffset: foff, Length: length},
		Local:  local,
		Target: f,
	}
	t.SetCompleter(rec)
	return t
}

func newTransport(t testing.TB, cfg Config) *Transport {
	t.Helper()
	if cfg.AllowedDirs == nil {
		cfg.AllowedDirs = []string{t.TempDir()}
	}
	tr, err := New(cfg, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// runOne submits one task and waits for it.
func runOne(t testing.TB, tr *Transport, rec *recorder, task *xfer.Task) (uint64, error) {
	t.Helper()
	before := rec.doneCnt.Load()
	n, err := tr.Submit([]*xfer.Task{task})
	if n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	rec.waitDone(t, before+1, 10*time.Second)
	calls, moved, terr := rec.result(task)
	if calls != 1 {
		t.Fatalf("task ended %d times", calls)
	}
	return moved, terr
}

// fdOpen reports whether f's descriptor still refers to f's path.
func (t *Transport) fdOpen(f *File) error {
	l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.fd))
	if err != nil {
		return err
	}
	if l != f.path {
		return fmt.Errorf("descriptor %d now refers to %s", f.fd, l)
	}
	return nil
}
