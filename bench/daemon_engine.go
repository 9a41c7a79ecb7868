package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/shm"
)

func init() {
	engines["local"] = newDaemonEngine
	engines["uring"] = newDaemonEngine
	delete(unavailable, "local")
	delete(unavailable, "uring")
}

// waitTimeout bounds one Transfer; a request that takes longer is reported
// as an I/O error.
const waitTimeout = 60 * time.Second

// MaxConnsPerClone bounds the daemon connections one clone opens.
const MaxConnsPerClone = 16

// daemonEngine runs a job as a client of tensorcastd.
//
//   - local: the slot buffers are one client buffer (a sealed memfd),
//     registered on every connection; the target region is pool blocks.
//     A write copies buffer → pool, a read pool → buffer, by the daemon's
//     local transport.
//   - uring: the slot buffers are pool blocks (the pages io_uring moves
//     to and from); the target is a file segment each connection opens.
//
// The daemon serves each connection on its own goroutine and a call holds
// its connection until it is answered, so requests are kept in flight by
// several connections ("lanes"), about one per batch of iodepth, each with
// a goroutine that sends what is queued for it as one Transfer. A
// connection may touch only pool blocks it allocated, so every request
// part goes to the lane that holds the pool block it touches: for uring the
// lane that allocated the slot's buffer, for local the lane that allocated
// the region block (region blocks are dealt out to lanes in turn, in
// blocks of about one batch of bytes, so sequential batches alternate).
type daemonEngine struct {
	env *Env
	job *Job
	dispatcher

	slotSize uint64
	slotMem  [][]byte // per slot: its buffer as mapped here
	memfdMem []byte   // local: the slot buffers' mapping, unmapped at Close
	pool     []byte   // the pool as mapped by the first lane
	file     string   // uring: the file's path
	scratch  []byte
	closed   bool
}

var (
	_ Engine = (*daemonEngine)(nil)
	_ Peeker = (*daemonEngine)(nil)
)

func newDaemonEngine(env *Env, job *Job) (Engine, error) {
	return &daemonEngine{env: env, job: job}, nil
}

func (d *daemonEngine) Name() string { return d.job.Engine }

// laneCount is how many connections keep slots requests of batch in
// flight: one per batch, at most MaxConnsPerClone.
func laneCount(slots, batch int) int {
	if batch <= 0 {
		batch = 1
	}
	return min(max((slots+batch-1)/batch, 1), MaxConnsPerClone)
}

func (d *daemonEngine) Open(s EngineSpec) (err error) {
	if d.closed || d.lanes != nil {
		return fmt.Errorf("%w: engine opened twice", ErrBadValue)
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	sock := d.env.socket(d.job)
	nl := laneCount(s.Slots, d.job.Batch)
	if err := d.dial(sock, nl); err != nil {
		return err
	}
	c0 := d.lanes[0].c
	pool, ok := c0.Pool()
	if !ok {
		return fmt.Errorf("%w: the daemon's pool is not mapped", ErrEngineUnavailable)
	}
	d.pool = c0.PoolBytes()
	maxBlock := largestBlock(pool.BlockClasses)
	if maxBlock == 0 {
		maxBlock = 1 << 20
	}
	lim := c0.Hello().Limits
	capacity := int(min(max(lim.MaxBatchCapacity, 1), 4096))
	d.slotSize = s.SlotSize
	d.slotMem = make([][]byte, s.Slots)
	slotOff := make([]uint64, s.Slots)
	slotLane := make([]int, s.Slots)
	maxPartsPerIO := 1

	switch d.job.Engine {
	case "local":
		size := uint64(s.Slots) * s.SlotSize
		fd, err := shm.NewMemfd("tcbench-slots", size, true)
		if err != nil {
			return fmt.Errorf("slot buffers: %w", err)
		}
		defer unix.Close(fd)
		d.memfdMem, err = shm.MapShared(fd, size)
		if err != nil {
			return fmt.Errorf("slot buffers: %w", err)
		}
		for i, l := range d.lanes {
			// Each connection registers the same memory: a connection
			// may use only the buffers it registered.
			l.local, err = l.c.RegisterFD(fd, size)
			if err != nil {
				return fmt.Errorf("register buffer on connection %d: %w", i, err)
			}
			l.target = pool.Segment
		}
		for i := range slotOff {
			slotOff[i] = uint64(i) * s.SlotSize
			d.slotMem[i] = d.memfdMem[slotOff[i] : slotOff[i]+s.SlotSize]
		}
		d.blockSize = regionBlock(pool.BlockClasses, maxBlock, uint64(d.job.Batch)*s.SlotSize, nl)
		n := (s.Region + d.blockSize - 1) / d.blockSize
		per := (n + uint64(nl) - 1) / uint64(nl)
		if lim.MaxBlocks > 0 && per > uint64(lim.MaxBlocks) {
			return fmt.Errorf("%w: size needs %d pool blocks of %d bytes per connection; the daemon allows %d", ErrBadValue, per, d.blockSize, lim.MaxBlocks)
		}
		d.blocks = make([]uint64, n)
		d.blockLane = make([]int, n)
		var offs []uint64
		for i, l := range d.lanes {
			// Lane i holds blocks i, i+nl, i+2nl, ...
			k := int((n - uint64(i) + uint64(nl) - 1) / uint64(nl))
			if k == 0 {
				continue
			}
			offs, err = l.c.AllocBlocks(offs[:0], k, d.blockSize)
			if err != nil {
				return fmt.Errorf("alloc %d pool blocks of %d bytes: %w", k, d.blockSize, err)
			}
			for j, off := range offs {
				b := i + j*nl
				d.blocks[b], d.blockLane[b] = off, i
			}
		}
		maxPartsPerIO = int(1 + (d.job.BSMax+d.blockSize-1)/d.blockSize)
	case "uring":
		if s.SlotSize > maxBlock {
			return fmt.Errorf("%w: bs %d is larger than the pool's largest block %d", ErrBadValue, s.SlotSize, maxBlock)
		}
		d.file, err = filepath.Abs(d.job.Filename)
		if err != nil {
			return err
		}
		per := (s.Slots + nl - 1) / nl
		var offs []uint64
		for i, l := range d.lanes {
			// Lane i holds the buffers of slots [i*per, (i+1)*per): the
			// runner reuses slots a batch at a time, so a batch mostly
			// goes to one lane.
			lo, hi := min(i*per, s.Slots), min((i+1)*per, s.Slots)
			if hi > lo {
				offs, err = l.c.AllocBlocks(offs[:0], hi-lo, s.SlotSize)
				if err != nil {
					return fmt.Errorf("alloc %d pool blocks for buffers: %w", hi-lo, err)
				}
				for j, off := range offs {
					slotOff[lo+j], slotLane[lo+j] = off, i
					d.slotMem[lo+j] = d.pool[off : off+s.SlotSize]
				}
			}
			l.local = pool.Segment
			// Clones share the file, as fio's do when filename is given.
			id, size, err := l.c.RegisterFile(d.file, d.job.Direct, s.Region)
			if errors.Is(err, client.ErrPermissionDenied) || errors.Is(err, client.ErrInvalidArgument) || errors.Is(err, client.ErrNotFound) {
				return fmt.Errorf("register file %s: %w (tensorcastd opens files only under its data_dir and allowed_files; --spawn allows the jobs' directories)", d.file, err)
			}
			if err != nil {
				return fmt.Errorf("register file %s: %w", d.file, err)
			}
			if size < s.Region {
				return fmt.Errorf("%w: file %s is %d bytes, the job needs %d", ErrBadValue, d.file, size, s.Region)
			}
			l.target = id
		}
	default:
		return fmt.Errorf("%w: engine %q", ErrEngineUnavailable, d.job.Engine)
	}
	if d.job.Batch*maxPartsPerIO > capacity {
		return fmt.Errorf("%w: batch %d needs up to %d daemon tasks; a batch holds %d", ErrBadValue, d.job.Batch, d.job.Batch*maxPartsPerIO, capacity)
	}
	d.scratch = make([]byte, s.SlotSize)
	d.start(dispatchSpec{Slots: s.Slots, SlotSize: s.SlotSize, Region: s.Region, PartsPerIO: maxPartsPerIO,
		Capacity: capacity, SlotOff: slotOff, SlotLane: slotLane})
	return nil
}

// regionBlock picks the pool block size of the local target region: with
// one lane the largest class; otherwise the smallest class that holds a
// batch of requests, so sequential batches land on different lanes.
func regionBlock(classes []uint64, maxBlock, batchBytes uint64, lanes int) uint64 {
	if lanes <= 1 {
		return maxBlock
	}
	best := maxBlock
	for _, c := range classes {
		if c >= batchBytes && c < best {
			best = c
		}
	}
	return best
}

func (d *daemonEngine) Buffer(slot int) []byte { return d.slotMem[slot] }

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
	for done := uint64(0); done < n; {
		toff, l, _ := d.piece(off+done, n-done)
		copy(dst[done:done+l], d.pool[toff:toff+l])
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
		for done := uint64(0); done < d.job.Size; {
			toff, l, _ := d.piece(done, d.job.Size-done)
			fillPattern(d.pool[toff:toff+l], seed, done)
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

// Close stops the lanes' goroutines (each ends after its Transfer in
// flight, if any) and then closes their connections, which releases the
// buffers, blocks and file segments they hold in the daemon.
func (d *daemonEngine) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	d.stopLanes()
	var errs []error
	for _, l := range d.lanes {
		if l.c != nil {
			errs = append(errs, l.c.Close())
		}
	}
	d.lanes = nil
	d.pool = nil
	if d.memfdMem != nil {
		errs = append(errs, shm.Unmap(d.memfdMem))
		d.memfdMem, d.slotMem = nil, nil
	}
	return errors.Join(errs...)
}

// allocated is how many bytes of the file have blocks on disk.
func allocated(st os.FileInfo) uint64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return uint64(sys.Blocks) * 512
	}
	return 0
}
