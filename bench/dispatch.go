package bench

import (
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

// transferer is the one call a lane makes: *client.Client, or a fake in
// tests.
type transferer interface {
	Transfer(reqs []xfer.Request, timeout time.Duration, results []error, opts ...client.CallOption) (client.Summary, error)
}

// part is one daemon task of an IO: the piece of the IO that touches one
// pool block. Segment ids are the lane's own (each connection registers
// its own), so a part carries only offsets.
type part struct {
	slot   int
	op     xfer.Op
	local  uint64 // offset in the lane's local segment
	target uint64 // offset in the lane's target segment
	length uint64
}

// lane is one daemon connection and the goroutine that sends its queue.
type lane struct {
	c             *client.Client // nil in tests
	t             transferer
	local, target xfer.SegmentID

	// mu guards queue, the parts waiting for the lane's goroutine.
	mu    sync.Mutex
	queue []part
	wake  chan struct{} // room for one token: left by whoever queues

	// Owned by the lane's goroutine.
	work    []part
	reqs    []xfer.Request
	results []error

	// Owned by the engine's caller (Submit).
	staged []part
}

// slotState is an IO in flight: how many of its parts are still out, and
// the first error one of them ended with.
type slotState struct {
	length uint64
	left   int
	err    error
}

// dispatchSpec is what the dispatcher needs to route and size its queues.
type dispatchSpec struct {
	Slots      int
	SlotSize   uint64
	Region     uint64
	PartsPerIO int      // most parts one IO splits into
	Capacity   int      // most requests in one Transfer
	SlotOff    []uint64 // per slot: offset of its buffer in the local segment
	SlotLane   []int    // per slot: the lane holding its buffer (uring)
}

// dispatcher turns the runner's Submit/Reap into Transfers on several
// lanes. Its Submit and Reap are called by one goroutine (the worker's);
// each lane has one goroutine, started by start and stopped by stopLanes.
type dispatcher struct {
	lanes []*lane
	spec  dispatchSpec

	// local: the target region's pool blocks and the lane holding each;
	// nil for uring (the target is a file every lane opened).
	blocks    []uint64
	blockLane []int
	blockSize uint64
	// targetBase is added to every target offset (tcp, rdma: the clone's
	// window of a shared remote segment).
	targetBase uint64

	stop chan struct{} // nil while the lanes' goroutines are not running
	wg   sync.WaitGroup

	// mu guards slots, ready and pending; cond (on mu) is signaled when
	// ready grows.
	mu      sync.Mutex
	cond    sync.Cond
	slots   []slotState
	ready   []Completion
	pending int // IOs submitted whose completion is not in ready yet
}

// dial opens n connections to the daemon at sock as the dispatcher's
// lanes. On error the lanes dialed so far stay in d.lanes, for the
// engine's Close to close.
func (d *dispatcher) dial(sock string, n int) error {
	d.lanes = make([]*lane, 0, n)
	for range n {
		c, err := client.Dial(sock, client.Options{Name: "tcbench"})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrEngineUnavailable, err)
		}
		d.lanes = append(d.lanes, &lane{c: c, t: c})
	}
	return nil
}

// largestBlock is the largest of a pool's block classes (0 when it has none).
func largestBlock(classes []uint64) uint64 {
	var m uint64
	for _, c := range classes {
		m = max(m, c)
	}
	return m
}

// start sizes the queues and starts one goroutine per lane.
func (d *dispatcher) start(s dispatchSpec) {
	d.spec = s
	d.cond.L = &d.mu
	d.slots = make([]slotState, s.Slots)
	d.ready = make([]Completion, 0, s.Slots)
	most := s.Slots * s.PartsPerIO
	for _, l := range d.lanes {
		l.queue = make([]part, 0, most)
		l.work = make([]part, 0, most)
		l.staged = make([]part, 0, most)
		n := min(most, s.Capacity)
		l.reqs = make([]xfer.Request, 0, n)
		l.results = make([]error, n)
		l.wake = make(chan struct{}, 1)
	}
	d.stop = make(chan struct{})
	for _, l := range d.lanes {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.serve(l)
		}()
	}
}

// stopLanes stops every lane's goroutine and waits for them; a Transfer in
// flight is let finish (it is bounded by waitTimeout).
func (d *dispatcher) stopLanes() {
	if d.stop == nil {
		return
	}
	close(d.stop)
	d.wg.Wait()
	d.stop = nil
}

// Synchronous: Submit only queues; requests complete on the lanes.
func (d *dispatcher) Synchronous() bool { return false }

// piece returns the contiguous piece of the local target region that holds
// byte off of [off, off+left) onwards: its offset in the pool, its length
// and the lane holding it. For uring (no blocks) it is the file range.
func (d *dispatcher) piece(off, left uint64) (toff, n uint64, ln int) {
	if d.blocks == nil {
		return off, left, -1
	}
	b, in := off/d.blockSize, off%d.blockSize
	return d.blocks[b] + in, min(left, d.blockSize-in), d.blockLane[b]
}

func (d *dispatcher) Submit(ios []IO) (int, error) {
	if d.stop == nil {
		return 0, fmt.Errorf("%w: engine not open", ErrBadValue)
	}
	s := &d.spec
	n := 0
	d.mu.Lock()
	for _, io := range ios {
		if io.Slot < 0 || io.Slot >= s.Slots || io.Length == 0 || io.Length > s.SlotSize ||
			io.Offset > s.Region || io.Length > s.Region-io.Offset || (io.Op != OpRead && io.Op != OpWrite) ||
			d.slots[io.Slot].left != 0 {
			break
		}
		st := &d.slots[io.Slot]
		st.length, st.err = io.Length, nil
		for done := uint64(0); done < io.Length; {
			toff, l, ln := d.piece(io.Offset+done, io.Length-done)
			if ln < 0 {
				ln = s.SlotLane[io.Slot]
			}
			ls := d.lanes[ln]
			ls.staged = append(ls.staged, part{slot: io.Slot, op: io.Op, local: s.SlotOff[io.Slot] + done, target: d.targetBase + toff, length: l})
			st.left++
			done += l
		}
		n++
	}
	d.pending += n
	d.mu.Unlock()
	for _, l := range d.lanes {
		if len(l.staged) == 0 {
			continue
		}
		l.mu.Lock()
		l.queue = append(l.queue, l.staged...)
		l.mu.Unlock()
		l.staged = l.staged[:0]
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	if n < len(ios) {
		return n, fmt.Errorf("%w: request out of bounds or slot in flight", ErrBadValue)
	}
	return n, nil
}

// Reap waits until min completions are ready (or nothing more is in
// flight) and moves up to len(out) of them to out.
func (d *dispatcher) Reap(min int, out []Completion) (int, error) {
	d.mu.Lock()
	for len(d.ready) < min && d.pending > 0 {
		d.cond.Wait()
	}
	n := copy(out, d.ready)
	d.ready = append(d.ready[:0], d.ready[n:]...)
	d.mu.Unlock()
	return n, nil
}

// serve is a lane's goroutine: it sends what is queued, as one Transfer of
// up to Capacity requests at a time, until stop.
func (d *dispatcher) serve(l *lane) {
	for {
		select {
		case <-d.stop:
			return
		case <-l.wake:
		}
		for {
			l.mu.Lock()
			l.work, l.queue = l.queue, l.work[:0]
			l.mu.Unlock()
			if len(l.work) == 0 {
				break
			}
			for i := 0; i < len(l.work); i += d.spec.Capacity {
				d.transfer(l, l.work[i:min(i+d.spec.Capacity, len(l.work))])
			}
			select {
			case <-d.stop:
				return
			default:
			}
		}
	}
}

// transfer sends parts as one Transfer and completes the IOs whose last
// part it was.
func (d *dispatcher) transfer(l *lane, parts []part) {
	l.reqs = l.reqs[:0]
	for _, p := range parts {
		l.reqs = append(l.reqs, xfer.Request{Op: p.op, Local: l.local, LocalOffset: p.local,
			Target: l.target, TargetOffset: p.target, Length: p.length})
	}
	res := l.results[:len(parts)]
	_, err := l.t.Transfer(l.reqs, waitTimeout, res)
	d.mu.Lock()
	for i, p := range parts {
		e := err
		if e == nil {
			e = res[i]
		}
		st := &d.slots[p.slot]
		if e != nil && st.err == nil {
			st.err = e
		}
		st.left--
		if st.left == 0 {
			c := Completion{Slot: p.slot, N: st.length, Err: st.err}
			if c.Err != nil {
				c.N = 0
			}
			d.ready = append(d.ready, c)
			d.pending--
		}
	}
	d.mu.Unlock()
	d.cond.Signal()
}
