package shm

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// A pool outlives its daemon when the daemon hands its memfd to systemd's
// file descriptor store: the next daemon adopts that memfd (AdoptPool)
// instead of making one, so the pages (the store's L1 values) and the
// memfd's identity (what clients mapped) stay the same. The allocator is
// process memory: it starts empty, and Claim marks the blocks the store
// finds again as live before anything else is allocated.

// Identity names the memfd behind a pool or region: equal identities are
// the same memory. A client compares it to decide whether a mapping it
// holds is still the daemon's pool.
type Identity struct {
	Dev, Ino uint64
}

// Identity returns the identity of the pool's memfd.
func (p *Pool) Identity() (Identity, error) {
	f, err := inspectMemfd(p.fd)
	if err != nil {
		return Identity{}, err
	}
	return Identity{f.dev, f.ino}, nil
}

// AdoptPool builds a pool over fd, a pool memfd an earlier daemon made
// (NewPool) and handed on, instead of making one. fd must be a memfd with
// the pool's seals and exactly the size cfg asks for (rounded as NewPool
// rounds it); its hugepages are what they are. On success the pool owns fd
// and its allocator is empty (see Claim); on error fd is left open for the
// caller, who decides what to do with it.
func AdoptPool(cfg PoolConfig, fd int, log *slog.Logger) (*Pool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	size, minBlock, maxBlock, mode, err := cfg.geometry()
	if err != nil {
		return nil, err
	}
	f, err := inspectMemfd(fd)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: inherited pool (fd %d): "+format, append([]any{ErrInvalidConfig, fd}, args...)...)
	}
	switch {
	case !f.memfd:
		return nil, bad("not a memfd")
	case f.seals&poolSeals != poolSeals:
		return nil, bad("seals %#x, a pool has %#x", f.seals, poolSeals)
	case f.size != int64(size):
		return nil, bad("%d bytes, the configured pool is %d", f.size, size)
	case f.huge && mode == HugepagesOff:
		return nil, bad("hugepages, the config says hugepages = off")
	case !f.huge && mode == HugepagesOn:
		return nil, bad("normal pages, the config says hugepages = on")
	}
	mem, err := mapShared(fd, size)
	if err != nil {
		return nil, err
	}
	setCloexec(fd)
	p := &Pool{id: cfg.ID, fd: fd, mem: mem, huge: f.huge, log: log, a: newAllocator(size, minBlock, maxBlock)}
	log.Info("shm pool adopted from the previous daemon", "segment", uint64(cfg.ID), "size", size,
		"hugepages", f.huge, "min_block", minBlock, "max_block", maxBlock)
	return p, nil
}

// Claim marks blocks the pool already holds as live, on a pool with no
// live block yet (right after AdoptPool): block i is offs[i], of
// sizes[i] bytes (its class the smallest that fits, as Alloc would give).
// ok[i] says whether it was claimed; a block that is misaligned, outside
// the pool, of a size no class has, or overlapping one claimed before is
// refused. Callers claim the blocks they trust most first.
func (p *Pool) Claim(offs, sizes []uint64, ok []bool) error {
	if len(sizes) != len(offs) || len(ok) != len(offs) {
		return fmt.Errorf("%w: %d offsets, %d sizes, %d results", ErrInvalidSize, len(offs), len(sizes), len(ok))
	}
	if p.refs.closing() {
		return ErrClosed
	}
	return p.a.claim(offs, sizes, ok)
}

func (a *allocator) claim(offs, sizes []uint64, ok []bool) error {
	for i := range a.classes {
		a.classes[i].mu.Lock()
		defer a.classes[i].mu.Unlock()
	}
	a.slabMu.Lock()
	defer a.slabMu.Unlock()
	for i := range a.classes {
		if a.classes[i].live != 0 {
			return errors.New("shm: Claim on a pool with live blocks")
		}
	}
	// Every slab is free: claimed ones get a class, then their free-block
	// stacks and the free-slab stack are rebuilt.
	for i, off := range offs {
		ok[i] = false
		size := sizes[i]
		if a.checkSize(size) != nil || off >= a.size {
			continue
		}
		ci := a.classOf(size)
		c := &a.classes[ci]
		if off&(1<<c.shift-1) != 0 {
			continue
		}
		s := int32(off >> a.maxShift)
		sl := &a.slabs[s]
		switch got := sl.class.Load(); {
		case got == noSlab:
			sl.class.Store(int32(ci))
			sl.live, sl.top, sl.bump = 0, 0, c.per
			c.slabs++
		case got != int32(ci):
			continue
		}
		b := uint32((off & (1<<a.maxShift - 1)) >> c.shift)
		w := &a.bits[uint64(s)*uint64(a.wps)+uint64(b/64)]
		if *w&(1<<(b%64)) != 0 {
			continue
		}
		*w |= 1 << (b % 64)
		a.req[uint64(s)*uint64(a.bps)+uint64(b)] = uint32(size)
		sl.live++
		c.live++
		c.requested += size
		ok[i] = true
	}
	a.nfree = 0
	for s := len(a.slabs) - 1; s >= 0; s-- {
		sl := &a.slabs[s]
		ci := sl.class.Load()
		if ci == noSlab {
			a.freeSlabs[a.nfree] = int32(s)
			a.nfree++
			continue
		}
		c := &a.classes[ci]
		base := uint64(s) * uint64(a.bps)
		// Free blocks high to low, so the lowest is on top of the stack.
		for b := c.per; b > 0; b-- {
			if a.bits[uint64(s)*uint64(a.wps)+uint64((b-1)/64)]&(1<<((b-1)%64)) == 0 {
				a.stack[base+uint64(sl.top)] = uint16(b - 1)
				sl.top++
			}
		}
		if sl.live < c.per {
			a.link(c, int32(s))
		}
	}
	return nil
}

// Region is a memfd of the daemon's own, mapped shared and never given to
// clients: memory that, handed to systemd's file descriptor store, outlives
// the daemon (the store's L1 journal). Its methods are not safe for
// concurrent use; the bytes are.
type Region struct {
	fd  int
	mem []byte
}

// NewRegion makes a sealed memfd of size bytes (zeroed) named
// tensorcast-NAME and maps it.
func NewRegion(name string, size uint64) (*Region, error) {
	if size == 0 {
		return nil, ErrInvalidSize
	}
	if len(name) > 64 || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("%w: region name %q", ErrInvalidConfig, name)
	}
	fd, mem, err := createMapping("tensorcast-"+name, size, false)
	if err != nil {
		return nil, err
	}
	return &Region{fd: fd, mem: mem}, nil
}

// AdoptRegion maps fd, a region an earlier daemon made, if it is a sealed
// memfd of exactly size bytes. On error fd is left open for the caller.
func AdoptRegion(fd int, size uint64) (*Region, error) {
	f, err := inspectMemfd(fd)
	if err != nil {
		return nil, err
	}
	if !f.memfd || f.seals&poolSeals != poolSeals || f.size != int64(size) {
		return nil, fmt.Errorf("%w: inherited region (fd %d): %d bytes, seals %#x (want a sealed memfd of %d bytes)",
			ErrInvalidConfig, fd, f.size, f.seals, size)
	}
	mem, err := mapShared(fd, size)
	if err != nil {
		return nil, err
	}
	setCloexec(fd)
	return &Region{fd: fd, mem: mem}, nil
}

// Fd is the region's memfd, valid until Close.
func (r *Region) Fd() int { return r.fd }

// Bytes is the mapping, valid until Close.
func (r *Region) Bytes() []byte { return r.mem }

// Close unmaps the region and closes its memfd (the memory lives on while
// another holder, such as systemd's fd store, has the memfd).
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	err := errors.Join(unmap(r.mem), closeFd(r.fd))
	r.mem, r.fd = nil, -1
	return err
}
