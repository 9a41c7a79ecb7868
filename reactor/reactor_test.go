//go:build linux

package reactor

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/queue/queuetest"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/xfer"
)

// echo is a queue a worker serves by answering every entry at once
// (Result = Length), as a queue of no-ops does.
type echo struct {
	d    *queue.DaemonRing
	sqes [32]queue.SQE
}

func (e *echo) Serve() bool {
	n := e.d.Take(e.sqes[:])
	if n == 0 {
		return false
	}
	e.d.Publish()
	for i := range e.sqes[:n] {
		e.d.Post(&queue.CQE{UserData: e.sqes[i].UserData, Result: e.sqes[i].Length, State: 3})
	}
	return true
}

func (e *echo) Doorbell() (*atomic.Uint32, uint32, bool) { return e.d.Doorbell() }
func (e *echo) Awake()                                   { e.d.Awake() }
func (e *echo) Idle() bool                               { return e.d.Idle() }
func (e *echo) EventfdDoorbell() (int, bool)             { return e.d.EventfdDoorbell() }

// attach gives e (whose client side is c, nil for none) to a worker of p,
// with an eventfd doorbell when p's workers wait on those, and detaches
// it at the test's end. Without a client side, the eventfd passed for it
// is returned (closed at the test's end; -1 without one), and given to
// before, when set, before the worker has the queue.
func attach(t testing.TB, p *Pool, e *echo, c *queue.ClientRing, before ...func(fd int)) int {
	t.Helper()
	w := p.Pick()
	pass := -1
	if p.EventfdDoorbells() {
		fd, err := e.d.UseEventfd(func() { p.Wake(w) })
		if err != nil {
			t.Fatal(err)
		}
		if c == nil {
			pass = fd
			t.Cleanup(func() { unix.Close(fd) })
			for _, f := range before {
				f(fd)
			}
		} else if err := c.SetDoorbellFD(fd); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Attach(w, e); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Detach(w, e) })
	return pass
}

// newQueue makes a queue of sq entries and returns its daemon side (as an
// echo), its client side, and the client's raw mapping (for a hostile
// client's writes).
func newQueue(t testing.TB, id uint64, sq uint32) (*echo, *queue.ClientRing, []byte) {
	t.Helper()
	g, err := queue.NewGeometry(sq, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	d, fd, err := queue.Create(id, g)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := queue.Map(fd, g.Size)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := shm.MapShared(fd, g.Size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Unmap()
		shm.Unmap(raw)
		d.Release()
	})
	return &echo{d: d}, c, raw
}

// pools runs f with a pool of workers on their own threads, and with one
// hosted on io_uring rings.
func pools(t *testing.T, workers int, f func(t *testing.T, p *Pool)) {
	poolsWith(t, Config{Workers: workers}, f)
}

// poolsWith is pools with cfg (its Doorbell set by each hosted run).
func poolsWith(t *testing.T, cfg Config, f func(t *testing.T, p *Pool)) {
	workers := cfg.Workers
	t.Run("threads", func(t *testing.T) {
		p, err := New(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		f(t, p)
	})
	for _, bell := range []string{DoorbellFutex, DoorbellEventfd} {
		t.Run("uring-"+bell, func(t *testing.T) {
			tr, err := uring.New(uring.Config{Rings: workers, AllowedDirs: []string{t.TempDir()}}, nil)
			testutil.RequireSupported(t, testutil.IOUring, err)
			if bell == DoorbellFutex && !tr.Wakeable() {
				tr.Close()
				testutil.Missing(t, testutil.IOUring, "IORING_OP_FUTEX_WAIT (Linux 6.7)")
			}
			c := cfg
			c.Doorbell = bell
			p, err := New(c, tr, nil)
			if err != nil {
				tr.Close()
				t.Fatal(err)
			}
			// The transport closes after the test's cleanups (the
			// queues' detaches), and the pool with it.
			t.Cleanup(func() { p.Close(); tr.Close() })
			f(t, p)
		})
	}
}

// TestLostWakeupManyQueues: four queues on one worker, each with a
// client submitting and waiting at random, the worker sleeping in one wait
// on all their doorbells (and its ring): no wake-up is lost, whether the
// worker polls before it sleeps (poll.go) or not.
func TestLostWakeupManyQueues(t *testing.T) {
	total := 1 << 16
	if invariants.RaceEnabled || testing.Short() {
		total = 1 << 13
	}
	for _, poll := range []time.Duration{-1, 0} {
		name := "poll"
		if poll < 0 {
			name = "nopoll"
		}
		t.Run(name, func(t *testing.T) { lostWakeupManyQueues(t, total, poll) })
	}
}

func lostWakeupManyQueues(t *testing.T, total int, poll time.Duration) {
	poolsWith(t, Config{Workers: 1, Poll: poll}, func(t *testing.T, p *Pool) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			e, c, _ := newQueue(t, uint64(i+1), 64)
			attach(t, p, e, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- queuetest.RoundTrips(c, uint64(i), total, 24)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		st := p.Stats()
		if st[0].Queues != 4 || st[0].Sleeps == 0 || st[0].Deaf != 0 {
			t.Errorf("worker stats %+v: want 4 queues, some sleeps, none bounded for want of a doorbell", st[0])
		}
		if (poll >= 0) != (st[0].Polls > 0) {
			t.Errorf("worker stats %+v with poll %v: polls where none was asked, or none where asked", st[0], poll)
		}
	})
}

// TestHostileNeighbour: a client that keeps changing its queue's wake
// word without ringing, and scribbles its flags, shares a worker with a
// well-behaved one, whose round trips still complete without stalls.
func TestHostileNeighbour(t *testing.T) {
	pools(t, 1, func(t *testing.T, p *Pool) {
		bad, _, raw := newQueue(t, 1, 8)
		good, c, _ := newQueue(t, 2, 64)
		// With an eventfd doorbell: one it never rings.
		attach(t, p, bad, nil)
		if p.EventfdDoorbells() {
			// And a third that says it rings its eventfd but made the
			// file non-blocking, so that a read of it fails at once.
			worse, _, wraw := newQueue(t, 3, 8)
			attach(t, p, worse, nil, func(fd int) {
				if err := unix.SetNonblock(fd, true); err != nil {
					t.Fatal(err)
				}
				(*atomic.Uint32)(unsafe.Pointer(&wraw[0x03c])).Store(queue.BellAckEventfd)
			})
		}
		attach(t, p, good, c)
		var stop atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			wake := (*atomic.Uint32)(unsafe.Pointer(&raw[0x0c4]))
			flags := (*atomic.Uint32)(unsafe.Pointer(&raw[0x0c0]))
			for i := uint32(0); !stop.Load(); i++ {
				wake.Add(1)
				flags.Store(i)
				if i%64 == 0 {
					runtime.Gosched()
				}
			}
		}()
		defer func() { stop.Store(true); <-done }()
		var cqes [1]queue.CQE
		for i := 0; i < 2000; i++ {
			if ok, err := c.Stage(&queue.SQE{Op: queue.OpNop, UserData: uint64(i)}, nil); !ok || err != nil {
				t.Fatalf("stage: %v %v", ok, err)
			}
			c.Submit()
			if err := c.Wait(1, 5*time.Second); err != nil {
				t.Fatalf("round trip %d beside a hostile queue: %v", i, err)
			}
			c.Reap(cqes[:])
		}
		if p.EventfdDoorbells() {
			// Where a read of a non-blocking eventfd fails at once (a
			// kernel whose io_uring does not arm a poll for it), the
			// worker looks at that queue instead of waiting on it: its
			// sleeps are counted deaf, and it does not spin. Linux 6.18
			// arms the poll: nothing fails.
			t.Logf("worker stats beside a client whose eventfd is non-blocking: %+v", p.Stats()[0])
		}
	})
}

// TestEventfdDoorbell: workers forced onto eventfd doorbells (as on a
// kernel whose io_uring lacks IORING_OP_FUTEX_WAIT) still sleep on their
// rings with no bound, and each sleep is ended by the client's doorbell:
// a request submitted while the worker sleeps is answered, every time,
// and no sleep was bounded for want of a doorbell (which would hide a lost
// one behind a millisecond's poll).
func TestEventfdDoorbell(t *testing.T) {
	tr, err := uring.New(uring.Config{Rings: 1, AllowedDirs: []string{t.TempDir()}}, nil)
	testutil.RequireSupported(t, testutil.IOUring, err)
	p, err := New(Config{Workers: 1, Doorbell: DoorbellEventfd}, tr, nil)
	if err != nil {
		tr.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); tr.Close() })
	if !p.EventfdDoorbells() || p.Home(0) != 1 {
		t.Fatalf("a pool configured for eventfd doorbells: eventfd %v, worker 0's home %#x (want its ring, 1)", p.EventfdDoorbells(), p.Home(0))
	}
	// By default, eventfd doorbells exactly where the kernel's io_uring
	// cannot wait on a futex (on Linux 6.18 the futex, in the Soft-RoCE
	// VM's 6.1 the eventfd), and the workers on their rings either way.
	tr2, err := uring.New(uring.Config{Rings: 1, AllowedDirs: []string{t.TempDir()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	auto, err := New(Config{Workers: 1}, tr2, nil)
	if err != nil {
		tr2.Close()
		t.Fatal(err)
	}
	if auto.EventfdDoorbells() == tr2.Wakeable() || auto.Home(0) != 1 {
		t.Errorf("by default, on io_uring with futex waits %v: eventfd doorbells %v, worker 0's home %#x (want its ring, 1)",
			tr2.Wakeable(), auto.EventfdDoorbells(), auto.Home(0))
	}
	t.Logf("io_uring futex waits %v: doorbells by default are eventfds %v", tr2.Wakeable(), auto.EventfdDoorbells())
	auto.Close()
	tr2.Close()
	e, c, _ := newQueue(t, 1, 8)
	attach(t, p, e, c)
	if c.Doorbell() != queue.DoorbellEventfd {
		t.Fatalf("the queue's header asks for doorbell %d", c.Doorbell())
	}
	var cqes [1]queue.CQE
	var before uint64 // the worker's sleeps when the last request was submitted
	for i := 0; i < 200; i++ {
		// The worker is asleep, or about to be: it agreed to a sleep
		// after it served the last request.
		testutil.Eventually(t, 10*time.Second, func() bool { return p.Stats()[0].Sleeps > before },
			"the worker sleeping before round trip %d", i)
		before = p.Stats()[0].Sleeps
		if ok, err := c.Stage(&queue.SQE{Op: queue.OpNop, UserData: uint64(i), Length: 1}, nil); !ok || err != nil {
			t.Fatalf("stage: %v %v", ok, err)
		}
		c.Submit()
		if err := c.Wait(1, 10*time.Second); err != nil {
			t.Fatalf("round trip %d to a sleeping worker: %v", i, err)
		}
		if c.Reap(cqes[:]) != 1 || cqes[0].UserData != uint64(i) {
			t.Fatalf("round trip %d: %+v", i, cqes[0])
		}
	}
	if c.SubmitDoorbells.Load() == 0 {
		t.Error("no submit rang the doorbell: the worker never slept for entries")
	}
	if st := p.Stats()[0]; st.Deaf != 0 {
		t.Errorf("worker stats %+v: sleeps bounded for want of a doorbell", st)
	}
}

// TestAttachBalances: queues go to the worker serving the fewest, and
// Detach gives the slot back.
func TestAttachBalances(t *testing.T) {
	p, err := New(Config{Workers: 3}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var got []int
	var qs []*echo
	for i := 0; i < 6; i++ {
		e, _, _ := newQueue(t, uint64(i+1), 8)
		w := p.Pick()
		if err := p.Attach(w, e); err != nil {
			t.Fatal(err)
		}
		got = append(got, w)
		qs = append(qs, e)
	}
	count := map[int]int{}
	for _, w := range got {
		count[w]++
	}
	if len(count) != 3 || count[0] != 2 || count[1] != 2 || count[2] != 2 {
		t.Fatalf("6 queues on 3 workers went %v", got)
	}
	p.Detach(got[0], qs[0])
	if w := p.Pick(); w != got[0] {
		t.Errorf("after a detach from worker %d, the next queue went to %d", got[0], w)
	}
	p.unload(got[0])
	for i := 1; i < len(qs); i++ {
		p.Detach(got[i], qs[i])
	}
	if st := p.Stats(); st[0].Queues+st[1].Queues+st[2].Queues != 0 {
		t.Errorf("queues left after every detach: %+v", st)
	}
}

// TestStopped: a stopped pool takes no queue (ErrStopped), and a Detach
// of a queue it served returns at once.
func TestStopped(t *testing.T) {
	p, err := New(Config{Workers: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, _, _ := newQueue(t, 1, 8)
	if err := p.Attach(p.Pick(), e); err != nil {
		t.Fatal(err)
	}
	p.Close()
	detached := make(chan struct{})
	go func() { p.Detach(0, e); close(detached) }()
	select {
	case <-detached:
	case <-time.After(10 * time.Second):
		t.Fatal("Detach from a stopped worker waits")
	}
	e2, _, _ := newQueue(t, 2, 8)
	if err := p.Attach(p.Pick(), e2); !errors.Is(err, ErrStopped) {
		t.Fatalf("attach to a stopped pool: %v", err)
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		workers int
		ok      bool
	}{{0, true}, {1, true}, {MaxWorkers, true}, {-1, false}, {MaxWorkers + 1, false}} {
		err := Config{Workers: tc.workers}.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("workers %d: %v", tc.workers, err)
		}
	}
	if err := (Config{Doorbell: "bell"}).Validate(); !errors.Is(err, ErrConfig) {
		t.Errorf("doorbell \"bell\": %v", err)
	}
	if n := (Config{}).WorkersFor(); n != runtime.NumCPU() {
		t.Errorf("default workers %d, want %d", n, runtime.NumCPU())
	}
	if _, err := New(Config{Workers: 2}, fakeHost(3), nil); !errors.Is(err, ErrConfig) {
		t.Errorf("2 workers on 3 rings: %v", err)
	}
}

type fakeHost int

func (h fakeHost) Rings() int     { return int(h) }
func (h fakeHost) Wakeable() bool { return true }
func (h fakeHost) Host(int, uring.Guest) (func(), error) {
	return nil, errors.New("not hosted")
}

// unwakeableHost is a transport on a kernel without IORING_OP_FUTEX_WAIT;
// it takes its guests without serving them.
type unwakeableHost int

func (h unwakeableHost) Rings() int     { return int(h) }
func (h unwakeableHost) Wakeable() bool { return false }
func (h unwakeableHost) Host(int, uring.Guest) (func(), error) {
	return func() {}, nil
}

// TestUnwakeableHost: where a ring cannot wait on a futex, the workers
// stay on their rings and wait on eventfd doorbells (the default), or,
// with futex doorbells configured, run on their own threads (a queue's
// tasks then carry no ring as Home).
func TestUnwakeableHost(t *testing.T) {
	p, err := New(Config{Workers: 2}, unwakeableHost(2), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.EventfdDoorbells() || p.Home(1) != 2 {
		t.Errorf("by default: eventfd doorbells %v, worker 1's Home %#x (want true, its ring 2)", p.EventfdDoorbells(), p.Home(1))
	}
	p.Close()
	p, err = New(Config{Workers: 2, Doorbell: DoorbellFutex}, unwakeableHost(2), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.EventfdDoorbells() {
		t.Error("futex doorbells configured, eventfd ones used")
	}
	for w := 0; w < p.Workers(); w++ {
		// The worker, marked as on its own thread: beyond every ring's
		// index, so that no ring takes its tasks as its guest's.
		if h := p.Home(w); h != uint32(w+1)|xfer.HomeOwnThread || int(h) <= 2 {
			t.Errorf("worker %d: Home %#x, want %#x (its own thread)", w, h, uint32(w+1)|xfer.HomeOwnThread)
		}
	}
}
