package xfer

import "errors"

// The categories. Every sentinel error of every package belongs to at most
// one of them and matches it with errors.Is (Categorized makes such an
// error); package status maps categories, never a package's own errors, to
// the code a client sees. An error that matches no category is a bug, and
// a client sees INTERNAL.
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
	// ErrNotFound: what the call names (a segment, batch, key, peer) does
	// not exist.
	ErrNotFound = errors.New("xfer: not found")
	// ErrAlreadyExists: what the call creates exists already.
	ErrAlreadyExists = errors.New("xfer: already exists")
	// ErrBusy: what the call names is in use by another operation; the
	// same call may succeed once that ends.
	ErrBusy = errors.New("xfer: busy")
	// ErrBackpressure: a queue, pool, quota or limit is full; the call
	// changed nothing and may be retried once something drains.
	ErrBackpressure = errors.New("xfer: resource exhausted")
	// ErrPrecondition: the state the call needs does not hold (a pin to
	// undo that is not there, memory unmapped under a copy).
	ErrPrecondition = errors.New("xfer: failed precondition")
	// ErrUnavailable: what serves the call (a peer, a connection, a
	// dependency) is not there now; a retry later may succeed.
	ErrUnavailable = errors.New("xfer: unavailable")
)

// Categorized returns a sentinel error whose message is msg and that
// matches, with errors.Is, itself and category. Packages declare their
// sentinels with it so that package status maps them by category.
func Categorized(category error, msg string) error {
	return &categorized{msg: msg, category: category}
}

type categorized struct {
	msg      string
	category error
}

func (e *categorized) Error() string        { return e.msg }
func (e *categorized) Is(target error) bool { return target == e.category }

// Sentinel errors of the batch lifecycle and the segment registry.
var (
	// ErrBatchNotFound: no live batch has that id (never allocated, or
	// already freed).
	ErrBatchNotFound = Categorized(ErrNotFound, "xfer: batch not found")
	// ErrBatchFull: the submit would take the batch past its capacity.
	ErrBatchFull = Categorized(ErrBackpressure, "xfer: batch full")
	// ErrBatchBusy: the batch still has Waiting or Pending tasks.
	ErrBatchBusy = Categorized(ErrBusy, "xfer: batch busy")
	// ErrBatchLimit: the engine already holds Config.MaxBatches batches.
	ErrBatchLimit = Categorized(ErrBackpressure, "xfer: too many batches")
	// ErrTransport: a transport broke the Transport contract (a dispatch
	// count outside 0..len, a short count without an error, a second Done).
	// The whole call is failed; nothing of it is reported as a success. It
	// is in no category: a broken contract is a bug in the transport, and
	// a client sees INTERNAL.
	ErrTransport = errors.New("xfer: transport contract violation")
	// ErrExists: a segment with that id is already registered.
	ErrExists = Categorized(ErrAlreadyExists, "xfer: segment exists")
	// ErrNoSegment: a request names a segment that is not registered (or is
	// closing).
	ErrNoSegment = Categorized(ErrNotFound, "xfer: unknown segment")
	// ErrFault: a copy touched memory that is no longer mapped (a client
	// truncated or unmapped its buffer under the transfer).
	ErrFault = Categorized(ErrPrecondition, "xfer: memory fault")
	// ErrUnsealed: the request's memory is a client buffer its owner can
	// shrink (Shrinkable) and the path it would take cannot contain a fault
	// to that request (a TCP stream to a peer, an export); sealing the
	// memfd with F_SEAL_SHRINK lifts it.
	ErrUnsealed = Categorized(ErrPrecondition, "xfer: unsealed client buffer on a path that needs a sealed one")

	// ErrBadOp: a request's Op is neither OpRead nor OpWrite. It matches
	// ErrInvalid.
	ErrBadOp = Categorized(ErrInvalid, "xfer: invalid op")
	// ErrZeroLength: a request moves no bytes. It matches ErrInvalid.
	ErrZeroLength = Categorized(ErrInvalid, "xfer: zero length")
	// ErrOutOfBounds: offset+length is past the end of a segment. It matches
	// ErrInvalid.
	ErrOutOfBounds = Categorized(ErrInvalid, "xfer: out of segment bounds")

	// ErrNoNotify: a task carries a notification (Task.Notify) and its
	// transport has nobody to deliver it to (a local copy, a file). It
	// matches ErrNotSupported.
	ErrNoNotify = Categorized(ErrNotSupported, "xfer: this transport carries no notifications")

	// ErrRangeRefused: a segment that holds the ranges transfers use
	// (RangeHolder) refused the request's range: the caller does not hold
	// it, or the segment's owner is gone. It matches ErrPermission.
	ErrRangeRefused = Categorized(ErrPermission, "xfer: range refused by its segment")
)
