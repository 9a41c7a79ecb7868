//go:build linux

package uring

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// queueGuest is a guest with two queues of tasks, submitted to its ring
// from the ring's own thread (Task.Home) at its first pass, and a futex
// word it sleeps on.
type queueGuest struct {
	home   uint32
	tr     *Transport
	queues [][]*xfer.Task
	word   *atomic.Uint32
	// efd, when not 0, is an eventfd the guest sleeps on (FDWait) instead
	// of word; cancel asks the next sleep to cancel that wait.
	efd    int
	cancel atomic.Bool
	res    atomic.Int32 // the last Fired's result

	// Owned by the ring's thread.
	started bool

	submitted chan [2]int // per queue: the count Submit returned
	errs      chan error  // per queue: Submit's error
	serves    atomic.Int64
	sleeps    atomic.Int64
	fired     atomic.Int64
	armed     atomic.Bool
	stopped   atomic.Bool
}

func (g *queueGuest) Serve() bool {
	g.serves.Add(1)
	if g.started {
		return false
	}
	g.started = true
	var counts [2]int
	for i, q := range g.queues {
		n, err := g.tr.Submit(q)
		counts[i] = n
		g.errs <- err
	}
	g.submitted <- counts
	return true
}

func (g *queueGuest) Sleep(w Waits) bool {
	g.sleeps.Add(1)
	if g.efd != 0 && !g.armed.Load() && g.fired.Load() == 0 {
		g.armed.Store(true)
		w.FDWait(g.efd, 7)
	}
	if g.cancel.Load() && w.CancelWait(7) {
		g.cancel.Store(false)
	}
	if g.word != nil && !g.armed.Load() && g.fired.Load() == 0 {
		// Armed for the word's first value: a change the test makes
		// before the wait reaches the kernel ends it at once.
		g.armed.Store(true)
		w.FutexWait(g.word, 0, 7)
	}
	return true
}

func (g *queueGuest) Awake() {}

func (g *queueGuest) Fired(token uint32, res int32) {
	if token == 7 {
		g.res.Store(res)
		g.armed.Store(false)
		g.fired.Add(1)
	}
}

func (g *queueGuest) Stop() { g.stopped.Store(true) }

// TestGuestQueuesEndOnce: a guest's two queues share its ring; one queue's
// reads fail on the device (EIO), or keep answering EAGAIN, while the
// other's writes run, and io_uring_enter answers EBUSY every other time.
// Every task ends exactly once, each with its own result, and the
// failing queue does not hold the other up.
func TestGuestQueuesEndOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errno syscall.Errno
	}{{"eio", syscall.EIO}, {"eagain", syscall.EAGAIN}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var enters atomic.Int64
			hooks := &testHooks{
				result: func(op uint8, res int32) int32 {
					if op == opRead || op == opReadFixed {
						return -int32(tc.errno)
					}
					return res
				},
				enter: func() syscall.Errno {
					if enters.Add(1)%2 == 0 {
						return syscall.EBUSY
					}
					return 0
				},
			}
			tr := newTransport(t, Config{AllowedDirs: []string{dir}, Rings: 2, Entries: 64, hooks: hooks})
			f := openTestFile(t, tr, dir, true, 1<<20)
			pool := newMemSeg(t, 2, 1<<20)
			rec := newRecorder()
			g := &queueGuest{home: 2, tr: tr, submitted: make(chan [2]int, 1), errs: make(chan error, 2)}
			for qi, op := range []xfer.Op{xfer.OpRead, xfer.OpWrite} {
				var q []*xfer.Task
				for i := 0; i < 24; i++ {
					task := newTask(rec, op, pool, uint64(i)*4096, f, uint64(qi*24+i)*4096, 4096)
					task.Home = g.home
					q = append(q, task)
				}
				g.queues = append(g.queues, q)
			}
			if _, err := tr.Host(1, g); err != nil {
				t.Fatal(err)
			}
			counts := <-g.submitted
			for i := range g.queues {
				if err := <-g.errs; err != nil || counts[i] != len(g.queues[i]) {
					t.Fatalf("queue %d: Submit = %d, %v", i, counts[i], err)
				}
			}
			waitEnded(t, rec, 48, 10*time.Second)
			for qi, q := range g.queues {
				for i, task := range q {
					calls, n, err := result(rec, task)
					switch {
					case calls != 1:
						t.Fatalf("queue %d task %d ended %d times", qi, i, calls)
					case qi == 0 && !errors.Is(err, tc.errno):
						t.Fatalf("read %d: %v, want %v", i, err, tc.errno)
					case qi == 1 && (err != nil || n != 4096):
						t.Fatalf("write %d: %d, %v", i, n, err)
					}
				}
			}
			st := tr.Stats()
			if st[1].Submitted == 0 || st[0].Submitted != 0 {
				t.Errorf("ring submissions %d and %d: the guest's tasks went to another ring than its own", st[0].Submitted, st[1].Submitted)
			}
		})
	}
}

// TestGuestRingFull: a guest that submits more tasks than its ring has
// slots is answered ErrQueueFull at once for the rest, not after
// SubmitWait: only its own thread could make room.
func TestGuestRingFull(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 8, SubmitWait: time.Hour})
	f := openTestFile(t, tr, dir, true, 1<<20)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	g := &queueGuest{home: 1, tr: tr, submitted: make(chan [2]int, 1), errs: make(chan error, 1)}
	var q []*xfer.Task
	for i := 0; i < 20; i++ {
		task := newTask(rec, xfer.OpWrite, pool, 0, f, uint64(i)*4096, 4096)
		task.Home = g.home
		q = append(q, task)
	}
	g.queues = [][]*xfer.Task{q}
	if _, err := tr.Host(0, g); err != nil {
		t.Fatal(err)
	}
	var counts [2]int
	select {
	case counts = <-g.submitted:
	case <-time.After(10 * time.Second):
		t.Fatalf("a guest's Submit to its full ring waits for room only its thread can make (passes %d, stats %+v)", g.serves.Load(), tr.Stats())
	}
	if err := <-g.errs; !errors.Is(err, ErrQueueFull) || counts[0] != 8 {
		t.Fatalf("Submit = %d, %v; want 8 and ErrQueueFull", counts[0], err)
	}
	waitEnded(t, rec, 8, 10*time.Second)
	for i, task := range q {
		if calls, _, _ := result(rec, task); i < 8 && calls != 1 || i >= 8 && calls != 0 {
			t.Fatalf("task %d ended %d times", i, calls)
		}
	}
}

// TestGuestFutexWait: a sleeping ring wakes on a FUTEX_WAKE of a word
// its guest armed, in memory shared as a client's queue is, and the
// armed wait reports its token once.
func TestGuestFutexWait(t *testing.T) {
	tr := newTransport(t, Config{})
	if !tr.futexWait {
		testutil.Missing(t, testutil.IOUring, "IORING_OP_FUTEX_WAIT (Linux 6.7)")
	}
	fd, err := unix.MemfdCreate("guest-word", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	word := (*atomic.Uint32)(unsafe.Pointer(&mem[0]))
	g := &queueGuest{tr: tr, word: word, started: true}
	if _, err := tr.Host(0, g); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Host(0, g); err == nil {
		t.Error("a second guest on one ring was accepted")
	}
	testutil.Eventually(t, 10*time.Second, g.armed.Load, "the guest's wait armed")
	serves := g.serves.Load()
	// The ring sleeps now: only the word's wake-up can end it.
	word.Add(1)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), 1 /* FUTEX_WAKE */, 1, 0, 0, 0)
	testutil.Eventually(t, 10*time.Second, func() bool { return g.fired.Load() == 1 && g.serves.Load() > serves },
		"the ring woken by the futex word (fired %d, passes %d)", testutil.Lazy(g.fired.Load), testutil.Lazy(g.serves.Load))
	tr.Close()
	if !g.stopped.Load() {
		t.Error("closing the transport did not stop its guest")
	}
}

// TestGuestFutexWaitMissing: on a kernel without IORING_OP_FUTEX_WAIT the
// guest's wait cannot be armed; the ring's sleep is bounded instead, and
// the wait is reported fired when that sleep ends, so the guest asks again
// at its next sleep rather than counting on a wake-up nothing waits for
// (which left queue requests unanswered until their deadline).
func TestGuestFutexWaitMissing(t *testing.T) {
	tr := newTransport(t, Config{hooks: &testHooks{noFutexWait: true}})
	if tr.futexWait {
		t.Fatal("the hook did not take IORING_OP_FUTEX_WAIT away")
	}
	var word atomic.Uint32
	g := &queueGuest{tr: tr, word: &word, started: true}
	if _, err := tr.Host(0, g); err != nil {
		t.Fatal(err)
	}
	// Nothing changes the word and nothing wakes it: only the bounded
	// sleep's end can report the wait.
	testutil.Eventually(t, 10*time.Second, func() bool { return g.fired.Load() == 1 && !g.armed.Load() },
		"the unarmed wait reported fired (fired %d)", testutil.Lazy(g.fired.Load))
	tr.Close()
}

// TestGuestFDWait: on a kernel taken to lack IORING_OP_FUTEX_WAIT, a
// sleeping ring wakes on a write to an eventfd its guest armed (FDWait),
// which reports its token once with the read's result, not the bounded
// sleep's; and a wait armed again is cancelled by CancelWait.
func TestGuestFDWait(t *testing.T) {
	tr := newTransport(t, Config{hooks: &testHooks{noFutexWait: true}})
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	g := &queueGuest{tr: tr, efd: efd, started: true}
	wake, err := tr.Host(0, g)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, g.armed.Load, "the guest's wait armed")
	serves := g.serves.Load()
	one := [8]byte{1}
	if _, err := unix.Write(efd, one[:]); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return g.fired.Load() == 1 && g.serves.Load() > serves },
		"the ring woken by the eventfd (fired %d, passes %d)", testutil.Lazy(g.fired.Load), testutil.Lazy(g.serves.Load))
	if r := g.res.Load(); r != 8 {
		t.Fatalf("the eventfd wait fired with %d, want 8 (the read's)", r)
	}
	// Armed again, then cancelled: it fires with -ECANCELED.
	g.fired.Store(0)
	g.cancel.Store(true)
	wake()
	testutil.Eventually(t, 10*time.Second, func() bool { return g.fired.Load() == 1 },
		"the cancelled wait fired (fired %d)", testutil.Lazy(g.fired.Load))
	if r := g.res.Load(); r != -int32(unix.ECANCELED) {
		t.Fatalf("the cancelled wait fired with %d, want -ECANCELED", r)
	}
	tr.Close()
}

// manyWaitsGuest arms a read of each of its eventfds (FDWait), a few a
// sleep, until it has asked for all; then, with busy, it never lets its
// ring sleep again.
type manyWaitsGuest struct {
	efds  []int
	asked int // owned by the ring's thread
	busy  atomic.Bool
	// settled counts the sleeps that began with every wait asked for:
	// each wait is in the kernel by then, or was reported unarmed.
	settled  atomic.Int64
	unarmed  atomic.Int64 // reported fired with 0: never in the kernel
	fired    atomic.Int64 // fired with the eventfd read's 8 bytes
	firedBad atomic.Int64 // fired with anything else
}

func (g *manyWaitsGuest) Serve() bool { return false }

func (g *manyWaitsGuest) Sleep(w Waits) bool {
	if g.busy.Load() {
		return false
	}
	if g.asked == len(g.efds) {
		g.settled.Add(1)
		return true
	}
	for k := 0; k < 2 && g.asked < len(g.efds); k++ {
		w.FDWait(g.efds[g.asked], uint32(g.asked))
		g.asked++
	}
	w.Soon() // pass again to ask for the rest
	return true
}

func (g *manyWaitsGuest) Awake() {}

func (g *manyWaitsGuest) Fired(token uint32, res int32) {
	switch res {
	case 0:
		g.unarmed.Add(1)
	case 8:
		g.fired.Add(1)
	default:
		g.firedBad.Add(1)
	}
}

func (g *manyWaitsGuest) Stop() {}

// TestGuestWaitsNeverOverflowCQ: a guest with more queues than its ring's
// completion queue has entries arms a wait for each; every doorbell then
// rings at once, and the guest keeps its ring busy from then on. Every wait
// the ring put in the kernel comes back to the guest. A ring that let the
// waits owe more completions than its CQ holds had the kernel keep the
// rest aside (CQ overflow), posted only by an io_uring_enter that waits
// for events, which a busy ring without DEFER_TASKRUN never makes, and
// lost outright when the kernel has no memory for them: here, three
// quarters of the doorbells were never seen.
func TestGuestWaitsNeverOverflowCQ(t *testing.T) {
	tr := newTransport(t, Config{Entries: 2, SingleIssuer: Off, DeferTaskrun: Off, CoopTaskrun: Off})
	cq := len(tr.rings[0].raw.cqes)
	g := &manyWaitsGuest{efds: make([]int, 4*cq)}
	for i := range g.efds {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		g.efds[i] = fd
		defer unix.Close(fd)
	}
	if _, err := tr.Host(0, g); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return g.settled.Load() > 0 },
		"every wait asked for (unarmed %d)", testutil.Lazy(g.unarmed.Load))
	g.busy.Store(true)
	one := [8]byte{1}
	for _, fd := range g.efds {
		if _, err := unix.Write(fd, one[:]); err != nil {
			t.Fatal(err)
		}
	}
	armed := int64(len(g.efds)) - g.unarmed.Load()
	testutil.Eventually(t, 10*time.Second, func() bool { return g.fired.Load() == armed },
		"every wait in the kernel fired: %d of %d (%d with another result)", testutil.Lazy(g.fired.Load), armed,
		testutil.Lazy(g.firedBad.Load))
	if armed > int64(cq) || armed == 0 || g.firedBad.Load() != 0 {
		t.Fatalf("%d waits in the kernel of a ring whose CQ holds %d; %d fired with a result other than 8", armed, cq, g.firedBad.Load())
	}
	tr.Close()
}
