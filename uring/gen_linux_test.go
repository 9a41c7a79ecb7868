//go:build linux

package uring

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// fillSlot puts task in slot idx as Submit and prepIO do, with one SQE in
// the kernel, and returns that SQE's user_data.
func fillSlot(r *ring, idx int32, task *xfer.Task) uint64 {
	s := &r.slots[idx]
	s.gen.Add(1)
	s.task, s.op, s.total, s.done = task, opRead, 4096, 0
	s.ud = r.userData(idx)
	s.inKernel = true
	r.inKernel++
	r.inflight++
	return s.ud
}

// TestStaleCompletionAndCancel: user_data and cancels name a slot's task
// by the slot's generation, so a completion or a cancel meant for the task
// a slot held before (a late -ECANCELED from a cancel that raced its
// completion) never ends the task the slot holds now.
func TestStaleCompletionAndCancel(t *testing.T) {
	tr := &Transport{cfg: Config{Entries: 4, Batch: 4}}
	r := newRing(tr, 0, 0)
	tr.rings = []*ring{r}
	a, b := &xfer.Task{}, &xfer.Task{}

	udA := fillSlot(r, 2, a)
	a.Tag = 2
	tr.Cancel(a) // recorded for a's generation
	if len(r.cancels) != 1 {
		t.Fatalf("Cancel recorded %d cancels", len(r.cancels))
	}
	staleCancel := r.cancels[0]
	r.complete(&CQE{UserData: udA, Res: 4096}, false)
	if len(r.fin) != 1 || r.fin[0].task != a || r.fin[0].err != nil {
		t.Fatalf("a's completion: %+v", r.fin)
	}
	// Freed as flushFinished frees it, then taken by b.
	r.fin = r.fin[:0]
	r.slots[2].task = nil
	r.slots[2].canceled.Store(false)
	r.slots[2].cancelQueued = false
	udB := fillSlot(r, 2, b)
	if udB == udA {
		t.Fatalf("b's user_data %#x is a's", udB)
	}

	// The cancel Cancel recorded for a no longer names the slot's task.
	if idx, gen := refSlot(staleCancel); idx != 2 || r.slots[2].current(gen) {
		t.Fatalf("a's cancel (slot %d) names b's task", idx)
	}
	// A completion for a's SQE (the -ECANCELED of a cancel that raced
	// its completion) leaves b alone.
	r.complete(&CQE{UserData: udA, Res: -int32(unix.ECANCELED)}, false)
	if len(r.fin) != 0 || !r.slots[2].inKernel {
		t.Fatalf("a's stale completion ended b: %+v", r.fin)
	}
	r.complete(&CQE{UserData: udB | TracedUserData, Res: 4096}, false)
	if len(r.fin) != 1 || r.fin[0].task != b || r.fin[0].err != nil {
		t.Fatalf("b's completion: %+v", r.fin)
	}
}
