package control

import (
	"errors"
	"io/fs"
	"runtime/debug"
	"syscall"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Code is the status of a call or of one item of a batch call.
type Code = wire.Code

// CodeOf maps an error to the status code a client sees. It is the only such
// mapping; it matches with errors.Is, so wrapped errors map by their cause.
func CodeOf(err error) Code {
	switch {
	case err == nil:
		return tcproto.CodeOK
	case errors.Is(err, ErrMalformed), errors.Is(err, wire.ErrMalformed), errors.Is(err, ErrMissingFD), errors.Is(err, ErrUnexpectedFD),
		errors.Is(err, xfer.ErrInvalid), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EBADF):
		return tcproto.CodeINVALID_ARGUMENT
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrBatchNotFound), errors.Is(err, fs.ErrNotExist):
		return tcproto.CodeNOT_FOUND
	case errors.Is(err, fs.ErrExist):
		return tcproto.CodeALREADY_EXISTS
	case errors.Is(err, ErrBatchBusy):
		return tcproto.CodeBUSY
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrLimit), errors.Is(err, wire.ErrLimit), errors.Is(err, ErrTooManyConns),
		errors.Is(err, ErrBatchFull), errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.ENOSPC),
		errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return tcproto.CodeRESOURCE_EXHAUSTED
	case errors.Is(err, ErrIdempotencyConflict):
		return tcproto.CodeFAILED_PRECONDITION
	case errors.Is(err, ErrPermission), errors.Is(err, xfer.ErrPermission), errors.Is(err, fs.ErrPermission):
		return tcproto.CodePERMISSION_DENIED
	case errors.Is(err, xfer.ErrTimeout):
		return tcproto.CodeDEADLINE_EXCEEDED
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed), errors.Is(err, xfer.ErrClosed),
		errors.Is(err, xfer.ErrCanceled), errors.Is(err, xfer.ErrNotSupported):
		return tcproto.CodeUNAVAILABLE
	}
	if c, ok := codeOfExtra(err); ok {
		return c
	}
	return tcproto.CodeINTERNAL
}

// codeForState is the code of a task in state st that ended with err.
func codeForState(st xfer.State, err error) Code {
	switch st {
	case xfer.StateCompleted:
		return tcproto.CodeOK
	case xfer.StateTimeout:
		return tcproto.CodeDEADLINE_EXCEEDED
	case xfer.StateCanceled:
		return tcproto.CodeUNAVAILABLE
	case xfer.StateWaiting, xfer.StatePending:
		return tcproto.CodeDEADLINE_EXCEEDED
	}
	if err == nil {
		return tcproto.CodeINTERNAL
	}
	return CodeOf(err)
}

func stack() []byte { return debug.Stack() }
