package tcp

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestNotifyAlone: Notify sends only a task's notification, for bytes
// another transport moved: no payload crosses, the task ends with the
// bytes it was told moved on the owner's ACK, and fails closed as a
// notified WRITE does on a negative ACK; a task that cannot carry a
// notification ends typed.
func TestNotifyAlone(t *testing.T) {
	a, b, r, local, col := notifyPair(t)
	out := func() uint64 {
		for _, p := range a.Peers() {
			if p.ID == "b" {
				return p.BytesOut
			}
		}
		return 0
	}
	before := out()
	tk := mkTask(col, xfer.OpWrite, local, 0, r, 0, 64<<10)
	tk.Notify, tk.Deadline = []byte("ready"), time.Now().Add(5*time.Second)
	a.Notify(tk, 64<<10)
	if d := col.Next(t, 1, 5*time.Second)[0]; d.Err != nil || d.N != 64<<10 {
		t.Fatalf("notification alone: n=%d err=%v", d.N, d.Err)
	}
	if got := <-b.exp.notifyCh; got != "seg:ready" {
		t.Fatalf("delivered %q", got)
	}
	if moved := out() - before; moved != 0 {
		t.Fatalf("%d payload bytes sent with a notification alone", moved)
	}

	b.exp.mu.Lock()
	b.exp.deliver = func(string, []byte) error { return errors.New("no subscriber") }
	b.exp.mu.Unlock()
	tk = mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	tk.Notify, tk.Deadline = []byte("x"), time.Now().Add(5*time.Second)
	a.Notify(tk, 4096)
	if d := col.Next(t, 1, 5*time.Second)[0]; !errors.Is(d.Err, ErrNotifyRejected) {
		t.Fatalf("negative ACK: n=%d err=%v", d.N, d.Err)
	}
	// A peer that notifies an export whose owner refuses over and over
	// is logged as every refusal is: once per interval, not per frame.
	for range 20 {
		tk = mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
		tk.Notify, tk.Deadline = []byte("x"), time.Now().Add(5*time.Second)
		a.Notify(tk, 4096)
		if d := col.Next(t, 1, 5*time.Second)[0]; !errors.Is(d.Err, ErrNotifyRejected) {
			t.Fatalf("negative ACK: n=%d err=%v", d.N, d.Err)
		}
	}
	if logs := b.logs.String(); strings.Count(logs, "request refused: notify") != 1 || strings.Contains(logs, "level=WARN msg=\"notification") {
		t.Fatalf("21 refused notifications logged as:\n%s", logs)
	}

	for _, bad := range []*xfer.Task{
		mkTask(col, xfer.OpRead, local, 0, r, 0, 4096),  // not a WRITE
		mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096), // no notification
	} {
		if bad.Req.Op == xfer.OpRead {
			bad.Notify = []byte("x")
		}
		a.Notify(bad, 4096)
		if d := col.Next(t, 1, 5*time.Second)[0]; !errors.Is(d.Err, xfer.ErrInvalid) {
			t.Fatalf("%v with notification %q: %v, want xfer.ErrInvalid", bad.Req.Op, bad.Notify, d.Err)
		}
	}
}

// notifyPair is two nodes on one connection, a's write-only remote of b's
// "seg", a local 1 MiB segment and a recorder of the tasks' ends: the
// set-up of the notification tests. One connection keeps a's requests in
// order on the wire.
func notifyPair(t *testing.T) (a, b *testNode, r *Remote, local *xfertest.Segment, col *xfertest.Recorder) {
	t.Helper()
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{ConnsPerPeer: 1})
	a, b = nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, r, xfertest.NewSegment(1, 1<<20), xfertest.NewRecorder()
}
