package control

import (
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of the control server. Match them with errors.Is; the
// server wraps them with detail for its log and answers the client with the
// Code that CodeOf maps them to. A frame that does not decode fails with
// wire.ErrMalformed or wire.ErrLimit.
var (
	// ErrMalformed: a request's arguments are not valid (a bad name, rights
	// or range, a body the server does not serve).
	ErrMalformed = xfer.Categorized(xfer.ErrInvalid, "control: malformed message")
	// ErrFrameTooLarge: a frame's length exceeds the configured maximum.
	ErrFrameTooLarge = xfer.Categorized(xfer.ErrBackpressure, "control: frame too large")
	// ErrLimit: a count or length in a request, or a per-connection quota,
	// exceeds its configured limit.
	ErrLimit = xfer.Categorized(xfer.ErrBackpressure, "control: limit exceeded")
	// ErrMissingFD: a message that carries a file descriptor arrived
	// without one.
	ErrMissingFD = xfer.Categorized(xfer.ErrInvalid, "control: file descriptor missing")
	// ErrUnexpectedFD: a file descriptor arrived with a message that takes
	// none, or more than one arrived.
	ErrUnexpectedFD = xfer.Categorized(xfer.ErrInvalid, "control: unexpected file descriptor")
	// ErrNotFound: the message names a segment, block or batch that this
	// connection does not hold.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "control: not found")
	// ErrPermission: the peer may not use this daemon, or may not touch the
	// named resource.
	ErrPermission = xfer.Categorized(xfer.ErrPermission, "control: permission denied")
	// ErrUnavailable: the daemon is draining or closed, or a dependency the
	// message needs (a file opener, the pool) is not configured.
	ErrUnavailable = xfer.Categorized(xfer.ErrUnavailable, "control: unavailable")
	// ErrIdempotencyConflict: an idempotency key was reused with different
	// arguments or another lane.
	ErrIdempotencyConflict = xfer.Categorized(xfer.ErrPrecondition, "control: idempotency key reused with different arguments")
	// ErrTooManyConns: the server is at MaxConns.
	ErrTooManyConns = xfer.Categorized(xfer.ErrBackpressure, "control: too many connections")
	// ErrClosed: the server or client is closed.
	ErrClosed = xfer.Categorized(xfer.ErrUnavailable, "control: closed")
	// ErrAddrInUse: another daemon is serving on the socket path. Matches
	// xfer.ErrAlreadyExists: the socket is served already, a start-up
	// error.
	ErrAddrInUse = xfer.Categorized(xfer.ErrAlreadyExists, "control: socket in use by a running daemon")
	// ErrConfig: a Config value is invalid. Matches xfer.ErrInvalid, a
	// start-up error.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "control: invalid config")
)

// Code is the status of a call or of one item of a batch call; package
// status maps an error to it.
type Code = wire.Code
