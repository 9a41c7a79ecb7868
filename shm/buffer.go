package shm

import (
	"errors"
	"fmt"
	"math"

	"github.com/tensorcast/tensorcast/xfer"
)

// Buffer is a client's buffer, registered from a passed fd and mapped
// read-write, shared. It implements xfer.MemSegment (KindClient). Its
// methods are safe for concurrent use.
type Buffer struct {
	id   xfer.SegmentID
	mem  []byte
	refs refs
	// regs are the transports' registrations over the mapping, released
	// just before it goes away.
	regs xfer.Regs
}

var (
	_ xfer.MemSegment = (*Buffer)(nil)
	_ xfer.Registered = (*Buffer)(nil)
)

// MapBuffer maps the first size bytes of fd as a client buffer. It takes
// ownership of fd: fd is closed on every path, success or error (the mapping
// outlives it).
//
// It refuses, with typed errors: id 0 (ErrInvalidID); size 0
// (ErrInvalidSize) or over limit (ErrTooLarge); an fd that is not a regular
// file or memfd: pipes, sockets, devices, directories (ErrNotMappable); a
// file shorter than size (ErrShortFile); a memfd (or any shmem file) without
// F_SEAL_SHRINK, which its owner could truncate under a transfer
// (ErrUnsealed); and mmap failures (an fd not open for reading and writing,
// a write-sealed memfd), wrapped as syscall errors. Regular files on other
// file systems are accepted unsealed.
func MapBuffer(id xfer.SegmentID, fd int, size uint64, limit uint64) (*Buffer, error) {
	mem, err := mapBuffer(id, fd, size, limit)
	if cerr := closeFd(fd); cerr != nil {
		if mem != nil {
			cerr = errors.Join(cerr, unmap(mem))
		}
		return nil, errors.Join(err, cerr)
	}
	if err != nil {
		return nil, err
	}
	return &Buffer{id: id, mem: mem}, nil
}

// mapBuffer checks fd and maps it; the caller closes fd.
func mapBuffer(id xfer.SegmentID, fd int, size, limit uint64) ([]byte, error) {
	switch {
	case id == 0:
		return nil, ErrInvalidID
	case size == 0:
		return nil, ErrInvalidSize
	case size > limit:
		return nil, fmt.Errorf("%w: buffer of %d bytes, limit %d", ErrTooLarge, size, limit)
	case size > math.MaxInt:
		return nil, fmt.Errorf("%w: buffer of %d bytes cannot be mapped", ErrTooLarge, size)
	case fd < 0:
		return nil, fmt.Errorf("%w: fd %d", ErrNotMappable, fd)
	}
	info, err := inspectFd(fd)
	if err != nil {
		return nil, err
	}
	if !info.regular {
		return nil, fmt.Errorf("%w: %s", ErrNotMappable, info.kind)
	}
	if info.size < 0 || uint64(info.size) < size {
		return nil, fmt.Errorf("%w: %d bytes, %d declared", ErrShortFile, info.size, size)
	}
	if info.sealable && !info.shrink {
		return nil, ErrUnsealed
	}
	return mapShared(fd, size)
}

// ID returns the buffer's segment id.
func (b *Buffer) ID() xfer.SegmentID { return b.id }

// Kind returns xfer.KindClient.
func (b *Buffer) Kind() xfer.Kind { return xfer.KindClient }

// Size returns the buffer's length in bytes.
func (b *Buffer) Size() uint64 { return uint64(len(b.mem)) }

// Acquire takes a reference that keeps the mapping alive; false once the
// buffer is closing.
func (b *Buffer) Acquire() bool { return b.refs.acquire() }

// Release drops a reference taken by Acquire; the last one after Close
// unmaps the buffer.
func (b *Buffer) Release() {
	if b.refs.release() {
		// munmap of a whole mapping this package made fails only for a bad
		// range, which cannot happen; there is no caller to tell.
		_ = b.teardown()
	}
}

// Bytes returns the mapping, valid while a reference is held.
func (b *Buffer) Bytes() []byte { return b.mem }

// Close marks the buffer closing (Acquire then fails) and unmaps it now if
// no reference is held, else when the last one is released. It is
// idempotent; only the call that unmaps can return an error.
func (b *Buffer) Close() error {
	if _, now := b.refs.close(); now {
		return b.teardown()
	}
	return nil
}

func (b *Buffer) teardown() error {
	b.regs.Teardown()
	return unmap(b.mem)
}

// Regs are the transports' registrations over the buffer's memory (an
// RDMA memory registration): each is released once, just before the
// mapping goes away (after Close, when the last reference is released), on
// the goroutine that releases it. A transport sets one while it holds a
// reference, so that the teardown cannot have happened yet.
func (b *Buffer) Regs() *xfer.Regs { return &b.regs }

// NewMemfd creates a close-on-exec, sealable memfd of size bytes, for
// clients and tests. With seal it is sealed against shrinking and growing,
// as MapBuffer requires. On error nothing is left open.
func NewMemfd(name string, size uint64, seal bool) (int, error) {
	if size == 0 {
		return -1, ErrInvalidSize
	}
	if size > math.MaxInt64 {
		return -1, fmt.Errorf("%w: memfd of %d bytes", ErrTooLarge, size)
	}
	fd, err := createMemfd(name, size, false)
	if err != nil {
		return -1, err
	}
	if seal {
		if err := sealClient(fd); err != nil {
			return -1, errors.Join(err, closeFd(fd))
		}
	}
	return fd, nil
}

// MapShared maps size bytes of fd read-write, shared: how a client maps the
// pool's memfd (or its own). Unmap the result with Unmap.
func MapShared(fd int, size uint64) ([]byte, error) {
	if size == 0 {
		return nil, ErrInvalidSize
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%w: mapping of %d bytes", ErrTooLarge, size)
	}
	return mapShared(fd, size)
}

// Unmap unmaps a mapping returned by MapShared.
func Unmap(mem []byte) error { return unmap(mem) }
