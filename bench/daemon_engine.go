package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

func init() {
	engines["local"] = newDaemonEngine
	engines["uring"] = newDaemonEngine
	delete(unavailable, "local")
	delete(unavailable, "uring")
}

// waitTimeout bounds one Wait on a batch; a request that takes longer is
// reported as an I/O error.
const waitTimeout = 60 * time.Second

// daemonEngine runs a job as a client of tensorcastd.
//
//   - local: the slot buffers are one registered client buffer (a sealed
//     memfd); the target region is pool blocks. A write copies buffer →
//     pool, a read pool → buffer, by the daemon's local transport.
//   - uring: the slot buffers are pool blocks (the pages io_uring moves
//     to and from); the target is a file segment the daemon opened.
//
// When iodepth equals batch, each submit is one Transfer (one round trip).
// Otherwise batches are pipelined on the connection: a submit is one Submit
// into an idle batch ("lane"), a reap is one Wait on the oldest round.
// Batches are reused until their task capacity is spent, then replaced.
type daemonEngine struct {
	env *Env
	job *Job
	c   *client.Client

	slotSize uint64
	local    xfer.SegmentID
	localOff []uint64 // per slot: offset of its buffer in the local segment
	slotMem  [][]byte // per slot: its buffer as mapped here

	target    xfer.SegmentID
	blocks    []uint64 // local: pool blocks of the target region
	blockSize uint64
	file      string // uring: the file's path

	single   bool // one Transfer per submit
	capacity int  // tasks per batch
	maxLanes int
	lanes    []*lane
	idle     []*lane
	rounds   []round // ring of rounds in flight
	head     int
	nrounds  int
	reqs     []xfer.Request
	results  []error
	ready    []Completion
	scratch  []byte
}

type lane struct {
	id   xfer.BatchID
	used int            // task indices taken
	prev client.Summary // the summary at the last reap
}

// ioRef is one IO of a round; parts counts the tasks it was split into.
type ioRef struct {
	slot   int
	length uint64
	err    error
}

type round struct {
	lane     *lane
	first    int     // task index of the round's first request
	ios      []ioRef // the round's IOs
	taskIO   []int   // per task: index into ios
	accepted int
}

var (
	_ Engine = (*daemonEngine)(nil)
	_ Peeker = (*daemonEngine)(nil)
)

func newDaemonEngine(env *Env, job *Job) (Engine, error) {
	return &daemonEngine{env: env, job: job}, nil
}

func (d *daemonEngine) Name() string { return d.job.Engine }

func (d *daemonEngine) Open(s EngineSpec) (err error) {
	sock := d.env.socket(d.job)
	d.c, err = client.Dial(sock, client.Options{Name: "tcbench"})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrEngineUnavailable, err)
	}
	defer func() {
		if err != nil {
			d.c.Close()
			d.c = nil
		}
	}()
	pool, ok := d.c.Pool()
	if !ok {
		return fmt.Errorf("%w: the daemon's pool is not mapped", ErrEngineUnavailable)
	}
	maxBlock := uint64(0)
	for _, b := range pool.BlockClasses {
		maxBlock = max(maxBlock, b)
	}
	if maxBlock == 0 {
		maxBlock = 1 << 20
	}
	lim := d.c.Hello().Limits
	d.capacity = int(min(max(lim.MaxBatchCapacity, 1), 4096))
	d.maxLanes = int(max(lim.MaxBatches, 2)) - 1
	d.slotSize = s.SlotSize
	d.single = s.Slots == d.job.Batch
	d.localOff = make([]uint64, s.Slots)
	d.slotMem = make([][]byte, s.Slots)

	switch d.job.Engine {
	case "local":
		buf, err := d.c.RegisterBuffer(uint64(s.Slots) * s.SlotSize)
		if err != nil {
			return fmt.Errorf("register buffer: %w", err)
		}
		d.local = buf.ID
		for i := range d.localOff {
			d.localOff[i] = uint64(i) * s.SlotSize
			d.slotMem[i] = buf.Mem[d.localOff[i] : d.localOff[i]+s.SlotSize]
		}
		d.target = pool.Segment
		d.blockSize = maxBlock
		n := (s.Region + maxBlock - 1) / maxBlock
		if lim.MaxBlocks > 0 && n > uint64(lim.MaxBlocks) {
			return fmt.Errorf("%w: size needs %d pool blocks of %d bytes; the daemon allows %d", ErrBadValue, n, maxBlock, lim.MaxBlocks)
		}
		d.blocks, err = d.c.AllocBlocks(nil, int(n), maxBlock)
		if err != nil {
			return fmt.Errorf("alloc %d pool blocks of %d bytes: %w", n, maxBlock, err)
		}
	case "uring":
		if s.SlotSize > maxBlock {
			return fmt.Errorf("%w: bs %d is larger than the pool's largest block %d", ErrBadValue, s.SlotSize, maxBlock)
		}
		offs, err := d.c.AllocBlocks(nil, s.Slots, s.SlotSize)
		if err != nil {
			return fmt.Errorf("alloc %d pool blocks for buffers: %w", s.Slots, err)
		}
		mem := d.c.PoolBytes()
		d.local = pool.Segment
		for i, off := range offs {
			d.localOff[i] = off
			d.slotMem[i] = mem[off : off+s.SlotSize]
		}
		d.file, err = filepath.Abs(d.job.Filename)
		if err != nil {
			return err
		}
		// Clones share the file, as fio's do when filename is given.
		id, size, err := d.c.RegisterFile(d.file, d.job.Direct, s.Region)
		if errors.Is(err, client.ErrPermissionDenied) || errors.Is(err, client.ErrInvalidArgument) || errors.Is(err, client.ErrNotFound) {
			return fmt.Errorf("register file %s: %w (tensorcastd opens files only under its data_dir and allowed_files; --spawn allows the jobs' directories)", d.file, err)
		}
		if err != nil {
			return fmt.Errorf("register file %s: %w", d.file, err)
		}
		if size < s.Region {
			return fmt.Errorf("%w: file %s is %d bytes, the job needs %d", ErrBadValue, d.file, size, s.Region)
		}
		d.target = id
	default:
		return fmt.Errorf("%w: engine %q", ErrEngineUnavailable, d.job.Engine)
	}
	maxParts := d.job.Batch * int(1+(d.job.BSMax+d.blockSizeOr()-1)/d.blockSizeOr())
	if maxParts > d.capacity {
		return fmt.Errorf("%w: batch %d needs up to %d daemon tasks; a batch holds %d", ErrBadValue, d.job.Batch, maxParts, d.capacity)
	}
	d.reqs = make([]xfer.Request, 0, maxParts)
	d.results = make([]error, maxParts)
	d.ready = make([]Completion, 0, s.Slots)
	d.rounds = make([]round, s.Slots)
	for i := range d.rounds {
		d.rounds[i].ios = make([]ioRef, 0, d.job.Batch)
		d.rounds[i].taskIO = make([]int, 0, maxParts)
	}
	d.scratch = make([]byte, s.SlotSize)
	return nil
}

func (d *daemonEngine) blockSizeOr() uint64 {
	if d.blockSize == 0 {
		return ^uint64(0) >> 1
	}
	return d.blockSize
}

// Synchronous: a Transfer completes its requests before Submit returns.
func (d *daemonEngine) Synchronous() bool { return d.single }

func (d *daemonEngine) Buffer(slot int) []byte { return d.slotMem[slot] }

// piece returns the contiguous piece of the target region that holds byte
// off of [off, off+n) onwards: its target offset and length (at most left).
func (d *daemonEngine) piece(off, left uint64) (toff, l uint64) {
	if d.blocks == nil {
		return off, left
	}
	b, in := off/d.blockSize, off%d.blockSize
	return d.blocks[b] + in, min(left, d.blockSize-in)
}

func (d *daemonEngine) Submit(ios []IO) (int, error) {
	if len(ios) == 0 {
		return 0, nil
	}
	if d.nrounds == len(d.rounds) {
		return 0, fmt.Errorf("%w: more rounds in flight than slots", ErrBadValue)
	}
	r := &d.rounds[(d.head+d.nrounds)%len(d.rounds)]
	r.ios, r.taskIO, r.accepted = r.ios[:0], r.taskIO[:0], 0
	d.reqs = d.reqs[:0]
	for i, io := range ios {
		if io.Slot < 0 || io.Slot >= len(d.slotMem) || io.Length == 0 || io.Length > d.slotSize ||
			io.Offset > d.job.Size || io.Length > d.job.Size-io.Offset || (io.Op != OpRead && io.Op != OpWrite) ||
			len(d.reqs) >= cap(d.reqs) {
			if i == 0 {
				return 0, fmt.Errorf("%w: request out of bounds", ErrBadValue)
			}
			ios = ios[:i]
			break
		}
		op := xfer.OpRead
		if io.Op == OpWrite {
			op = xfer.OpWrite
		}
		r.ios = append(r.ios, ioRef{slot: io.Slot, length: io.Length})
		for done := uint64(0); done < io.Length; {
			toff, l := d.piece(io.Offset+done, io.Length-done)
			d.reqs = append(d.reqs, xfer.Request{Op: op, Local: d.local, LocalOffset: d.localOff[io.Slot] + done,
				Target: d.target, TargetOffset: toff, Length: l})
			r.taskIO = append(r.taskIO, len(r.ios)-1)
			done += l
		}
	}
	res := d.results[:len(d.reqs)]
	if d.single {
		if _, err := d.c.Transfer(d.reqs, waitTimeout, res); err != nil {
			return 0, err
		}
		for t, e := range res {
			if e != nil && r.ios[r.taskIO[t]].err == nil {
				r.ios[r.taskIO[t]].err = e
			}
		}
		d.emit(r)
		return len(ios), nil
	}
	l, err := d.idleLane(len(d.reqs))
	if err != nil {
		return 0, err
	}
	if err := d.c.Submit(l.id, d.reqs, res); err != nil {
		d.idle = append(d.idle, l)
		return 0, err
	}
	r.lane, r.first = l, l.used
	l.used += len(d.reqs)
	for t, e := range res {
		if e != nil {
			if r.ios[r.taskIO[t]].err == nil {
				r.ios[r.taskIO[t]].err = e
			}
			continue
		}
		r.accepted++
	}
	d.nrounds++
	return len(ios), nil
}

// idleLane returns a batch with room for n tasks and nothing in flight,
// reaping the oldest round when every lane is busy.
func (d *daemonEngine) idleLane(n int) (*lane, error) {
	for len(d.idle) == 0 {
		if len(d.lanes) < d.maxLanes {
			id, err := d.c.AllocBatch(d.capacity)
			if err != nil {
				return nil, fmt.Errorf("alloc batch: %w", err)
			}
			l := &lane{id: id}
			d.lanes = append(d.lanes, l)
			d.idle = append(d.idle, l)
			break
		}
		if err := d.waitOldest(); err != nil {
			return nil, err
		}
	}
	l := d.idle[len(d.idle)-1]
	d.idle = d.idle[:len(d.idle)-1]
	if l.used+n > d.capacity {
		if err := d.c.FreeBatch(l.id); err != nil {
			return nil, fmt.Errorf("free batch: %w", err)
		}
		id, err := d.c.AllocBatch(d.capacity)
		if err != nil {
			return nil, fmt.Errorf("alloc batch: %w", err)
		}
		*l = lane{id: id}
	}
	return l, nil
}

// waitOldest waits for the oldest round and moves its IOs to ready.
func (d *daemonEngine) waitOldest() error {
	r := &d.rounds[d.head]
	l := r.lane
	sum, err := d.c.Wait(l.id, waitTimeout)
	if err != nil {
		return err
	}
	if sum.Waiting+sum.Pending > 0 {
		return fmt.Errorf("%w: batch not done after %s", xfer.ErrTimeout, waitTimeout)
	}
	if int(sum.Completed-l.prev.Completed) != r.accepted {
		// Some accepted task did not complete: find which.
		for t := range r.taskIO {
			ref := &r.ios[r.taskIO[t]]
			st, err := d.c.TaskStatus(l.id, r.first+t)
			if err != nil {
				return err
			}
			if st.State != xfer.StateCompleted && ref.err == nil {
				ref.err = st.Err
				if ref.err == nil {
					ref.err = fmt.Errorf("task ended %s", st.State)
				}
			}
		}
	}
	l.prev = sum
	d.idle = append(d.idle, l)
	d.head = (d.head + 1) % len(d.rounds)
	d.nrounds--
	d.emit(r)
	return nil
}

func (d *daemonEngine) emit(r *round) {
	for _, io := range r.ios {
		c := Completion{Slot: io.slot, N: io.length, Err: io.err}
		if io.err != nil {
			c.N = 0
		}
		d.ready = append(d.ready, c)
	}
}

func (d *daemonEngine) Reap(min int, out []Completion) (int, error) {
	for len(d.ready) < min && d.nrounds > 0 {
		if err := d.waitOldest(); err != nil {
			return 0, err
		}
	}
	n := copy(out, d.ready)
	d.ready = append(d.ready[:0], d.ready[n:]...)
	return n, nil
}

// Peek returns the target bytes [off, off+n) as they are now.
func (d *daemonEngine) Peek(off, n uint64) ([]byte, error) {
	if n > uint64(len(d.scratch)) || off > d.job.Size || n > d.job.Size-off {
		return nil, fmt.Errorf("%w: peek out of bounds", ErrBadValue)
	}
	dst := d.scratch[:n]
	if d.job.Engine == "uring" {
		f, err := os.Open(d.file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if _, err := f.ReadAt(dst, int64(off)); err != nil {
			return nil, err
		}
		return dst, nil
	}
	mem := d.c.PoolBytes()
	for done := uint64(0); done < n; {
		toff, l := d.piece(off+done, n-done)
		copy(dst[done:done+l], mem[toff:toff+l])
		done += l
	}
	return dst, nil
}

// Prefill writes the verify pattern over the target region directly (the
// pool is mapped here; the file is written through the page cache), which
// is much faster than requests of bs bytes. For uring it is skipped when
// the pattern is not needed and the file is already fully allocated.
func (d *daemonEngine) Prefill(seed uint64, needPattern bool) error {
	if d.job.Engine == "local" {
		mem := d.c.PoolBytes()
		for done := uint64(0); done < d.job.Size; {
			toff, l := d.piece(done, d.job.Size-done)
			fillPattern(mem[toff:toff+l], seed, done)
			done += l
		}
		return nil
	}
	if !needPattern {
		if st, err := os.Stat(d.file); err == nil && uint64(st.Size()) >= d.job.Size && allocated(st) >= d.job.Size {
			return nil
		}
	}
	f, err := os.OpenFile(d.file, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	chunk := make([]byte, 4<<20)
	for off := uint64(0); off < d.job.Size; off += uint64(len(chunk)) {
		n := min(uint64(len(chunk)), d.job.Size-off)
		fillPattern(chunk[:n], seed, off)
		if _, err := f.WriteAt(chunk[:n], int64(off)); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return os.NewSyscallError("fsync", err)
	}
	return f.Close()
}

func (d *daemonEngine) Close() error {
	if d.c == nil {
		return nil
	}
	var errs []error
	for d.nrounds > 0 {
		if err := d.waitOldest(); err != nil {
			errs = append(errs, err)
			break
		}
	}
	d.ready = d.ready[:0]
	// Closing the connection releases the buffer, blocks and batches.
	errs = append(errs, d.c.Close())
	d.c = nil
	return errors.Join(errs...)
}

// allocated is how many bytes of the file have blocks on disk.
func allocated(st os.FileInfo) uint64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return uint64(sys.Blocks) * 512
	}
	return 0
}
