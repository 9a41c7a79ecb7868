package queue

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"golang.org/x/sys/unix"
)

// pair makes a queue on a real sealed memfd, mapped twice: the daemon's
// mapping and the client's, as two processes would have them.
func pair(t testing.TB, sq, cq, data uint32) (*DaemonRing, *ClientRing) {
	t.Helper()
	g, err := NewGeometry(sq, cq, data)
	if err != nil {
		t.Fatal(err)
	}
	d, fd, err := Create(7, g)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Map(fd, g.Size)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Unmap(); err != nil {
			t.Error(err)
		}
		if err := d.Release(); err != nil {
			t.Error(err)
		}
	})
	return d, c
}

func TestGeometry(t *testing.T) {
	for _, tc := range []struct {
		sq, cq, data   uint32
		wantSQ, wantCQ uint32
		wantData       uint32
		wantErr        bool
	}{
		{0, 0, 0, DefaultSQ, 2 * DefaultSQ, DefaultDataSize, false},
		{3, 0, 1, 4, 8, 4096, false},
		{8, 17, 0, 8, 32, DefaultDataSize, false},
		{1, 0, 0, 0, 0, 0, true},
		{8, 15, 0, 0, 0, 0, true},
		{MaxSQEntries + 1, 0, 0, 0, 0, 0, true},
		{MaxSQEntries, 0, 0, MaxSQEntries, 2 * MaxSQEntries, DefaultDataSize, false},
		{16, MaxCQEntries + 1, 0, 0, 0, 0, true},
		{16, 0, MaxDataSize + 1, 0, 0, 0, true},
	} {
		g, err := NewGeometry(tc.sq, tc.cq, tc.data)
		if tc.wantErr {
			if !errors.Is(err, ErrGeometry) {
				t.Errorf("NewGeometry(%d, %d, %d): %v, want ErrGeometry", tc.sq, tc.cq, tc.data, err)
			}
			continue
		}
		if err != nil || g.SQEntries != tc.wantSQ || g.CQEntries != tc.wantCQ || g.DataSize != tc.wantData {
			t.Errorf("NewGeometry(%d, %d, %d) = %+v, %v", tc.sq, tc.cq, tc.data, g, err)
			continue
		}
		if g.CQOff != g.SQOff+g.SQEntries*SQESize || g.DataOff%4096 != 0 || g.Size != uint64(g.DataOff)+uint64(g.DataSize) {
			t.Errorf("layout of %+v overlaps or is misaligned", g)
		}
	}
}

func TestHeaderChecked(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	mem := c.mem
	if _, err := NewClientRing(mem[:100]); !errors.Is(err, ErrGeometry) {
		t.Errorf("short mapping: %v", err)
	}
	word(mem, offSQEntries).Store(6) // not a power of two
	if _, err := NewClientRing(mem); !errors.Is(err, ErrGeometry) {
		t.Errorf("bad sq_entries: %v", err)
	}
	word(mem, offSQEntries).Store(8)
	word(mem, offMagic).Store(1)
	if _, err := NewClientRing(mem); !errors.Is(err, ErrGeometry) {
		t.Errorf("bad magic: %v", err)
	}
	word(mem, offMagic).Store(Magic)
	// The daemon never reads the header back: scribbling it changes
	// nothing of its geometry.
	word(mem, offCQEntries).Store(1 << 30)
	if g := d.Geometry(); g.CQEntries != 16 {
		t.Errorf("daemon geometry follows the shared header: %+v", g)
	}
}

func TestRoundTrip(t *testing.T) {
	d, c := pair(t, 8, 0, 4096)
	for i := 0; i < 3; i++ {
		e := SQE{Op: OpWrite, TimeoutUS: 1000, UserData: uint64(100 + i), Local: 1, LocalOff: 2, Target: 3, TargetOff: 4, Length: 5}
		var payload []byte
		if i == 1 {
			payload = []byte("hello")
		}
		if ok, err := c.Stage(&e, payload); !ok || err != nil {
			t.Fatalf("stage %d: %v %v", i, ok, err)
		}
	}
	if n := c.Submit(); n != 3 {
		t.Fatalf("submitted %d", n)
	}
	var got [8]SQE
	if n := d.Take(got[:]); n != 3 {
		t.Fatalf("took %d", n)
	}
	want := SQE{Op: OpWrite, TimeoutUS: 1000, UserData: 101, Local: 1, LocalOff: 2, Target: 3, TargetOff: 4, Length: 5,
		Flags: SQEFlagNotify, NotifyLen: 5}
	want.NotifyOff = got[1].NotifyOff
	if got[1] != want {
		t.Errorf("entry 1 = %+v, want %+v", got[1], want)
	}
	buf := make([]byte, 16)
	if !d.Data(buf, got[1].NotifyOff, got[1].NotifyLen) || !bytes.Equal(buf[:5], []byte("hello")) {
		t.Errorf("payload %q", buf[:5])
	}
	if d.Data(buf, 4090, 10) || d.Data(buf[:2], 0, 5) {
		t.Error("Data accepted a range outside the data area or the destination")
	}
	d.Publish()
	for i := 0; i < 3; i++ {
		d.Post(&CQE{UserData: got[i].UserData, Result: uint64(i), Code: uint32(i), State: 3})
	}
	var cqes [8]CQE
	if err := c.Wait(3, time.Second); err != nil {
		t.Fatal(err)
	}
	if n := c.Reap(cqes[:]); n != 3 || cqes[2] != (CQE{UserData: 102, Result: 2, Code: 2, State: 3}) {
		t.Fatalf("reaped %d: %+v", n, cqes[:n])
	}
	if inflight, unreaped, posted := d.Counts(); inflight != 0 || posted != 3 {
		t.Errorf("counts %d %d %d", inflight, unreaped, posted)
	}
	if c.SubmitDoorbells.Load()+c.ReapDoorbells != 0 {
		// The daemon never slept, so the client never needed to ring.
		t.Errorf("%d+%d doorbells while the daemon was awake", c.SubmitDoorbells.Load(), c.ReapDoorbells)
	}
}

// TestDataAreaReuse fills the data area, and checks that space comes back
// as the daemon takes entries, never before.
func TestDataAreaReuse(t *testing.T) {
	d, c := pair(t, 8, 0, 4096)
	p := make([]byte, 1500)
	var e SQE
	for i := 0; i < 2; i++ {
		if ok, err := c.Stage(&SQE{}, p); !ok || err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	if _, err := c.Stage(&e, p); !errors.Is(err, ErrDataFull) {
		t.Fatalf("third payload of 1500 in 4096: %v, want ErrDataFull", err)
	}
	c.Submit()
	var got [8]SQE
	if d.Take(got[:]) != 2 {
		t.Fatal("take")
	}
	if _, err := c.Stage(&SQE{}, p); !errors.Is(err, ErrDataFull) {
		t.Fatalf("data reused before the daemon published its head: %v", err)
	}
	d.Publish()
	if ok, err := c.Stage(&SQE{}, p); !ok || err != nil {
		t.Fatalf("after publish: %v %v", ok, err)
	}
	if _, err := c.Stage(&SQE{}, make([]byte, 5000)); !errors.Is(err, ErrDataFull) {
		t.Fatalf("payload larger than the data area: %v", err)
	}
}

// idle is a worker's sleep on one queue, as a reactor sleeps on each of
// its queues: Doorbell, a futex wait on the word it returns, Awake. It
// reports whether the worker should Take again (false once the ring is
// closed or broken).
func idle(d *DaemonRing) bool {
	w, v, sleep := d.Doorbell()
	if !sleep {
		return !d.Closed() && !d.Broken()
	}
	if w == nil {
		return false
	}
	futexWait(w, v, -1) //nolint:errcheck // the caller re-checks either way
	d.Awake()
	return !d.Closed()
}

// echo is a daemon worker for tests: it takes entries and posts a CQE for
// each at once (Result = Length), until the ring is closed.
func echo(d *DaemonRing, jitter bool, stop *atomic.Bool) {
	var sqes [64]SQE
	rng := rand.New(rand.NewPCG(1, 2))
	for !stop.Load() {
		n := d.Take(sqes[:rng.IntN(len(sqes))+1])
		d.Publish()
		for i := 0; i < n; i++ {
			if jitter && rng.IntN(64) == 0 {
				runtime.Gosched()
			}
			d.Post(&CQE{UserData: sqes[i].UserData, Result: sqes[i].Length, State: 3})
		}
		if n == 0 && !idle(d) {
			return
		}
	}
}

// TestCQBackpressure: a client that does not reap stops the daemon from
// taking more than the completion ring holds; reaping lets it go on.
func TestCQBackpressure(t *testing.T) {
	d, c := pair(t, 4, 8, 0)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); echo(d, false, &stop) }()
	defer func() { stop.Store(true); d.Close(); wg.Wait() }()

	submitted := 0
	for submitted < 12 {
		if ok, _ := c.Stage(&SQE{Op: OpNop, UserData: uint64(submitted)}, nil); !ok {
			break
		}
		submitted++
		c.Submit()
		if submitted <= 8 {
			if err := c.Wait(submitted, 5*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	// 8 completions fill the ring; the 4 entries after them stay in the
	// submission ring, untaken.
	if submitted != 12 {
		t.Fatalf("staged %d, want 12 (8 completed + 4 waiting)", submitted)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return d.w.sqFlags.Load()&FlagCQWait != 0 },
		"the daemon flagging that it waits for completion room")
	if got := c.Ready(); got != 8 {
		t.Fatalf("%d completions ready, want exactly the ring's 8", got)
	}
	if inflight, unreaped, _ := d.Counts(); inflight != 0 || unreaped != 8 {
		t.Fatalf("daemon: %d in flight, %d unreaped", inflight, unreaped)
	}
	var cqes [16]CQE
	if n := c.Reap(cqes[:]); n != 8 {
		t.Fatalf("reaped %d", n)
	}
	if err := c.Wait(4, 5*time.Second); err != nil {
		t.Fatalf("after reaping, the waiting entries did not complete: %v", err)
	}
	if c.ReapDoorbells == 0 {
		t.Error("reaping a full ring did not ring the daemon that waited for room")
	}
}

// TestForgedViolationWords: the state and violation words are shared, so a
// client can write anything there; what the daemon reports and how it
// treats the queue come from its own memory.
func TestForgedViolationWords(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	c.w.violations.Store(3_000_000_000)
	if v := d.Violations(); v != 0 {
		t.Fatalf("a client's forged violation word reads as %d violations", v)
	}
	c.w.sqTail.Store(9)
	var sqes [16]SQE
	if n := d.Take(sqes[:]); n != 0 || !d.Broken() {
		t.Fatalf("took %d, broken %v", n, d.Broken())
	}
	c.w.violations.Store(3_000_000_000)
	if v := d.Violations(); v != 1 {
		t.Fatalf("%d violations after one, with the client's word at 3e9", v)
	}
	// Clearing the broken bit does not mend the queue for the daemon.
	c.w.state.Store(0)
	c.w.sqTail.Store(1)
	if n := d.Take(sqes[:]); n != 0 || !d.Broken() {
		t.Fatalf("after the client cleared the state word: took %d, broken %v", n, d.Broken())
	}
}

func TestInvalidIndices(t *testing.T) {
	t.Run("sq_tail past the ring", func(t *testing.T) {
		d, c := pair(t, 8, 0, 0)
		c.w.sqTail.Store(9)
		var sqes [16]SQE
		if n := d.Take(sqes[:]); n != 0 || !d.Broken() || d.Violations() != 1 {
			t.Fatalf("took %d, broken %v, violations %d", n, d.Broken(), d.Violations())
		}
		if !errors.Is(c.Err(), ErrBroken) {
			t.Errorf("client sees %v", c.Err())
		}
		if idle(d) {
			t.Error("Idle on a broken ring asks for more Takes")
		}
	})
	t.Run("sq_tail behind the head", func(t *testing.T) {
		d, c := pair(t, 8, 0, 0)
		c.Stage(&SQE{}, nil)
		c.Submit()
		var sqes [16]SQE
		if d.Take(sqes[:]) != 1 {
			t.Fatal("take")
		}
		c.w.sqTail.Store(0) // behind the head: 2^32-1 "entries"
		if n := d.Take(sqes[:]); n != 0 || !d.Broken() {
			t.Fatalf("took %d, broken %v", n, d.Broken())
		}
		d.Post(&CQE{UserData: 1}) // what was taken still completes
		if c.Ready() != 1 {
			t.Error("the CQE of an entry taken before the break was not posted")
		}
	})
	t.Run("cq_head past the tail", func(t *testing.T) {
		d, c := pair(t, 8, 0, 0)
		c.w.cqHead.Store(100)
		c.Stage(&SQE{}, nil)
		c.Submit()
		var sqes [16]SQE
		if n := d.Take(sqes[:]); n != 0 || !d.Broken() {
			t.Fatalf("took %d with a bogus cq_head, broken %v", n, d.Broken())
		}
	})
}

// TestHostileScribble: another goroutine rewrites the indices and the
// entries with random words while the daemon takes; the daemon never takes
// more than the ring holds or than completion slots allow, and never
// crashes.
func TestHostileScribble(t *testing.T) {
	d, _ := pair(t, 16, 32, 0)
	mem := d.mem
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(5, 6))
		sq := int(d.g.SQOff)
		for !stop.Load() {
			switch rng.IntN(4) {
			case 0:
				d.w.sqTail.Store(d.w.sqHead.Load() + uint32(rng.IntN(20)))
			case 1:
				d.w.cqHead.Store(rng.Uint32())
			default:
				off := sq + 8*rng.IntN(16*SQESize/8)
				(*atomic.Uint64)(unsafe.Pointer(&mem[off])).Store(rng.Uint64())
			}
		}
	}()
	var sqes [64]SQE
	deadline := time.Now().Add(time.Second)
	taken := 0
	for time.Now().Before(deadline) && !d.Broken() {
		n := d.Take(sqes[:])
		if n > 16 {
			t.Fatalf("took %d from a ring of 16", n)
		}
		taken += n
		d.Publish()
		for i := 0; i < n; i++ {
			d.Post(&CQE{UserData: sqes[i].UserData})
		}
	}
	stop.Store(true)
	wg.Wait()
	if inflight, unreaped, _ := d.Counts(); inflight != 0 || unreaped > 32 {
		t.Fatalf("after the scribbling: %d in flight, %d unreaped in a ring of 32", inflight, unreaped)
	}
	t.Logf("took %d entries; broken %v after %d violations", taken, d.Broken(), d.Violations())
}

func TestCloseWakesBothSides(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	errs := make(chan error, 1)
	slept := make(chan bool, 1)
	go func() { errs <- c.Wait(1, -1) }()
	go func() {
		var sqes [4]SQE
		d.Take(sqes[:])
		slept <- idle(d)
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&FlagWaiting != 0 && d.w.sqFlags.Load()&FlagNeedWakeup != 0 },
		"the client waiting and the daemon asleep")
	d.Close()
	if err := <-errs; !errors.Is(err, ErrClosed) {
		t.Errorf("client wait: %v, want ErrClosed", err)
	}
	if <-slept {
		t.Error("the daemon's sleep asked for more Takes on a closed ring")
	}
}

func TestWaitTimeout(t *testing.T) {
	_, c := pair(t, 8, 0, 0)
	c.spin = spinner{}
	start := time.Now()
	if err := c.Wait(1, 20*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait: %v", err)
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Error("timed out early")
	}
}

// TestNoAllocations: the hot calls of both sides allocate nothing.
func TestNoAllocations(t *testing.T) {
	d, c := pair(t, 64, 0, 0)
	var sqes [64]SQE
	var cqes [64]CQE
	e := SQE{Op: OpRead, Length: 4096}
	payload := []byte("x")
	a := testing.AllocsPerRun(1000, func() {
		for i := 0; i < 8; i++ {
			e.UserData = uint64(i)
			c.Stage(&e, payload)
		}
		c.Submit()
		n := d.Take(sqes[:])
		d.Publish()
		for i := 0; i < n; i++ {
			d.Post(&CQE{UserData: sqes[i].UserData})
		}
		c.Wait(8, time.Second)
		c.Reap(cqes[:])
	})
	if a != 0 {
		t.Errorf("%v allocations per round", a)
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	d, c := pair(b, 256, 0, 0)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); echo(d, false, &stop) }()
	defer func() { stop.Store(true); d.Close(); wg.Wait() }()
	var cqes [64]CQE
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Stage(&SQE{Op: OpNop, UserData: uint64(i)}, nil)
		c.Submit()
		c.Wait(1, time.Second)
		c.Reap(cqes[:])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
}

// TestStoreEntry stages a store op with its key list written straight into
// the data area: its count and flags reach the daemon, the data range is
// the one filled, and a results record reads back as written.
func TestStoreEntry(t *testing.T) {
	d, c := pair(t, 4, 0, 4096)
	e := SQE{Op: OpStoreCommit, Flags: SQEFlagDurable, Count: 513, UserData: 9, Local: 4, LocalOff: 64}
	data, ok, err := c.StageData(&e, 10)
	if !ok || err != nil || len(data) != 10 {
		t.Fatalf("stage: %d bytes %v %v", len(data), ok, err)
	}
	copy(data, "keys-bytes")
	c.Submit()
	var got [4]SQE
	if n := d.Take(got[:]); n != 1 {
		t.Fatalf("took %d", n)
	}
	want := e
	if got[0] != want || got[0].Count != 513 || got[0].NotifyLen != 10 {
		t.Fatalf("entry %+v, want %+v", got[0], want)
	}
	buf := make([]byte, 10)
	if !d.Data(buf, got[0].NotifyOff, got[0].NotifyLen) || string(buf) != "keys-bytes" {
		t.Fatalf("key list %q", buf)
	}
	d.Publish()
	d.Post(&CQE{UserData: 9})
	// The data area is reused once the entry was taken; more than it holds
	// is ErrDataFull.
	if _, _, err := c.StageData(&SQE{Op: OpStoreGet}, 8192); !errors.Is(err, ErrDataFull) {
		t.Fatalf("8 KiB in a 4 KiB area: %v", err)
	}

	rec := make([]byte, StoreResultSize)
	PutStoreResult(rec, 4, 1<<20, 1<<33)
	if code, l, off, ok := StoreResult(rec); code != 4 || l != 1<<20 || off != 1<<33 || !ok {
		t.Fatalf("record %d %d %d %v", code, l, off, ok)
	}
	rec[2] = 1
	if _, _, _, ok := StoreResult(rec); ok {
		t.Fatal("a record with a reserved byte set read as written")
	}
}

// TestWaitTargetWakesOnce: a client sleeping for several completions is
// not woken by each post: only by the last it waits for.
func TestWaitTargetWakesOnce(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	c.spin = spinner{} // sleep at once
	inFlight(t, d, c, 5)
	errs := make(chan error, 1)
	go func() { errs <- c.Wait(4, 10*time.Second) }()
	sleepingFor := func(n uint32) bool {
		return c.w.cqFlags.Load()&waitBits == waitBits && c.w.cqTarget.Load()-c.cqHead == n
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return sleepingFor(4) }, "the client sleeping for 4")
	for i := 0; i < 3; i++ {
		d.Post(&CQE{UserData: uint64(i)})
	}
	if w := d.WakeCounts.ClientWakes.Load(); w != 0 {
		t.Fatalf("%d client wakes for 3 of the 4 completions it waits for", w)
	}
	select {
	case err := <-errs:
		t.Fatalf("Wait(4) returned with 3 ready: %v", err)
	default:
	}
	d.Post(&CQE{UserData: 3})
	if err := <-errs; err != nil {
		t.Fatalf("Wait(4): %v", err)
	}
	if w := d.WakeCounts.ClientWakes.Load(); w != 1 {
		t.Errorf("%d client wakes, want 1", w)
	}
	if c.Ready() != 4 || c.w.cqFlags.Load()&waitBits != 0 {
		t.Errorf("ready %d, flags %#x after the wait", c.Ready(), c.w.cqFlags.Load())
	}
}

// TestClientWants: what the client's flags and target ask for decides the
// wake-up; a target that is never reached (a client's mistake or
// scribble) still gets the client woken when nothing is left in flight,
// and a client that sets no target is woken by every completion.
func TestClientWants(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	for _, tc := range []struct {
		flags, target, tail uint32
		emptied, want       bool
	}{
		{0, 0, 5, true, false},                 // not sleeping
		{FlagWaiting, 100, 5, false, true},     // no target: every completion
		{waitBits, 6, 5, false, false},         // short of the target
		{waitBits, 5, 5, false, true},          // reached
		{waitBits, 3, 5, false, true},          // passed
		{waitBits, 0xfffffffe, 1, false, true}, // reached across the wrap
		{waitBits, 5 + 1<<30, 5, false, false}, // far ahead: never reached...
		{waitBits, 5 + 1<<30, 5, true, true},   // ...but woken once the queue empties
		{FlagWaitTarget, 5, 5, false, false},   // a target without FlagWaiting: not sleeping
		{waitBits | 1<<7, 5, 5, false, true},   // other bits are ignored
	} {
		c.w.cqFlags.Store(tc.flags)
		c.w.cqTarget.Store(tc.target)
		if got := d.clientWants(tc.tail, tc.emptied); got != tc.want {
			t.Errorf("flags %#x target %d tail %d emptied %v: wants %v, want %v", tc.flags, tc.target, tc.tail, tc.emptied, got, tc.want)
		}
	}
}

// TestWaitSleepsWhileSeveralMissing: a client waiting for 4 completions
// with 4 in flight does not spin (the daemon is known to be working),
// whatever its spin budget: it sleeps at once, for all 4. A client waiting
// for the one completion missing spins first. The spinner's clock is the
// test's and counts the spin's readings.
func TestWaitSleepsWhileSeveralMissing(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	inFlight(t, d, c, 5)
	var ticks atomic.Int64
	base := time.Unix(1000, 0)
	spinClock = func() time.Time {
		return base.Add(time.Duration(ticks.Add(1)) * time.Microsecond)
	}
	defer func() { spinClock = time.Now }()
	c.spin = spinner{budget: 25 * time.Millisecond, max: 25 * time.Millisecond}
	errs := make(chan error, 1)
	go func() { errs <- c.Wait(4, 10*time.Second) }()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return c.w.cqFlags.Load()&waitBits == waitBits && c.w.cqTarget.Load()-c.cqHead == 4
	}, "the client sleeping for 4")
	if n := ticks.Load(); n != 0 {
		t.Fatalf("the client spun (%d clock readings) with 4 completions missing", n)
	}
	for i := 0; i < 4; i++ {
		d.Post(&CQE{UserData: uint64(i)})
	}
	if err := <-errs; err != nil {
		t.Fatalf("Wait(4): %v", err)
	}
	if c.Sleeps != 1 {
		t.Errorf("slept %d times, want 1", c.Sleeps)
	}
	// One missing: the spin runs (and, with nothing posted, ends in a
	// sleep that the timeout ends).
	var out [4]CQE
	c.Reap(out[:])
	if err := c.Wait(1, time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait(1) with nothing posted: %v", err)
	}
	if ticks.Load() == 0 {
		t.Error("no spin before the sleep with one completion missing")
	}
}

// TestWaitWokenBeforeTheLast: a client whose completions come fast asks
// to be woken some before the last it waits for and spins for the rest;
// one whose completions come within a spin of each other, waiting for all
// it has in flight, asks to be woken by the one before the last; one whose
// completions come slowly sleeps for all of them.
func TestWaitWokenBeforeTheLast(t *testing.T) {
	for _, tc := range []struct {
		gap, spin time.Duration // the gap learnt, the spin budget for a last completion
		want      uint32        // the target of the client's first sleep
	}{
		{6 * time.Microsecond, 0, 32 - uint32(tailSpin/2/(6*time.Microsecond))},
		{11 * time.Microsecond, 0, 32}, // file reads at QD32
		{30 * time.Microsecond, 0, 32}, // no spin for the last: woken by it
		{30 * time.Microsecond, 40 * time.Microsecond, 31},
		{70 * time.Microsecond, 40 * time.Microsecond, 31}, // 1 MiB copies
		{tailSpin, 40 * time.Microsecond, 32},
	} {
		d, c := pair(t, 32, 0, 0)
		inFlight(t, d, c, 32)
		c.spin = spinner{budget: tc.spin, max: spinCeiling}
		c.tail = tail{gap: tc.gap}
		errs := make(chan error, 1)
		go func() { errs <- c.Wait(32, 10*time.Second) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
			"the client sleeping (gap %v)", tc.gap)
		if got := c.w.cqTarget.Load() - c.cqHead; got != tc.want {
			t.Errorf("gap %v: the client sleeps for %d of 32, want %d", tc.gap, got, tc.want)
		}
		for i := 0; i < 32; i++ {
			d.Post(&CQE{UserData: uint64(i)})
		}
		if err := <-errs; err != nil {
			t.Fatalf("gap %v: Wait(32): %v", tc.gap, err)
		}
	}
}

// TestDrainedWaitLearnsLead: a drained wait on a 30 µs stream is woken one
// before the last; when its wake-up finds every completion there (late),
// the next such wait is woken two before the last, and spins for them.
func TestDrainedWaitLearnsLead(t *testing.T) {
	d, c := pair(t, 8, 0, 0)
	c.spin = spinner{budget: 40 * time.Microsecond, max: spinCeiling}
	c.tail = tail{gap: 30 * time.Microsecond}
	for round, want := range []uint32{7, 6} {
		inFlight(t, d, c, 8)
		late, head := c.LateWakes, c.cqHead
		errs := make(chan error, 1)
		go func() { errs <- c.Wait(8, 10*time.Second) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
			"round %d: the client sleeping", round)
		if got := c.w.cqTarget.Load() - head; got != want {
			t.Errorf("round %d: the client sleeps for %d of 8, want %d", round, got, want)
		}
		// A slow wake-up: the client's flags taken (as a waker does) so
		// that the posts wake nobody, all 8 posted, then the wake: it
		// finds the last completion there.
		flags := c.w.cqFlags.And(^waitBits)
		if flags&waitBits != waitBits {
			t.Fatalf("round %d: flags %#x", round, flags)
		}
		for i := 0; i < 8; i++ {
			d.Post(&CQE{UserData: uint64(i)})
		}
		c.w.cqWake.Add(1)
		futexWake(c.w.cqWake)
		if err := <-errs; err != nil {
			t.Fatalf("round %d: Wait(8): %v", round, err)
		}
		if c.LateWakes != late+1 {
			t.Errorf("round %d: late wake-ups %d, want %d", round, c.LateWakes, late+1)
		}
		c.Reap(make([]CQE, 8))
		c.tail.gap = 30 * time.Microsecond // the posts above came at once: keep the stream's gap
	}
}

// inFlight has the client submit n NOPs and the daemon take them, so that
// n requests are in flight with no CQE posted.
func inFlight(t *testing.T, d *DaemonRing, c *ClientRing, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if ok, err := c.Stage(&SQE{Op: OpNop, UserData: uint64(i)}, nil); !ok || err != nil {
			t.Fatalf("stage: %v %v", ok, err)
		}
	}
	c.Submit()
	sqes := make([]SQE, n)
	if got := d.Take(sqes); got != n {
		t.Fatalf("took %d of %d", got, n)
	}
	d.Publish()
}

// TestWaitNaps: a client waiting for 16 of its 32 in flight, with a gap
// learnt, first naps on the clock with no wake-up asked for: when the
// completions come during the nap, the daemon makes no wake-up at all;
// when some are still missing after it, the client sleeps for the rest
// and is woken once. A wait for everything in flight (drained) does not
// nap, nor one whose daemon worker sleeps or slept since the last wait
// (a Submit rang its doorbell). The nap is the test's: it checks the flags, posts, and moves the
// spinners' clock by the nap's length.
func TestWaitNaps(t *testing.T) {
	var now atomic.Int64
	base := time.Unix(1000, 0)
	spinClock = func() time.Time { return base.Add(time.Duration(now.Load())) }
	realNap := napSleep
	defer func() { spinClock, napSleep = time.Now, realNap }()

	d, c := pair(t, 64, 0, 0)
	c.spin = spinner{} // no spin for a last completion
	c.slack = 0
	var naps []time.Duration
	var during int            // posted by the nap
	var napCount atomic.Int32 // naps taken, for a test goroutine to read
	napSleep = func(n time.Duration) {
		naps = append(naps, n)
		defer napCount.Add(1)
		if f := c.w.cqFlags.Load(); f&waitBits != 0 {
			t.Errorf("flags %#x during a nap: the daemon was asked for a wake-up", f)
		}
		for i := 0; i < during; i++ {
			d.Post(&CQE{UserData: uint64(i)})
		}
		now.Add(int64(n))
	}

	// put puts 32 in flight, n of which the nap posts; begin does so
	// with a fresh tail; end reaps the wait's and posts and reaps the
	// other 16.
	put := func(n int) {
		inFlight(t, d, c, 32)
		during = n
		naps = naps[:0]
		napCount.Store(0)
	}
	begin := func(n int) {
		c.tail = tail{gap: 20 * time.Microsecond}
		put(n)
	}
	end := func() {
		c.Reap(make([]CQE, 64))
		for i := 16; i < 32; i++ {
			d.Post(&CQE{UserData: uint64(i)})
		}
		c.Reap(make([]CQE, 64))
	}

	// All 16 come during the nap: no wake-up.
	begin(16)
	if err := c.Wait(16, 10*time.Second); err != nil {
		t.Fatalf("Wait(16): %v", err)
	}
	want := 16 * 20 * time.Microsecond
	if len(naps) != 1 || naps[0] != want || c.Naps != 1 {
		t.Fatalf("naps %v (counted %d), want one of %v", naps, c.Naps, want)
	}
	if w := d.WakeCounts.ClientWakes.Load(); w != 0 || c.Sleeps != 0 {
		t.Errorf("%d client wakes and %d sleeps for completions that came during the nap", w, c.Sleeps)
	}
	if g := c.tail.napGap(); g != 20*time.Microsecond || c.tail.gap != 20*time.Microsecond {
		t.Errorf("nap gap %v, learnt gap %v after a nap on time, want both 20µs", g, c.tail.gap)
	}
	end()

	// 10 of 16 come during the nap: the client sleeps for the other 6.
	begin(10)
	errs := make(chan error, 1)
	go func() { errs <- c.Wait(16, 10*time.Second) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
		"the client sleeping after its nap")
	for i := 10; i < 16; i++ {
		d.Post(&CQE{UserData: uint64(i)})
	}
	if err := <-errs; err != nil {
		t.Fatalf("Wait(16): %v", err)
	}
	// The sleep after the nap teaches the learnt gap, not the nap's.
	if g, seen := c.tail.napGap(), want/10; g != 20*time.Microsecond+(seen-20*time.Microsecond)/2 {
		t.Errorf("nap gap %v after a nap that saw 10 in %v, want halfway from 20µs to %v", g, want, seen)
	}
	if len(naps) != 1 || d.WakeCounts.ClientWakes.Load() != 1 {
		t.Errorf("naps %v, %d client wakes; want one nap and one wake-up", naps, d.WakeCounts.ClientWakes.Load())
	}
	end()

	// 15 of 16 come during the nap: the client spins for the last (due
	// within half a behindSpin at the 20 µs gap; the test's clock stands
	// still, so the spin lasts until it comes).
	begin(15)
	sleeps, wakes := c.Sleeps, d.WakeCounts.ClientWakes.Load()
	var reads atomic.Int64
	spinClock = func() time.Time { reads.Add(1); return base.Add(time.Duration(now.Load())) }
	go func() { errs <- c.Wait(16, 10*time.Second) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return napCount.Load() == 1 && reads.Load() >= 4 },
		"the client spinning after its nap")
	d.Post(&CQE{UserData: 15})
	if err := <-errs; err != nil {
		t.Fatalf("Wait(16): %v", err)
	}
	if c.Sleeps != sleeps || d.WakeCounts.ClientWakes.Load() != wakes {
		t.Errorf("%d sleeps and %d client wakes for the one left after a nap, want a spin only",
			c.Sleeps-sleeps, d.WakeCounts.ClientWakes.Load()-wakes)
	}
	end()

	// 14 of 16: the 2 left are due in 40 µs, more than half a behindSpin
	// (the daemon keeps working whatever the client does, and a spin that
	// long costs more than a wake-up): the client sleeps for them at once.
	begin(14)
	sleeps = c.Sleeps
	reads.Store(0)
	go func() { errs <- c.Wait(16, 10*time.Second) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
		"the client sleeping after its nap")
	for i := 14; i < 16; i++ {
		d.Post(&CQE{UserData: uint64(i)})
	}
	if err := <-errs; err != nil {
		t.Fatalf("Wait(16): %v", err)
	}
	if c.Sleeps != sleeps+1 || reads.Load() >= 4 {
		t.Errorf("%d sleeps, %d clock reads for 2 due in 40µs after a nap; want one sleep and no spin",
			c.Sleeps-sleeps, reads.Load())
	}
	end()

	// 15 of 16 come during the nap, and the last only after the spin for
	// it has run out (each read of the clock after the nap moves it on by
	// a quarter of a behindSpin): the client sleeps for it, and the
	// spin, learnt as a tail spin, is backed off as those are (the first
	// miss is forgiven, each next one skips twice as many waits): after
	// two such waits, the next naps, then sleeps at once without spinning.
	runOut := func(spinning bool) {
		t.Helper()
		put(15)
		reads.Store(0)
		spinClock = func() time.Time {
			if napCount.Load() == 1 {
				reads.Add(1)
				now.Add(int64(behindSpin / 4))
			}
			return base.Add(time.Duration(now.Load()))
		}
		go func() { errs <- c.Wait(16, 10*time.Second) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
			"the client sleeping after its nap")
		d.Post(&CQE{UserData: 15})
		if err := <-errs; err != nil {
			t.Fatalf("Wait(16): %v", err)
		}
		if len(naps) != 1 {
			t.Fatalf("naps %v, want one", naps)
		}
		// A spin reads the clock at its start and every 64 polls until
		// it runs out (four reads past its start); without one, the
		// nap's own bookkeeping reads it at most twice.
		if spun := reads.Load() >= 4; spun != spinning {
			t.Fatalf("spun after the nap: %v (%d clock reads), want %v", spun, reads.Load(), spinning)
		}
		end()
	}
	c.tail = tail{gap: 20 * time.Microsecond}
	runOut(true)
	runOut(true)
	if c.tail.skip == 0 {
		t.Fatal("two spins after a nap ran out and backed nothing off")
	}
	runOut(false)
	spinClock = func() time.Time { return base.Add(time.Duration(now.Load())) }

	// No nap: a drained wait (for all 16 in flight); a worker asleep
	// now; one that a Submit since the last wait found asleep.
	for _, tc := range []struct {
		name      string
		inFlight  int
		asleep    bool // FlagNeedWakeup set when the wait begins
		submitted bool // a Submit found it set since the last wait
	}{
		{"drained", 16, false, false},
		{"worker asleep", 32, true, false},
		{"doorbell since the last wait", 32, false, true},
	} {
		c.tail = tail{gap: 20 * time.Microsecond}
		if tc.submitted {
			d.w.sqFlags.Or(FlagNeedWakeup)
		}
		inFlight(t, d, c, tc.inFlight)
		if tc.asleep {
			d.w.sqFlags.Or(FlagNeedWakeup)
		}
		naps = naps[:0]
		go func() { errs <- c.Wait(16, 10*time.Second) }()
		testutil.Eventually(t, 10*time.Second, func() bool { return c.w.cqFlags.Load()&waitBits == waitBits },
			"%s: the client sleeping", tc.name)
		for i := 0; i < tc.inFlight; i++ {
			d.Post(&CQE{UserData: uint64(i)})
		}
		if err := <-errs; err != nil {
			t.Fatalf("%s: Wait(16): %v", tc.name, err)
		}
		if len(naps) != 0 {
			t.Errorf("%s: naps %v", tc.name, naps)
		}
		d.w.sqFlags.And(^FlagNeedWakeup)
		c.Reap(make([]CQE, 64))
	}
}

// TestLongSleepsAreSliced: a client's sleep is futex waits of at most
// sleepSlice each (the Go runtime's monitor polls every 20 µs for a while
// after it takes the processor of a thread 10 ms in one system call),
// stays armed for its wake-up from one slice to the next, and ends when
// the completion comes or once the slices add up to the time left. The
// futex wait is the test's: a slice "passes" when it returns ErrTimeout.
func TestLongSleepsAreSliced(t *testing.T) {
	realSleep := futexSleep
	defer func() { futexSleep = realSleep }()
	var got []time.Duration
	futexSleep = func(w *atomic.Uint32, v uint32, d time.Duration) error {
		got = append(got, d)
		return ErrTimeout
	}
	var word atomic.Uint32
	if err := sleepOn(&word, 0, 23*time.Millisecond); err != ErrTimeout {
		t.Fatalf("a sleep of 23 ms with nothing coming: %v, want ErrTimeout", err)
	}
	ms := time.Millisecond
	if want := []time.Duration{5 * ms, 5 * ms, 5 * ms, 5 * ms, 3 * ms}; !slices.Equal(got, want) {
		t.Fatalf("slices %v, want %v", got, want)
	}

	// Through a client's Wait with no deadline: asleep across slices
	// until the third, during which the completion comes.
	d, c := pair(t, 64, 0, 0)
	c.spin = spinner{} // no spin for a last completion
	inFlight(t, d, c, 1)
	got = got[:0]
	futexSleep = func(w *atomic.Uint32, v uint32, s time.Duration) error {
		got = append(got, s)
		if f := c.w.cqFlags.Load(); f&FlagWaiting == 0 {
			t.Errorf("slice %d: flags %#x, the daemon would not wake the client", len(got), f)
		}
		if len(got) < 3 {
			return ErrTimeout
		}
		d.Post(&CQE{UserData: 7})
		return nil
	}
	if err := c.Wait(1, -1); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if want := []time.Duration{sleepSlice, sleepSlice, sleepSlice}; !slices.Equal(got, want) {
		t.Fatalf("slices %v, want %v", got, want)
	}
	if cqes := make([]CQE, 1); c.Reap(cqes) != 1 || cqes[0].UserData != 7 {
		t.Fatalf("reaped %+v, want the completion posted during the third slice", cqes)
	}
}
