package shm

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package shm. Match them with errors.Is; returned errors
// wrap them with detail (and syscall failures with os.NewSyscallError).
var (
	// ErrInvalidConfig: a PoolConfig field is out of range (zero id or size,
	// block sizes not powers of two, unknown hugepages mode, a pool too large
	// to map or index). Matches xfer.ErrInvalid, a start-up error.
	ErrInvalidConfig = xfer.Categorized(xfer.ErrInvalid, "shm: invalid pool config")
	// ErrInvalidID: a segment id of zero.
	ErrInvalidID = xfer.Categorized(xfer.ErrInvalid, "shm: segment id 0")
	// ErrInvalidSize: a size of zero (an allocation or a buffer).
	ErrInvalidSize = xfer.Categorized(xfer.ErrInvalid, "shm: invalid size")
	// ErrTooLarge: an allocation larger than MaxBlock, or a buffer larger
	// than the caller's limit.
	ErrTooLarge = xfer.Categorized(xfer.ErrBackpressure, "shm: size too large")
	// ErrPoolExhausted: no free block of the class and no free slab.
	ErrPoolExhausted = xfer.Categorized(xfer.ErrBackpressure, "shm: pool exhausted")
	// ErrBadFree: Free of an offset that is not a live block (never
	// allocated, already freed, or not the start of a block).
	ErrBadFree = xfer.Categorized(xfer.ErrNotFound, "shm: free of an unknown or already freed block")
	// ErrClosed: the pool or buffer is closed (or closing).
	ErrClosed = fmt.Errorf("shm: %w", xfer.ErrClosed)
	// ErrNoHugepages: hugepages were required ("on") but could not be had.
	// Matches xfer.ErrNotSupported: the host cannot give what the config
	// requires, a start-up error.
	ErrNoHugepages = xfer.Categorized(xfer.ErrNotSupported, "shm: hugepages unavailable")
	// ErrNotMappable: a passed fd is not memory: neither a memfd nor a file
	// on tmpfs or hugetlbfs (a pipe, socket, device, directory, a file on a
	// disk file system).
	ErrNotMappable = xfer.Categorized(xfer.ErrInvalid, "shm: fd is not a memfd or tmpfs file")
	// ErrShortFile: the passed file is shorter than the declared size.
	ErrShortFile = xfer.Categorized(xfer.ErrInvalid, "shm: file shorter than the declared size")
	// ErrNotSupported: this system has no memfd/mmap support for shm. It
	// also matches xfer.ErrNotSupported.
	ErrNotSupported = fmt.Errorf("shm: %w", xfer.ErrNotSupported)
)
