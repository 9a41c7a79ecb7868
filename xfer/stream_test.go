package xfer_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// recSink records every StreamDone and fails the test on a second end of
// the same user data.
type recSink struct {
	t    testing.TB
	mu   sync.Mutex
	ends map[uint64]xfer.State
	errs map[uint64]error
	n    int
	ch   chan uint64 // every end, when set (buffered by the test)
}

func newRecSink(t testing.TB) *recSink {
	return &recSink{t: t, ends: map[uint64]xfer.State{}, errs: map[uint64]error{}}
}

func (r *recSink) StreamDone(ud uint64, st xfer.State, n uint64, err error) {
	r.mu.Lock()
	if prev, dup := r.ends[ud]; dup {
		r.mu.Unlock()
		r.t.Errorf("user data %d ended twice: %v then %v", ud, prev, st)
		return
	}
	if !st.Terminal() {
		r.t.Errorf("user data %d ended in live state %v", ud, st)
	}
	r.ends[ud], r.errs[ud] = st, err
	r.n++
	ch := r.ch
	r.mu.Unlock()
	if ch != nil {
		ch <- ud
	}
}

func (r *recSink) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *recSink) state(ud uint64) (xfer.State, error, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.ends[ud]
	return st, r.errs[ud], ok
}

// streamReqs returns n valid 64-byte writes from a to b with user data
// base..base+n-1.
func (f *fixture) streamReqs(n int, base uint64, deadline time.Time) []xfer.StreamRequest {
	rs := make([]xfer.StreamRequest, n)
	for i, q := range f.reqs(n) {
		rs[i] = xfer.StreamRequest{Req: q, UserData: base + uint64(i), Deadline: deadline}
	}
	return rs
}

func waitIdle(t testing.TB, s *xfer.Stream) {
	t.Helper()
	select {
	case <-s.Idle():
	case <-time.After(10 * time.Second):
		t.Fatalf("stream not idle: %+v", s.Stats())
	}
}

func TestStreamSync(t *testing.T) {
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	sink := newRecSink(t)
	s, err := f.e.NewStream(8, f.reg, sink)
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		reqs := f.streamReqs(8, uint64(round*8), time.Time{})
		res := make([]error, len(reqs))
		if n, err := s.Submit(reqs, res); n != 8 || err != nil {
			t.Fatalf("round %d: took %d, %v", round, n, err)
		}
		for i, e := range res {
			if e != nil {
				t.Fatalf("request %d refused: %v", i, e)
			}
		}
		if s.Free() != 8 {
			t.Fatalf("round %d: %d slots free after every request ended inline, want 8", round, s.Free())
		}
	}
	if sink.count() != 40 {
		t.Fatalf("%d ends, want 40", sink.count())
	}
	if st, _, _ := sink.state(39); st != xfer.StateCompleted {
		t.Errorf("state %v", st)
	}
	if st := s.Stats(); st.Completed != 40 || st.Bytes != 40*64 || st.Live != 0 || st.Held != 0 {
		t.Errorf("stats %+v", st)
	}
	if ts := f.e.TransportStats(); xfer.MetersOn && (len(ts) != 1 || ts[0].Requests != 40 || ts[0].Bytes != 40*64 || ts[0].InFlight != 0) {
		t.Errorf("transport meters after 40 stream requests: %+v", ts)
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
	if es := f.e.Stats(); es.Completed != 40 || es.Streams != 0 {
		t.Errorf("engine stats after the stream closed: %+v", es)
	}
}

func TestStreamRefusedAndFull(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	reqs := f.streamReqs(6, 0, time.Time{})
	reqs[1].Req.Target = 99            // no such segment
	reqs[2].Req.Length = 0             // zero length
	reqs[3].Req.TargetOffset = 1 << 20 // out of bounds
	res := make([]error, len(reqs))
	n, err := s.Submit(reqs, res)
	if n != 4 || err != nil {
		t.Fatalf("took %d, %v; want the 4 the stream has slots for", n, err)
	}
	if res[0] != nil || !errors.Is(res[1], xfer.ErrNoSegment) || !errors.Is(res[2], xfer.ErrZeroLength) || !errors.Is(res[3], xfer.ErrOutOfBounds) {
		t.Fatalf("results %v", res[:4])
	}
	if s.Free() != 3 {
		t.Fatalf("%d free: the refused requests' slots must come back at once", s.Free())
	}
	n, _ = s.Submit(reqs[4:], res[4:])
	if n != 2 || s.Free() != 1 {
		t.Fatalf("second submit took %d, %d free", n, s.Free())
	}
	if n, _ := s.Submit(f.streamReqs(2, 20, time.Time{}), res[:2]); n != 1 {
		t.Fatalf("full stream took %d", n)
	}
	tr.Finish()
	if sink.count() != 4 {
		t.Fatalf("%d ends; the refused ones must not reach the sink", sink.count())
	}
	if _, _, ok := sink.state(20); !ok {
		t.Error("the request taken into the last free slot did not end")
	}
	if _, _, ok := sink.state(1); ok {
		t.Error("a refused request reached the sink")
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestStreamDeadlinesOneTimer: the stream's one timer ends each request at
// its own deadline whatever the order they came in: a later request with
// an earlier deadline than the one the timer is armed for, and the
// requests still pending after a fire (armed again for the next), each end
// Timeout at or after their deadline and in deadline order; one not due
// stays Pending.
func TestStreamDeadlinesOneTimer(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	sink.ch = make(chan uint64, 8)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 1)
	start := time.Now()
	deadlines := map[uint64]time.Time{}
	submit := func(ud uint64, in time.Duration) {
		deadlines[ud] = start.Add(in)
		if n, err := s.Submit(f.streamReqs(1, ud, deadlines[ud]), res); n != 1 || err != nil || res[0] != nil {
			t.Fatal(n, err, res[0])
		}
	}
	submit(1, time.Hour)
	submit(2, 60*time.Millisecond) // earlier than the timer is armed for
	submit(3, 90*time.Millisecond) // pending when 2 fires: armed again for it
	submit(4, 120*time.Millisecond)
	next := func() uint64 {
		select {
		case ud := <-sink.ch:
			return ud
		case <-time.After(10 * time.Second):
			t.Fatalf("no request ended within 10 s: %+v", s.Stats())
			return 0
		}
	}
	for _, want := range []uint64{2, 3, 4} {
		ud := next()
		if ud != want {
			t.Fatalf("ended %d, want %d next (deadline order)", ud, want)
		}
		if now := time.Now(); now.Before(deadlines[ud]) {
			t.Fatalf("%d ended %v before its deadline", ud, deadlines[ud].Sub(now))
		}
		if st, err, _ := sink.state(ud); st != xfer.StateTimeout || !errors.Is(err, xfer.ErrTimeout) {
			t.Fatalf("%d ended %v %v, want Timeout", ud, st, err)
		}
	}
	if st := s.Stats(); st.Live != 1 || st.Timeout != 3 {
		t.Fatalf("after three deadlines: %+v, want 1 live and 3 timed out", st)
	}
	tr.Finish() // the late Dones of 2, 3, 4 and the real one of 1
	if ud := next(); ud != 1 {
		t.Fatalf("ended %d, want 1", ud)
	}
	if st, _, _ := sink.state(1); st != xfer.StateCompleted {
		t.Fatalf("1 ended %v, want Completed", st)
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestStreamDeadline: a request past its deadline ends Timeout at once and
// its transport is asked to cancel; its slot (and segment references) are
// kept until the transport's late Done.
func TestStreamDeadline(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	sink.ch = make(chan uint64, 4)
	s, _ := f.e.NewStream(2, f.reg, sink)
	reqs := f.streamReqs(2, 10, time.Now().Add(20*time.Millisecond))
	reqs[1].Deadline = time.Now().Add(time.Hour)
	res := make([]error, 2)
	if n, err := s.Submit(reqs, res); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	if ud := <-sink.ch; ud != 10 {
		t.Fatalf("first end is %d, want the short deadline's 10", ud)
	}
	if st, err, _ := sink.state(10); st != xfer.StateTimeout || !errors.Is(err, xfer.ErrTimeout) {
		t.Fatalf("ended %v %v", st, err)
	}
	// The timer ends the task (which the sink saw), then asks the
	// transport to cancel it, then drops its own reference to the slot.
	testutil.Eventually(t, 5*time.Second, func() bool { return tr.Cancels() == 1 },
		"the transport asked to cancel once (asked %v times)", testutil.Lazy(tr.Cancels))
	if s.Free() != 0 || f.b.Refs() != 2 {
		t.Fatalf("slot or refs released before the transport's Done: free %d, refs %d", s.Free(), f.b.Refs())
	}
	tr.Finish() // a late Done for 10, a real one for 11
	if st, _, _ := sink.state(11); st != xfer.StateCompleted {
		t.Errorf("11 ended %v", st)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return s.Free() == 2 },
		"2 free after both Dones (free: %v)", testutil.Lazy(s.Free))
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestStreamSplitPoints: for every dispatch count k the transport can
// return, with Close racing the Submit, every accepted request ends exactly
// once, what was never dispatched ends Failed with the transport's error,
// and nothing is leaked or released twice.
func TestStreamSplitPoints(t *testing.T) {
	const n = 8
	for k := 0; k <= n; k++ {
		for _, race := range []bool{false, true} {
			tr := xfertest.New(xfertest.Config{Limit: takeAtMost(k), CancelEnds: true})
			f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
			sink := newRecSink(t)
			s, _ := f.e.NewStream(n, f.reg, sink)
			var wg sync.WaitGroup
			if race {
				wg.Add(1)
				tr.Update(func(c *xfertest.Config) {
					c.OnSubmit = func([]*xfer.Task) {
						go func() { defer wg.Done(); s.Close(nil) }()
					}
				})
			}
			res := make([]error, n)
			took, err := s.Submit(f.streamReqs(n, 0, time.Time{}), res)
			wg.Wait()
			if err != nil && !errors.Is(err, xfer.ErrClosed) {
				t.Fatalf("k=%d race=%v: %v", k, race, err)
			}
			if err == nil && took != n {
				t.Fatalf("k=%d: took %d", k, took)
			}
			for i := k; i < took; i++ {
				if st, e, ok := sink.state(uint64(i)); !ok || st != xfer.StateFailed || !errors.Is(e, xfertest.ErrInjected) {
					t.Fatalf("k=%d race=%v: undispatched request %d ended %v %v %v", k, race, i, st, e, ok)
				}
			}
			tr.Finish()
			s.Close(nil)
			waitIdle(t, s)
			if sink.count() != took {
				t.Fatalf("k=%d race=%v: %d ends for %d accepted", k, race, sink.count(), took)
			}
			xfertest.CheckRefs(t, f.a, f.b)
		}
	}
}

// TestStreamDoneInsideSubmit: a transport that ends tasks before its Submit
// returns has their results published by the Submit.
func TestStreamDoneInsideSubmit(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Inline: true, Limit: 3})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(5, f.reg, sink)
	res := make([]error, 5)
	s.Submit(f.streamReqs(5, 0, time.Time{}), res)
	for i := uint64(0); i < 5; i++ {
		st, _, ok := sink.state(i)
		want := xfer.StateCompleted
		if i >= 3 {
			want = xfer.StateFailed
		}
		if !ok || st != want {
			t.Errorf("request %d: %v %v, want %v", i, st, ok, want)
		}
	}
	if s.Free() != 5 {
		t.Errorf("%d free", s.Free())
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

func TestStreamCloseCancels(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 4)
	s.Submit(f.streamReqs(4, 0, time.Time{}), res)
	s.Close(nil)
	for i := uint64(0); i < 4; i++ {
		if st, err, _ := sink.state(i); st != xfer.StateCanceled || !errors.Is(err, xfer.ErrCanceled) {
			t.Fatalf("%d: %v %v", i, st, err)
		}
	}
	if n, err := s.Submit(f.streamReqs(1, 9, time.Time{}), res[:1]); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("submit after close: %d %v", n, err)
	}
	select {
	case <-s.Idle():
		t.Fatal("idle while the transport still holds every task")
	default:
	}
	tr.Finish()
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

func TestStreamEngineClose(t *testing.T) {
	tr := xfertest.New(xfertest.Config{CancelEnds: true})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 4)
	s.Submit(f.streamReqs(4, 0, time.Time{}), res)
	f.e.Close()
	waitIdle(t, s)
	for i := uint64(0); i < 4; i++ {
		if st, err, _ := sink.state(i); st != xfer.StateCanceled || !errors.Is(err, xfer.ErrClosed) {
			t.Fatalf("%d: %v %v", i, st, err)
		}
	}
	if _, err := f.e.NewStream(1, f.reg, sink); !errors.Is(err, xfer.ErrClosed) {
		t.Errorf("NewStream after Close: %v", err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

func TestStreamContractViolation(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Name: "liar", Lie: says(func(l int) int { return l + 1 }, nil)}) // holds what it takes
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 2)
	s.Submit(f.streamReqs(2, 0, time.Time{}), res)
	if n, err := s.Submit(f.streamReqs(2, 5, time.Time{}), res); n != 0 || !errors.Is(err, xfer.ErrTransport) {
		t.Fatalf("after a contract violation: took %d, %v", n, err)
	}
	if f.e.Stats().Violations == 0 {
		t.Error("violation not counted")
	}
}

func TestStreamNoAllocations(t *testing.T) {
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	s, _ := f.e.NewStream(64, f.reg, discardSink{})
	reqs := f.streamReqs(32, 0, time.Now().Add(time.Hour))
	reqs[3].Notify = []byte("note")
	res := make([]error, len(reqs))
	s.Submit(reqs, res) // first use grows the notify buffer
	a := testing.AllocsPerRun(200, func() {
		if n, err := s.Submit(reqs, res); n != len(reqs) || err != nil {
			t.Fatal(n, err)
		}
	})
	if a != 0 {
		t.Errorf("%v allocations per submit of 32", a)
	}
}

type discardSink struct{}

func (discardSink) StreamDone(uint64, xfer.State, uint64, error) {}

func BenchmarkStreamSubmit(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run("batch"+string(rune('0'+batch/10))+string(rune('0'+batch%10)), func(b *testing.B) {
			f := newFixture(b, xfer.Config{}, xfertest.RouteAll(syncTr()))
			s, _ := f.e.NewStream(64, f.reg, discardSink{})
			reqs := f.streamReqs(batch, 0, time.Time{})
			res := make([]error, batch)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Submit(reqs, res)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/req")
		})
	}
}

func TestStreamOnFree(t *testing.T) {
	tr := xfertest.New(xfertest.Config{})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	s, _ := f.e.NewStream(1, f.reg, newRecSink(t))
	freed := make(chan struct{}, 4)
	s.OnFree(func() { freed <- struct{}{} })
	res := make([]error, 2)
	s.Submit(f.streamReqs(1, 0, time.Time{}), res[:1]) // fits: no call later
	tr.Finish()
	select {
	case <-freed:
		t.Fatal("OnFree called though no Submit went short")
	default:
	}
	if n, _ := s.Submit(f.streamReqs(2, 1, time.Time{}), res); n != 1 {
		t.Fatalf("took %d", n)
	}
	tr.Finish()
	select {
	case <-freed:
	default:
		t.Fatal("OnFree not called when a slot freed after a short Submit")
	}
}

// watchTr ends each task inside Submit and records, after each Done, how
// many ends the sink had heard of: a task that a transport finished while
// the call goes on is answered at once, not when the call returns.
type watchTr struct {
	sink  *recSink
	heard []int
}

func (w *watchTr) Name() string { return "watch" }
func (w *watchTr) Submit(ts []*xfer.Task) (int, error) {
	for _, t := range ts {
		t.Done(t.Req.Length, nil)
		w.heard = append(w.heard, w.sink.count())
	}
	return len(ts), nil
}
func (w *watchTr) Cancel(*xfer.Task) {}
func (w *watchTr) Close() error      { return nil }

func TestStreamInlineDoneAnsweredAtOnce(t *testing.T) {
	sink := newRecSink(t)
	tr := &watchTr{sink: sink}
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 4)
	if n, err := s.Submit(f.streamReqs(4, 0, time.Time{}), res); n != 4 || err != nil {
		t.Fatalf("submit: %d %v", n, err)
	}
	for i, h := range tr.heard {
		if h != i+1 {
			t.Fatalf("after the Done of task %d the sink had heard of %d ends, want %d (heard: %v)", i, h, i+1, tr.heard)
		}
	}
	if s.Free() != 4 {
		t.Errorf("%d slots free after every task ended, want 4", s.Free())
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// A transport that ends every task inside Submit but then says it took
// none broke the count contract: each task still ends exactly once (the
// sink fails the test on a second end), and the stream takes no more.
func TestStreamDoneThenDisowned(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Name: "liar", Inline: true, Disown: true, Lie: says(func(int) int { return 0 }, nil)})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 3)
	s.Submit(f.streamReqs(3, 0, time.Time{}), res)
	if sink.count() != 3 {
		t.Fatalf("%d ends, want 3", sink.count())
	}
	if f.e.Stats().Violations == 0 {
		t.Error("violation not counted")
	}
	if n, err := s.Submit(f.streamReqs(1, 9, time.Time{}), res[:1]); n != 0 || !errors.Is(err, xfer.ErrTransport) {
		t.Fatalf("after a contract violation: took %d, %v", n, err)
	}
}

// A Submit whose requests go to two transports dispatches one group per
// transport; every task is published, so each slot frees once its task
// ends and the stream goes idle after Close.
func TestStreamTwoTransports(t *testing.T) {
	ta := xfertest.New(xfertest.Config{Name: "a"})
	tb := xfertest.New(xfertest.Config{Name: "b"})
	f := newFixture(t, xfer.Config{}, xfertest.RouterFunc(func(l, _ xfer.Segment) (xfer.Transport, error) {
		if l.ID() == 1 {
			return ta, nil
		}
		return tb, nil
	}))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	reqs := f.streamReqs(4, 0, time.Now().Add(time.Hour))
	for _, i := range []int{1, 3} {
		reqs[i].Req.Local, reqs[i].Req.Target = 2, 1
	}
	res := make([]error, 4)
	if n, err := s.Submit(reqs, res); n != 4 || err != nil {
		t.Fatalf("submit: %d %v", n, err)
	}
	if ta.Held() != 2 || tb.Held() != 2 {
		t.Fatalf("held %d and %d, want 2 and 2", ta.Held(), tb.Held())
	}
	ta.Finish()
	tb.Finish()
	if sink.count() != 4 {
		t.Fatalf("%d ends, want 4", sink.count())
	}
	if st := s.Stats(); s.Free() != 4 || st.Held != 0 || st.Completed != 4 {
		t.Fatalf("%d slots free, stats %+v; want 4 free, none held, 4 completed", s.Free(), st)
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// A transport that ends a task twice inside Submit broke the contract as
// much as one that miscounts: the task ends once, and the stream takes no
// more.
func TestStreamSecondDone(t *testing.T) {
	tr := xfertest.New(xfertest.Config{Inline: true, Err: func(t *xfer.Task) error {
		t.Done(t.Req.Length, nil) // the transport then ends it again
		return nil
	}})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	sink := newRecSink(t)
	s, _ := f.e.NewStream(4, f.reg, sink)
	res := make([]error, 2)
	if n, err := s.Submit(f.streamReqs(2, 0, time.Time{}), res); n != 2 || err != nil {
		t.Fatalf("submit: took %d, %v", n, err)
	}
	if sink.count() != 2 {
		t.Fatalf("%d ends, want 2", sink.count())
	}
	if v := f.e.Stats().Violations; v != 2 {
		t.Errorf("%d violations counted, want 2 (one a second Done)", v)
	}
	if n, err := s.Submit(f.streamReqs(1, 5, time.Time{}), res[:1]); n != 0 || !errors.Is(err, xfer.ErrTransport) {
		t.Fatalf("after a second Done: took %d, %v", n, err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestStreamResolvedRequests: a stream without a resolver takes requests
// whose caller resolved both segments, acquires and releases them as it
// does what it resolves, and refuses one that carries one side only, or
// none (ErrNoSegment).
func TestStreamResolvedRequests(t *testing.T) {
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	sink := newRecSink(t)
	s, err := f.e.NewStream(8, nil, sink)
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.streamReqs(4, 0, time.Time{})
	for i := range reqs[:2] {
		reqs[i].LocalSeg, reqs[i].TargetSeg = f.a, f.b
	}
	reqs[2].LocalSeg = f.a // one side only
	res := make([]error, len(reqs))
	if n, err := s.Submit(reqs, res); n != 4 || err != nil {
		t.Fatalf("took %d, %v", n, err)
	}
	if res[0] != nil || res[1] != nil || !errors.Is(res[2], xfer.ErrNoSegment) || !errors.Is(res[3], xfer.ErrNoSegment) {
		t.Fatalf("results %v, want nil, nil, ErrNoSegment, ErrNoSegment", res)
	}
	if sink.count() != 2 {
		t.Fatalf("%d ends, want the 2 accepted", sink.count())
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestStreamContractViolationFailsTheCall: the tasks a transport took in a
// call whose count broke the contract end Failed with ErrTransport as the
// call returns, and the transport is asked to cancel them, as a batch's
// do: whatever that transport says of them later, they are never a
// success. A short count without an error and a count past the end are
// both tried.
func TestStreamContractViolationFailsTheCall(t *testing.T) {
	for name, lie := range map[string]func(int, error) (int, error){
		"past the end":        says(func(l int) int { return l + 1 }, nil),
		"short without error": says(func(l int) int { return l - 1 }, nil),
	} {
		t.Run(name, func(t *testing.T) {
			tr := xfertest.New(xfertest.Config{Name: "liar", Lie: lie, Disown: true}) // holds all it takes
			f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
			sink := newRecSink(t)
			s, _ := f.e.NewStream(4, f.reg, sink)
			res := make([]error, 3)
			if n, err := s.Submit(f.streamReqs(3, 0, time.Now().Add(time.Hour)), res); n != 3 || err != nil {
				t.Fatalf("submit: took %d, %v", n, err)
			}
			for ud := uint64(0); ud < 3; ud++ {
				if st, err, ok := sink.state(ud); !ok || st != xfer.StateFailed || !errors.Is(err, xfer.ErrTransport) {
					t.Fatalf("request %d of a call whose transport broke the contract: %v %v (ended %v), want Failed, ErrTransport",
						ud, st, err, ok)
				}
			}
			if tr.Cancels() == 0 {
				t.Error("the transport was not asked to cancel what it took")
			}
			tr.Finish() // its late, successful Dones change nothing
			for ud := uint64(0); ud < 3; ud++ {
				if st, _, _ := sink.state(ud); st != xfer.StateFailed {
					t.Fatalf("request %d ended %v after the transport's late Done", ud, st)
				}
			}
			s.Close(nil)
			xfertest.CheckRefs(t, f.a, f.b)
		})
	}
}
