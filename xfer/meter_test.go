package xfer_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/loghist"

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

// fakeClock is an engine clock that moves only when the test says.
type fakeClock struct {
	base time.Time
	off  atomic.Int64 // ns past base
}

func newFakeClock() *fakeClock               { return &fakeClock{base: time.Now()} }
func (c *fakeClock) now() time.Time          { return c.base.Add(time.Duration(c.off.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

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

// TestTransportMeterLatency: the latency of a task runs from its submit
// call's clock reading to its Done, for tasks ended inside Submit (timed
// once for the call after the transport returns) and for tasks ended later
// (timed at each Done), through batches and streams alike. The engine's
// clock is a fake one, so every value is exact.
func TestTransportMeterLatency(t *testing.T) {
	needMeters(t)
	clk := newFakeClock()
	// Inside Submit, the inline transport takes 3 µs, the held one 1 µs.
	inline := xfertest.New(xfertest.Config{Name: "inline", Inline: true,
		OnSubmit: func([]*xfer.Task) { clk.advance(3 * time.Microsecond) }})
	held := xfertest.New(xfertest.Config{Name: "held",
		OnSubmit: func([]*xfer.Task) { clk.advance(time.Microsecond) }})
	var route atomic.Pointer[xfertest.Transport]
	route.Store(inline)
	f := newFixture(t, xfer.Config{}, xfertest.RouterFunc(func(l, tg xfer.Segment) (xfer.Transport, error) {
		return route.Load(), nil
	}))
	xfer.SetClock(f.e, clk.now)

	// Batch: four inline tasks in one call, then two held ones ended
	// 100 µs and 1 ms after their call.
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
	route.Store(held)
	clk.advance(time.Second) // between calls: counts for no task
	if err := f.e.Submit(id, f.reqs(2), f.opts, res[:2]); err != nil {
		t.Fatal(err)
	}
	ts := held.Take(-1)
	clk.advance(99 * time.Microsecond)
	ts[0].Done(64, nil)
	clk.advance(900 * time.Microsecond)
	ts[1].Done(64, nil)
	wantLatency(t, "batch held", statsOf(t, f.e, "held").Latency, 100*time.Microsecond, time.Millisecond)
	if _, err := f.e.Wait(id, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}

	// Stream: the same on a stream, two of each.
	s, err := f.e.NewStream(8, f.reg, discardSink{})
	if err != nil {
		t.Fatal(err)
	}
	route.Store(inline)
	clk.advance(time.Second)
	sres := make([]error, 2)
	if n, err := s.Submit(f.streamReqs(2, 0, time.Time{}), sres); n != 2 || err != nil {
		t.Fatalf("stream submit: %d %v", n, err)
	}
	wantLatency(t, "stream inline", statsOf(t, f.e, "inline").Latency, us3, us3, us3, us3, us3, us3)
	route.Store(held)
	clk.advance(time.Second)
	if n, err := s.Submit(f.streamReqs(2, 2, time.Time{}), sres); n != 2 || err != nil {
		t.Fatalf("stream submit: %d %v", n, err)
	}
	ts = held.Take(-1)
	clk.advance(9 * time.Microsecond)
	ts[0].Done(64, nil)
	clk.advance(20 * time.Millisecond)
	ts[1].Done(64, nil)
	wantLatency(t, "stream held", statsOf(t, f.e, "held").Latency,
		100*time.Microsecond, time.Millisecond, 10*time.Microsecond, 20*time.Millisecond+10*time.Microsecond)
	s.Close(nil)
	waitIdle(t, s)
	xfertest.CheckRefs(t, f.a, f.b)
}
