package shm

import (
	"errors"
	"fmt"
	"math"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sealing says why a client buffer's mapping cannot vanish under the
// daemon, or that it can.
type Sealing uint8

const (
	// SealedByClient: the memfd came with F_SEAL_SHRINK.
	SealedByClient Sealing = iota + 1
	// SealedByDaemon: the memfd allowed sealing and MapBuffer added
	// F_SEAL_SHRINK; a later ftruncate that shrinks it fails with EPERM in
	// the client.
	SealedByDaemon
	// Unsealed: the file cannot be sealed (a memfd made without
	// MFD_ALLOW_SEALING, a tmpfs file), so its owner can shrink it under any
	// transfer and any byte of the mapping can fault. The buffer is
	// xfer.Shrinkable: see the package doc for what that costs.
	Unsealed
)

func (s Sealing) String() string {
	switch s {
	case SealedByClient:
		return "sealed by client"
	case SealedByDaemon:
		return "sealed by daemon"
	case Unsealed:
		return "unsealed"
	}
	return "invalid"
}

// Buffer is a client's buffer, registered from a passed fd and mapped
// read-write, shared. It implements xfer.MemSegment (KindClient). Its
// methods are safe for concurrent use.
type Buffer struct {
	id      xfer.SegmentID
	mem     []byte
	sealing Sealing
	refs    refs
	// regs are the transports' registrations over the mapping, released
	// just before it goes away.
	regs xfer.Regs
}

var (
	_ xfer.MemSegment = (*Buffer)(nil)
	_ xfer.Registered = (*Buffer)(nil)
	_ xfer.Shrinkable = (*Buffer)(nil)
)

// MapBuffer maps the first size bytes of fd as a client buffer. It takes
// ownership of fd: fd is closed on every path, success or error (the mapping
// outlives it).
//
// Only memory is accepted: a memfd or a file on tmpfs or hugetlbfs. A memfd
// already sealed with F_SEAL_SHRINK is mapped as it is (SealedByClient);
// one that still allows seals is sealed with F_SEAL_SHRINK here, before its
// size is checked (SealedByDaemon); one that cannot be sealed is mapped
// Unsealed.
//
// It refuses, with typed errors: id 0 (ErrInvalidID); size 0
// (ErrInvalidSize) or over limit (ErrTooLarge); an fd that is not memory:
// pipes, sockets, devices, directories, files on disk file systems
// (ErrNotMappable); a file shorter than size (ErrShortFile); and fcntl or
// mmap failures (an fd not open for reading and writing, a write-sealed
// memfd), wrapped as syscall errors.
func MapBuffer(id xfer.SegmentID, fd int, size uint64, limit uint64) (*Buffer, error) {
	mem, sealing, err := mapBuffer(id, fd, size, limit)
	if cerr := closeFd(fd); cerr != nil {
		if mem != nil {
			cerr = errors.Join(cerr, unmap(mem))
		}
		return nil, errors.Join(err, cerr)
	}
	if err != nil {
		return nil, err
	}
	return &Buffer{id: id, mem: mem, sealing: sealing}, nil
}

// mapBuffer checks fd, seals it when it can and maps it; the caller closes
// fd.
func mapBuffer(id xfer.SegmentID, fd int, size, limit uint64) ([]byte, Sealing, error) {
	switch {
	case id == 0:
		return nil, 0, ErrInvalidID
	case size == 0:
		return nil, 0, ErrInvalidSize
	case size > limit:
		return nil, 0, fmt.Errorf("%w: buffer of %d bytes, limit %d", ErrTooLarge, size, limit)
	case size > math.MaxInt:
		return nil, 0, fmt.Errorf("%w: buffer of %d bytes cannot be mapped", ErrTooLarge, size)
	case fd < 0:
		return nil, 0, fmt.Errorf("%w: fd %d", ErrNotMappable, fd)
	}
	info, err := inspectFd(fd)
	if err != nil {
		return nil, 0, err
	}
	if !info.regular || !info.memory {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotMappable, info.kind)
	}
	sealing := SealedByClient
	switch {
	case info.shrink:
	case !info.sealed:
		// Sealed before the size is read again: from here on the client
		// cannot shrink it below what is checked.
		if err := sealShrink(fd); err != nil {
			return nil, 0, err
		}
		if info.size, err = fileSize(fd); err != nil {
			return nil, 0, err
		}
		sealing = SealedByDaemon
	default:
		sealing = Unsealed
	}
	if info.size < 0 || uint64(info.size) < size {
		return nil, 0, fmt.Errorf("%w: %d bytes, %d declared", ErrShortFile, info.size, size)
	}
	mem, err := mapShared(fd, size)
	if err != nil {
		return nil, 0, err
	}
	return mem, sealing, nil
}

// ID returns the buffer's segment id.
func (b *Buffer) ID() xfer.SegmentID { return b.id }

// Kind returns xfer.KindClient.
func (b *Buffer) Kind() xfer.Kind { return xfer.KindClient }

// Sealing says how the buffer's file is kept from shrinking, if it is.
func (b *Buffer) Sealing() Sealing { return b.sealing }

// Unsealed reports whether the buffer's owner can shrink it under a
// transfer (xfer.Shrinkable).
func (b *Buffer) Unsealed() bool { return b.sealing == Unsealed }

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

// Collapse places mem, a mapping from MapShared over a new memfd nobody
// has written yet (it writes a zero into each span), on transparent 2 MiB
// pages as the pool is: done of its spans whole 2 MiB spans, and the first
// error. A client buffer so placed is mapped with 2 MiB entries in the
// daemon too (MapBuffer maps it aligned).
func Collapse(mem []byte) (done, spans int, err error) { return collapse(mem) }
