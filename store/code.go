package store

import (
	"errors"
	"strconv"
	"syscall"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// Code is a per-key result. The values are those of the control protocol's
// status codes (fbs/control.fbs, enum Code), one for one, so a caller
// converts with tcproto.Code(c).
type Code uint8

// The codes, in the protocol's order.
const (
	OK Code = iota
	InvalidArgument
	NotFound
	AlreadyExists
	Busy
	ResourceExhausted
	FailedPrecondition
	PermissionDenied
	DeadlineExceeded
	Unavailable
	Internal
)

var codeNames = [...]string{
	OK:                 "OK",
	InvalidArgument:    "INVALID_ARGUMENT",
	NotFound:           "NOT_FOUND",
	AlreadyExists:      "ALREADY_EXISTS",
	Busy:               "BUSY",
	ResourceExhausted:  "RESOURCE_EXHAUSTED",
	FailedPrecondition: "FAILED_PRECONDITION",
	PermissionDenied:   "PERMISSION_DENIED",
	DeadlineExceeded:   "DEADLINE_EXCEEDED",
	Unavailable:        "UNAVAILABLE",
	Internal:           "INTERNAL",
}

// String is the code's protocol name.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.Itoa(int(c)) + ")"
}

// CodeOf maps an error to the code of the key it happened to. It matches
// with errors.Is, so wrapped errors map by their cause.
func CodeOf(err error) Code {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ErrBadKey), errors.Is(err, ErrBadSize), errors.Is(err, ErrShortBuffer),
		errors.Is(err, ErrBadCall):
		return InvalidArgument
	case errors.Is(err, ErrNotFound):
		return NotFound
	case errors.Is(err, ErrExists):
		return AlreadyExists
	case errors.Is(err, ErrBusy), errors.Is(err, ErrNoIO):
		return Busy
	case errors.Is(err, ErrL1Full), errors.Is(err, ErrL2Full), errors.Is(err, ErrOverflow), errors.Is(err, ErrReserveLimit),
		errors.Is(err, shm.ErrPoolExhausted), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ResourceExhausted
	case errors.Is(err, ErrPinned), errors.Is(err, ErrNotReserved), errors.Is(err, ErrUnderflow),
		errors.Is(err, ErrNotApplied), errors.Is(err, ErrNoL2), errors.Is(err, ErrFault):
		return FailedPrecondition
	case errors.Is(err, xfer.ErrPermission):
		return PermissionDenied
	case errors.Is(err, xfer.ErrTimeout):
		return DeadlineExceeded
	case errors.Is(err, ErrClosed), errors.Is(err, xfer.ErrClosed), errors.Is(err, xfer.ErrCanceled):
		return Unavailable
	}
	return Internal
}
