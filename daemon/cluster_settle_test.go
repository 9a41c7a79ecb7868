package daemon

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// settleFixture is an engine over a transport that holds every task until
// the test ends it, a read batch of n tasks timed out on it, and a mover
// over the engine.
func settleFixture(t *testing.T, n int) (*mover, *xfertest.Transport, xfer.BatchID) {
	t.Helper()
	tr := xfertest.New(xfertest.Config{})
	e := xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = e.Close() })
	reg := xfer.NewRegistry()
	pool, holder := xfertest.NewSegment(1, 1<<16), xfertest.NewSegment(2, 1<<16)
	for _, s := range []*xfertest.Segment{pool, holder} {
		if err := reg.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	id, err := e.AllocateBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]xfer.Request, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: 1, LocalOffset: uint64(i) * 4096, Target: 2, TargetOffset: uint64(i) * 4096, Length: 4096}
	}
	deadline := time.Now().Add(20 * time.Millisecond)
	if err := e.Submit(id, reqs, xfer.SubmitOptions{Resolver: reg, Deadline: deadline}, make([]error, n)); err != nil {
		t.Fatal(err)
	}
	if sum, err := e.Wait(id, time.Now().Add(10*time.Second)); err != nil || sum.Timeout != n {
		t.Fatalf("Wait: %+v, %v (want %d timed out)", sum, err, n)
	}
	return &mover{engine: e}, tr, id
}

// TestSettleWaitsForLateReads: a read batch that timed out settles (its
// blocks may go back to the pool) only once its transport can no longer
// write into them: after the last late Done, not before.
func TestSettleWaitsForLateReads(t *testing.T) {
	const n = 4
	m, tr, id := settleFixture(t, n)
	settled := m.settle(id)
	ts := tr.Take(-1)
	if len(ts) != n {
		t.Fatalf("the transport held %d reads, want %d", len(ts), n)
	}
	for i, task := range ts {
		select {
		case <-settled:
			t.Fatalf("settled with %d late reads still to land in its blocks", n-i)
		default:
		}
		task.Done(task.Req.Length, nil) // the READ lands after its deadline
	}
	select {
	case <-settled:
	default:
		t.Fatal("not settled after the last late read landed")
	}
}

// TestSettleNothingOwed: a read batch whose transport owes nothing settles
// at once.
func TestSettleNothingOwed(t *testing.T) {
	m, tr, id := settleFixture(t, 2)
	for _, task := range tr.Take(-1) {
		task.Done(0, xfer.ErrCanceled) // ended by the transport before the batch is handed back
	}
	select {
	case <-m.settle(id):
	default:
		t.Fatal("a batch owing nothing did not settle at once")
	}
}
