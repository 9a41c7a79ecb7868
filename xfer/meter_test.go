package xfer_test

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/loghist"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// needMeters skips a test of the meters' counts in a build without them.
func needMeters(t *testing.T) {
	t.Helper()
	if !xfer.MetersOn {
		t.Skip("the meters are compiled out (-tags nometers): nothing to count")
	}
}

func statsOf(t *testing.T, e *xfer.Engine, name string) xfer.TransportStats {
	t.Helper()
	for _, s := range e.TransportStats() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no transport stats for %q in %+v", name, e.TransportStats())
	return xfer.TransportStats{}
}

// TestTransportMeter drives one transport through every way a dispatched
// task can end and checks the exact per-transport counts.
func TestTransportMeter(t *testing.T) {
	needMeters(t)
	tr := xfertest.New(xfertest.Config{Name: "fake", Limit: 3})
	codes := map[error]int{xfertest.ErrInjected: 5, xfer.ErrFault: 6}
	f := newFixture(t, xfer.Config{ErrorCode: func(err error) int {
		for e, c := range codes {
			if errors.Is(err, e) {
				return c
			}
		}
		return 15
	}}, xfertest.RouteAll(tr))
	xfer.SetSampler(f.e, always)
	id, err := f.e.AllocateBatch(16)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 5)
	// Five requests, three taken, two refused at dispatch.
	if err := f.e.Submit(id, f.reqs(5), f.opts, res); err != nil {
		t.Fatal(err)
	}
	st := statsOf(t, f.e, "fake")
	if st.InFlight != 3 || st.Refused != 2 || st.Requests != 0 {
		t.Fatalf("after dispatch: in flight %d refused %d requests %d, want 3 2 0", st.InFlight, st.Refused, st.Requests)
	}
	// Two end well, one with a fault.
	held := tr.Take(-1)
	held[0].Done(64, nil)
	held[1].Done(64, nil)
	held[2].Done(0, xfer.ErrFault)
	st = statsOf(t, f.e, "fake")
	if st.InFlight != 0 || st.Requests != 3 || st.Bytes != 128 || st.Refused != 2 {
		t.Fatalf("after Done: %+v", st)
	}
	for c, n := range st.Errors {
		want := uint64(0)
		if c == 6 {
			want = 1
		}
		if n != want {
			t.Fatalf("errors by code %v, want one under code 6", st.Errors)
		}
	}
	if st.Latency.Count() != 3 {
		t.Fatalf("latency count %d, want 3", st.Latency.Count())
	}
	if _, err := f.e.Wait(id, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestTransportMeterLateDone: a task that timed out is still the
// transport's until its Done; that Done counts once, with the transport's
// own result.
func TestTransportMeterLateDone(t *testing.T) {
	needMeters(t)
	tr := xfertest.New(xfertest.Config{Name: "slow"})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	id, _ := f.e.AllocateBatch(4)
	res := make([]error, 2)
	opts := f.opts
	opts.Deadline = time.Now().Add(20 * time.Millisecond)
	if err := f.e.Submit(id, f.reqs(2), opts, res); err != nil {
		t.Fatal(err)
	}
	s, err := f.e.Wait(id, time.Time{})
	if err != nil || s.Timeout != 2 {
		t.Fatalf("wait %+v %v, want 2 timed out", s, err)
	}
	if st := statsOf(t, f.e, "slow"); st.InFlight != 2 || st.Requests != 0 {
		t.Fatalf("timed-out tasks the transport still holds: %+v", st)
	}
	tr.Finish()
	st := statsOf(t, f.e, "slow")
	if st.InFlight != 0 || st.Requests != 2 || st.Bytes != 128 {
		t.Fatalf("after the late Done: %+v", st)
	}
	for _, n := range st.Errors {
		if n != 0 {
			t.Fatalf("a late success counted as an error: %v", st.Errors)
		}
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
}

// TestTransportMeterAllocs: metering adds no allocation to the
// steady-state submit path.
func TestTransportMeterAllocs(t *testing.T) {
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	reqs := f.reqs(8)
	res := make([]error, len(reqs))
	run := func() {
		id, err := f.e.AllocateBatch(8)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
			t.Fatal(err)
		}
		if err := f.e.Free(id); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
	if !xfer.MetersOn {
		return
	}
	if st := statsOf(t, f.e, "sync"); st.Requests != 8*202 || st.Bytes != 8*202*64 {
		t.Fatalf("counts %+v, want %d requests", st, 8*202)
	}
}

// always is a sampler that times every submit call.
func always() bool { return true }

// TestTransportMeterInline: completions inside Submit are metered by the
// submit call in runs; counts, bytes and errors come out exact.
func TestTransportMeterInline(t *testing.T) {
	needMeters(t)
	f := newFixture(t, xfer.Config{ErrorCode: func(err error) int {
		if errors.Is(err, xfer.ErrFault) {
			return 3
		}
		return 15
	}}, xfertest.RouteAll(xfertest.New(xfertest.Config{Name: "failinline", Inline: true,
		// Every other task (f.reqs puts task i at offset 64*i) fails.
		Err: func(t *xfer.Task) error {
			if t.Req.LocalOffset/64%2 == 1 {
				return xfer.ErrFault
			}
			return nil
		}})))
	xfer.SetSampler(f.e, always)
	id, _ := f.e.AllocateBatch(16)
	res := make([]error, 7)
	if err := f.e.Submit(id, f.reqs(7), f.opts, res); err != nil {
		t.Fatal(err)
	}
	st := statsOf(t, f.e, "failinline")
	if st.Requests != 7 || st.Bytes != 4*64 || st.Errors[3] != 3 || st.InFlight != 0 || st.Latency.Count() != 7 {
		t.Fatalf("%+v", st)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
}

// wantLatency checks a latency snapshot against the exact values recorded.
func wantLatency(t *testing.T, what string, got loghist.Snapshot, vals ...time.Duration) {
	t.Helper()
	var want loghist.Snapshot
	for _, v := range vals {
		want.Counts[loghist.Index(uint64(v))]++
		want.Sum += uint64(v)
	}
	if got != want {
		t.Fatalf("%s: latency %+v, want %+v", what, got, want)
	}
}

// script is a sampler that answers from picks, one answer per submit call
// that dispatches; a call past its end fails the test.
type script struct {
	t     *testing.T
	picks []bool
	asked int
}

func (s *script) pick() bool {
	if s.asked >= len(s.picks) {
		s.t.Errorf("sampler asked %d times, the script has %d answers", s.asked+1, len(s.picks))
		return false
	}
	s.asked++
	return s.picks[s.asked-1]
}

// wantCounts checks a transport's exact counts.
func wantCounts(t *testing.T, what string, st xfer.TransportStats, requests, bytes, inFlight uint64) {
	t.Helper()
	if st.Requests != requests || st.Bytes != bytes || st.InFlight != inFlight {
		t.Fatalf("%s: requests %d bytes %d in flight %d, want %d %d %d", what, st.Requests, st.Bytes, st.InFlight, requests, bytes, inFlight)
	}
}

// TestTransportMeterLatency: the latency of a task runs from its submit
// call's clock reading to its Done, for tasks ended inside Submit (timed
// once for the call after the transport returns) and for tasks ended later
// (timed at each Done), through batches and streams alike; only the calls
// the sampler picks are timed, every task of such a call, while the
// others' tasks count exactly in Requests, Bytes and InFlight. The
// engine's clock is a fake one and the sampler a script, so every value is
// exact and a wrong call timed (or one missed) shows in the sum.
func TestTransportMeterLatency(t *testing.T) {
	needMeters(t)
	clk := testutil.NewClock(time.Now()) // the meters need a monotonic reading
	// Inside Submit, the inline transport takes 3 µs, the held one 1 µs.
	inline := xfertest.New(xfertest.Config{Name: "inline", Inline: true,
		OnSubmit: func([]*xfer.Task) { clk.Advance(3 * time.Microsecond) }})
	held := xfertest.New(xfertest.Config{Name: "held",
		OnSubmit: func([]*xfer.Task) { clk.Advance(time.Microsecond) }})
	var route atomic.Pointer[xfertest.Transport]
	route.Store(inline)
	f := newFixture(t, xfer.Config{}, xfertest.RouterFunc(func(l, tg xfer.Segment) (xfer.Transport, error) {
		return route.Load(), nil
	}))
	xfer.SetClock(f.e, clk.Now)
	// Per medium: an inline call timed, one not, a held call not timed,
	// one timed.
	sc := &script{t: t, picks: []bool{true, false, false, true, true, false, false, true}}
	xfer.SetSampler(f.e, sc.pick)

	// Batch: four inline tasks in a timed call and four in an untimed
	// one, then two held ones in an untimed call and two ended 100 µs and
	// 1 ms after their timed call.
	id, err := f.e.AllocateBatch(16)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 4)
	if err := f.e.Submit(id, f.reqs(4), f.opts, res); err != nil {
		t.Fatal(err)
	}
	us3 := 3 * time.Microsecond
	wantLatency(t, "batch inline", statsOf(t, f.e, "inline").Latency, us3, us3, us3, us3)
	clk.Advance(time.Second)
	if err := f.e.Submit(id, f.reqs(4), f.opts, res); err != nil {
		t.Fatal(err)
	}
	st := statsOf(t, f.e, "inline")
	wantLatency(t, "batch inline, untimed call", st.Latency, us3, us3, us3, us3)
	wantCounts(t, "batch inline, untimed call", st, 8, 8*64, 0)

	route.Store(held)
	clk.Advance(time.Second) // between calls: counts for no task
	if err := f.e.Submit(id, f.reqs(2), f.opts, res[:2]); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, "batch held, untimed, dispatched", statsOf(t, f.e, "held"), 0, 0, 2)
	ts := held.Take(-1)
	clk.Advance(50 * time.Microsecond)
	ts[0].Done(64, nil)
	ts[1].Done(32, nil)
	st = statsOf(t, f.e, "held")
	wantLatency(t, "batch held, untimed call", st.Latency)
	wantCounts(t, "batch held, untimed, ended", st, 2, 96, 0)

	if err := f.e.Submit(id, f.reqs(2), f.opts, res[:2]); err != nil {
		t.Fatal(err)
	}
	ts = held.Take(-1)
	clk.Advance(99 * time.Microsecond)
	ts[0].Done(64, nil)
	wantCounts(t, "batch held, timed, one ended", statsOf(t, f.e, "held"), 3, 160, 1)
	clk.Advance(900 * time.Microsecond)
	ts[1].Done(64, nil)
	st = statsOf(t, f.e, "held")
	wantLatency(t, "batch held", st.Latency, 100*time.Microsecond, time.Millisecond)
	wantCounts(t, "batch held, timed, ended", st, 4, 224, 0)
	if _, err := f.e.Wait(id, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}

	// Stream: the same on a stream, two tasks per call.
	s, err := f.e.NewStream(8, f.reg, discardSink{})
	if err != nil {
		t.Fatal(err)
	}
	route.Store(inline)
	clk.Advance(time.Second)
	sres := make([]error, 2)
	submit := func(base uint64) {
		t.Helper()
		if n, err := s.Submit(f.streamReqs(2, base, time.Time{}), sres); n != 2 || err != nil {
			t.Fatalf("stream submit: %d %v", n, err)
		}
	}
	submit(0)
	wantLatency(t, "stream inline", statsOf(t, f.e, "inline").Latency, us3, us3, us3, us3, us3, us3)
	clk.Advance(time.Second)
	submit(2)
	st = statsOf(t, f.e, "inline")
	wantLatency(t, "stream inline, untimed call", st.Latency, us3, us3, us3, us3, us3, us3)
	wantCounts(t, "stream inline, untimed call", st, 12, 12*64, 0)

	route.Store(held)
	clk.Advance(time.Second)
	submit(4)
	wantCounts(t, "stream held, untimed, dispatched", statsOf(t, f.e, "held"), 4, 224, 2)
	ts = held.Take(-1)
	clk.Advance(time.Millisecond)
	ts[0].Done(64, nil)
	ts[1].Done(64, nil)
	wantCounts(t, "stream held, untimed, ended", statsOf(t, f.e, "held"), 6, 352, 0)

	clk.Advance(time.Second)
	submit(6)
	ts = held.Take(-1)
	clk.Advance(9 * time.Microsecond)
	ts[0].Done(64, nil)
	clk.Advance(20 * time.Millisecond)
	ts[1].Done(64, nil)
	st = statsOf(t, f.e, "held")
	wantLatency(t, "stream held", st.Latency,
		100*time.Microsecond, time.Millisecond, 10*time.Microsecond, 20*time.Millisecond+10*time.Microsecond)
	wantCounts(t, "stream held, timed, ended", st, 8, 480, 0)
	if sc.asked != len(sc.picks) {
		t.Fatalf("sampler asked %d times for %d submit calls", sc.asked, len(sc.picks))
	}
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestTransportMeterMixedCall: one submit call whose tasks go to two
// transports, the first ending them inside Submit and the second holding
// them. The first group's ends are published after the call moved on to
// the second transport; they must count under the first, and a timed
// call times both groups from the call's one clock reading.
func TestTransportMeterMixedCall(t *testing.T) {
	needMeters(t)
	clk := testutil.NewClock(time.Now()) // the meters need a monotonic reading
	inline := xfertest.New(xfertest.Config{Name: "inline", Inline: true,
		OnSubmit: func([]*xfer.Task) { clk.Advance(2 * time.Microsecond) }})
	held := xfertest.New(xfertest.Config{Name: "held"})
	// Requests from a to b go inline, from a to a held.
	f := newFixture(t, xfer.Config{}, xfertest.RouterFunc(func(l, tg xfer.Segment) (xfer.Transport, error) {
		if l == tg {
			return held, nil
		}
		return inline, nil
	}))
	xfer.SetClock(f.e, clk.Now)
	sc := &script{t: t, picks: []bool{false, true}}
	xfer.SetSampler(f.e, sc.pick)
	reqs := f.reqs(5)
	for i := range reqs[3:] { // a→a: held
		reqs[3+i].Target = 1
	}
	id, _ := f.e.AllocateBatch(16)
	res := make([]error, len(reqs))
	for call := range 2 {
		if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
			t.Fatal(err)
		}
		c := uint64(call + 1)
		wantCounts(t, "inline", statsOf(t, f.e, "inline"), 3*c, 3*c*64, 0)
		wantCounts(t, "held, dispatched", statsOf(t, f.e, "held"), 2*(c-1), 2*(c-1)*64, 2)
		clk.Advance(5 * time.Microsecond)
		held.Finish()
		wantCounts(t, "held, ended", statsOf(t, f.e, "held"), 2*c, 2*c*64, 0)
	}
	us2, us7 := 2*time.Microsecond, 7*time.Microsecond
	wantLatency(t, "inline, second call timed", statsOf(t, f.e, "inline").Latency, us2, us2, us2)
	wantLatency(t, "held, second call timed", statsOf(t, f.e, "held").Latency, us7, us7)
	if _, err := f.e.Wait(id, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
}

// TestTransportMeterLeavers: a submitter's counts outlive it. A stream
// closed and a tainted batch freed (its object replaced in its slot)
// before any fold still count every task they dispatched.
func TestTransportMeterLeavers(t *testing.T) {
	needMeters(t)
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(syncTr()))
	s, err := f.e.NewStream(8, f.reg, discardSink{})
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 3)
	if n, err := s.Submit(f.streamReqs(3, 0, time.Time{}), res); n != 3 || err != nil {
		t.Fatalf("stream submit: %d %v", n, err)
	}
	s.Close(nil)
	waitIdle(t, s)
	wantCounts(t, "closed stream", statsOf(t, f.e, "sync"), 3, 3*64, 0)

	// A transport that ends all four tasks inside Submit, then claims
	// five: the call fails and the batch is tainted.
	liar := xfertest.New(xfertest.Config{Name: "liar", Inline: true, Lie: says(func(l int) int { return l + 1 }, nil)})
	f = newFixture(t, xfer.Config{}, xfertest.RouteAll(liar), withLog(slog.New(&countHandler{})))
	id, _ := f.e.AllocateBatch(4)
	res = make([]error, 4)
	if err := f.e.Submit(id, f.reqs(4), f.opts, res); !errors.Is(err, xfer.ErrTransport) {
		t.Fatalf("Submit: %v, want ErrTransport", err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	// The meter counts what the transport reported, before the engine
	// failed the call.
	wantCounts(t, "tainted batch", statsOf(t, f.e, "liar"), 4, 4*64, 0)
}

// TestTransportMeterSampler: the engine's own sampler times about one
// submit call in SampleEvery, and not by the calls' position: every 16th
// call goes to one transport and the rest to another, which a sampler
// counting calls would give all its samples or none. Requests stay exact.
// The sequences are deterministic (seeded per submitter), so the test
// cannot flake; its bounds are six standard deviations of a fair 1 in
// SampleEvery draw wide, so any seeds pass them.
func TestTransportMeterSampler(t *testing.T) {
	needMeters(t)
	rare := xfertest.New(xfertest.Config{Name: "rare", Inline: true})
	common := xfertest.New(xfertest.Config{Name: "common", Inline: true})
	var route atomic.Pointer[xfertest.Transport]
	f := newFixture(t, xfer.Config{}, xfertest.RouterFunc(func(l, tg xfer.Segment) (xfer.Transport, error) {
		return route.Load(), nil
	}))
	const calls = 256 * xfer.SampleEvery // 16 calls to rare per sample expected
	reqs := f.reqs(1)
	res := make([]error, 1)
	id, _ := f.e.AllocateBatch(calls)
	for i := range calls {
		if i%16 == 0 {
			route.Store(rare)
		} else {
			route.Store(common)
		}
		if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
			t.Fatal(err)
		}
	}
	r, c := statsOf(t, f.e, "rare"), statsOf(t, f.e, "common")
	if r.Requests != calls/16 || c.Requests != calls-calls/16 {
		t.Fatalf("requests %d and %d, want %d and %d", r.Requests, c.Requests, calls/16, calls-calls/16)
	}
	// Expected samples: 16 ± 3.9 and 240 ± 15 (binomial, p = 1/SampleEvery).
	if n := r.Latency.Count(); n < 1 || n > 40 {
		t.Errorf("%d of the %d calls to rare timed, want about %d", n, r.Requests, r.Requests/xfer.SampleEvery)
	}
	if n := c.Latency.Count(); n < 150 || n > 330 {
		t.Errorf("%d of the %d calls to common timed, want about %d", n, c.Requests, c.Requests/xfer.SampleEvery)
	}
	if _, err := f.e.Wait(id, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
}

// TestTransportStatsConcurrentFold: folds race with submit calls on
// several batches and streams and with Dones from other goroutines. Every
// fold's Requests and Bytes only grow, InFlight never exceeds what was
// submitted and not yet seen ended, and the last fold is exact. Under
// -tags invariants (make test) a fold that saw more ends than dispatches
// panics.
func TestTransportStatsConcurrentFold(t *testing.T) {
	needMeters(t)
	tr := xfertest.New(xfertest.Config{Name: "mixed", Inline: true,
		// Every third request is held and ended by the finisher below.
		Hold: func(t *xfer.Task) bool { return t.Req.LocalOffset/64%3 == 0 }})
	f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
	const workers, calls, per = 3, 300, 6
	// submitted bounds what was accepted; short is what a stream's Submit
	// took less (no free slot).
	var submitted, short atomic.Uint64
	stop := make(chan struct{})
	folded := make(chan error, 1)
	go func() {
		var last xfer.TransportStats
		for {
			select {
			case <-stop:
				folded <- nil
				return
			default:
			}
			for _, st := range f.e.TransportStats() {
				if st.Requests < last.Requests || st.Bytes < last.Bytes {
					folded <- errorf("fold went backwards: %+v after %+v", st, last)
					return
				}
				if sub := submitted.Load(); st.Requests+st.InFlight > sub {
					folded <- errorf("fold counts %d ended and %d in flight, only %d submitted", st.Requests, st.InFlight, sub)
					return
				}
				last = st
			}
			tr.Finish()
		}
	}()
	done := make(chan error, workers)
	for w := range workers {
		go func() {
			reqs := f.reqs(per)
			res := make([]error, per)
			if w == 0 { // a stream
				s, err := f.e.NewStream(64, f.reg, discardSink{})
				if err != nil {
					done <- err
					return
				}
				sreqs := f.streamReqs(per, 0, time.Time{})
				for range calls {
					// The stream's capacity leaves room for ten calls' held
					// tasks that another Finish took and has not ended.
					submitted.Add(per)
					n, err := s.Submit(sreqs, res)
					if err != nil {
						done <- err
						return
					}
					short.Add(uint64(per - n))
					tr.Finish()
				}
				s.Close(nil)
				<-s.Idle()
				done <- nil
				return
			}
			for range calls {
				id, err := f.e.AllocateBatch(per)
				if err != nil {
					done <- err
					return
				}
				submitted.Add(per)
				if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
					done <- err
					return
				}
				tr.Finish()
				if _, err := f.e.Wait(id, time.Time{}); err != nil {
					done <- err
					return
				}
				if err := f.e.Free(id); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range workers {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-folded; err != nil {
		t.Fatal(err)
	}
	tr.Finish()
	n := uint64(workers*calls*per) - short.Load()
	wantCounts(t, "after the workload", statsOf(t, f.e, "mixed"), n, n*64, 0)
}

func errorf(format string, a ...any) error { return fmt.Errorf(format, a...) }
