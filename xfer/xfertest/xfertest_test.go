package xfertest_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// ends records every Done of the tasks it completes and fails the test on
// a second one.
type ends struct {
	t   testing.TB
	mu  sync.Mutex // guards got
	got map[*xfer.Task]end
}

type end struct {
	n   uint64
	err error
}

func newEnds(t testing.TB) *ends { return &ends{t: t, got: map[*xfer.Task]end{}} }

func (e *ends) TaskDone(t *xfer.Task, n uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.got[t]; dup {
		e.t.Errorf("task %+v ended twice", t.Req)
	}
	e.got[t] = end{n, err}
}

func (e *ends) of(t *xfer.Task) (end, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.got[t]
	return r, ok
}

func (e *ends) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.got)
}

// tasks returns n tasks of lengths 1..n reporting to e, between a and b.
func tasks(e *ends, a, b *xfertest.Segment, n int) []*xfer.Task {
	ts := make([]*xfer.Task, n)
	for i := range ts {
		ts[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Local: a.ID(), LocalOffset: uint64(i),
			Target: b.ID(), TargetOffset: uint64(i), Length: uint64(i + 1)}, Local: a, Target: b}
		ts[i].SetCompleter(e)
	}
	return ts
}

func TestHoldFinishFailTake(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	e := newEnds(t)
	tr := xfertest.New(xfertest.Config{Name: "held", Record: true})
	if tr.Name() != "held" || xfertest.New(xfertest.Config{}).Name() != "xfertest" {
		t.Fatalf("names %q", tr.Name())
	}
	ts := tasks(e, a, b, 6)
	if n, err := tr.Submit(ts); n != 6 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	select {
	case <-tr.Holding():
	default:
		t.Fatal("no Holding signal after a Submit held tasks")
	}
	if tr.Held() != 6 || e.count() != 0 {
		t.Fatalf("held %d, ended %d: a holding transport ended tasks in Submit", tr.Held(), e.count())
	}
	took := tr.Take(2)
	if len(took) != 2 || took[0] != ts[0] || took[1] != ts[1] || tr.Held() != 4 {
		t.Fatalf("Take(2) = %v, %d left", took, tr.Held())
	}
	if n := tr.Fail(nil); n != 4 {
		t.Fatalf("Fail ended %d, want 4", n)
	}
	for _, tk := range ts[2:] {
		if r, ok := e.of(tk); !ok || r.n != 0 || !errors.Is(r.err, xfertest.ErrInjected) {
			t.Fatalf("failed task %d: %+v, %v", tk.Req.Length, r, ok)
		}
	}
	if _, ok := e.of(ts[0]); ok {
		t.Fatal("a taken task was ended by the transport")
	}
	took[0].Done(1, nil)
	took[1].Done(2, nil)
	if tr.Ended() != 4 {
		t.Fatalf("Ended = %d, want 4 (taken tasks are the test's)", tr.Ended())
	}
	// Finish carries tasks out with Move, newest first with LIFO.
	var order []uint64
	tr.Update(func(c *xfertest.Config) {
		c.LIFO = true
		c.Move = func(t *xfer.Task) (uint64, error) { order = append(order, t.Req.Length); return 7, nil }
	})
	more := tasks(e, a, b, 3)
	if n, err := tr.Submit(more); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	if n := tr.Finish(); n != 3 || len(order) != 3 || order[0] != 3 || order[2] != 1 {
		t.Fatalf("Finish ended %d in order %v, want 3 newest first", n, order)
	}
	if r, _ := e.of(more[1]); r.n != 7 || r.err != nil {
		t.Fatalf("finished task: %+v, want Move's 7", r)
	}
	if reqs := tr.Requests(); len(reqs) != 9 || reqs[6] != more[0].Req {
		t.Fatalf("recorded %d requests", len(reqs))
	}
	if tr.Submits() != 2 || tr.Finish() != 0 {
		t.Fatalf("Submits = %d", tr.Submits())
	}
}

func TestInlineLimitLieHold(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	e := newEnds(t)
	tr := xfertest.New(xfertest.Config{Inline: true, Limit: 3,
		Hold: func(t *xfer.Task) bool { return t.Req.Length == 2 },
		Err: func(t *xfer.Task) error {
			if t.Req.Length == 3 {
				return xfer.ErrFault
			}
			return nil
		}})
	ts := tasks(e, a, b, 5)
	n, err := tr.Submit(ts)
	if n != 3 || !errors.Is(err, xfertest.ErrInjected) {
		t.Fatalf("Submit = %d, %v; want 3 and ErrInjected", n, err)
	}
	if r, ok := e.of(ts[0]); !ok || r.n != 1 || r.err != nil {
		t.Fatalf("inline task: %+v %v", r, ok)
	}
	if r, _ := e.of(ts[2]); !errors.Is(r.err, xfer.ErrFault) || r.n != 0 {
		t.Fatalf("Err's task: %+v", r)
	}
	if _, ok := e.of(ts[1]); ok || tr.Held() != 1 {
		t.Fatalf("the task Hold picks was not held: held %d", tr.Held())
	}
	for _, tk := range ts[3:] {
		if _, ok := e.of(tk); ok {
			t.Fatal("a task past the limit was ended")
		}
	}
	tr.Finish()
	// No task is taken: Limit < 0, with the error asked for.
	tr.Update(func(c *xfertest.Config) { c.Limit, c.LimitErr = -1, xfer.ErrClosed })
	if n, err := tr.Submit(ts[3:]); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Limit -1: %d, %v", n, err)
	}
	// Lie says one more than it took: the transport takes what fits.
	tr.Update(func(c *xfertest.Config) {
		c.Limit, c.Lie = 0, func(n int, err error) (int, error) { return n + 1, nil }
	})
	if n, err := tr.Submit(ts[3:]); n != 3 || err != nil || e.count() != 5 {
		t.Fatalf("Lie: %d, %v, %d ended", n, err, e.count())
	}

	var after []int
	tr.Update(func(c *xfertest.Config) {
		c.Lie = nil
		c.OnSubmit = func(ts []*xfer.Task) { after = append(after, -len(ts)) }
		c.AfterSubmit = func() { after = append(after, e.count()) }
	})
	// Of the two, Hold keeps the one of length 2: 6 ended when AfterSubmit runs.
	if n, _ := tr.Submit(tasks(e, a, b, 2)); n != 2 || len(after) != 2 || after[0] != -2 || after[1] != 6 {
		t.Fatalf("hooks saw %v, want [-2 6]", after)
	}
	// With Disown the transport takes what Limit lets through whatever
	// Lie says: one of two, reported as -1.
	e2 := newEnds(t)
	liar := xfertest.New(xfertest.Config{Inline: true, Limit: 1, Disown: true,
		Lie: func(int, error) (int, error) { return -1, nil }})
	if n, err := liar.Submit(tasks(e2, a, b, 2)); n != -1 || err != nil || e2.count() != 1 {
		t.Fatalf("Lie with Disown: %d, %v, %d ended", n, err, e2.count())
	}
}

// TestUpdateDuringSubmit: an Update made while a Submit runs (here from
// its OnSubmit, after Submit read the Config) decides whether the Submit's
// tasks are held, so a test that turns Hold off and then ends what is held
// leaves none held behind it.
func TestUpdateDuringSubmit(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	e := newEnds(t)
	var tr *xfertest.Transport
	tr = xfertest.New(xfertest.Config{Inline: true,
		Hold: func(*xfer.Task) bool { return true },
		OnSubmit: func([]*xfer.Task) {
			tr.Update(func(c *xfertest.Config) { c.Hold, c.OnSubmit = nil, nil })
		}})
	ts := tasks(e, a, b, 2)
	if n, err := tr.Submit(ts); n != 2 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if tr.Held() != 0 || e.count() != 2 {
		t.Fatalf("%d held and %d ended after Hold was turned off during the Submit; want 0 and 2", tr.Held(), e.count())
	}
}

func TestCancelAndClose(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	e := newEnds(t)
	tr := xfertest.New(xfertest.Config{})
	ts := tasks(e, a, b, 3)
	tr.Submit(ts)
	tr.Cancel(ts[0])
	if tr.Cancels() != 1 || tr.Held() != 3 {
		t.Fatalf("Cancel without CancelEnds: %d cancels, %d held", tr.Cancels(), tr.Held())
	}
	tr.Update(func(c *xfertest.Config) { c.CancelEnds = true })
	tr.Cancel(ts[1])
	tr.Cancel(ts[1]) // no longer held: nothing
	if r, _ := e.of(ts[1]); !errors.Is(r.err, xfer.ErrCanceled) || tr.Held() != 2 || tr.Ended() != 1 {
		t.Fatalf("canceled: %+v, %d held", r, tr.Held())
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tk := range []*xfer.Task{ts[0], ts[2]} {
		if r, _ := e.of(tk); !errors.Is(r.err, xfer.ErrClosed) {
			t.Fatalf("held task at Close: %+v", r)
		}
	}
	if n, err := tr.Submit(tasks(e, a, b, 1)); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Submit after Close: %d, %v", n, err)
	}
	if err := tr.Close(); err != nil || e.count() != 3 {
		t.Fatalf("second Close: %v, %d ended", err, e.count())
	}
}

// TestCloseWaitsForSubmit: a Close concurrent with Submits returns only
// when every task they took has ended.
func TestCloseWaitsForSubmit(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	for round := 0; round < 50; round++ {
		e := newEnds(t)
		tr := xfertest.New(xfertest.Config{Inline: true, Hold: func(t *xfer.Task) bool { return t.Req.Length%2 == 0 }})
		var taken int
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 20 {
				n, _ := tr.Submit(tasks(e, a, b, 4))
				taken += n
			}
		}()
		tr.Close()
		<-done
		// Close returned before the last Submits, which were refused; what
		// was taken before it has ended.
		if e.count() != taken || tr.Held() != 0 {
			t.Fatalf("round %d: %d taken, %d ended, %d held", round, taken, e.count(), tr.Held())
		}
	}
}

func TestCopy(t *testing.T) {
	a, b := xfertest.NewSegment(1, 16), xfertest.NewSegment(2, 16)
	copy(a.Bytes(), "abcdefgh")
	copy(b.Bytes()[8:], "ABCDEFGH")
	tk := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: 2, Target: 2, TargetOffset: 0, Length: 4}, Local: a, Target: b}
	if n, err := xfertest.Copy(tk); n != 4 || err != nil || string(b.Bytes()[:4]) != "cdef" {
		t.Fatalf("write: %d %v %q", n, err, b.Bytes()[:4])
	}
	tk.Req = xfer.Request{Op: xfer.OpRead, Local: 1, LocalOffset: 12, Target: 2, TargetOffset: 8, Length: 4}
	if n, err := xfertest.Copy(tk); n != 4 || err != nil || string(a.Bytes()[12:]) != "ABCD" {
		t.Fatalf("read: %d %v %q", n, err, a.Bytes()[12:])
	}
	for _, q := range []xfer.Request{
		{Op: xfer.OpRead, LocalOffset: 13, Length: 4},
		{Op: xfer.OpRead, TargetOffset: 1 << 63, Length: 1 << 63},
		{Op: 9, Length: 1},
	} {
		tk.Req = q
		if _, err := xfertest.Copy(tk); !errors.Is(err, xfer.ErrInvalid) {
			t.Fatalf("%+v: %v, want ErrInvalid", q, err)
		}
	}
	tk.Local = plain{}
	if _, err := xfertest.Copy(tk); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("no memory: %v", err)
	}
}

type plain struct{}

func (plain) ID() xfer.SegmentID { return 3 }
func (plain) Kind() xfer.Kind    { return xfer.KindFile }
func (plain) Size() uint64       { return 16 }
func (plain) Acquire() bool      { return true }
func (plain) Release()           {}

func TestSegment(t *testing.T) {
	s := xfertest.SegmentOf(4, xfer.KindClient, make([]byte, 10))
	if s.ID() != 4 || s.Kind() != xfer.KindClient || s.Size() != 10 || len(s.Bytes()) != 10 {
		t.Fatalf("segment %d %v %d", s.ID(), s.Kind(), s.Size())
	}
	first, second := s.Acquire(), s.Acquire()
	if !first || !second || s.Refs() != 2 {
		t.Fatalf("refs %d", s.Refs())
	}
	s.Close()
	if s.Acquire() {
		t.Fatal("Acquire after Close")
	}
	s.Release()
	s.Release()
	xfertest.CheckRefs(t, s)
	s.Release()
	if !s.Underflowed() {
		t.Fatal("a Release below zero went unrecorded")
	}
}

// TestThroughEngine: the doubles under a real engine, with the engine's
// own accounting: held tasks are Pending until finished, refs come back.
func TestThroughEngine(t *testing.T) {
	a, b := xfertest.NewSegment(1, 4096), xfertest.NewSegment(2, 4096)
	reg := xfer.NewRegistry()
	reg.Add(a)
	reg.Add(b)
	held := xfertest.New(xfertest.Config{Name: "held", Move: xfertest.Copy})
	e := xfer.NewEngine(xfer.Config{}, xfertest.RouterFunc(func(l, _ xfer.Segment) (xfer.Transport, error) {
		if l.ID() == 1 {
			return held, nil
		}
		return nil, xfer.ErrNotSupported
	}), nil)
	defer e.Close()
	id, _ := e.AllocateBatch(2)
	copy(a.Bytes(), "payload")
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: 1, Target: 2, Length: 7}, {Op: xfer.OpWrite, Local: 2, Target: 1, Length: 7}}
	res := make([]error, 2)
	if err := e.Submit(id, reqs, xfer.SubmitOptions{Resolver: reg}, res); err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || !errors.Is(res[1], xfer.ErrNotSupported) {
		t.Fatalf("results %v", res)
	}
	if st, _ := e.Status(id, 0); st.State != xfer.StatePending || a.Refs() != 1 {
		t.Fatalf("held task %v, refs %d", st.State, a.Refs())
	}
	<-held.Holding()
	held.Finish()
	if s, err := e.Wait(id, time.Now().Add(5*time.Second)); err != nil || s.Completed != 1 || string(b.Bytes()[:7]) != "payload" {
		t.Fatalf("%+v %v %q", s, err, b.Bytes()[:7])
	}
	xfertest.CheckRefs(t, a, b)
	if _, err := xfertest.RefuseAll(xfer.ErrFault).Route(a, b); !errors.Is(err, xfer.ErrFault) {
		t.Fatalf("RefuseAll: %v", err)
	}
	if tr, _ := xfertest.RouteAll(held).Route(a, b); tr != held {
		t.Fatal("RouteAll")
	}
}

// TestSteadyStateAllocs: submitting and finishing through the doubles
// allocates nothing once their slices have grown.
func TestSteadyStateAllocs(t *testing.T) {
	a, b := xfertest.NewSegment(1, 64), xfertest.NewSegment(2, 64)
	var dones int
	e := xfertest.Func(func(*xfer.Task, uint64, error) { dones++ })
	ts := make([]*xfer.Task, 8)
	for i := range ts {
		ts[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Length: 8}, Local: a, Target: b}
		ts[i].SetCompleter(e)
	}
	inline := xfertest.New(xfertest.Config{Inline: true})
	held := xfertest.New(xfertest.Config{})
	run := func() {
		inline.Submit(ts)
		held.Submit(ts)
		held.Finish()
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations per round", n)
	}
	if dones != 16*102 { // run, AllocsPerRun's warm-up, 100 runs
		t.Fatalf("%d Dones", dones)
	}
}
