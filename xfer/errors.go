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
