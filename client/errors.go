package client

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Errors of the client. A daemon's status code comes back as a *StatusError
// that matches (errors.Is) the sentinel of its code. Each sentinel of a code
// is in the xfer category of that code, so that package status maps it back
// to the code it stands for; ErrInternal is in none, as INTERNAL is the code
// of an error no category covers.
var (
	ErrInvalidArgument    = xfer.Categorized(xfer.ErrInvalid, "tensorcast: invalid argument")
	ErrNotFound           = xfer.Categorized(xfer.ErrNotFound, "tensorcast: not found")
	ErrAlreadyExists      = xfer.Categorized(xfer.ErrAlreadyExists, "tensorcast: already exists")
	ErrBusy               = xfer.Categorized(xfer.ErrBusy, "tensorcast: busy")
	ErrResourceExhausted  = xfer.Categorized(xfer.ErrBackpressure, "tensorcast: resource exhausted")
	ErrFailedPrecondition = xfer.Categorized(xfer.ErrPrecondition, "tensorcast: failed precondition")
	ErrPermissionDenied   = xfer.Categorized(xfer.ErrPermission, "tensorcast: permission denied")
	ErrDeadlineExceeded   = xfer.Categorized(xfer.ErrTimeout, "tensorcast: deadline exceeded")
	ErrUnavailable        = xfer.Categorized(xfer.ErrUnavailable, "tensorcast: unavailable")
	ErrInternal           = errors.New("tensorcast: daemon internal error")

	// ErrProtocol: the daemon's answer does not match the request (another
	// body, another request id, a different number of positional results).
	// The whole call failed; the connection is closed. Matches
	// xfer.ErrUnavailable, as a peer's protocol violation does in the
	// daemon: a new connection may serve.
	ErrProtocol = xfer.Categorized(xfer.ErrUnavailable, "tensorcast: protocol violation")
	// ErrClosed: the client is closed, or its connection broke. Matches
	// xfer.ErrClosed.
	ErrClosed = xfer.Categorized(xfer.ErrClosed, "tensorcast: client closed")
	// ErrNoPool: the client was dialed without mapping the pool. Matches
	// xfer.ErrPrecondition: the call needs a mapping this client lacks.
	ErrNoPool = xfer.Categorized(xfer.ErrPrecondition, "tensorcast: pool not mapped")
	// ErrNotSupported: the call needs what this OS lacks (memfds and shared
	// mappings are Linux's). It matches xfer.ErrNotSupported.
	ErrNotSupported = fmt.Errorf("tensorcast: %w on this OS", xfer.ErrNotSupported)
)

// StatusError is a non-OK status the daemon answered.
type StatusError struct {
	Code    wire.Code
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("tensorcast: %s: %s", e.Code, e.Message)
}

// Is matches the sentinel of e's code.
func (e *StatusError) Is(target error) bool { return target == codeErr(e.Code) }

func codeErr(c wire.Code) error {
	switch c {
	case tcproto.CodeINVALID_ARGUMENT:
		return ErrInvalidArgument
	case tcproto.CodeNOT_FOUND:
		return ErrNotFound
	case tcproto.CodeALREADY_EXISTS:
		return ErrAlreadyExists
	case tcproto.CodeBUSY:
		return ErrBusy
	case tcproto.CodeRESOURCE_EXHAUSTED:
		return ErrResourceExhausted
	case tcproto.CodeFAILED_PRECONDITION:
		return ErrFailedPrecondition
	case tcproto.CodePERMISSION_DENIED:
		return ErrPermissionDenied
	case tcproto.CodeDEADLINE_EXCEEDED:
		return ErrDeadlineExceeded
	case tcproto.CodeUNAVAILABLE:
		return ErrUnavailable
	case tcproto.CodeINTERNAL:
		return ErrInternal
	}
	return ErrProtocol // a code the protocol does not name
}

// knownCode reports whether the protocol names c: a daemon that sends
// another speaks a protocol this client does not, and the code comes back
// as ErrProtocol, never as it came.
func knownCode(c wire.Code) bool { return c <= tcproto.CodeINTERNAL }

// completionCode is a completion's u32 code as a Code: one past what a
// Code holds would otherwise be cut to a byte (258 would read NOT_FOUND),
// so every code the protocol does not name becomes 0xff, whose Err is
// ErrProtocol.
func completionCode(c uint32) wire.Code {
	if c > 0xff || !knownCode(wire.Code(c)) {
		return 0xff
	}
	return wire.Code(c)
}

// completionState is a task's state as the daemon sent it: 0 (it never
// ran: refused before it started) or one the protocol names, else
// StateFailed and false (Reap then gives the completion the code whose Err
// is ErrProtocol), as libtensorcast's tc__state.
func completionState(s uint32) (xfer.State, bool) {
	if st := xfer.State(s); st <= xfer.StateCanceled {
		return st, true
	}
	return xfer.StateFailed, false
}

// itemErr is the error of one positional item: nil for OK, ErrProtocol
// for a code the protocol does not name.
func itemErr(c wire.Code) error {
	if c == tcproto.CodeOK {
		return nil
	}
	if !knownCode(c) {
		return fmt.Errorf("%w: item code %d", ErrProtocol, c)
	}
	return &StatusError{Code: c, Message: "item failed"}
}
