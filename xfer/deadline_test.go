package xfer_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// A deadline is absolute: it ends what is still live at that time, however
// long the dispatch took and however long a request waited before a
// stream took it. The tests run in a synctest bubble, whose clock moves
// only when every goroutine of the test is blocked, so "at its deadline"
// is exact.

// slowDispatch is a transport whose Submit waits for room for d of the
// bubble's clock (a full ring) before it takes the tasks, and then holds
// them.
func slowDispatch(d time.Duration) *xfertest.Transport {
	return xfertest.New(xfertest.Config{CancelEnds: true, OnSubmit: func([]*xfer.Task) { time.Sleep(d) }})
}

// TestBatchDeadlinePassedInDispatch: a call whose transport's Submit takes
// past the call's deadline has its tasks ended Timeout as soon as Submit
// returns, not a whole timeout later.
func TestBatchDeadlinePassedInDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := slowDispatch(2 * time.Hour)
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
		start := time.Now()
		opts := f.opts
		opts.Deadline = start.Add(time.Hour)
		id, err := f.e.AllocateBatch(2)
		if err != nil {
			t.Fatal(err)
		}
		res := make([]error, 2)
		if err := f.e.Submit(id, f.reqs(2), opts, res); err != nil || res[0] != nil || res[1] != nil {
			t.Fatalf("Submit: %v %v", err, res)
		}
		synctest.Wait()
		for i := range 2 {
			if st := f.status(t, id, i); st.State != xfer.StateTimeout || !errors.Is(st.Err, xfer.ErrTimeout) {
				t.Fatalf("task %d at %v, an hour past its deadline: %v %v", i, time.Since(start), st.State, st.Err)
			}
		}
		if tr.Cancels() != 2 {
			t.Fatalf("%d cancels, want 2", tr.Cancels())
		}
		if err := f.e.Free(id); err != nil {
			t.Fatal(err)
		}
		xfertest.CheckRefs(t, f.a, f.b)
	})
}

// TestStreamDeadlinePassedInDispatch is the same for a stream's requests.
func TestStreamDeadlinePassedInDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := slowDispatch(2 * time.Hour)
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
		sink := newRecSink(t)
		s, err := f.e.NewStream(2, f.reg, sink)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		res := make([]error, 2)
		if n, err := s.Submit(f.streamReqs(2, 10, start.Add(time.Hour)), res); n != 2 || err != nil || res[0] != nil || res[1] != nil {
			t.Fatalf("Submit: %d %v %v", n, err, res)
		}
		synctest.Wait()
		for ud := uint64(10); ud < 12; ud++ {
			if st, err, ok := sink.state(ud); !ok || st != xfer.StateTimeout || !errors.Is(err, xfer.ErrTimeout) {
				t.Fatalf("request %d at %v, an hour past its deadline: %v %v (ended %v)", ud, time.Since(start), st, err, ok)
			}
		}
		s.Close(nil)
		<-s.Idle()
		xfertest.CheckRefs(t, f.a, f.b)
	})
}

// TestStreamRefusesExpired: a request whose deadline has passed when the
// stream takes it (it waited in its queue for a slot) is refused
// ErrTimeout, the sink never hears of it, and no transport is given it:
// the deadline ended it while it was still live, so nothing of it may be
// carried out. A deadline exactly now has passed, as for Engine.Submit.
func TestStreamRefusesExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := xfertest.New(xfertest.Config{Inline: true, Record: true})
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(tr))
		sink := newRecSink(t)
		s, err := f.e.NewStream(4, f.reg, sink)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		reqs := f.streamReqs(3, 10, now.Add(time.Second))
		reqs[0].Deadline = now
		reqs[1].Deadline = now.Add(-time.Nanosecond)
		res := make([]error, 3)
		if n, err := s.Submit(reqs, res); n != 3 || err != nil {
			t.Fatalf("Submit: %d %v", n, err)
		}
		if !errors.Is(res[0], xfer.ErrTimeout) || !errors.Is(res[1], xfer.ErrTimeout) || res[2] != nil {
			t.Fatalf("results %v, want the two expired requests refused ErrTimeout", res)
		}
		if got := tr.Requests(); len(got) != 1 || got[0] != reqs[2].Req {
			t.Fatalf("the transport was given %+v, want only the live request", got)
		}
		if st, _, _ := sink.state(12); st != xfer.StateCompleted || sink.count() != 1 {
			t.Fatalf("sink heard %d ends (12: %v), want only 12 Completed", sink.count(), st)
		}
		if s.Free() != 4 {
			t.Fatalf("%d slots free, want 4", s.Free())
		}
		s.Close(nil)
		<-s.Idle()
		xfertest.CheckRefs(t, f.a, f.b)
	})
}
