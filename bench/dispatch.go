package bench

import (
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// queuer is what the dispatcher drives: a *client.Queue, or a fake in
// tests.
type queuer interface {
	Submit(reqs []xfer.Request, userData []uint64) (int, error)
	Reap(out []client.Completion, min int, timeout time.Duration) (int, error)
}

// part is one daemon request of an IO: the piece of the IO that touches
// one pool block.
type part struct {
	slot   int
	op     xfer.Op
	local  uint64 // offset in the local segment
	target uint64 // offset in the target segment
	length uint64
}

// slotState is an IO in flight: how many of its parts are still out, and
// the first error one of them ended with.
type slotState struct {
	length uint64
	left   int
	err    error
}

// dispatchSpec is what the dispatcher needs to split IOs and size its
// queue.
type dispatchSpec struct {
	Slots      int
	SlotSize   uint64
	Region     uint64
	PartsPerIO int      // most parts one IO splits into
	SlotOff    []uint64 // per slot: offset of its buffer in the local segment
}

// dispatcher turns the runner's Submit/Reap into requests on one queue of
// one daemon connection: every IO in flight is in the daemon at once, as
// an engine keeping thousands of KV blocks in flight would have them. Its
// Submit and Reap are called by one goroutine (the worker's) and start no
// goroutine of their own.
type dispatcher struct {
	c             *client.Client // the connection (nil in tests)
	q             queuer
	local, target xfer.SegmentID

	spec dispatchSpec
	// local: the target region's pool blocks; nil for targets addressed
	// directly (a file, a remote segment).
	blocks    []uint64
	blockSize uint64
	// targetBase is added to every target offset (tcp, rdma: the clone's
	// window of a shared remote segment).
	targetBase uint64

	slots   []slotState
	backlog []part // parts of IOs taken whose request the queue had no room for yet
	reqs    []xfer.Request
	uds     []uint64
	cqes    []client.Completion
	ready   []Completion
	pending int // IOs submitted whose completion is not in ready yet
	closed  bool
}

// queueEntries is the submission ring a job's dispatcher asks for: room for
// every part of every slot in flight, within the daemon's limit.
func queueEntries(s dispatchSpec) int {
	return min(max(s.Slots*s.PartsPerIO, 2), 4096)
}

// dial opens the engine's connection to the daemon at sock.
func (d *dispatcher) dial(sock string) error {
	c, err := client.Dial(sock, client.Options{Name: "tcbench"})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrEngineUnavailable, err)
	}
	d.c = c
	return nil
}

// slotBuffer registers a client buffer of size bytes on c for a job's slot
// buffers: the buffer an engine's client would register (on transparent
// 2 MiB pages where the kernel gives them, which the log says when it
// gave fewer than its whole spans). c's Close unmaps it.
func slotBuffer(env *Env, c *client.Client, size uint64) (*client.Buffer, error) {
	buf, err := c.RegisterBuffer(size)
	if err != nil {
		return nil, fmt.Errorf("slot buffers: %w", err)
	}
	if whole := size &^ (shm.HugepageSize - 1); buf.Huge < whole && env != nil && env.Logger != nil {
		env.Logger.Warn("slot buffers on normal pages", "huge_bytes", buf.Huge, "whole_2MiB_spans_bytes", whole)
	}
	return buf, nil
}

// largestBlock is the largest of a pool's block classes (0 when it has none).
func largestBlock(classes []uint64) uint64 {
	var m uint64
	for _, c := range classes {
		m = max(m, c)
	}
	return m
}

// start opens the queue on the connection (unless a test set q) and sizes
// the dispatcher's tables.
func (d *dispatcher) start(s dispatchSpec) error {
	d.spec = s
	if d.q == nil {
		q, err := d.c.OpenQueue(queueEntries(s))
		if err != nil {
			return fmt.Errorf("%w: open a queue: %w", ErrEngineUnavailable, err)
		}
		d.q = q
	}
	most := s.Slots * s.PartsPerIO
	d.slots = make([]slotState, s.Slots)
	d.backlog = make([]part, 0, most)
	d.reqs = make([]xfer.Request, 0, most)
	d.uds = make([]uint64, 0, most)
	d.cqes = make([]client.Completion, most)
	d.ready = make([]Completion, 0, s.Slots)
	return nil
}

// Synchronous: Submit only queues; requests complete in the daemon.
func (d *dispatcher) Synchronous() bool { return false }

// piece returns the contiguous piece of the local target region that holds
// byte off of [off, off+left) onwards: its offset in the pool and its
// length. For targets addressed directly it is the range itself.
func (d *dispatcher) piece(off, left uint64) (toff, n uint64) {
	if d.blocks == nil {
		return off, left
	}
	b, in := off/d.blockSize, off%d.blockSize
	return d.blocks[b] + in, min(left, d.blockSize-in)
}

func (d *dispatcher) Submit(ios []IO) (int, error) {
	if d.q == nil || d.closed {
		return 0, fmt.Errorf("%w: engine not open", ErrBadValue)
	}
	s := &d.spec
	n := 0
	for _, io := range ios {
		if io.Slot < 0 || io.Slot >= s.Slots || io.Length == 0 || io.Length > s.SlotSize ||
			io.Offset > s.Region || io.Length > s.Region-io.Offset || (io.Op != OpRead && io.Op != OpWrite) ||
			d.slots[io.Slot].left != 0 {
			break
		}
		st := &d.slots[io.Slot]
		st.length, st.err = io.Length, nil
		for done := uint64(0); done < io.Length; {
			toff, l := d.piece(io.Offset+done, io.Length-done)
			d.backlog = append(d.backlog, part{slot: io.Slot, op: io.Op, local: s.SlotOff[io.Slot] + done,
				target: d.targetBase + toff, length: l})
			st.left++
			done += l
		}
		n++
	}
	d.pending += n
	if err := d.flush(); err != nil {
		return n, err
	}
	if n < len(ios) {
		return n, fmt.Errorf("%w: request out of bounds or slot in flight", ErrBadValue)
	}
	return n, nil
}

// flush puts what the backlog holds into the queue, as much as it has room
// for.
func (d *dispatcher) flush() error {
	if len(d.backlog) == 0 {
		return nil
	}
	d.reqs, d.uds = d.reqs[:0], d.uds[:0]
	for _, p := range d.backlog {
		d.reqs = append(d.reqs, xfer.Request{Op: p.op, Local: d.local, LocalOffset: p.local,
			Target: d.target, TargetOffset: p.target, Length: p.length})
		d.uds = append(d.uds, uint64(p.slot))
	}
	n, err := d.q.Submit(d.reqs, d.uds)
	d.backlog = d.backlog[:copy(d.backlog, d.backlog[n:])]
	if err != nil {
		return fmt.Errorf("%w: %w", ErrIO, err)
	}
	return nil
}

// Reap waits until atLeast completions are ready (or nothing more is in
// flight) and moves up to len(out) of them to out.
func (d *dispatcher) Reap(atLeast int, out []Completion) (int, error) {
	if d.q == nil || d.closed {
		return 0, fmt.Errorf("%w: engine not open", ErrBadValue)
	}
	for len(d.ready) < atLeast && d.pending > 0 {
		if err := d.flush(); err != nil {
			return 0, err
		}
		// Every IO still missing ends with at least one CQE: wait for
		// as many at once (one wake-up for them, as fio's
		// iodepth_batch_complete_min), never more than are pending.
		want := min(atLeast-len(d.ready), d.pending, len(d.cqes))
		k, err := d.q.Reap(d.cqes, want, waitTimeout)
		for _, c := range d.cqes[:k] {
			d.complete(c)
		}
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrIO, err)
		}
	}
	n := copy(out, d.ready)
	d.ready = d.ready[:copy(d.ready, d.ready[n:])]
	return n, nil
}

// complete counts one request's end against its IO, which is ready when
// its last part ends.
func (d *dispatcher) complete(c client.Completion) {
	if c.UserData >= uint64(len(d.slots)) {
		return // not one of ours: a daemon bug the counts will show
	}
	st := &d.slots[c.UserData]
	if err := c.Err(); err != nil && st.err == nil {
		st.err = fmt.Errorf("%w: %w", ErrIO, err)
	}
	if st.left == 0 {
		return
	}
	st.left--
	if st.left == 0 {
		r := Completion{Slot: int(c.UserData), N: st.length, Err: st.err}
		if r.Err != nil {
			r.N = 0
		}
		d.ready = append(d.ready, r)
		d.pending--
	}
}

// closeQueue closes the queue and the connection (which releases the
// buffers, blocks and segments it holds in the daemon).
func (d *dispatcher) closeQueue() error {
	if d.closed {
		return nil
	}
	d.closed = true
	if d.c == nil {
		return nil
	}
	if q, ok := d.q.(*client.Queue); ok {
		q.Close()
	}
	return d.c.Close()
}
