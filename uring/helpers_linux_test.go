//go:build linux

package uring

import (
	"fmt"
	"os"
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

// newMemSeg returns the shared counting segment over anonymous,
// page-aligned memory (which O_DIRECT needs), unmapped when t ends.
func newMemSeg(t testing.TB, id xfer.SegmentID, size int) *xfertest.Segment {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap %d: %v", size, err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return xfertest.SegmentOf(id, xfer.KindPool, mem)
}

func newRecorder() *xfertest.Recorder { return xfertest.NewRecorder() }

// result is how often t ended and how, as r recorded it.
func result(r *xfertest.Recorder, t *xfer.Task) (calls int, n uint64, err error) {
	n, err = r.Result(t)
	return r.Ends(t), n, err
}

// waitEnded waits until r has recorded count ends in all.
func waitEnded(t testing.TB, r *xfertest.Recorder, count int64, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() bool { return int64(r.Count()) >= count },
		"%d tasks ended (ended: %d)", count, testutil.Lazy(r.Count))
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
func runOne(t testing.TB, tr *Transport, rec *xfertest.Recorder, task *xfer.Task) (uint64, error) {
	t.Helper()
	before := int64(rec.Count())
	n, err := tr.Submit([]*xfer.Task{task})
	if n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitEnded(t, rec, before+1, 10*time.Second)
	calls, moved, terr := result(rec, task)
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
