package xfer

import "errors"

// Sentinel errors of the transfer engine and the transport contract. Match
// them with errors.Is; transports wrap them with detail.
var (
	// ErrClosed: the engine or transport is closed (or closing) and takes no
	// new work.
	ErrClosed = errors.New("xfer: closed")
	// ErrInvalid: a request is malformed (bad op, zero length, out of a
	// segment's bounds, misaligned for the transport).
	ErrInvalid = errors.New("xfer: invalid request")
	// ErrNotSupported: the transport or host cannot do what was asked.
	ErrNotSupported = errors.New("xfer: not supported")
	// ErrCanceled: the task was canceled before it completed.
	ErrCanceled = errors.New("xfer: canceled")
	// ErrTimeout: the task's deadline passed.
	ErrTimeout = errors.New("xfer: deadline exceeded")
	// ErrPermission: the caller may not touch the segment.
	ErrPermission = errors.New("xfer: permission denied")
)

// Sentinel errors of the batch lifecycle and the segment registry.
var (
	// ErrBatchNotFound: no live batch has that id (never allocated, or
	// already freed).
	ErrBatchNotFound = errors.New("xfer: batch not found")
	// ErrBatchFull: the submit would take the batch past its capacity.
	ErrBatchFull = errors.New("xfer: batch full")
	// ErrBatchBusy: the batch still has Waiting or Pending tasks.
	ErrBatchBusy = errors.New("xfer: batch busy")
	// ErrBatchLimit: the engine already holds Config.MaxBatches batches.
	ErrBatchLimit = errors.New("xfer: too many batches")
	// ErrTransport: a transport broke the Transport contract (a dispatch
	// count outside 0..len, a short count without an error, a second Done).
	// The whole call is failed; nothing of it is reported as a success.
	ErrTransport = errors.New("xfer: transport contract violation")
	// ErrExists: a segment with that id is already registered.
	ErrExists = errors.New("xfer: segment exists")
	// ErrNoSegment: a request names a segment that is not registered (or is
	// closing).
	ErrNoSegment = errors.New("xfer: unknown segment")
	// ErrFault: a copy touched memory that is no longer mapped (a client
	// truncated or unmapped its buffer under the transfer).
	ErrFault = errors.New("xfer: memory fault")

	// ErrBadOp: a request's Op is neither OpRead nor OpWrite. It matches
	// ErrInvalid.
	ErrBadOp error = &invalidError{"xfer: invalid op"}
	// ErrZeroLength: a request moves no bytes. It matches ErrInvalid.
	ErrZeroLength error = &invalidError{"xfer: zero length"}
	// ErrOutOfBounds: offset+length is past the end of a segment. It matches
	// ErrInvalid.
	ErrOutOfBounds error = &invalidError{"xfer: out of segment bounds"}

	// ErrNoNotify: a task carries a notification (Task.Notify) and its
	// transport has nobody to deliver it to (a local copy, a file). It
	// matches ErrNotSupported.
	ErrNoNotify error = &notSupportedError{"xfer: this transport carries no notifications"}

	// ErrRangeRefused: a segment that holds the ranges transfers use
	// (RangeHolder) refused the request's range: the caller does not hold
	// it, or the segment's owner is gone. It matches ErrPermission.
	ErrRangeRefused error = &permissionError{"xfer: range refused by its segment"}
)

// permissionError is a refinement of ErrPermission.
type permissionError struct{ msg string }

func (e *permissionError) Error() string        { return e.msg }
func (e *permissionError) Is(target error) bool { return target == ErrPermission }

// invalidError is a refinement of ErrInvalid: errors.Is matches both the
// refinement itself and ErrInvalid.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

// notSupportedError is a refinement of ErrNotSupported.
type notSupportedError struct{ msg string }

func (e *notSupportedError) Error() string        { return e.msg }
func (e *notSupportedError) Is(target error) bool { return target == ErrNotSupported }
