//go:build linux

package uring

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/xfer"
)

// wantBackoff is the back-off after the n-th failed io_uring_enter in a
// row (n from 1).
func wantBackoff(n int) time.Duration {
	return min(enterBackoffMin<<(n-1), enterBackoffMax)
}

// TestEnterFailsForGood: io_uring_enter keeps failing with errno. The
// ring does not spin: each failure is followed by one back-off, doubling
// from 1 ms to 100 ms, before the next enter (the test is the clock: it
// lets each back-off end). The enterFailLimit-th failure fails the ring:
// its tasks end once with ErrRingFailed naming the errno (UNAVAILABLE,
// whatever the errno's own category), Submit refuses new ones at once,
// the ring enters no more, and Health and Stats say so.
func TestEnterFailsForGood(t *testing.T) {
	// EAGAIN and EBUSY with no completion to reap (the kernel short of
	// room for good) are such failures too.
	for _, errno := range []syscall.Errno{syscall.EBADF, syscall.ENOMEM, syscall.EPERM, syscall.EAGAIN, syscall.EBUSY} {
		t.Run(unix.ErrnoName(errno), func(t *testing.T) {
			dir := t.TempDir()
			var failing atomic.Bool
			var enters, backoffs atomic.Int64
			spun := make(chan struct{})
			var spinOnce sync.Once
			waited := make(chan time.Duration)
			step, done := make(chan struct{}), make(chan struct{})
			hooks := &testHooks{
				enter: func() syscall.Errno {
					if !failing.Load() {
						return 0
					}
					if enters.Add(1) > backoffs.Load()+1 {
						spinOnce.Do(func() { close(spun) })
					}
					return errno
				},
				backoff: func(d time.Duration) {
					backoffs.Add(1)
					select {
					case waited <- d:
					case <-done:
						return
					}
					select {
					case <-step:
					case <-done:
					}
				},
			}
			tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 16, hooks: hooks})
			t.Cleanup(func() { close(done) }) // before Close: a failed test leaves no back-off waiting
			f := openTestFile(t, tr, dir, true, 1<<20)
			pool := newMemSeg(t, 2, 1<<20)
			rec := newRecorder()
			failing.Store(true)
			var tasks []*xfer.Task
			for i := 0; i < 8; i++ {
				tasks = append(tasks, newTask(rec, xfer.OpWrite, pool, uint64(i)*4096, f, uint64(i)*4096, 4096))
			}
			if n, err := tr.Submit(tasks); n != len(tasks) {
				t.Fatalf("Submit = %d, %v", n, err)
			}
			for i := 1; i < enterFailLimit; i++ {
				select {
				case d := <-waited:
					if d != wantBackoff(i) {
						t.Fatalf("back-off after failure %d: %v, want %v", i, d, wantBackoff(i))
					}
				case <-spun:
					t.Fatalf("the ring entered again without backing off (%d enters, %d back-offs)", enters.Load(), backoffs.Load())
				case <-time.After(10 * time.Second):
					t.Fatalf("no back-off %d (%d enters)", i, enters.Load())
				}
				if n := enters.Load(); n != int64(i) {
					t.Fatalf("%d enters during back-off %d", n, i)
				}
				if n := rec.Count(); n != 0 {
					t.Fatalf("%d tasks ended before the ring failed", n)
				}
				if err := tr.Health(); err != nil {
					t.Fatalf("Health after %d failures: %v", i, err)
				}
				step <- struct{}{}
			}
			waitEnded(t, rec, int64(len(tasks)), 10*time.Second)
			for i, task := range tasks {
				calls, _, err := result(rec, task)
				switch {
				case calls != 1:
					t.Fatalf("task %d ended %d times", i, calls)
				case !errors.Is(err, ErrRingFailed) || !errors.Is(err, errno):
					t.Fatalf("task %d: %v, want ErrRingFailed with %v", i, err, errno)
				case status.CodeOf(err) != tcproto.CodeUNAVAILABLE:
					t.Fatalf("task %d: %v is %v, want UNAVAILABLE", i, err, status.CodeOf(err))
				case !strings.Contains(err.Error(), unix.ErrnoName(errno)):
					t.Fatalf("task %d: %q does not name %s", i, err, unix.ErrnoName(errno))
				}
			}
			late := newTask(rec, xfer.OpWrite, pool, 0, f, 0, 4096)
			if n, err := tr.Submit([]*xfer.Task{late}); n != 0 || !errors.Is(err, ErrRingFailed) || !errors.Is(err, errno) {
				t.Fatalf("Submit to the failed ring = %d, %v", n, err)
			}
			if err := tr.Health(); !errors.Is(err, ErrRingFailed) || !errors.Is(err, errno) {
				t.Fatalf("Health = %v", err)
			}
			st := tr.Stats()[0]
			if !st.Down || st.EnterErrors != enterFailLimit || st.InFlight != 0 || st.Failed != uint64(len(tasks)) {
				t.Fatalf("stats %+v", st)
			}
			// Registrations are answered, not left waiting for a ring
			// that never issues again.
			g, err := tr.OpenFile(3, filepath.Join(dir, "g"), FileOptions{Size: 4096, Create: true})
			if err != nil {
				t.Fatalf("OpenFile on the failed ring's transport: %v", err)
			}
			g.Close()
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			if n := enters.Load(); n != enterFailLimit {
				t.Fatalf("%d enters, want %d: the failed ring went on entering", n, enterFailLimit)
			}
			if calls, _, _ := result(rec, late); calls != 0 {
				t.Fatalf("the refused task ended %d times", calls)
			}
		})
	}
}

// TestEnterFailsBriefly: io_uring_enter fails a few times, then works
// again, twice. Every task completes, each failure in a row backs off
// longer, a working enter starts the count again, and the ring stays up.
// So too when the kernel is short of room for a while (EAGAIN, EBUSY)
// with no completion to reap.
func TestEnterFailsBriefly(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EFAULT, syscall.EAGAIN, syscall.EBUSY} {
		t.Run(unix.ErrnoName(errno), func(t *testing.T) { enterFailsBriefly(t, errno) })
	}
}

func enterFailsBriefly(t *testing.T, errno syscall.Errno) {
	dir := t.TempDir()
	var fails atomic.Int64
	var mu sync.Mutex
	var waits []time.Duration
	hooks := &testHooks{
		enter: func() syscall.Errno {
			if fails.Load() > 0 {
				fails.Add(-1)
				return errno
			}
			return 0
		},
		backoff: func(d time.Duration) {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
		},
	}
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 16, hooks: hooks})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	var want []time.Duration
	for round := 0; round < 2; round++ {
		fails.Store(3)
		var tasks []*xfer.Task
		for i := 0; i < 32; i++ {
			tasks = append(tasks, newTask(rec, xfer.OpWrite, pool, uint64(i)*4096, f, uint64(i)*4096, 4096))
		}
		if n, err := tr.Submit(tasks); n != len(tasks) {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		waitEnded(t, rec, int64((round+1)*len(tasks)), 10*time.Second)
		for i, task := range tasks {
			if calls, n, err := result(rec, task); calls != 1 || err != nil || n != 4096 {
				t.Fatalf("round %d task %d: ended %d times, %d, %v", round, i, calls, n, err)
			}
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return fails.Load() == 0 }, "the failures injected")
		want = append(want, wantBackoff(1), wantBackoff(2), wantBackoff(3))
	}
	mu.Lock()
	got := append([]time.Duration(nil), waits...)
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("back-offs %v, want %v", got, want)
	}
	if err := tr.Health(); err != nil {
		t.Fatalf("Health = %v", err)
	}
	if st := tr.Stats()[0]; st.Down || st.EnterErrors != 6 {
		t.Fatalf("stats %+v", st)
	}
}

// TestEnterFailsGuest: a ring that failed goes on serving its guest (a
// reactor's queues, whose other work needs no ring): a guest hosted then
// is served, its Submit to the failed ring is refused at once, its
// sleeps end on a kick and are bounded, and Close stops it.
func TestEnterFailsGuest(t *testing.T) {
	dir := t.TempDir()
	var failing atomic.Bool
	hooks := &testHooks{
		enter: func() syscall.Errno {
			if failing.Load() {
				return syscall.ENXIO
			}
			return 0
		},
		backoff: func(time.Duration) {},
	}
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 16, hooks: hooks})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	failing.Store(true)
	task := newTask(rec, xfer.OpWrite, pool, 0, f, 0, 4096)
	if n, err := tr.Submit([]*xfer.Task{task}); n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitEnded(t, rec, 1, 10*time.Second)
	if _, _, err := result(rec, task); !errors.Is(err, ErrRingFailed) || !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("task: %v", err)
	}

	g := &queueGuest{home: 1, tr: tr, submitted: make(chan [2]int, 1), errs: make(chan error, 1)}
	g.queues = [][]*xfer.Task{{newTask(rec, xfer.OpRead, pool, 0, f, 0, 4096)}}
	g.queues[0][0].Home = 1
	wake, err := tr.Host(0, g)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case counts := <-g.submitted:
		if err := <-g.errs; counts[0] != 0 || !errors.Is(err, ErrRingFailed) {
			t.Fatalf("the guest's Submit to its failed ring = %d, %v", counts[0], err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the failed ring does not serve its guest")
	}
	for i := 0; i < 3; i++ {
		serves := g.serves.Load()
		wake()
		testutil.Eventually(t, 10*time.Second, func() bool { return g.serves.Load() > serves }, "the guest served after a kick")
	}
	tr.Close()
	if !g.stopped.Load() {
		t.Error("closing the transport did not stop the failed ring's guest")
	}
	if rec.Count() != 1 {
		t.Errorf("%d tasks ended, want the first only", rec.Count())
	}
}

// TestSleepsBoundedWhileRecentlyBusy: a poller that had work sleeps at
// most BusySleep (so the Go runtime's monitor never takes its
// processor for a long system call, which sets it polling every 20 µs at
// the next wake-up), and sleeps unbounded once idle for BusyWindow.
func TestSleepsBoundedWhileRecentlyBusy(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var bounds []time.Duration
	hooks := &testHooks{sleep: func(d time.Duration) {
		mu.Lock()
		bounds = append(bounds, d)
		mu.Unlock()
	}}
	sawSince := func(from int, want time.Duration) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return from < len(bounds) && slices.Contains(bounds[from:], want)
		}
	}
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 16, hooks: hooks})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 1, 1<<20)
	for round := range 2 {
		rec := newRecorder()
		mu.Lock()
		from := len(bounds)
		mu.Unlock()
		task := newTask(rec, xfer.OpWrite, pool, 0, f, 0, 4096)
		if n, err := tr.Submit([]*xfer.Task{task}); n != 1 {
			t.Fatalf("round %d: Submit = %d, %v", round, n, err)
		}
		waitEnded(t, rec, 1, 10*time.Second)
		testutil.Eventually(t, 10*time.Second, sawSince(from, BusySleep), "round %d: a sleep bounded by %v after the write", round, BusySleep)
		mu.Lock()
		from = len(bounds)
		mu.Unlock()
		testutil.Eventually(t, 10*BusyWindow, sawSince(from, -1), "round %d: an unbounded sleep after %v idle", round, BusyWindow)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, d := range bounds {
		if d != -1 && d != BusySleep {
			t.Fatalf("a sleep bounded by %v: only %v or none were expected here (bounds %v)", d, BusySleep, bounds)
		}
	}
}

// TestYieldsWithinRuntimeWindow walks the poller's yield decisions
// (YieldDue, as loop takes them) through a second of passes on its own
// clock: a request's pass at each arrival, a pass at the end of each
// slice (BusySleep) between them, for arrivals every 20 ms (the pace that
// once left 12 ms between yields) and at other gaps. Between two yields
// there is never the runtime's 10 ms, after which its monitor takes the
// processor of the sleeping thread.
func TestYieldsWithinRuntimeWindow(t *testing.T) {
	const window = 10 * time.Millisecond
	for _, gap := range []time.Duration{3 * time.Millisecond, 7 * time.Millisecond, 11 * time.Millisecond,
		20 * time.Millisecond, 21 * time.Millisecond, 33 * time.Millisecond} {
		var now, yielded, arrival, worst time.Duration
		yield := func() {
			worst = max(worst, now-yielded)
			yielded = now
		}
		for now < time.Second {
			if YieldDue(now-yielded, false) {
				yield()
			}
			// The pass is instant; the poller then sleeps a slice
			// (nothing in flight, busy within BusyWindow) until the
			// next arrival or the slice's end, whichever is first.
			if YieldDue(now-yielded, true) {
				yield()
			}
			if now >= arrival {
				arrival += gap
			}
			now = min(now+BusySleep, arrival)
		}
		if worst >= window {
			t.Errorf("requests every %v: %v between two yields (want under %v)", gap, worst, window)
		}
		if worst == 0 {
			t.Errorf("requests every %v: no yield walked", gap)
		}
	}
}
