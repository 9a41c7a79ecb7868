package xfer_test

import (
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// ledgerCaller drives xfer.Dispatch without an engine: it owns a table of
// tasks, is their Completer, and counts what the ledger decided for each:
// the Done that claimed it, the Dones refused, and whether Dispatch gave it
// back.
type ledgerCaller struct {
	tasks []xfer.Task
	ptrs  []*xfer.Task
	// Per task, by index (the Dones may come from any goroutine).
	owed, stray, late []atomic.Int32
	slot              map[*xfer.Task]int
}

func newLedgerCaller(n int) *ledgerCaller {
	c := &ledgerCaller{tasks: make([]xfer.Task, n), ptrs: make([]*xfer.Task, n),
		owed: make([]atomic.Int32, n), stray: make([]atomic.Int32, n), late: make([]atomic.Int32, n),
		slot: make(map[*xfer.Task]int, n)}
	for i := range c.tasks {
		t := &c.tasks[i]
		t.SetCompleter(c)
		t.Req = xfer.Request{Op: xfer.OpWrite, Length: uint64(1 + i)}
		c.ptrs[i] = t
		c.slot[t] = i
	}
	return c
}

func (c *ledgerCaller) TaskDone(t *xfer.Task, _ uint64, _ error) {
	i := c.slot[t]
	switch t.ClaimDone() {
	case xfer.DoneOwed:
		c.owed[i].Add(1)
	case xfer.DoneStray:
		c.stray[i].Add(1)
	case xfer.DoneLate:
		c.late[i].Add(1)
	}
}

// reset forgets the counts before the table is dispatched again.
func (c *ledgerCaller) reset() {
	for i := range c.tasks {
		c.owed[i].Store(0)
		c.stray[i].Store(0)
		c.late[i].Store(0)
	}
}

// check fails unless every task of ts was released exactly once: by the
// Done the transport owed, or by the caller that got it back.
func (c *ledgerCaller) check(t *testing.T, what string, ts []*xfer.Task) {
	t.Helper()
	for _, tk := range ts {
		i := c.slot[tk]
		back := 0
		if tk.Undispatched() {
			back = 1
		}
		if got := int(c.owed[i].Load()) + back; got != 1 {
			t.Fatalf("%s: task %d released %d times (owed Dones %d, given back %v)", what, i, got, c.owed[i].Load(), back == 1)
		}
	}
}

// TestDispatchLies: every way a transport can answer a Submit, honest or
// not, through the xfertest double (Config.Lie for its count, its hooks for
// Dones it did not owe): what Dispatch reports, which tasks it gives back,
// and that each task is released exactly once.
func TestDispatchLies(t *testing.T) {
	const n = 4
	cases := []struct {
		name   string
		tr     xfer.Transport
		k      int
		broke  xfer.Breach
		err    error // the error for the tasks given back
		strays int   // Dones refused during the call
	}{
		{name: "all", tr: xfertest.New(xfertest.Config{}), k: n},
		{name: "all inline", tr: xfertest.New(xfertest.Config{Inline: true}), k: n},
		{name: "some", tr: xfertest.New(xfertest.Config{Limit: 3}), k: 3, err: xfertest.ErrInjected},
		{name: "none", tr: xfertest.New(xfertest.Config{Limit: -1, LimitErr: xfer.ErrClosed}), k: 0, err: xfer.ErrClosed},
		{name: "some inline", tr: xfertest.New(xfertest.Config{Limit: 2, Inline: true}), k: 2, err: xfertest.ErrInjected},
		{name: "short without error", k: n - 1, broke: xfer.BadCount, err: xfer.ErrTransport,
			tr: xfertest.New(xfertest.Config{Lie: func(n int, _ error) (int, error) { return n - 1, nil }})},
		{name: "long", k: n, broke: xfer.BadCount, err: xfer.ErrTransport,
			tr: xfertest.New(xfertest.Config{Lie: func(n int, _ error) (int, error) { return n + 1, nil }})},
		{name: "negative", k: 0, broke: xfer.BadCount, err: xfer.ErrTransport,
			tr: xfertest.New(xfertest.Config{Lie: func(int, error) (int, error) { return -1, xfer.ErrClosed }})},
		{name: "full with error", k: n, broke: xfer.BadCount, err: xfer.ErrTransport,
			tr: xfertest.New(xfertest.Config{Inline: true, Lie: func(n int, _ error) (int, error) { return n, xfertest.ErrInjected }})},
		{name: "Done past the count", k: 1, broke: xfer.DoneUndispatched, err: xfertest.ErrInjected,
			tr: xfertest.New(xfertest.Config{Inline: true, OnSubmit: doneFrom(1),
				Lie: func(int, error) (int, error) { return 1, xfertest.ErrInjected }})},
		{name: "second Done", k: n, broke: xfer.SecondDone, err: xfer.ErrTransport, strays: n,
			tr: xfertest.New(xfertest.Config{Inline: true, Err: func(t *xfer.Task) error {
				t.Done(t.Req.Length, nil) // the transport then ends it again
				return nil
			}})},
		{name: "negative after Dones", k: 0, broke: xfer.BadCount, err: xfer.ErrTransport,
			tr: xfertest.New(xfertest.Config{OnSubmit: doneFrom(n - 2),
				Lie: func(int, error) (int, error) { return -1, nil }})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newLedgerCaller(n)
			d := xfer.Dispatch(tc.tr, c.ptrs)
			if d.K != tc.k || d.Broke != tc.broke || d.Kept() != (tc.broke == xfer.Kept) {
				t.Fatalf("Dispatch: %+v, want K %d, %v", d, tc.k, tc.broke)
			}
			if d.K < n && !errors.Is(d.Err, tc.err) {
				t.Fatalf("error for the tasks given back: %v, want %v", d.Err, tc.err)
			}
			strays := 0
			for i, tk := range c.ptrs {
				strays += int(c.stray[i].Load())
				// Given back: exactly the tail the transport did not end.
				if want := i >= d.K && c.owed[i].Load() == 0; tk.Undispatched() != want {
					t.Fatalf("task %d: given back %v, want %v", i, tk.Undispatched(), want)
				}
			}
			if strays != tc.strays {
				t.Fatalf("%d Dones refused during the call, want %d", strays, tc.strays)
			}
			// The transport ends what it still holds: those Dones are the
			// owed ones, and then every task was released once.
			if ft, ok := tc.tr.(*xfertest.Transport); ok {
				ft.Finish()
			}
			c.check(t, tc.name, c.ptrs)
			// A Done now, for any task, is late: it claims nothing.
			c.ptrs[0].Done(0, nil)
			if c.late[0].Load() != 1 {
				t.Fatal("a Done after the call was not refused as late")
			}
			c.check(t, tc.name+", then a late Done", c.ptrs)
		})
	}
}

// doneFrom is a Config.OnSubmit that ends the tasks from i on before the
// transport takes any: Dones for tasks its count will not take.
func doneFrom(i int) func(ts []*xfer.Task) {
	return func(ts []*xfer.Task) {
		for _, t := range ts[i:] {
			t.Done(t.Req.Length, nil)
		}
	}
}

// TestDispatchReclaim: after a broken call the caller takes back what the
// transport still owes; the transport's later Done touches nothing.
func TestDispatchReclaim(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Lie: func(n int, _ error) (int, error) { return n + 1, nil }})
	c := newLedgerCaller(3)
	d := xfer.Dispatch(tr, c.ptrs)
	if d.Kept() {
		t.Fatalf("Dispatch: %+v", d)
	}
	tr.Take(1)[0].Done(1, nil) // ends task 0 before the caller reclaims
	for i, tk := range c.ptrs {
		if got, want := tk.Reclaim(), i != 0; got != want {
			t.Fatalf("task %d: Reclaim %v, want %v", i, got, want)
		}
	}
	if tr.Finish() != 2 {
		t.Fatal("the transport did not hold the other two")
	}
	for i := range c.ptrs {
		if o, l := c.owed[i].Load(), c.late[i].Load(); i == 0 && (o != 1 || l != 0) || i != 0 && (o != 0 || l != 1) {
			t.Fatalf("task %d: %d owed and %d late Dones", i, o, l)
		}
	}
}

// TestDispatchChaos: Dispatch over the chaos transport, which takes a
// random share, ends it inline or later and now and then lies, again and
// again on the same tasks: whatever it does, each task of a call is
// released exactly once, a kept call gives back exactly the tail, and a
// call is reported broken when its count was a lie.
func TestDispatchChaos(t *testing.T) {
	tr := &chaosTr{rng: rand.New(rand.NewPCG(7, 99))}
	c := newLedgerCaller(16)
	rng := rand.New(rand.NewPCG(7, 1))
	broken := 0
	for round := 0; round < 2000; round++ {
		ts := c.ptrs[:1+rng.IntN(len(c.ptrs))]
		c.reset()
		d := xfer.Dispatch(tr, ts)
		if d.N < 0 || d.N > len(ts) {
			if d.Kept() {
				t.Fatalf("round %d: count %d of %d reported kept", round, d.N, len(ts))
			}
		}
		if d.Kept() {
			for i, tk := range ts {
				if tk.Undispatched() != (i >= d.K) {
					t.Fatalf("round %d: kept call of %d, K %d: task %d given back %v", round, len(ts), d.K, i, tk.Undispatched())
				}
			}
		} else {
			broken++
		}
		// The transport gives up everything it holds before the tasks are
		// dispatched again, as an owner would wait for before reusing them.
		tr.mu.Lock()
		held := tr.held
		tr.held = nil
		tr.mu.Unlock()
		for _, tk := range held {
			tk.Done(tk.Req.Length, nil)
		}
		c.check(t, "chaos", ts)
	}
	if broken == 0 {
		t.Fatal("no broken call exercised")
	}
}

// TestDispatchAllocs: a dispatch, its inline Dones and the claims allocate
// nothing.
func TestDispatchAllocs(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Inline: true})
	c := newLedgerCaller(32)
	run := func() {
		if d := xfer.Dispatch(tr, c.ptrs); !d.Kept() || d.K != len(c.ptrs) {
			panic("dispatch not kept")
		}
	}
	run()
	if a := testing.AllocsPerRun(100, run); a != 0 {
		t.Fatalf("%v allocations per dispatch, want 0", a)
	}
}
