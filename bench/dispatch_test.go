package bench

import (
	"errors"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/xfer"
)

// fakeQueue stands in for a daemon queue: Submit takes up to room requests
// (the rest wait for a reap, as a full submission ring makes them), and
// Reap completes what was submitted, failing the requests whose target
// offset is in fail.
type fakeQueue struct {
	room  int
	fail  map[uint64]bool
	held  []client.Completion // submitted, not reaped
	reqs  []xfer.Request      // every request submitted, in order
	reaps int
}

func (f *fakeQueue) Submit(reqs []xfer.Request, ud []uint64) (int, error) {
	n := min(len(reqs), f.room-len(f.held))
	for i := range n {
		c := client.Completion{UserData: ud[i], N: reqs[i].Length, State: xfer.StateCompleted}
		if f.fail[reqs[i].TargetOffset] {
			c = client.Completion{UserData: ud[i], Code: tcproto.CodeINVALID_ARGUMENT, State: xfer.StateFailed}
		}
		f.held = append(f.held, c)
		f.reqs = append(f.reqs, reqs[i])
	}
	return n, nil
}

func (f *fakeQueue) Reap(out []client.Completion, min int, _ time.Duration) (int, error) {
	f.reaps++
	if len(f.held) < min {
		return 0, client.ErrDeadlineExceeded
	}
	n := copy(out, f.held)
	f.held = f.held[:copy(f.held, f.held[n:])]
	return n, nil
}

// fakeDispatcher is a dispatcher over a fake queue with room requests.
func fakeDispatcher(q *fakeQueue, s dispatchSpec) *dispatcher {
	d := &dispatcher{q: q, local: 100, target: 200}
	if err := d.start(s); err != nil {
		panic(err)
	}
	return d
}

func uringSpec(slots int) dispatchSpec {
	s := dispatchSpec{Slots: slots, SlotSize: 4096, Region: 1 << 20, PartsPerIO: 1, SlotOff: make([]uint64, slots)}
	for i := range slots {
		s.SlotOff[i] = uint64(i) * 4096
	}
	return s
}

// TestDispatcherKeepsDepthInFlight: iodepth 32 submitted as four batches of
// 8 puts all 32 requests in the queue before anything is reaped, with the
// engine's segments, and every IO completes once.
func TestDispatcherKeepsDepthInFlight(t *testing.T) {
	const slots, batch = 32, 8
	q := &fakeQueue{room: 64}
	d := fakeDispatcher(q, uringSpec(slots))
	ios := make([]IO, batch)
	for b := 0; b < slots/batch; b++ {
		for k := range ios {
			s := b*batch + k
			ios[k] = IO{Op: OpRead, Slot: s, Offset: uint64(s) * 4096, Length: 4096}
		}
		if n, err := d.Submit(ios); n != batch || err != nil {
			t.Fatalf("submit batch %d: n=%d err=%v", b, n, err)
		}
	}
	if len(q.held) != slots || q.reaps != 0 {
		t.Fatalf("%d requests in the queue after %d reaps, want all %d before any", len(q.held), q.reaps, slots)
	}
	for i, r := range q.reqs {
		if r.Local != 100 || r.Target != 200 || r.Op != xfer.OpRead || r.TargetOffset != uint64(i)*4096 || r.LocalOffset != uint64(i)*4096 {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	out := make([]Completion, slots)
	n, err := d.Reap(slots, out)
	if err != nil || n != slots {
		t.Fatalf("reap: n=%d err=%v, want %d", n, err, slots)
	}
	seen := make([]bool, slots)
	for _, c := range out[:n] {
		if c.Err != nil || c.N != 4096 || seen[c.Slot] {
			t.Fatalf("completion %+v (seen before: %v)", c, seen[c.Slot])
		}
		seen[c.Slot] = true
	}
}

// TestDispatcherSplitsAcrossBlocks: an IO whose target spans pool blocks is
// sent as one request per block and completes once; a part's error fails
// the whole IO; parts the queue had no room for go in after a reap.
func TestDispatcherSplitsAcrossBlocks(t *testing.T) {
	q := &fakeQueue{room: 3, fail: map[uint64]bool{4096: true}} // block 3: the second part of slot 1's IO
	s := dispatchSpec{Slots: 2, SlotSize: 8192, Region: 4 * 4096, PartsPerIO: 3, SlotOff: []uint64{0, 8192}}
	d := &dispatcher{q: q, local: 100, target: 200, blocks: []uint64{40960, 0, 45056, 4096}, blockSize: 4096}
	d.start(s)
	ios := []IO{
		{Op: OpWrite, Slot: 0, Offset: 2048, Length: 8192},         // blocks 0, 1, 2
		{Op: OpRead, Slot: 1, Offset: 2*4096 + 2048, Length: 4096}, // blocks 2, 3
	}
	if n, err := d.Submit(ios); n != 2 || err != nil {
		t.Fatalf("submit: n=%d err=%v", n, err)
	}
	if len(q.held) != 3 || len(d.backlog) != 2 {
		t.Fatalf("%d requests in a queue with room for 3, %d held back", len(q.held), len(d.backlog))
	}
	out := make([]Completion, 2)
	got := 0
	for got < 2 {
		n, err := d.Reap(1, out[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	for _, c := range out {
		switch c.Slot {
		case 0:
			if c.Err != nil || c.N != 8192 {
				t.Errorf("slot 0: %+v, want 8192 bytes", c)
			}
		case 1:
			if !errors.Is(c.Err, client.ErrInvalidArgument) || !errors.Is(c.Err, ErrIO) || c.N != 0 {
				t.Errorf("slot 1: %+v, want the part's error", c)
			}
		}
	}
	if out[0].Slot == out[1].Slot {
		t.Errorf("slot %d completed twice", out[0].Slot)
	}
	wantTargets := []uint64{40960 + 2048, 0, 45056, 45056 + 2048, 4096}
	for i, r := range q.reqs {
		if r.TargetOffset != wantTargets[i] {
			t.Errorf("part %d targets %d, want %d", i, r.TargetOffset, wantTargets[i])
		}
	}
	// A slot in flight cannot be submitted again; after its completion
	// was reaped it can.
	if n, err := d.Submit(ios[:1]); n != 1 || err != nil {
		t.Fatalf("resubmit: n=%d err=%v", n, err)
	}
	if n, err := d.Submit(ios[:1]); n != 0 || !errors.Is(err, ErrBadValue) {
		t.Fatalf("submit of a slot in flight: n=%d err=%v", n, err)
	}
	if n, _ := d.Reap(1, out); n != 1 {
		t.Fatalf("reap: %d", n)
	}
}

// TestDispatcherClosed: after closeQueue nothing is taken.
func TestDispatcherClosed(t *testing.T) {
	d := fakeDispatcher(&fakeQueue{room: 8}, uringSpec(4))
	d.closeQueue()
	d.closeQueue()
	if _, err := d.Submit([]IO{{Op: OpRead, Slot: 0, Length: 4096}}); !errors.Is(err, ErrBadValue) {
		t.Errorf("submit after close: %v", err)
	}
}

// TestDispatcherNoAllocPerRequest: a Submit/Reap round of a full depth
// allocates nothing once the tables are sized.
func TestDispatcherNoAllocPerRequest(t *testing.T) {
	const slots, batch = 32, 8
	q := &fakeQueue{room: 64, held: make([]client.Completion, 0, 64), reqs: make([]xfer.Request, 0, 1<<16)}
	d := fakeDispatcher(q, uringSpec(slots))
	ios := make([]IO, slots)
	for s := range ios {
		ios[s] = IO{Op: OpWrite, Slot: s, Offset: uint64(s) * 4096, Length: 4096}
	}
	out := make([]Completion, slots)
	round := func() {
		q.reqs = q.reqs[:0]
		for b := 0; b < slots; b += batch {
			if n, err := d.Submit(ios[b : b+batch]); n != batch || err != nil {
				t.Fatalf("submit: n=%d err=%v", n, err)
			}
		}
		for got := 0; got < slots; {
			n, err := d.Reap(1, out[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	round()
	if a := testing.AllocsPerRun(50, round); a > 0 {
		t.Errorf("%.1f allocations per round of %d requests", a, slots)
	}
}
