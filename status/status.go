// Package status is the one mapping from errors to the status codes a
// client sees (wire.Code), used by every path that answers a client: the
// control socket, the queues, the store's per-key results and the metrics.
//
// It maps categories, never a package's own errors: every package declares
// its sentinel errors in the category they belong to (xfer.Categorized, or
// by wrapping a category with %w), and CodeOf matches the categories with
// errors.Is. A package adds errors, never a mapping. An error that matches
// no category is a bug somewhere, and the client sees INTERNAL. The tests
// hold every exported error of every package to this (errors_test.go): one
// in no category must be listed there as a bug, or with why no client can
// see it.
package status

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// CodeOf maps err to the code a client sees. Where an error matches
// several categories, the first in the order below wins: a malformed
// request is INVALID_ARGUMENT even if it also named something absent.
func CodeOf(err error) wire.Code {
	switch {
	case err == nil:
		return tcproto.CodeOK
	case errors.Is(err, xfer.ErrInvalid), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EBADF):
		return tcproto.CodeINVALID_ARGUMENT
	case errors.Is(err, xfer.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return tcproto.CodeNOT_FOUND
	case errors.Is(err, xfer.ErrAlreadyExists), errors.Is(err, fs.ErrExist):
		return tcproto.CodeALREADY_EXISTS
	case errors.Is(err, xfer.ErrBusy):
		return tcproto.CodeBUSY
	case errors.Is(err, xfer.ErrBackpressure), errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.ENOSPC),
		errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return tcproto.CodeRESOURCE_EXHAUSTED
	case errors.Is(err, xfer.ErrPrecondition), errors.Is(err, syscall.EFAULT):
		// EFAULT: the kernel found no memory where a client's buffer was
		// (its owner shrank an unsealed one), as a Go copy's ErrFault.
		return tcproto.CodeFAILED_PRECONDITION
	case errors.Is(err, xfer.ErrPermission), errors.Is(err, fs.ErrPermission):
		return tcproto.CodePERMISSION_DENIED
	case errors.Is(err, xfer.ErrTimeout):
		return tcproto.CodeDEADLINE_EXCEEDED
	case errors.Is(err, xfer.ErrUnavailable), errors.Is(err, xfer.ErrClosed),
		errors.Is(err, xfer.ErrCanceled), errors.Is(err, xfer.ErrNotSupported):
		return tcproto.CodeUNAVAILABLE
	}
	return tcproto.CodeINTERNAL
}

// ForState is the code of a task that is in state st and ended with err
// (nil unless it failed). A task still Waiting or Pending when its answer is
// due ran out of time.
func ForState(st xfer.State, err error) wire.Code {
	switch st {
	case xfer.StateCompleted:
		return tcproto.CodeOK
	case xfer.StateTimeout, xfer.StateWaiting, xfer.StatePending:
		return tcproto.CodeDEADLINE_EXCEEDED
	case xfer.StateCanceled:
		return tcproto.CodeUNAVAILABLE
	}
	if err == nil {
		return tcproto.CodeINTERNAL
	}
	return CodeOf(err)
}
