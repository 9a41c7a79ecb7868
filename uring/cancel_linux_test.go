//go:build linux

package uring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// pipeFile makes a File over the read end of an empty pipe: a read on it
// stays in the kernel until it is canceled, so cancel paths run
// deterministically. (OpenFile never opens pipes; only tests build these.)
func pipeFile(t *testing.T, tr *Transport) *File {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[1]) })
	f := &File{t: tr, id: 7, path: "pipe", fd: p[0], size: 1 << 20, fixed: -1}
	f.refs.Store(1)
	t.Cleanup(func() { f.Close() })
	return f
}

// waitInKernel waits until n requests are in ring 0's SQ and the kernel
// has taken every SQE of it (its fdinfo shows the SQ head at the tail): a
// read of an empty pipe is then parked in the kernel, its poll armed by
// the io_uring_enter that took it.
func waitInKernel(t *testing.T, tr *Transport, n uint64) {
	t.Helper()
	info := fmt.Sprintf("/proc/self/fdinfo/%d", tr.rings[0].raw.fd)
	var head, tail string
	testutil.Eventually(t, 5*time.Second, func() bool {
		b, err := os.ReadFile(info)
		if err != nil {
			t.Fatal(err)
		}
		head, tail = fdinfoField(b, "SqHead:"), fdinfoField(b, "SqTail:")
		return tr.Stats()[0].Submitted >= n && head != "" && head == tail
	}, "requests taken by the kernel: %v, SQ head %v tail %v", testutil.Lazy(func() any { return tr.Stats()[0] }),
		testutil.Lazy(func() string { return head }), testutil.Lazy(func() string { return tail }))
}

// fdinfoField is the value of the fdinfo line that starts with key.
func fdinfoField(info []byte, key string) string {
	for _, l := range strings.Split(string(info), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == key {
			return f[1]
		}
	}
	return ""
}

// parkedRead submits a 4 KiB read of an empty pipe and waits until the
// kernel has taken it: it stays there until canceled.
func parkedRead(t *testing.T, tr *Transport) (*xfertest.Recorder, *xfer.Task) {
	t.Helper()
	f := pipeFile(t, tr)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	task := newTask(rec, xfer.OpRead, pool, 0, f, 0, 4096)
	if n, err := tr.Submit([]*xfer.Task{task}); n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitInKernel(t, tr, 1)
	return rec, task
}

// TestCancelInKernel: Cancel of a request parked in the kernel ends it with
// ErrCanceled through IORING_OP_ASYNC_CANCEL. A cancel names the SQE by its
// user_data, so a request picked for the kernel-side latency view (its
// user_data carries TracedUserData) is canceled too.
func TestCancelInKernel(t *testing.T) {
	for _, every := range []int{0, 1} {
		tr := newTransport(t, Config{TraceEvery: every})
		rec, task := parkedRead(t, tr)
		if int64(rec.Count()) != 0 {
			t.Fatal("read of an empty pipe completed")
		}
		if st := tr.Stats()[0]; st.Traced != uint64(every) {
			t.Fatalf("TraceEvery %d: %d SQEs traced", every, st.Traced)
		}
		tr.Cancel(task)
		waitEnded(t, rec, 1, 5*time.Second)
		if calls, n, err := result(rec, task); calls != 1 || n != 0 || !errors.Is(err, xfer.ErrCanceled) {
			t.Fatalf("TraceEvery %d: calls=%d n=%d err=%v", every, calls, n, err)
		}
	}
}

// TestCancelWaitsForAnSQE: a cancel that finds no SQE free (a guest's
// waits or failed enters can fill the SQ) is kept for the next pass, not
// dropped: the parked read still ends, canceled, once an SQE is free.
func TestCancelWaitsForAnSQE(t *testing.T) {
	var short atomic.Int64
	tr := newTransport(t, Config{hooks: &testHooks{noCancelSQE: func() bool { return short.Add(-1) >= 0 }}})
	rec, task := parkedRead(t, tr)
	short.Store(3)
	tr.Cancel(task)
	waitEnded(t, rec, 1, 5*time.Second)
	if calls, n, err := result(rec, task); calls != 1 || n != 0 || !errors.Is(err, xfer.ErrCanceled) {
		t.Fatalf("calls=%d n=%d err=%v", calls, n, err)
	}
	if n := short.Load(); n >= 0 {
		t.Fatalf("the cancel found no SQE free %d times fewer than set", n+1)
	}
}

// TestCloseCancelsInKernel: Close with requests parked in the kernel cancels
// them, ends each with ErrClosed and returns well before DrainTimeout.
func TestCloseCancelsInKernel(t *testing.T) {
	tr, err := New(Config{DrainTimeout: 20 * time.Second}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	f := pipeFile(t, tr)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	tasks := make([]*xfer.Task, 100)
	for i := range tasks {
		tasks[i] = newTask(rec, xfer.OpRead, pool, uint64(i)*4096, f, 0, 4096)
	}
	if n, err := tr.Submit(tasks); n != len(tasks) {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitInKernel(t, tr, uint64(len(tasks)))
	start := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v with a 20 s drain timeout: in-kernel requests were not canceled", d)
	}
	for i, task := range tasks {
		if calls, _, err := result(rec, task); calls != 1 || !errors.Is(err, xfer.ErrClosed) {
			t.Fatalf("task %d: calls=%d err=%v", i, calls, err)
		}
	}
}

// TestCloseDrainTimeout: requests the kernel does not give back end with
// ErrClosed once DrainTimeout passes (the hook withholds the cancel, which
// is what a device that ignores cancels looks like).
func TestCloseDrainTimeout(t *testing.T) {
	tr, err := New(Config{DrainTimeout: 200 * time.Millisecond, hooks: &testHooks{noDrainCancel: true}}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	rec, task := parkedRead(t, tr)
	start := time.Now()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	if d < 150*time.Millisecond || d > 3*time.Second {
		t.Fatalf("Close took %v, want about the 200 ms drain timeout", d)
	}
	if calls, _, err := result(rec, task); calls != 1 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("calls=%d err=%v", calls, err)
	}
}
