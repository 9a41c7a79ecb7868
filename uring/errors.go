package uring

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of the io_uring transport. Match them with errors.Is; each
// also matches the xfer category it belongs to, so callers that only know
// package xfer can still classify them.
var (
	// ErrNotSupported: io_uring (or a feature asked for) is not available
	// on this host. Matches xfer.ErrNotSupported.
	ErrNotSupported = fmt.Errorf("uring: not supported: %w", xfer.ErrNotSupported)
	// ErrDirectUnsupported: the file system refused O_DIRECT for a file
	// opened with FileOptions.Direct. Matches xfer.ErrNotSupported.
	ErrDirectUnsupported = fmt.Errorf("uring: O_DIRECT refused by the file system: %w", xfer.ErrNotSupported)
	// ErrNotAllowed: the path is outside Config.AllowedDirs and
	// Config.AllowedDevices. Matches xfer.ErrPermission.
	ErrNotAllowed = fmt.Errorf("uring: path not allowed: %w", xfer.ErrPermission)
	// ErrMisaligned: an O_DIRECT request's offset, length or memory address
	// is not aligned as the device requires. Matches xfer.ErrInvalid.
	ErrMisaligned = fmt.Errorf("uring: misaligned for O_DIRECT: %w", xfer.ErrInvalid)
	// ErrBadRequest: a request the transport cannot serve (wrong segment
	// kinds, bad op, zero length, out of bounds). Matches xfer.ErrInvalid.
	ErrBadRequest = fmt.Errorf("uring: bad request: %w", xfer.ErrInvalid)
	// ErrQueueFull: Submit waited Config.SubmitWait for a free slot and got
	// none; the remaining tasks were not dispatched. Matches
	// xfer.ErrBackpressure: the ring drains and the same request may then
	// be taken.
	ErrQueueFull = xfer.Categorized(xfer.ErrBackpressure, "uring: queue full")
	// ErrShortIO: the file ended before the request did (a read at or past
	// end of file, or a write the device accepted zero bytes of). Matches
	// xfer.ErrPrecondition: the request is well formed, the file is not as
	// long as it needs.
	ErrShortIO = xfer.Categorized(xfer.ErrPrecondition, "uring: unexpected end of file")
	// ErrConfig: a Config or FileOptions value is invalid. Matches
	// xfer.ErrInvalid.
	ErrConfig = fmt.Errorf("uring: invalid config: %w", xfer.ErrInvalid)
	// ErrRingFailed: a ring's io_uring_enter kept failing, and the ring
	// was declared failed: the tasks it held ended with it, and Submit
	// refuses new ones for that ring with it until the transport closes
	// (Transport.Health reports it). The error a ring fails with also
	// names the ring and matches the errno (errors.Is), but not that
	// errno's own category. Matches xfer.ErrUnavailable: another ring,
	// or the daemon restarted, may serve the same request.
	ErrRingFailed = xfer.Categorized(xfer.ErrUnavailable, "uring: ring failed")
)
