package uring

import (
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// TestTraceEveryMarksSQEs: with TraceEvery 1 every data SQE carries
// TracedUserData and its completion still finds its slot; with 16 about
// one in 16 does; with 0 none.
func TestTraceEveryMarksSQEs(t *testing.T) {
	for _, tc := range []struct {
		every    int
		min, max uint64 // traced SQEs of 1600
	}{{1, 1600, 1600}, {16, 50, 200}, {0, 0, 0}} {
		tr := integrity(t, Config{TraceEvery: tc.every}, false, false, 800)
		st := tr.Stats()[0]
		if st.Submitted != 1600 || st.Traced < tc.min || st.Traced > tc.max {
			t.Errorf("TraceEvery %d: %d of %d SQEs traced, want %d..%d", tc.every, st.Traced, st.Submitted, tc.min, tc.max)
		}
	}
}

// TestCancelTracedInKernel: a cancel names the SQE by its user_data, flag
// included, so a traced request parked in the kernel is canceled too.
func TestCancelTracedInKernel(t *testing.T) {
	tr := newTransport(t, Config{TraceEvery: 1})
	f := pipeFile(t, tr)
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	task := newTask(rec, xfer.OpRead, pool, 0, f, 0, 4096)
	if n, err := tr.Submit([]*xfer.Task{task}); n != 1 {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	waitInKernel(t, tr, 1)
	if st := tr.Stats()[0]; st.Traced != 1 {
		t.Fatalf("the request was not traced: %+v", st)
	}
	tr.Cancel(task)
	rec.waitDone(t, 1, 5*time.Second)
	if calls, n, err := rec.result(task); calls != 1 || n != 0 || !errors.Is(err, xfer.ErrCanceled) {
		t.Fatalf("calls=%d n=%d err=%v", calls, n, err)
	}
}
