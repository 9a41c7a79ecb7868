package store

import (
	"strconv"

	"github.com/tensorcast/tensorcast/status"
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

// CodeOf is the code of the key err happened to: package status's mapping,
// as a store Code.
func CodeOf(err error) Code { return Code(status.CodeOf(err)) }
