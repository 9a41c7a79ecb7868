//go:build linux && cgo

package rdma

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// Completions polled by the reactor that posted, over real verbs (the
// Soft-RoCE VM): home_test.go covers the same over rdmatest.

// TestVerbsHomeReapsItsOwn: WRITEs and READs a home submitted complete on
// the device and end only in that home's Reap, with their bytes; the home
// sleeps once it polled its spin, and the completion event wakes it.
func TestVerbsHomeReapsItsOwn(t *testing.T) {
	hs := NewHomes(1, -1) // no spin: every round trip goes through the wake-up
	p := newVerbsPair(t, Config{QPs: 1, Homes: hs}, 4<<20)
	h := hs.Home(0)
	var kicks atomic.Int32
	h.Bind(func() { kicks.Add(1) }, false)
	r := newRecorder()
	for i := range p.la[:1<<20] {
		p.la[i] = byte(i*13 + 1)
	}
	for round := range 20 {
		w := p.segs.Tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 1 << 20})
		w[0].Home = 1
		if n, err := p.a.Submit(w); n != 1 || err != nil {
			t.Fatalf("round %d: Submit = %d, %v", round, n, err)
		}
		// The worker's loop: reap, and sleep (armed) when nothing came.
		testutil.Eventually(t, 10*time.Second, func() bool {
			if !h.Reap() {
				h.Sleep(nil)
			}
			return r.Count() == 2*round+1
		}, "round %d's WRITE ended in its home's Reap", round)
		rd := p.segs.Tasks(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: 2 << 20, Target: segRemote, Length: 1 << 20})
		rd[0].Home = 1
		if n, err := p.a.Submit(rd); n != 1 || err != nil {
			t.Fatalf("round %d: Submit = %d, %v", round, n, err)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			if !h.Reap() {
				h.Sleep(nil)
			}
			return r.Count() == 2*round+2
		}, "round %d's READ ended in its home's Reap", round)
		if err := r.Err(w[0]); err != nil {
			t.Fatal(err)
		}
		if err := r.Err(rd[0]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(p.la[:1<<20], p.la[2<<20:3<<20]) {
		t.Fatal("bytes read back differ")
	}
	if h.Reaped() == 0 {
		t.Fatal("the home reaped nothing")
	}
	if kicks.Load() == 0 {
		t.Error("no completion event woke the home in 40 round trips without spin")
	}
	t.Logf("home reaped %d completions, woken %d times", h.Reaped(), kicks.Load())
}

// TestVerbsHomeQPErrorAndClose: a queue pair error with a home's work in
// flight ends each task once, with a completion error naming its status,
// reaped by that home; the queue pair comes back; then Close with the
// home's work in flight and the home gone quiet ends every task once,
// reaped by the transport (not the drain's bound).
func TestVerbsHomeQPErrorAndClose(t *testing.T) {
	const chunk = 4 << 20
	hs := NewHomes(1, 0)
	p := newVerbsPair(t, Config{QPs: 1, Homes: hs, ConnectTimeout: 30 * time.Second}, 16*chunk)
	h := hs.Home(0)
	h.Bind(func() {}, false)
	r := newRecorder()
	var reqs []xfer.Request
	for i := range 16 {
		off := uint64(i) * chunk
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: chunk})
	}
	tasks := p.segs.Tasks(r, reqs...)
	for _, tk := range tasks {
		tk.Home = 1
	}
	if n, err := p.a.Submit(tasks); n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if err := p.a.failQP(0); err != nil {
		t.Fatalf("forcing the queue pair to ERR: %v", err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { h.Reap(); return r.Count() == len(tasks) }, "every task ended")
	r.Check(t, tasks)
	failed := 0
	for i, tk := range tasks {
		if err := r.Err(tk); err != nil {
			failed++
			var ce *CompletionError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "IBV_WC_") {
				t.Errorf("task %d: %v, want a completion error naming the status", i, err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no task was in flight when the queue pair failed")
	}
	if h.Reaped() == 0 {
		t.Fatal("the home did not reap its failed work")
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return qpIsUp(p.a, 0) }, "the queue pair re-established")

	// The home posts again, and never reaps: Close takes it back.
	late := p.segs.Tasks(r, reqs...)
	for _, tk := range late {
		tk.Home = 1
	}
	if n, err := p.a.Submit(late); n != len(late) || err != nil {
		t.Fatalf("Submit after recovery = %d, %v", n, err)
	}
	start := time.Now()
	if err := p.a.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= 30*time.Second {
		t.Errorf("Close took %v: it waited for the drain's bound", took)
	}
	r.Check(t, append(tasks, late...))
	for i, tk := range late {
		if err := r.Err(tk); errors.Is(err, xfer.ErrClosed) {
			t.Errorf("late task %d ended by the drain's bound (%v), not reaped", i, err)
		}
	}
}
