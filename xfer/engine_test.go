package xfer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func TestRegistry(t *testing.T) {
	r := xfer.NewRegistry()
	s1, s2 := xfertest.NewSegment(5, 10), xfertest.NewSegment(7, 10)
	if err := r.Add(s1); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(xfertest.NewSegment(5, 1)); !errors.Is(err, xfer.ErrExists) {
		t.Fatalf("duplicate Add: %v, want ErrExists", err)
	}
	if err := r.Add(xfertest.NewSegment(0, 1)); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("zero id Add: %v, want ErrInvalid", err)
	}
	if err := r.Add(nil); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("nil Add: %v, want ErrInvalid", err)
	}
	if err := r.Add(s2); err != nil {
		t.Fatal(err)
	}
	if got := r.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2", got)
	}
	// NextID never hands out an id that was added by hand.
	if id := r.NextID(); id <= 7 {
		t.Fatalf("NextID = %d, want > 7", id)
	}
	a, b := r.NextID(), r.NextID()
	if b <= a {
		t.Fatalf("NextID not monotonic: %d then %d", a, b)
	}
	if s, ok := r.Resolve(5); !ok || s != xfer.Segment(s1) {
		t.Fatalf("Resolve(5) = %v, %v", s, ok)
	}
	if allocs := testing.AllocsPerRun(100, func() { r.Resolve(7) }); allocs != 0 {
		t.Fatalf("Resolve allocates %v times", allocs)
	}
	if s, ok := r.Remove(5); !ok || s != xfer.Segment(s1) {
		t.Fatalf("Remove(5) = %v, %v", s, ok)
	}
	if _, ok := r.Remove(5); ok {
		t.Fatal("second Remove(5) succeeded")
	}
	if _, ok := r.Resolve(5); ok {
		t.Fatal("Resolve after Remove succeeded")
	}
	if got := r.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
}

// TestStatesReached drives a task into each state and checks what Status
// and BatchStatus report.
func TestStatesReached(t *testing.T) {
	var waitingSeen int64 = -1
	var f *fixture
	// While transport a dispatches, the tasks routed to b are Waiting.
	tA := xfertest.New(xfertest.Config{Name: "a", OnSubmit: func([]*xfer.Task) { waitingSeen = f.e.Stats().Waiting }})
	tB := xfertest.New(xfertest.Config{Name: "b"})
	r := xfertest.RouterFunc(func(l, _ xfer.Segment) (xfer.Transport, error) {
		if l.ID() == 1 {
			return tA, nil
		}
		return tB, nil
	})
	f = newFixture(t, xfer.Config{}, r)
	id, err := f.e.AllocateBatch(8)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []xfer.Request{
		{Op: xfer.OpWrite, Local: 1, Target: 2, Length: 8},  // a: completes
		{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 8},  // b: fails
		{Op: 9, Local: 1, Target: 2, Length: 8},             // refused
		{Op: xfer.OpRead, Local: 1, Target: 2, Length: 8},   // a: stays pending, then canceled by Abandon
		{Op: xfer.OpRead, Local: 2, Target: 1, Length: 800}, // b: pending, times out
	}
	res := make([]error, len(reqs))
	if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
		t.Fatal(err)
	}
	if waitingSeen != 2 {
		t.Fatalf("Waiting tasks seen while the first transport dispatched: %d, want 2", waitingSeen)
	}
	if !errors.Is(res[2], xfer.ErrBadOp) || !errors.Is(res[2], xfer.ErrInvalid) || res[0] != nil || res[1] != nil || res[3] != nil || res[4] != nil {
		t.Fatalf("results = %v", res)
	}
	for i := 0; i < 5; i++ {
		want := xfer.StatePending
		if i == 2 {
			want = xfer.StateFailed
		}
		if st := f.status(t, id, i); st.State != want {
			t.Fatalf("task %d: %v, want %v", i, st.State, want)
		}
	}
	// End task 0 (Completed) and task 1 (Failed) by hand.
	if tA.Held() != 2 || tB.Held() != 2 {
		t.Fatalf("held a=%d b=%d, want 2 and 2", tA.Held(), tB.Held())
	}
	t0, t1 := tA.Take(1)[0], tB.Take(1)[0]
	t0.Done(8, nil)
	t1.Done(3, xfertest.ErrInjected)
	if st := f.status(t, id, 0); st.State != xfer.StateCompleted || st.Transferred != 8 || st.Err != nil {
		t.Fatalf("task 0: %+v", st)
	}
	if st := f.status(t, id, 1); st.State != xfer.StateFailed || !errors.Is(st.Err, xfertest.ErrInjected) || st.Transferred != 3 {
		t.Fatalf("task 1: %+v", st)
	}
	// Timeout: the second submit's deadline passes while task 5 is pending.
	res1 := make([]error, 1)
	if err := f.e.Submit(id, []xfer.Request{{Op: xfer.OpRead, Local: 2, Target: 1, Length: 16}},
		xfer.SubmitOptions{Resolver: f.reg, Deadline: time.Now().Add(30 * time.Millisecond)}, res1); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return f.status(t, id, 5).State == xfer.StateTimeout },
		"task 5 timing out")
	if st := f.status(t, id, 5); !errors.Is(st.Err, xfer.ErrTimeout) {
		t.Fatalf("task 5: %+v", st)
	}
	if tB.Cancels() != 1 {
		t.Fatalf("transport b saw %d cancels, want 1", tB.Cancels())
	}
	// Task 4 (first submit, 30 s deadline) is unaffected by the second
	// submit's timer.
	if st := f.status(t, id, 4); st.State != xfer.StatePending {
		t.Fatalf("task 4: %v, want pending", st.State)
	}
	sum, err := f.e.BatchStatus(id)
	if err != nil {
		t.Fatal(err)
	}
	want := xfer.BatchSummary{Total: 6, Pending: 2, Completed: 1, Failed: 2, Timeout: 1, Transferred: 11}
	if sum != want {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
	if err := f.e.Free(id); !errors.Is(err, xfer.ErrBatchBusy) {
		t.Fatalf("Free of a busy batch: %v", err)
	}
	if sum2, _ := f.e.BatchStatus(id); sum2 != want {
		t.Fatalf("busy Free changed the batch: %+v", sum2)
	}
	f.e.Abandon(id)
	if _, err := f.e.Status(id, 0); !errors.Is(err, xfer.ErrBatchNotFound) {
		t.Fatalf("Status after Abandon: %v", err)
	}
	// The abandoned tasks were canceled; the late Dones only release.
	if tA.Cancels() != 1 || tB.Cancels() != 2 {
		t.Fatalf("cancels a=%d b=%d, want 1 and 2", tA.Cancels(), tB.Cancels())
	}
	st := f.e.Stats()
	if st.Canceled != 2 || st.Timeout != 1 || st.Completed != 1 || st.Failed != 2 || st.BatchesRetiring != 1 || st.BatchesLive != 0 {
		t.Fatalf("stats %+v", st)
	}
	tA.Finish()
	tB.Finish()
	xfertest.CheckRefs(t, f.a, f.b)
	if st := f.e.Stats(); st.BatchesRetiring != 0 || st.Canceled != 2 || st.Pending != 0 {
		t.Fatalf("stats after late Dones %+v", st)
	}
}

func TestSubmitRefusals(t *testing.T) {
	tr := syncTr()
	f := newFixture(t, xfer.Config{MaxBatchCapacity: 16}, xfertest.RouteAll(tr))
	if _, err := f.e.AllocateBatch(0); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("AllocateBatch(0): %v", err)
	}
	if _, err := f.e.AllocateBatch(17); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("AllocateBatch(17): %v", err)
	}
	id, err := f.e.AllocateBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	closing := xfertest.NewSegment(3, 64)
	closing.Close()
	if err := f.reg.Add(closing); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		req  xfer.Request
		want error
	}{
		{"bad op", xfer.Request{Op: 0, Local: 1, Target: 2, Length: 1}, xfer.ErrBadOp},
		{"zero length", xfer.Request{Op: xfer.OpRead, Local: 1, Target: 2}, xfer.ErrZeroLength},
		{"unknown local", xfer.Request{Op: xfer.OpRead, Local: 99, Target: 2, Length: 1}, xfer.ErrNoSegment},
		{"unknown target", xfer.Request{Op: xfer.OpRead, Local: 1, Target: 0, Length: 1}, xfer.ErrNoSegment},
		{"closing target", xfer.Request{Op: xfer.OpRead, Local: 1, Target: 3, Length: 1}, xfer.ErrNoSegment},
		{"past end", xfer.Request{Op: xfer.OpRead, Local: 1, LocalOffset: 1 << 16, Target: 2, Length: 1}, xfer.ErrOutOfBounds},
		{"offset overflow", xfer.Request{Op: xfer.OpWrite, Local: 1, Target: 2, TargetOffset: math.MaxUint64, Length: 2}, xfer.ErrOutOfBounds},
		{"length overflow", xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: 8, Target: 2, Length: math.MaxUint64 - 4}, xfer.ErrOutOfBounds},
	}
	for _, c := range cases {
		bid, err := f.e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		res := []error{nil}
		if err := f.e.Submit(bid, []xfer.Request{c.req}, f.opts, res); err != nil {
			t.Fatalf("%s: call error %v", c.name, err)
		}
		if !errors.Is(res[0], c.want) || !errors.Is(res[0], xfer.ErrInvalid) && !errors.Is(res[0], xfer.ErrNoSegment) {
			t.Fatalf("%s: result %v, want %v", c.name, res[0], c.want)
		}
		if st := f.status(t, bid, 0); st.State != xfer.StateFailed || !errors.Is(st.Err, c.want) {
			t.Fatalf("%s: status %+v", c.name, st)
		}
		if err := f.e.Free(bid); err != nil {
			t.Fatal(err)
		}
	}
	xfertest.CheckRefs(t, f.a, f.b, closing)
	if tr.Submits() != 0 {
		t.Fatalf("refused requests reached the transport %d times", tr.Submits())
	}

	// Whole-call errors change nothing.
	res := make([]error, 5)
	if err := f.e.Submit(id, f.reqs(5), f.opts, res); !errors.Is(err, xfer.ErrBatchFull) {
		t.Fatalf("over capacity: %v", err)
	}
	if err := f.e.Submit(id, f.reqs(2), f.opts, res); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("len mismatch: %v", err)
	}
	if err := f.e.Submit(id, f.reqs(2), xfer.SubmitOptions{}, res[:2]); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("no resolver: %v", err)
	}
	if err := f.e.Submit(id, f.reqs(2), xfer.SubmitOptions{Resolver: f.reg, Deadline: time.Now().Add(-time.Second)}, res[:2]); !errors.Is(err, xfer.ErrTimeout) {
		t.Fatalf("past deadline: %v", err)
	}
	for _, bad := range []xfer.BatchID{0, 1, xfer.BatchID(math.MaxUint64), id + 1<<32} {
		if err := f.e.Submit(bad, f.reqs(1), f.opts, res[:1]); !errors.Is(err, xfer.ErrBatchNotFound) {
			t.Fatalf("Submit(%#x): %v", bad, err)
		}
		if _, err := f.e.Status(bad, 0); !errors.Is(err, xfer.ErrBatchNotFound) {
			t.Fatalf("Status(%#x): %v", bad, err)
		}
		if _, err := f.e.Wait(bad, time.Time{}); !errors.Is(err, xfer.ErrBatchNotFound) {
			t.Fatalf("Wait(%#x): %v", bad, err)
		}
		if err := f.e.Free(bad); !errors.Is(err, xfer.ErrBatchNotFound) {
			t.Fatalf("Free(%#x): %v", bad, err)
		}
		f.e.Abandon(bad)
	}
	if sum, _ := f.e.BatchStatus(id); sum != (xfer.BatchSummary{}) {
		t.Fatalf("refused calls changed the batch: %+v", sum)
	}
	if _, err := f.e.Status(id, 0); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("Status past Total: %v", err)
	}
	if _, err := f.e.Status(id, -1); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("Status(-1): %v", err)
	}
	// Capacity is exact: 4 fit, the 5th does not.
	if err := f.e.Submit(id, f.reqs(4), f.opts, res[:4]); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Submit(id, f.reqs(1), f.opts, res[:1]); !errors.Is(err, xfer.ErrBatchFull) {
		t.Fatalf("one past capacity: %v", err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); !errors.Is(err, xfer.ErrBatchNotFound) {
		t.Fatalf("double Free: %v", err)
	}
	xfertest.CheckRefs(t, f.a, f.b)

	// A router error refuses the request with that error.
	g := newFixture(t, xfer.Config{}, xfertest.RefuseAll(xfer.ErrNotSupported))
	bid, _ := g.e.AllocateBatch(1)
	if err := g.e.Submit(bid, g.reqs(1), g.opts, res[:1]); err != nil || !errors.Is(res[0], xfer.ErrNotSupported) {
		t.Fatalf("router refusal: %v, %v", err, res[0])
	}
	xfertest.CheckRefs(t, g.a, g.b)
}

func TestBatchLimitAndReuse(t *testing.T) {
	f := newFixture(t, xfer.Config{MaxBatches: 2}, xfertest.RouteAll(syncTr()))
	a, err := f.e.AllocateBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.AllocateBatch(4); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.AllocateBatch(4); !errors.Is(err, xfer.ErrBatchLimit) {
		t.Fatalf("third batch: %v", err)
	}
	if err := f.e.Free(a); err != nil {
		t.Fatal(err)
	}
	c, err := f.e.AllocateBatch(8) // grows the recycled table
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Fatal("a recycled slot handed out the freed id again")
	}
	if _, err := f.e.Status(a, 0); !errors.Is(err, xfer.ErrBatchNotFound) {
		t.Fatalf("old id after reuse: %v", err)
	}
	res := make([]error, 8)
	if err := f.e.Submit(c, f.reqs(8), f.opts, res); err != nil {
		t.Fatal(err)
	}
	if sum, _ := f.e.Wait(c, time.Time{}); sum.Completed != 8 || sum.Total != 8 || sum.Transferred != 8*64 {
		t.Fatalf("summary %+v", sum)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestTimeoutLateDone: a timed-out batch ends in Timeout without hanging,
// and its slot is not reused until the transport's late Done arrives.
func TestTimeoutLateDone(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{MaxBatches: 1, DefaultTimeout: 40 * time.Millisecond}, xfertest.RouteAll(tr))
	id, _ := f.e.AllocateBatch(16)
	res := make([]error, 16)
	if err := f.e.Submit(id, f.reqs(16), f.opts, res); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sum, err := f.e.Wait(id, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Timeout != 16 || sum.Pending != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("timeout took %v", el)
	}
	if tr.Cancels() != 16 {
		t.Fatalf("%d cancels, want 16", tr.Cancels())
	}
	// The transport still owes 16 Dones: refs stay held.
	if f.a.Refs() != 16 {
		t.Fatalf("refs %d before the late Dones, want 16", f.a.Refs())
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.AllocateBatch(1); !errors.Is(err, xfer.ErrBatchLimit) {
		t.Fatalf("slot reused while Dones are owed: %v", err)
	}
	tr.Finish() // late: must only release
	xfertest.CheckRefs(t, f.a, f.b)
	st := f.e.Stats()
	if st.Timeout != 16 || st.Completed != 0 || st.BatchesRetiring != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := f.e.AllocateBatch(1); err != nil {
		t.Fatalf("slot not recycled after the late Dones: %v", err)
	}
}

func TestWaitDeadline(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	id, _ := f.e.AllocateBatch(2)
	res := make([]error, 2)
	if err := f.e.Submit(id, f.reqs(2), f.opts, res); err != nil {
		t.Fatal(err)
	}
	sum, err := f.e.Wait(id, time.Now().Add(20*time.Millisecond))
	if !errors.Is(err, xfer.ErrTimeout) || sum.Pending != 2 {
		t.Fatalf("Wait: %+v, %v", sum, err)
	}
	if st := f.status(t, id, 0); st.State != xfer.StatePending {
		t.Fatalf("a Wait timeout changed a task: %v", st.State)
	}
	// A waiter is woken by the last completion, not by polling: it parks
	// once, with both tasks pending and no deadline, so only a wake-up
	// can end its sleep; the first completion leaves it asleep (the batch
	// is still live); the last one takes it off the batch's waiters before
	// it returns, and the waiter returns without parking again.
	parked := make(chan xfer.BatchID, 8)
	xfer.SetWaitParked(f.e, func(b xfer.BatchID) { parked <- b })
	done := make(chan xfer.BatchSummary, 1)
	go func() {
		s, _ := f.e.Wait(id, time.Time{})
		done <- s
	}()
	select {
	case b := <-parked:
		if b != id {
			t.Fatalf("parked on batch %#x, want %#x", b, id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter never parked")
	}
	ts := tr.Take(-1)
	if len(ts) != 2 {
		t.Fatalf("%d tasks held, want 2", len(ts))
	}
	ts[0].Done(64, nil)
	select {
	case s := <-done:
		t.Fatalf("waiter returned %+v with a task still pending", s)
	default:
	}
	if n, err := xfer.Waiters(f.e, id); n != 1 || err != nil {
		t.Fatalf("%d waiters asleep after the first completion (%v), want 1", n, err)
	}
	ts[1].Done(64, nil)
	if n, err := xfer.Waiters(f.e, id); n != 0 || err != nil {
		t.Fatalf("%d waiters still asleep when the last completion returned (%v), want it woken", n, err)
	}
	select {
	case s := <-done:
		if s.Completed != 2 {
			t.Fatalf("woken with %+v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken by the last completion")
	}
	if n := len(parked); n != 0 {
		t.Fatalf("the waiter parked %d more times: woken before the last completion", n)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestRollback: a transport that dispatches k of n and then fails, for
// every k, ending the dispatched tasks inside Submit or later, with and
// without a racing Close.
func TestRollback(t *testing.T) {
	const n = 8
	for _, inline := range []bool{true, false} {
		for _, race := range []bool{false, true} {
			for k := 0; k <= n; k++ {
				tr := xfertest.New(xfertest.Config{Limit: takeAtMost(k), Inline: inline})
				f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
				id, _ := f.e.AllocateBatch(n)
				res := make([]error, n)
				var wg sync.WaitGroup
				var closeTook time.Duration
				if race {
					wg.Add(1)
					go func() {
						defer wg.Done()
						s := time.Now()
						f.e.Close()
						closeTook = time.Since(s)
					}()
				}
				err := f.e.Submit(id, f.reqs(n), f.opts, res)
				wg.Wait()
				if race && closeTook > time.Second {
					t.Fatalf("k=%d: Close took %v", k, closeTook)
				}
				if err != nil {
					if !race || !errors.Is(err, xfer.ErrClosed) {
						t.Fatalf("k=%d inline=%v: Submit: %v", k, inline, err)
					}
					xfertest.CheckRefs(t, f.a, f.b)
					continue
				}
				// The owner closes the transports after the engine.
				f.e.Close()
				tr.Close()
				xfertest.CheckRefs(t, f.a, f.b)
				sum, err := f.e.Wait(id, time.Now().Add(5*time.Second))
				if err != nil {
					t.Fatalf("k=%d: Wait: %v", k, err)
				}
				if sum.Completed+sum.Failed+sum.Canceled+sum.Timeout != n || sum.Waiting+sum.Pending != 0 {
					t.Fatalf("k=%d inline=%v race=%v: summary %+v", k, inline, race, sum)
				}
				for i := 0; i < n; i++ {
					st := f.status(t, id, i)
					if !st.State.Terminal() {
						t.Fatalf("k=%d: task %d %v", k, i, st.State)
					}
					if i >= k && (st.State != xfer.StateFailed || !errors.Is(st.Err, xfertest.ErrInjected)) {
						t.Fatalf("k=%d: undispatched task %d: %+v", k, i, st)
					}
					if i < k && inline && st.State != xfer.StateCompleted {
						t.Fatalf("k=%d: dispatched task %d: %+v", k, i, st)
					}
				}
				if !race && !inline && sum.Canceled != k {
					t.Fatalf("k=%d: Close canceled %d, want %d", k, sum.Canceled, k)
				}
				if err := f.e.Free(id); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestContractViolations: a transport that answers with a wrong count, or
// ends a task twice, fails the whole call and never reports a success.
func TestContractViolations(t *testing.T) {
	const n = 4
	all := func(l int) int { return l }
	neg := func(int) int { return -1 }
	// Each transport ends the tasks it takes inside Submit: Lie alone takes
	// what it reports (clamped to 0..len); with Disown it takes what Limit
	// lets through (all without one) whatever it reports.
	cases := []struct {
		name string
		cfg  xfertest.Config
	}{
		{"too few, nil error", xfertest.Config{Lie: says(func(l int) int { return l - 1 }, nil)}},
		{"too many", xfertest.Config{Lie: says(func(l int) int { return l + 1 }, nil)}},
		{"negative", xfertest.Config{Lie: says(neg, nil)}},
		{"negative after Dones", xfertest.Config{Limit: 2, Disown: true, Lie: says(neg, nil)}},
		{"all with error", xfertest.Config{Lie: says(all, xfertest.ErrInjected)}},
		{"second Done", xfertest.Config{Err: func(t *xfer.Task) error {
			t.Done(t.Req.Length, nil) // the transport then ends it again
			return nil
		}}},
		{"Done past the count", xfertest.Config{Disown: true, Lie: says(func(int) int { return 1 }, xfertest.ErrInjected)}},
	}
	for _, c := range cases {
		logs := &countHandler{}
		c.cfg.Name, c.cfg.Inline = "liar", true
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(xfertest.New(c.cfg)), withLog(slog.New(logs)))
		id, _ := f.e.AllocateBatch(n)
		res := make([]error, n)
		err := f.e.Submit(id, f.reqs(n), f.opts, res)
		if !errors.Is(err, xfer.ErrTransport) {
			t.Fatalf("%s: Submit: %v, want ErrTransport", c.name, err)
		}
		if got := logs.errors.Load(); got != 1 {
			t.Fatalf("%s: %d error records logged, want 1", c.name, got)
		}
		sum, err := f.e.Wait(id, time.Now().Add(time.Second))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if sum.Failed != n || sum.Completed != 0 {
			t.Fatalf("%s: summary %+v, want all %d Failed", c.name, sum, n)
		}
		for i := 0; i < n; i++ {
			if st := f.status(t, id, i); st.State != xfer.StateFailed || st.Err == nil {
				t.Fatalf("%s: task %d %+v", c.name, i, st)
			}
		}
		if v := f.e.Stats().Violations; v == 0 {
			t.Fatalf("%s: violation not counted", c.name)
		}
		xfertest.CheckRefs(t, f.a, f.b)
		if err := f.e.Free(id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLateSecondDone: a second Done after the call returned is counted
// and ignored; refs are not released twice.
func TestLateSecondDone(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	id, _ := f.e.AllocateBatch(1)
	res := make([]error, 1)
	if err := f.e.Submit(id, f.reqs(1), f.opts, res); err != nil {
		t.Fatal(err)
	}
	task := tr.Take(1)[0]
	task.Done(64, nil)
	task.Done(1, xfertest.ErrInjected)
	xfertest.CheckRefs(t, f.a, f.b)
	if st := f.status(t, id, 0); st.State != xfer.StateCompleted {
		t.Fatalf("second Done changed the state: %+v", st)
	}
	if f.e.Stats().Violations != 1 {
		t.Fatalf("violations %d", f.e.Stats().Violations)
	}
}

func TestAbandonAndClose(t *testing.T) {
	tr := xfertest.New(xfertest.Config{CancelEnds: true})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	a, _ := f.e.AllocateBatch(4)
	b, _ := f.e.AllocateBatch(4)
	res := make([]error, 4)
	for _, id := range []xfer.BatchID{a, b} {
		if err := f.e.Submit(id, f.reqs(4), f.opts, res); err != nil {
			t.Fatal(err)
		}
	}
	f.e.Abandon(a)
	if err := f.e.Free(a); !errors.Is(err, xfer.ErrBatchNotFound) {
		t.Fatalf("Free after Abandon: %v", err)
	}
	if tr.Cancels() != 4 || tr.Held() != 4 {
		t.Fatalf("cancels %d held %d", tr.Cancels(), tr.Held())
	}
	parked := make(chan struct{}, 1)
	xfer.SetWaitParked(f.e, func(xfer.BatchID) { parked <- struct{}{} })
	waited := make(chan error)
	go func() {
		_, err := f.e.Wait(b, time.Time{})
		waited <- err
	}()
	select { // Close must wake a sleeping waiter
	case <-parked:
	case <-time.After(5 * time.Second):
		t.Fatal("waiter never parked")
	}
	start := time.Now()
	if err := f.e.Close(); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Close took %v", el)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Wait across Close: %v", err)
	}
	for i := 0; i < 4; i++ {
		if st := f.status(t, b, i); st.State != xfer.StateCanceled || !errors.Is(st.Err, xfer.ErrClosed) {
			t.Fatalf("task %d after Close: %+v", i, st)
		}
	}
	if _, err := f.e.AllocateBatch(1); !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("AllocateBatch after Close: %v", err)
	}
	if err := f.e.Submit(b, f.reqs(1), f.opts, res[:1]); !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if err := f.e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(b); err != nil {
		t.Fatal(err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
	if st := f.e.Stats(); st.Canceled != 8 || st.BatchesLive != 0 || st.BatchesRetiring != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGroupingOrder: tasks reach each transport in request order.
func TestGroupingOrder(t *testing.T) {
	var trs []*xfertest.Transport
	for range 3 {
		trs = append(trs, xfertest.New(xfertest.Config{Inline: true, Record: true}))
	}
	r := xfertest.RouterFunc(func(l, tg xfer.Segment) (xfer.Transport, error) {
		return trs[(l.ID()+tg.ID())%3], nil
	})
	f := newFixture(t, xfer.Config{}, r)
	for id := xfer.SegmentID(3); id <= 5; id++ {
		if err := f.reg.Add(xfertest.NewSegment(id, 1<<10)); err != nil {
			t.Fatal(err)
		}
	}
	var reqs []xfer.Request
	for i := 0; i < 60; i++ {
		reqs = append(reqs, xfer.Request{Op: xfer.OpRead, Local: xfer.SegmentID(1 + i%5), Target: xfer.SegmentID(1 + (i/5)%5), Length: uint64(i + 1)})
	}
	id, _ := f.e.AllocateBatch(len(reqs))
	res := make([]error, len(reqs))
	if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
		t.Fatal(err)
	}
	total := 0
	for ti, tr := range trs {
		if tr.Submits() != 1 {
			t.Fatalf("transport %d: %d Submit calls, want 1", ti, tr.Submits())
		}
		last := uint64(0)
		for _, q := range tr.Requests() {
			if (q.Local+q.Target)%3 != xfer.SegmentID(ti) || q.Length <= last {
				t.Fatalf("transport %d got %+v after length %d", ti, q, last)
			}
			last = q.Length
		}
		total += len(tr.Requests())
	}
	if total != len(reqs) {
		t.Fatalf("%d requests dispatched, want %d", total, len(reqs))
	}
	if sum, _ := f.e.Wait(id, time.Time{}); sum.Completed != len(reqs) {
		t.Fatalf("summary %+v", sum)
	}
}

// TestSteadyStateAllocs: Allocate+Submit+Status+Wait+Free on a reused
// batch table allocates nothing.
func TestSteadyStateAllocs(t *testing.T) {
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	reqs := f.reqs(64)
	res := make([]error, len(reqs))
	run := func() {
		id, err := f.e.AllocateBatch(len(reqs))
		if err != nil {
			panic(err)
		}
		if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
			panic(err)
		}
		for i := range reqs {
			if st, _ := f.e.Status(id, i); st.State != xfer.StateCompleted {
				panic(st.State)
			}
		}
		if s, err := f.e.Wait(id, time.Now().Add(time.Second)); err != nil || s.Completed != len(reqs) {
			panic(err)
		}
		if err := f.e.Free(id); err != nil {
			panic(err)
		}
	}
	run()
	if a := testing.AllocsPerRun(200, run); a != 0 {
		t.Fatalf("steady state allocates %v times per batch of %d", a, len(reqs))
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestConcurrentStress runs many clients against one engine with tasks
// that complete, fail, time out or get abandoned on other goroutines.
func TestConcurrentStress(t *testing.T) {
	tr := xfertest.New(xfertest.Config{CancelEnds: true})
	f := newFixture(t, xfer.Config{MaxBatches: 8, DefaultTimeout: 20 * time.Millisecond}, xfertest.RouteAll(tr))
	stop := make(chan struct{})
	var finisher sync.WaitGroup
	finisher.Add(1)
	go func() {
		defer finisher.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if i%3 == 0 {
				tr.Fail(xfertest.ErrInjected)
			} else {
				tr.Finish()
			}
		}
	}()
	var clients sync.WaitGroup
	for c := 0; c < 6; c++ {
		clients.Add(1)
		go func() {
			defer clients.Done()
			res := make([]error, 8)
			for i := 0; i < 60; i++ {
				id, err := f.e.AllocateBatch(16)
				if errors.Is(err, xfer.ErrBatchLimit) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				for j := 0; j < 2; j++ {
					if err := f.e.Submit(id, f.reqs(8), f.opts, res); err != nil {
						t.Error(err)
					}
				}
				if i%5 == 0 {
					f.e.Abandon(id)
					continue
				}
				sum, err := f.e.Wait(id, time.Time{})
				if err != nil || sum.Total != 16 || sum.Completed+sum.Failed+sum.Timeout+sum.Canceled != 16 {
					t.Errorf("Wait: %+v %v", sum, err)
				}
				if err := f.e.Free(id); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	clients.Wait()
	close(stop)
	finisher.Wait()
	f.e.Close()
	tr.Close()
	xfertest.CheckRefs(t, f.a, f.b)
	st := f.e.Stats()
	if st.BatchesLive != 0 || st.BatchesRetiring != 0 || st.Pending != 0 || st.Waiting != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRegistryConcurrent(t *testing.T) {
	r := xfer.NewRegistry()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				id := r.NextID()
				if err := r.Add(xfertest.NewSegment(id, 1)); err != nil {
					t.Error(err)
					return
				}
				if s, ok := r.Resolve(id); !ok || s.ID() != id {
					t.Errorf("Resolve(%d) = %v, %v", id, s, ok)
				}
				if i%2 == 0 {
					if _, ok := r.Remove(id); !ok {
						t.Errorf("Remove(%d) failed", id)
					}
				}
			}
		}()
	}
	wg.Wait()
	if r.Len() != 400 {
		t.Fatalf("Len = %d, want 400", r.Len())
	}
}

func TestNilRouter(t *testing.T) {
	f := newFixture(t, xfer.Config{}, nil)
	id, _ := f.e.AllocateBatch(1)
	res := make([]error, 1)
	if err := f.e.Submit(id, f.reqs(1), f.opts, res); err != nil || !errors.Is(res[0], xfer.ErrNotSupported) {
		t.Fatalf("nil router: %v, %v", err, res[0])
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

func TestTableShrink(t *testing.T) {
	f := newFixture(t, xfer.Config{MaxBatches: 1}, xfertest.RouteAll(syncTr()))
	id, _ := f.e.AllocateBatch(4 * xfer.ShrinkTasks)
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	id, _ = f.e.AllocateBatch(16)
	if c, err := xfer.TaskTableCap(f.e, id); c != 16 || err != nil {
		t.Fatalf("table of %d tasks kept for a batch of 16 (%v)", c, err)
	}
	res := make([]error, 16)
	if err := f.e.Submit(id, f.reqs(16), f.opts, res); err != nil {
		t.Fatal(err)
	}
	if s, _ := f.e.Wait(id, time.Time{}); s.Completed != 16 {
		t.Fatalf("summary %+v", s)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	// A modestly larger table is kept.
	id, _ = f.e.AllocateBatch(8)
	if c, err := xfer.TaskTableCap(f.e, id); c != 16 || err != nil {
		t.Fatalf("table of 16 not reused: %d (%v)", c, err)
	}
	_ = f.e.Free(id)
}

// countHandler counts the error records logged.
type countHandler struct{ errors atomic.Int64 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.errors.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// TestTaintedBatchNotReused: after a contract violation the batch's task
// memory is never handed to a new batch, so Dones the broken transport
// makes later cannot touch anyone else's tasks.
func TestTaintedBatchNotReused(t *testing.T) {
	// The liar holds every task but reports -1: it breaks the contract and
	// keeps tasks the engine rolled back.
	liar := xfertest.New(xfertest.Config{Name: "hold-liar", Disown: true, Lie: says(func(int) int { return -1 }, nil)})
	good := xfertest.New(xfertest.Config{})
	var tr xfer.Transport = liar
	f := newFixture(t, xfer.Config{MaxBatches: 1}, xfertest.RouterFunc(func(_, _ xfer.Segment) (xfer.Transport, error) { return tr, nil }))
	id, _ := f.e.AllocateBatch(4)
	res := make([]error, 4)
	if err := f.e.Submit(id, f.reqs(4), f.opts, res); !errors.Is(err, xfer.ErrTransport) {
		t.Fatalf("Submit: %v", err)
	}
	xfertest.CheckRefs(t, f.a, f.b) // rolled back: none was taken by the count
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	tr = good
	id2, err := f.e.AllocateBatch(4)
	if err != nil {
		t.Fatalf("slot not returned: %v", err)
	}
	if id2 == id {
		t.Fatal("the tainted batch's id was handed out again")
	}
	if err := f.e.Submit(id2, f.reqs(4), f.opts, res); err != nil {
		t.Fatal(err)
	}
	fresh := good.Take(-1)
	for _, old := range liar.Take(-1) {
		if slices.Contains(fresh, old) {
			t.Fatal("a tainted task was reused")
		}
		old.Done(64, nil) // late and unowned: counted, ignored
	}
	for i := 0; i < 4; i++ {
		if st := f.status(t, id2, i); st.State != xfer.StatePending {
			t.Fatalf("new batch task %d: %v", i, st.State)
		}
	}
	if f.a.Refs() != 4 || f.a.Underflowed() {
		t.Fatalf("refs %d, want 4 (the new batch's)", f.a.Refs())
	}
	for _, tk := range fresh {
		tk.Done(tk.Req.Length, nil)
	}
	if s, _ := f.e.Wait(id2, time.Time{}); s.Completed != 4 {
		t.Fatalf("summary %+v", s)
	}
	xfertest.CheckRefs(t, f.a, f.b)
	if v := f.e.Stats().Violations; v != 5 {
		t.Fatalf("violations %d, want 5 (the count and 4 unowned Dones)", v)
	}
}

// TestSleepingWaitAllocs: with completions on another goroutine, the
// steady-state Submit + Wait (sleeping, with and without a deadline) +
// Free cycle allocates nothing. The tasks end only once Wait has parked,
// so every Wait sleeps.
func TestSleepingWaitAllocs(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	parked := make(chan struct{}, 1)
	xfer.SetWaitParked(f.e, func(xfer.BatchID) { parked <- struct{}{} })
	stop := make(chan struct{})
	var done sync.WaitGroup
	done.Add(1)
	go func() { // the transport's completions, each after the waiter parked
		defer done.Done()
		for {
			select {
			case <-parked:
				tr.Finish()
			case <-stop:
				return
			}
		}
	}()
	defer func() {
		close(stop)
		done.Wait()
	}()
	reqs := f.reqs(4)
	res := make([]error, len(reqs))
	for _, withDeadline := range []bool{false, true} {
		run := func() {
			id, err := f.e.AllocateBatch(len(reqs))
			if err != nil {
				panic(err)
			}
			if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
				panic(err)
			}
			var dl time.Time
			if withDeadline {
				dl = time.Now().Add(10 * time.Second)
			}
			if s, err := f.e.Wait(id, dl); err != nil || s.Completed != len(reqs) {
				panic(fmt.Sprint(s, err))
			}
			if err := f.e.Free(id); err != nil {
				panic(err)
			}
		}
		run()
		// The race detector makes sync.Pool drop a share of what is put
		// back, so there a pooled timer is sometimes made anew.
		limit := 0.0
		if invariants.RaceEnabled {
			limit = 1
		}
		if a := testing.AllocsPerRun(50, run); a > limit {
			t.Errorf("deadline=%v: %v allocations per batch, want <= %v", withDeadline, a, limit)
		}
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestAbandonThen: released runs once no transport owes a Done for the
// batch (not while a timed-out task may still land), exactly once, at once
// when nothing is owed, never for an unknown id nor for a batch a
// transport broke the dispatch contract on.
func TestAbandonThen(t *testing.T) {
	t.Run("late Dones", func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{})
		f := newFixture(t, xfer.Config{MaxBatches: 1, DefaultTimeout: 20 * time.Millisecond}, xfertest.RouteAll(tr))
		id, _ := f.e.AllocateBatch(4)
		res := make([]error, 4)
		if err := f.e.Submit(id, f.reqs(4), f.opts, res); err != nil {
			t.Fatal(err)
		}
		if sum, err := f.e.Wait(id, time.Now().Add(10*time.Second)); err != nil || sum.Timeout != 4 {
			t.Fatalf("Wait: %+v, %v", sum, err)
		}
		var runs atomic.Int32
		if !f.e.AbandonThen(id, func() { runs.Add(1) }) {
			t.Fatal("AbandonThen: id unknown")
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("released ran %d times with 4 Dones owed", n)
		}
		for _, task := range tr.Take(3) { // three late Dones: one still owed
			task.Done(0, xfer.ErrCanceled)
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("released ran %d times with 1 Done owed", n)
		}
		tr.Finish() // the last one
		if n := runs.Load(); n != 1 {
			t.Fatalf("released ran %d times after the last Done, want 1", n)
		}
		// The slot is reused; the next batch's end does not run it again.
		id2, err := f.e.AllocateBatch(1)
		if err != nil {
			t.Fatalf("slot not recycled: %v", err)
		}
		if err := f.e.Submit(id2, f.reqs(1), f.opts, res[:1]); err != nil {
			t.Fatal(err)
		}
		tr.Finish()
		f.e.Abandon(id2)
		if n := runs.Load(); n != 1 {
			t.Fatalf("released ran %d times, want 1", n)
		}
	})
	t.Run("nothing owed", func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{Inline: true})
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
		id, _ := f.e.AllocateBatch(2)
		res := make([]error, 2)
		if err := f.e.Submit(id, f.reqs(2), f.opts, res); err != nil {
			t.Fatal(err)
		}
		ran := false
		f.e.AbandonThen(id, func() { ran = true })
		if !ran {
			t.Fatal("released did not run at once with nothing owed")
		}
		if f.e.AbandonThen(id, func() { t.Error("released ran for a freed id") }) {
			t.Fatal("AbandonThen took a freed id")
		}
	})
	t.Run("contract broken", func(t *testing.T) {
		// The liar holds every task but reports -1: it may touch them at
		// any time, so the memory they name is lost.
		liar := xfertest.New(xfertest.Config{Name: "hold-liar", Disown: true, Lie: says(func(int) int { return -1 }, nil)})
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(liar), withLog(slog.New(&countHandler{})))
		id, _ := f.e.AllocateBatch(2)
		res := make([]error, 2)
		if err := f.e.Submit(id, f.reqs(2), f.opts, res); !errors.Is(err, xfer.ErrTransport) {
			t.Fatalf("Submit: %v", err)
		}
		var runs atomic.Int32
		f.e.AbandonThen(id, func() { runs.Add(1) })
		for _, task := range liar.Take(-1) {
			task.Done(0, xfer.ErrCanceled)
		}
		if n := runs.Load(); n != 0 {
			t.Fatalf("released ran %d times for a batch a transport broke the contract on", n)
		}
	})
}
