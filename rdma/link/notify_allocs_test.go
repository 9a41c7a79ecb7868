package link

import (
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestNotifiedWriteAllocations: a notified WRITE on an rdma link, from
// routing (the link and both sides' keys found through the task's
// segments) to the owner's answer, allocates nothing once warm: the link's note
// is reused, the WRITE is posted without a slice, and the notification
// goes in the tcp node's pooled notification frame, with no goroutine of
// its own (the runtime's count of goroutines created stays put). Both daemons run in this process, so the owner's side counts
// too; its delivery here is a counter (the export table's copies the
// payload for its subscribers, which is the owner's business).
func TestNotifiedWriteAllocations(t *testing.T) {
	var delivered atomic.Int64
	devs := fabric()
	devs.deliver = func(name string, payload []byte) error {
		if name == "kv" && string(payload) == "ready" {
			delivered.Add(1)
		}
		return nil
	}
	p := startPair(t, devs)
	w := xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 4096}
	p.d2.untilRDMA(t, p.kvRemote, w)
	l := p.d2.link("d1")
	if l == nil {
		t.Fatal("d2 has no rdma link to d1")
	}
	done := make(xfertest.Chan, 1)
	task := &xfer.Task{Req: w, Local: p.d2.pool, Target: p.kvRemote}
	one := []*xfer.Task{task}
	payload := []byte("ready")
	before := p.d2.tcpBytes()
	write := func() {
		task.Notify = payload
		task.Deadline = time.Now().Add(10 * time.Second)
		task.SetCompleter(done)
		if tr := p.d2.p.rdma.Route(task.Local, task.Target); tr != xfer.Transport(l) {
			t.Fatalf("Route = %v, want the link", tr)
		}
		if n, err := l.Submit(one); n != 1 {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		if e := <-done; e.Err != nil {
			t.Fatalf("notified WRITE: %v", e.Err)
		}
	}
	for range 50 { // warm the notes and the tcp node's pools
		write()
	}
	created := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(created)
	goroutinesBefore := created[0].Value.Uint64()
	allocs := testing.AllocsPerRun(200, write)
	metrics.Read(created)
	started := created[0].Value.Uint64() - goroutinesBefore
	t.Logf("%.2f allocations per notified WRITE, %d goroutines started in 201 of them (whole process, both daemons)", allocs, started)
	if started != 0 {
		t.Errorf("%d goroutines started during 201 notified WRITEs, want none", started)
	}
	limit := 0.0
	if invariants.RaceEnabled {
		limit = 4
	}
	if allocs > limit {
		t.Errorf("a notified WRITE allocates %.2f times, want at most %v", allocs, limit)
	}
	if n := delivered.Load(); n != 251 {
		t.Fatalf("%d notifications delivered for 251 notified WRITEs", n)
	}
	// The payload moved by rdma: tcp carried only the notifications.
	if moved := p.d2.tcpBytes() - before; moved >= 251*4096 {
		t.Fatalf("%d bytes of tcp for 251 notified WRITEs of 4 KiB", moved)
	}
	if task.Completer() != xfer.Completer(done) || string(task.Notify) != "ready" {
		t.Fatal("the task's completer or notification was not given back")
	}
}
