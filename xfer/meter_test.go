package xfer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

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
	if st := statsOf(t, f.e, "sync"); st.Requests != 8*202 || st.Bytes != 8*202*64 {
		t.Fatalf("counts %+v, want %d requests", st, 8*202)
	}
}

// TestTransportMeterInline: completions inside Submit are metered by the
// submit call in runs; counts, bytes and errors come out exact.
func TestTransportMeterInline(t *testing.T) {
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
