package tcp

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestSteadyStateAllocations: a 4 KiB READ or WRITE that fits one slice,
// on an established session with room in the window, allocates (almost)
// nothing: the task state and the request are pooled and the frame is
// written from the request's own header array.
func TestSteadyStateAllocations(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{ConnsPerPeer: 1})
	a := nodes[0]
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 1<<20)
	cc := make(xfertest.Chan, 1)
	for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
		tk := &xfer.Task{Req: xfer.Request{Op: op, Length: 4096}, Local: local, Target: r}
		tk.SetCompleter(cc)
		one := []*xfer.Task{tk}
		for i := 0; i < 50; i++ { // warm the pools
			a.Submit(one)
			<-cc
		}
		allocs := testing.AllocsPerRun(500, func() {
			a.Submit(one)
			if d := <-cc; d.Err != nil {
				t.Fatal(d.Err)
			}
		})
		t.Logf("%v: %.1f allocations per request (whole process, both nodes)", op, allocs)
		// Both nodes run in this process, so the owner's side counts too.
		limit := 0.0
		if invariants.RaceEnabled {
			limit = 4
		}
		if allocs > limit {
			t.Errorf("%v: %.1f allocations per request", op, allocs)
		}
	}
}
