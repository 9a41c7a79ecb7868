package bench

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

// fakeLanes stands in for daemon connections: every Transfer waits until
// want Transfers are in flight at once (or gives up after a while), so a
// dispatcher that does not overlap its lanes shows as a low maxActive.
type fakeLanes struct {
	want      int32
	active    atomic.Int32
	maxActive atomic.Int32
	calls     atomic.Int32

	mu    sync.Mutex // guards sizes and fail
	sizes []int      // requests per Transfer
	fail  map[uint64]error
}

type fakeConn struct {
	f  *fakeLanes
	id int
}

func (c fakeConn) Transfer(reqs []xfer.Request, _ time.Duration, results []error, _ ...client.CallOption) (client.Summary, error) {
	f := c.f
	f.calls.Add(1)
	a := f.active.Add(1)
	for {
		m := f.maxActive.Load()
		if a <= m || f.maxActive.CompareAndSwap(m, a) {
			break
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for f.maxActive.Load() < f.want && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	f.mu.Lock()
	f.sizes = append(f.sizes, len(reqs))
	for i, r := range reqs {
		if r.Local != xfer.SegmentID(100+c.id) || r.Target != xfer.SegmentID(200+c.id) {
			results[i] = errors.New("request names another connection's segment")
			continue
		}
		results[i] = f.fail[r.TargetOffset]
	}
	f.mu.Unlock()
	f.active.Add(-1)
	return client.Summary{}, nil
}

func newFakeDispatcher(f *fakeLanes, nl int, s dispatchSpec) *dispatcher {
	d := &dispatcher{}
	for i := range nl {
		d.lanes = append(d.lanes, &lane{t: fakeConn{f: f, id: i}, local: xfer.SegmentID(100 + i), target: xfer.SegmentID(200 + i)})
	}
	d.start(s)
	return d
}

// uringSpec lays out slots as the uring engine does: per lane, a run of
// batch slots.
func uringSpec(slots, batch int) dispatchSpec {
	s := dispatchSpec{Slots: slots, SlotSize: 4096, Region: 1 << 20, PartsPerIO: 1, Capacity: 4096,
		SlotOff: make([]uint64, slots), SlotLane: make([]int, slots)}
	for i := range slots {
		s.SlotOff[i] = uint64(i) * 4096
		s.SlotLane[i] = i / batch
	}
	return s
}

// TestDispatcherKeepsDepthInFlight: iodepth 32 submitted as four batches of
// 8 must be four Transfers in flight at once, one per lane, and every IO
// completes once.
func TestDispatcherKeepsDepthInFlight(t *testing.T) {
	const slots, batch = 32, 8
	f := &fakeLanes{want: slots / batch}
	d := newFakeDispatcher(f, laneCount(slots, batch), uringSpec(slots, batch))
	defer d.stopLanes()
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
	if got := f.maxActive.Load(); got != slots/batch {
		t.Errorf("at most %d Transfers were in flight at once, want %d", got, slots/batch)
	}
	if got := f.calls.Load(); got != slots/batch {
		t.Errorf("%d Transfers for %d batches", got, slots/batch)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.sizes {
		if s != batch {
			t.Errorf("a Transfer carried %d requests, want %d", s, batch)
		}
	}
}

// TestDispatcherSplitsAcrossLanes: an IO whose target spans blocks held by
// two lanes is sent as two parts, one per lane with that lane's segments,
// and completes once; a part's error fails the whole IO.
func TestDispatcherSplitsAcrossLanes(t *testing.T) {
	f := &fakeLanes{want: 1, fail: map[uint64]error{}}
	s := dispatchSpec{Slots: 2, SlotSize: 8192, Region: 4 * 4096, PartsPerIO: 3, Capacity: 4096,
		SlotOff: []uint64{0, 8192}, SlotLane: []int{0, 0}}
	d := &dispatcher{blocks: []uint64{40960, 0, 45056, 4096}, blockLane: []int{0, 1, 0, 1}, blockSize: 4096}
	for i := range 2 {
		d.lanes = append(d.lanes, &lane{t: fakeConn{f: f, id: i}, local: xfer.SegmentID(100 + i), target: xfer.SegmentID(200 + i)})
	}
	d.start(s)
	defer d.stopLanes()
	f.mu.Lock()
	f.fail[4096] = xfer.ErrInvalid // block 3: the second part of slot 1's IO
	f.mu.Unlock()
	ios := []IO{
		{Op: OpWrite, Slot: 0, Offset: 2048, Length: 8192},         // blocks 0, 1, 2
		{Op: OpRead, Slot: 1, Offset: 2*4096 + 2048, Length: 4096}, // blocks 2, 3
	}
	if n, err := d.Submit(ios); n != 2 || err != nil {
		t.Fatalf("submit: n=%d err=%v", n, err)
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
			if !errors.Is(c.Err, xfer.ErrInvalid) || c.N != 0 {
				t.Errorf("slot 1: %+v, want the part's error", c)
			}
		}
	}
	if out[0].Slot == out[1].Slot {
		t.Errorf("slot %d completed twice", out[0].Slot)
	}
	if f.calls.Load() < 2 {
		t.Errorf("%d Transfers; the parts live on two lanes", f.calls.Load())
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

// TestDispatcherStopWithWorkQueued: stopping with requests queued ends
// every lane goroutine (goleak in TestMain checks).
func TestDispatcherStopWithWorkQueued(t *testing.T) {
	f := &fakeLanes{want: 1}
	d := newFakeDispatcher(f, 2, uringSpec(16, 8))
	ios := []IO{{Op: OpRead, Slot: 0, Length: 4096}, {Op: OpRead, Slot: 8, Length: 4096}}
	if _, err := d.Submit(ios); err != nil {
		t.Fatal(err)
	}
	d.stopLanes()
	d.stopLanes()
	if _, err := d.Submit(ios); !errors.Is(err, ErrBadValue) {
		t.Errorf("submit after stop: %v", err)
	}
}

// nopConn completes every request at once.
type nopConn struct{}

func (nopConn) Transfer(reqs []xfer.Request, _ time.Duration, results []error, _ ...client.CallOption) (client.Summary, error) {
	for i := range results {
		results[i] = nil
	}
	return client.Summary{}, nil
}

// TestDispatcherNoAllocPerRequest: a Submit/Reap round of a full depth
// allocates nothing once the queues are sized.
func TestDispatcherNoAllocPerRequest(t *testing.T) {
	const slots, batch = 32, 8
	d := &dispatcher{}
	for range laneCount(slots, batch) {
		d.lanes = append(d.lanes, &lane{t: nopConn{}})
	}
	d.start(uringSpec(slots, batch))
	defer d.stopLanes()
	ios := make([]IO, slots)
	for s := range ios {
		ios[s] = IO{Op: OpWrite, Slot: s, Offset: uint64(s) * 4096, Length: 4096}
	}
	out := make([]Completion, slots)
	round := func() {
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
