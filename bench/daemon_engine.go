package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

func init() {
	engines["local"] = newDaemonEngine
	engines["uring"] = newDaemonEngine
	delete(unavailable, "local")
	delete(unavailable, "uring")
}

// waitTimeout bounds a wait for the next completion; a request that takes
// longer is reported as an I/O error.
const waitTimeout = 60 * time.Second

// daemonEngine runs a job as a client of tensorcastd, on one connection
// and one queue (per clone), with every IO in flight in the daemon at once.
//
//   - local: the slot buffers are one client buffer (a sealed memfd); the
//     target region is pool blocks the connection allocated. A write
//     copies buffer → pool, a read pool → buffer, by the daemon's local
//     transport.
//   - uring: the slot buffers are pool blocks (the pages io_uring moves
//     to and from); the target is a file segment the connection opens.
type daemonEngine struct {
	env *Env
	job *Job
	dispatcher

	slotSize uint64
	slotMem  [][]byte // per slot: its buffer as mapped here
	pool     []byte   // the pool as mapped here
	file     string   // uring: the file's path
	scratch  []byte
	opened   bool
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
	if d.opened {
		return fmt.Errorf("%w: engine opened twice", ErrBadValue)
	}
	d.opened = true
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if err := d.dial(d.env.socket(d.job)); err != nil {
		return err
	}
	c := d.c
	pool, ok := c.Pool()
	if !ok {
		return fmt.Errorf("%w: the daemon's pool is not mapped", ErrEngineUnavailable)
	}
	d.pool = c.PoolBytes()
	maxBlock := largestBlock(pool.BlockClasses)
	if maxBlock == 0 {
		maxBlock = 1 << 20
	}
	lim := c.Hello().Limits
	d.slotSize = s.SlotSize
	d.slotMem = make([][]byte, s.Slots)
	slotOff := make([]uint64, s.Slots)
	maxPartsPerIO := 1

	switch d.job.Engine {
	case "local":
		buf, err := slotBuffer(d.env, c, uint64(s.Slots)*s.SlotSize)
		if err != nil {
			return err
		}
		d.local, d.target = buf.ID, pool.Segment
		for i := range slotOff {
			slotOff[i] = uint64(i) * s.SlotSize
			d.slotMem[i] = buf.Mem[slotOff[i] : slotOff[i]+s.SlotSize]
		}
		d.blockSize = maxBlock
		n := (s.Region + d.blockSize - 1) / d.blockSize
		if lim.MaxBlocks > 0 && n > uint64(lim.MaxBlocks) {
			return fmt.Errorf("%w: size needs %d pool blocks of %d bytes; the daemon allows %d per connection", ErrBadValue, n, d.blockSize, lim.MaxBlocks)
		}
		if d.blocks, err = c.AllocBlocks(nil, int(n), d.blockSize); err != nil {
			return fmt.Errorf("alloc %d pool blocks of %d bytes: %w", n, d.blockSize, err)
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
		offs, err := c.AllocBlocks(nil, s.Slots, s.SlotSize)
		if err != nil {
			return fmt.Errorf("alloc %d pool blocks for buffers: %w", s.Slots, err)
		}
		for i, off := range offs {
			slotOff[i] = off
			d.slotMem[i] = d.pool[off : off+s.SlotSize]
		}
		d.local = pool.Segment
		// Clones share the file, as fio's do when filename is given.
		id, size, err := c.RegisterFile(d.file, d.job.Direct, s.Region)
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
	d.scratch = make([]byte, s.SlotSize)
	return d.start(dispatchSpec{Slots: s.Slots, SlotSize: s.SlotSize, Region: s.Region, PartsPerIO: maxPartsPerIO, SlotOff: slotOff})
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
		toff, l := d.piece(off+done, n-done)
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
			toff, l := d.piece(done, d.job.Size-done)
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

// Close closes the queue and the connection, which releases the buffers,
// blocks and file segments it holds in the daemon.
func (d *daemonEngine) Close() error {
	var errs []error
	errs = append(errs, d.closeQueue())
	d.pool, d.slotMem = nil, nil
	return errors.Join(errs...)
}

// allocated is how many bytes of the file have blocks on disk.
func allocated(st os.FileInfo) uint64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return uint64(sys.Blocks) * 512
	}
	return 0
}
