package xfer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestSubmitCarriesNotifyAndDeadline: the engine hands each task its
// effective deadline, its positional notification and its positional Sum
// (cleared) before dispatch, a Notify or Sums of the wrong length refuses
// the whole call without touching the batch, and a recycled slot carries
// none of them into the next batch.
func TestSubmitCarriesNotifyAndDeadline(t *testing.T) {
	type seen struct {
		notify   string
		has      bool
		deadline time.Time
		sum      *xfer.Sum
	}
	var got []seen
	tr := xfertest.New(xfertest.Config{Inline: true, OnSubmit: func(ts []*xfer.Task) {
		for _, tk := range ts {
			got = append(got, seen{string(tk.Notify), tk.Notify != nil, tk.Deadline, tk.Sum})
		}
	}})
	f := newFixture(t, xfer.Config{DefaultTimeout: time.Hour}, xfertest.RouteAll(tr))
	id, err := f.e.AllocateBatch(8)
	if err != nil {
		t.Fatal(err)
	}

	// A mismatched Notify is refused for the whole call: nothing is used.
	res := make([]error, 3)
	bad := f.opts
	bad.Notify = [][]byte{[]byte("only one")}
	if err := f.e.Submit(id, f.reqs(3), bad, res); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("Notify of 1 for 3 requests: %v, want ErrInvalid", err)
	}
	bad = f.opts
	bad.Sums = make([]xfer.Sum, 2)
	if err := f.e.Submit(id, f.reqs(3), bad, res); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("Sums of 2 for 3 requests: %v, want ErrInvalid", err)
	}
	if s, _ := f.e.BatchStatus(id); s.Total != 0 || len(got) != 0 {
		t.Fatalf("a refused call changed the batch: %+v, transport saw %d tasks", s, len(got))
	}

	// Positional: entries 0 and 2 carry one, entry 1 none (nil), and an
	// empty but non-nil payload is a notification too.
	deadline := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	opts := f.opts
	opts.Deadline = deadline
	opts.Notify = [][]byte{[]byte("layer-0"), nil, {}}
	opts.Sums = []xfer.Sum{{CRC: 7, Taken: true}, {CRC: 8}, {Taken: true}}
	before := time.Now()
	if err := f.e.Submit(id, f.reqs(3), opts, res); err != nil {
		t.Fatal(err)
	}
	want := []seen{{"layer-0", true, deadline, &opts.Sums[0]}, {"", false, deadline, &opts.Sums[1]},
		{"", true, deadline, &opts.Sums[2]}}
	if len(got) != len(want) {
		t.Fatalf("transport saw %d tasks, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].notify != want[i].notify || got[i].has != want[i].has || !got[i].deadline.Equal(want[i].deadline) ||
			got[i].sum != want[i].sum || *got[i].sum != (xfer.Sum{}) {
			t.Fatalf("task %d arrived as %+v, want %+v (its Sum cleared)", i, got[i], want[i])
		}
	}

	// No deadline in the call: each task carries now + DefaultTimeout.
	got = got[:0]
	if err := f.e.Submit(id, f.reqs(1), f.opts, res[:1]); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if len(got) != 1 || got[0].has || got[0].sum != nil || got[0].deadline.Before(before.Add(time.Hour)) ||
		got[0].deadline.After(after.Add(time.Hour)) {
		t.Fatalf("task without a call deadline arrived as %+v, want no notification, no Sum and now+1h", got)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}

	// The slot's next batch starts clean, whatever the last one carried.
	id, err = f.e.AllocateBatch(8)
	if err != nil {
		t.Fatal(err)
	}
	err = xfer.EachTask(f.e, id, func(i int, tk *xfer.Task) {
		if tk.Notify != nil || !tk.Deadline.IsZero() || tk.Sum != nil {
			t.Errorf("recycled task %d still carries %q / %v / %v", i, tk.Notify, tk.Deadline, tk.Sum)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.e.Free(id); err != nil {
		t.Fatal(err)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}

// TestLocalRefusesNotify: a notified WRITE between two local segments
// fails ErrNotSupported at its own position; its neighbours move, on both
// of the local transport's paths (inline and chunked).
func TestLocalRefusesNotify(t *testing.T) {
	for _, inline := range []int64{-1, 1 << 20} {
		l := xfer.NewLocal(xfer.LocalConfig{Workers: 1, InlineBytes: inline, ChunkBytes: 4096}, nil)
		f := newFixture(t, xfer.Config{}, xfertest.RouteAll(l))
		id, err := f.e.AllocateBatch(3)
		if err != nil {
			t.Fatal(err)
		}
		copy(f.a.Bytes(), "abcdefgh")
		f.a.Bytes()[64], f.a.Bytes()[128] = 'X', 'Y'
		opts := f.opts
		opts.Notify = [][]byte{nil, []byte("nobody to tell"), nil}
		res := make([]error, 3)
		if err := f.e.Submit(id, f.reqs(3), opts, res); err != nil {
			t.Fatal(err)
		}
		if _, err := f.e.Wait(id, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		for i, want := range []xfer.State{xfer.StateCompleted, xfer.StateFailed, xfer.StateCompleted} {
			st := f.status(t, id, i)
			if st.State != want {
				t.Fatalf("inline %d: task %d ended %v (%v), want %v", inline, i, st.State, st.Err, want)
			}
			if want == xfer.StateFailed && (!errors.Is(st.Err, xfer.ErrNotSupported) || !errors.Is(st.Err, xfer.ErrNoNotify)) {
				t.Fatalf("inline %d: notified task ended with %v, want ErrNotSupported", inline, st.Err)
			}
		}
		if string(f.b.Bytes()[:8]) != "abcdefgh" || f.b.Bytes()[64] != 0 || f.b.Bytes()[128] != 'Y' {
			t.Fatalf("inline %d: target holds %q, %q, %q: the notified WRITE moved bytes or a neighbour did not",
				inline, f.b.Bytes()[:8], f.b.Bytes()[64], f.b.Bytes()[128])
		}
		if err := f.e.Free(id); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		xfertest.CheckRefs(t, f.a, f.b)
	}
}

// TestOutstanding: the engine counts, per transport, the dispatched tasks
// still owed a Done, through a deadline, an Abandon and a Free, and forgets
// each once its transport ends it.
func TestOutstanding(t *testing.T) {
	slow, fast := xfertest.New(xfertest.Config{Name: "slow"}), syncTr()
	rt := xfertest.RouterFunc(func(_, tg xfer.Segment) (xfer.Transport, error) {
		if tg.ID() == 2 {
			return slow, nil
		}
		return fast, nil
	})
	f := newFixture(t, xfer.Config{}, rt)
	id, err := f.e.AllocateBatch(8)
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.reqs(3)
	reqs[2].Target = 1 // to the fast transport
	res := make([]error, 3)
	if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
		t.Fatal(err)
	}
	if got := f.e.Outstanding(); len(got) != 1 || got[slow] != 2 {
		t.Fatalf("outstanding after submit: %v, want 2 on slow", got)
	}
	// Abandoned: the engine ends them Canceled, the transport still owes.
	f.e.Abandon(id)
	if got := f.e.Outstanding(); got[slow] != 2 {
		t.Fatalf("outstanding after Abandon: %v, want 2 on slow", got)
	}
	slow.Finish()
	if got := f.e.Outstanding(); len(got) != 0 {
		t.Fatalf("outstanding after the transport ended them: %v", got)
	}
	xfertest.CheckRefs(t, f.a, f.b)
}
