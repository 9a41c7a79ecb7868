package shm

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Defaults and fixed sizes of the pool.
const (
	// DefaultMinBlock is the smallest size class unless configured.
	DefaultMinBlock = 4 << 10
	// DefaultMaxBlock is the largest size class and the slab size unless
	// configured.
	DefaultMaxBlock = 4 << 20
	// HugepageSize is the hugepage size the pool asks for (MFD_HUGE_2MB);
	// a hugepage-backed pool's size is a multiple of it.
	HugepageSize = 2 << 20
)

// Hugepages modes of PoolConfig.Hugepages.
const (
	// HugepagesAuto tries hugepages; without them it places the pool on
	// transparent 2 MiB pages (collapsed at start, so the pool is resident
	// from then on), and where the kernel refuses those, on normal pages,
	// saying why. The empty string means the same.
	HugepagesAuto = "auto"
	// HugepagesOn fails NewPool (ErrNoHugepages) when hugepages cannot be had.
	HugepagesOn = "on"
	// HugepagesOff uses normal pages.
	HugepagesOff = "off"
)

// PoolConfig describes the daemon's DRAM pool.
type PoolConfig struct {
	ID xfer.SegmentID // the pool's segment id; not zero
	// Name names the memfd (tensorcast-pool-NAME, as /proc/PID/maps and
	// fd listings show it), e.g. the tenant's; empty uses the id. At most
	// 64 bytes.
	Name string
	// Size is the pool's length in bytes, rounded up to a multiple of
	// MaxBlock. With hugepages it must also be a multiple of HugepageSize:
	// "auto" falls back to normal pages when it is not, "on" fails.
	Size uint64
	// Hugepages is "auto" (try a MFD_HUGETLB memfd, fall back to
	// transparent huge pages, then to normal pages), "on" (fail if
	// hugepages cannot be had) or "off" (normal pages, faulted in as they
	// are first touched). Empty is "auto".
	Hugepages string
	// MinBlock is the smallest size class, a power of two (default 4 KiB).
	MinBlock uint64
	// MaxBlock is the largest size class and the slab size, a power of two
	// of at most 1 GiB and at most 65536 MinBlocks (default 4 MiB).
	MaxBlock uint64
	// Prefault faults every page in at start (MADV_POPULATE_WRITE), so the
	// first transfers into the pool take no page faults and a pool the host
	// cannot back fails at start rather than later. Off by default: pages
	// fault in lazily.
	Prefault bool
}

// geometry validates cfg and returns the rounded size and block sizes.
func (cfg PoolConfig) geometry() (size, minBlock, maxBlock uint64, mode string, err error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if cfg.ID == 0 {
		return 0, 0, 0, "", bad("segment id 0")
	}
	if len(cfg.Name) > 64 || strings.ContainsAny(cfg.Name, "/\x00") {
		return 0, 0, 0, "", bad("name %q (at most 64 bytes, no '/' or NUL)", cfg.Name)
	}
	mode = cfg.Hugepages
	switch mode {
	case "":
		mode = HugepagesAuto
	case HugepagesAuto, HugepagesOn, HugepagesOff:
	default:
		return 0, 0, 0, "", bad("hugepages %q (want auto, on or off)", cfg.Hugepages)
	}
	minBlock, maxBlock = cfg.MinBlock, cfg.MaxBlock
	if minBlock == 0 {
		minBlock = DefaultMinBlock
	}
	if maxBlock == 0 {
		maxBlock = DefaultMaxBlock
	}
	if bits.OnesCount64(minBlock) != 1 || bits.OnesCount64(maxBlock) != 1 {
		return 0, 0, 0, "", bad("block sizes %d..%d are not powers of two", minBlock, maxBlock)
	}
	if minBlock > maxBlock || maxBlock > maxMaxBlock || maxBlock/minBlock > maxBlocksPerSlab {
		return 0, 0, 0, "", bad("block sizes %d..%d (want min <= max <= 1 GiB, max/min <= %d)",
			minBlock, maxBlock, maxBlocksPerSlab)
	}
	if cfg.Size == 0 {
		return 0, 0, 0, "", bad("size 0")
	}
	if cfg.Size > math.MaxInt-maxBlock {
		return 0, 0, 0, "", bad("size %d too large to map", cfg.Size)
	}
	size = (cfg.Size + maxBlock - 1) &^ (maxBlock - 1)
	if size/maxBlock > maxSlabs {
		return 0, 0, 0, "", bad("size %d needs more than %d slabs of %d", size, maxSlabs, maxBlock)
	}
	return size, minBlock, maxBlock, mode, nil
}

// Pool is the daemon's DRAM pool: one sealed memfd mapped shared, with a
// block allocator over it. It implements xfer.MemSegment (KindPool). Its
// methods are safe for concurrent use.
type Pool struct {
	id   xfer.SegmentID
	fd   int
	mem  []byte
	huge bool
	// thp is the bytes of a normal-page pool that NewPool placed on
	// transparent huge pages (collapse).
	thp  uint64
	log  *slog.Logger
	refs refs
	// gone is set once teardown unmapped the pool and closed its memfd.
	gone atomic.Bool
	a    *allocator
	// regs are the transports' registrations over the mapping (io_uring
	// fixed buffers), released just before it goes away.
	regs xfer.Regs
}

var (
	_ xfer.MemSegment = (*Pool)(nil)
	_ xfer.Registered = (*Pool)(nil)
)

// NewPool creates the pool's memfd, sizes and seals it against shrinking
// and growing, maps it shared, and sets up the allocator's metadata. It logs
// once which pages it got and why.
func NewPool(cfg PoolConfig, log *slog.Logger) (*Pool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	size, minBlock, maxBlock, mode, err := cfg.geometry()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("tensorcast-pool-%d", cfg.ID)
	if cfg.Name != "" {
		name = "tensorcast-pool-" + cfg.Name
	}
	fd, mem, huge := -1, []byte(nil), false
	var why string
	switch {
	case mode == HugepagesOff:
		why = "hugepages off in config"
	case size%HugepageSize != 0:
		why = fmt.Sprintf("size %d is not a multiple of the 2 MiB hugepage", size)
		if mode == HugepagesOn {
			return nil, fmt.Errorf("%w: %s", ErrNoHugepages, why)
		}
	default:
		fd, mem, err = createMapping(name, size, true)
		if err != nil {
			why = "hugepages unavailable: " + err.Error()
			if errors.Is(err, syscall.ENOMEM) {
				why += " (no free hugepages reserved; raise vm.nr_hugepages)"
			}
			if mode == HugepagesOn {
				return nil, fmt.Errorf("%w: %s", ErrNoHugepages, why)
			}
		} else {
			huge = true
			why = "hugepages " + mode
		}
	}
	if !huge {
		fd, mem, err = createMapping(name, size, false)
		if err != nil {
			return nil, err
		}
	}
	var (
		thp  uint64
		took time.Duration
	)
	if !huge && mode == HugepagesAuto {
		// An I/O into normal pages takes up to one DMA segment a 4 KiB page:
		// a virtio disk takes at most 254 of them per request, so a 1 MiB
		// read splits in two and never merges with the next one, where
		// 2 MiB pages make it one segment (see BENCHMARKS.md).
		t0 := time.Now()
		done, spans, err := collapse(mem)
		took = time.Since(t0)
		thp = uint64(done) * HugepageSize
		if err != nil {
			why += fmt.Sprintf("; transparent huge pages for %d of %d 2 MiB spans: %v", done, spans, err)
		} else {
			why += "; transparent huge pages"
		}
	}
	if cfg.Prefault {
		if err := prefault(mem); err != nil {
			return nil, errors.Join(err, unmap(mem), closeFd(fd))
		}
	}
	p := &Pool{
		id:   cfg.ID,
		fd:   fd,
		mem:  mem,
		huge: huge,
		thp:  thp,
		log:  log,
		a:    newAllocator(size, minBlock, maxBlock),
	}
	pages := "normal"
	switch {
	case huge:
		pages = "hugetlb 2MiB"
	case thp == size:
		pages = "transparent 2MiB"
	case thp > 0:
		pages = "transparent 2MiB and normal"
	}
	log.Info("shm pool mapped", "segment", uint64(cfg.ID), "size", size, "pages", pages, "why", why,
		"thp_bytes", thp, "thp_took", took, "min_block", minBlock, "max_block", maxBlock, "prefault", cfg.Prefault)
	return p, nil
}

// createMapping makes a sealed memfd of size bytes and maps it shared; on
// error nothing is left open or mapped.
func createMapping(name string, size uint64, huge bool) (int, []byte, error) {
	fd, err := createMemfd(name, size, huge)
	if err != nil {
		return -1, nil, err
	}
	if err := sealPool(fd); err != nil {
		return -1, nil, errors.Join(err, closeFd(fd))
	}
	mem, err := mapShared(fd, size)
	if err != nil {
		return -1, nil, errors.Join(err, closeFd(fd))
	}
	return fd, mem, nil
}

// ID returns the pool's segment id.
func (p *Pool) ID() xfer.SegmentID { return p.id }

// Kind returns xfer.KindPool.
func (p *Pool) Kind() xfer.Kind { return xfer.KindPool }

// Size returns the pool's length in bytes (PoolConfig.Size rounded up).
func (p *Pool) Size() uint64 { return p.a.size }

// Acquire takes a reference that keeps the mapping alive; false once the
// pool is closing.
func (p *Pool) Acquire() bool { return p.refs.acquire() }

// Release drops a reference taken by Acquire; the last one after Close
// unmaps the pool and closes its memfd.
func (p *Pool) Release() {
	if p.refs.release() {
		if err := p.teardown(); err != nil {
			p.log.Error("shm pool teardown", "segment", uint64(p.id), "err", err)
		}
	}
}

// Bytes returns the whole mapping, valid while a reference is held.
func (p *Pool) Bytes() []byte { return p.mem }

// Fd returns the pool's memfd, sealed against shrinking, growing and further
// seals, for passing to clients. It is valid until the pool is torn down;
// hold a reference while passing it.
func (p *Pool) Fd() int { return p.fd }

// Hugepages reports whether the pool is backed by hugepages.
func (p *Pool) Hugepages() bool { return p.huge }

// Alloc returns the offset of a free block of at least size bytes, in O(1)
// and without allocating. The block's size is the smallest power-of-two
// class that fits; blocks are aligned to their size. Errors: ErrInvalidSize
// (0), ErrTooLarge (> MaxBlock), ErrPoolExhausted, ErrClosed.
func (p *Pool) Alloc(size uint64) (uint64, error) {
	if p.refs.closing() {
		return 0, ErrClosed
	}
	return p.a.alloc(size)
}

// AllocN fills offs with len(offs) blocks of at least size bytes each, or
// takes none (ErrPoolExhausted, ErrTooLarge, ErrInvalidSize, ErrClosed).
func (p *Pool) AllocN(size uint64, offs []uint64) error {
	if p.refs.closing() {
		return ErrClosed
	}
	return p.a.allocN(size, offs)
}

// Free returns the block at off in O(1); ErrBadFree if off is not the
// start of a live block (never allocated or already freed).
func (p *Pool) Free(off uint64) error { return p.a.free(off) }

// BlockSize returns the class size of the live block at off, or false.
func (p *Pool) BlockSize(off uint64) (uint64, bool) { return p.a.blockSize(off) }

// Stats returns a consistent snapshot of the pool's usage.
func (p *Pool) Stats() PoolStats {
	st := p.a.stats()
	st.Hugepages = p.huge
	st.THPBytes = p.thp
	return st
}

// Close stops new allocations and Acquires; the memfd is unmapped and
// closed now if no reference is held, else by the last Release. It is
// idempotent; only the call that tears down can return an error.
func (p *Pool) Close() error {
	if _, now := p.refs.close(); now {
		return p.teardown()
	}
	return nil
}

func (p *Pool) teardown() error {
	p.regs.Teardown()
	err := errors.Join(unmap(p.mem), closeFd(p.fd))
	p.gone.Store(true)
	return err
}

// Unmapped says whether the pool's mapping and memfd are gone: Close was
// called and no reference holds them any more.
func (p *Pool) Unmapped() bool { return p.gone.Load() }

// Regs are the transports' registrations over the pool's memory (io_uring
// fixed buffers): each is released once, just before the mapping goes away
// (at Close, or when the last reference is released after it), on the
// goroutine that does that.
func (p *Pool) Regs() *xfer.Regs { return &p.regs }
