// Package status is the one mapping from errors to the status codes a
// client sees (wire.Code), used by every path that answers a client: the
// control socket, the queues, the store's per-key results and the metrics.
//
// It maps categories, never a package's own errors: every package declares
// its sentinel errors in the category they belong to (xfer.Categorized, or
// by wrapping a category with %w), and CodeOf matches the categories with
// errors.Is. A package adds errors, never a mapping. An error that matches
// no category but carries an errno (a syscall's, or one a device's
// completion returned) has the code of the errno's category; any other is
// a bug somewhere, and the client sees INTERNAL. The tests
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

// CategoryOf is the category of the errors that map to code c, the inverse
// of CodeOf: an error another daemon answered with c, wrapped in it, keeps
// its code here (OK has none: nil).
func CategoryOf(c wire.Code) error {
	switch c {
	case tcproto.CodeOK:
		return nil
	case tcproto.CodeINVALID_ARGUMENT:
		return xfer.ErrInvalid
	case tcproto.CodeNOT_FOUND:
		return xfer.ErrNotFound
	case tcproto.CodeALREADY_EXISTS:
		return xfer.ErrAlreadyExists
	case tcproto.CodeBUSY:
		return xfer.ErrBusy
	case tcproto.CodeRESOURCE_EXHAUSTED:
		return xfer.ErrBackpressure
	case tcproto.CodeFAILED_PRECONDITION:
		return xfer.ErrPrecondition
	case tcproto.CodePERMISSION_DENIED:
		return xfer.ErrPermission
	case tcproto.CodeDEADLINE_EXCEEDED:
		return xfer.ErrTimeout
	case tcproto.CodeUNAVAILABLE:
		return xfer.ErrUnavailable
	}
	return xfer.ErrTransport // INTERNAL, or a code this daemon does not know
}

// CodeOf maps err to the code a client sees. A category decides: where an
// error matches several, the first in the order below wins (a malformed
// request is INVALID_ARGUMENT even if it also named something absent).
// An error in no category that carries an errno (a syscall's, a device's
// completion) has the code of the errno's category (errnoCodes); any other
// is a bug, INTERNAL.
func CodeOf(err error) wire.Code {
	switch {
	case err == nil:
		return tcproto.CodeOK
	case errors.Is(err, xfer.ErrInvalid):
		return tcproto.CodeINVALID_ARGUMENT
	case errors.Is(err, xfer.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return tcproto.CodeNOT_FOUND
	case errors.Is(err, xfer.ErrAlreadyExists), errors.Is(err, fs.ErrExist):
		return tcproto.CodeALREADY_EXISTS
	case errors.Is(err, xfer.ErrBusy):
		return tcproto.CodeBUSY
	case errors.Is(err, xfer.ErrBackpressure):
		return tcproto.CodeRESOURCE_EXHAUSTED
	case errors.Is(err, xfer.ErrPrecondition):
		return tcproto.CodeFAILED_PRECONDITION
	case errors.Is(err, xfer.ErrPermission), errors.Is(err, fs.ErrPermission):
		return tcproto.CodePERMISSION_DENIED
	case errors.Is(err, xfer.ErrTimeout):
		return tcproto.CodeDEADLINE_EXCEEDED
	case errors.Is(err, xfer.ErrUnavailable), errors.Is(err, xfer.ErrClosed),
		errors.Is(err, xfer.ErrCanceled), errors.Is(err, xfer.ErrNotSupported):
		return tcproto.CodeUNAVAILABLE
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if c, ok := errnoCodes[errno]; ok {
			return c
		}
	}
	return tcproto.CodeINTERNAL
}

// errnoCodes are the codes of the errnos a syscall or a device's
// completion returns, by the category an operator would file each under.
// An errno not listed is INTERNAL: the daemon did not expect it.
var errnoCodes = map[syscall.Errno]wire.Code{
	// The request is wrong: bad arguments, a descriptor or a path that is
	// not what the call needs, a size out of range.
	syscall.EINVAL:       tcproto.CodeINVALID_ARGUMENT,
	syscall.EBADF:        tcproto.CodeINVALID_ARGUMENT,
	syscall.ENOTDIR:      tcproto.CodeINVALID_ARGUMENT,
	syscall.EISDIR:       tcproto.CodeINVALID_ARGUMENT,
	syscall.ENAMETOOLONG: tcproto.CodeINVALID_ARGUMENT,
	syscall.E2BIG:        tcproto.CodeINVALID_ARGUMENT,
	syscall.EOVERFLOW:    tcproto.CodeINVALID_ARGUMENT,
	syscall.ERANGE:       tcproto.CodeINVALID_ARGUMENT,
	// What the call names is not there.
	syscall.ENOENT: tcproto.CodeNOT_FOUND,
	// What the call creates is there already.
	syscall.EEXIST: tcproto.CodeALREADY_EXISTS,
	// In use by someone else; the same call may succeed later.
	syscall.EBUSY:   tcproto.CodeBUSY,
	syscall.ETXTBSY: tcproto.CodeBUSY,
	// A resource ran out (memory, space, quota, descriptors) or the kernel
	// asks to try again once something drains.
	syscall.ENOMEM:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.ENOSPC:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.EDQUOT:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.EFBIG:   tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.EMFILE:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.ENFILE:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.EAGAIN:  tcproto.CodeRESOURCE_EXHAUSTED,
	syscall.ENOBUFS: tcproto.CodeRESOURCE_EXHAUSTED,
	// The kernel found no memory where a client's buffer was (its owner
	// shrank an unsealed one under an io_uring read or write), as a Go
	// copy's xfer.ErrFault.
	syscall.EFAULT: tcproto.CodeFAILED_PRECONDITION,
	// Not allowed: credentials, or a file system mounted read-only.
	syscall.EACCES: tcproto.CodePERMISSION_DENIED,
	syscall.EPERM:  tcproto.CodePERMISSION_DENIED,
	syscall.EROFS:  tcproto.CodePERMISSION_DENIED,
	// Out of time.
	syscall.ETIMEDOUT: tcproto.CodeDEADLINE_EXCEEDED,
	syscall.ETIME:     tcproto.CodeDEADLINE_EXCEEDED,
	// What serves the call failed or is gone: the device's I/O failed, the
	// device went away, a connection broke, the operation was
	// canceled or is not supported here. A retry later, or elsewhere, may
	// succeed.
	syscall.EIO:          tcproto.CodeUNAVAILABLE,
	syscall.ENODEV:       tcproto.CodeUNAVAILABLE,
	syscall.ENXIO:        tcproto.CodeUNAVAILABLE,
	syscall.ENOLINK:      tcproto.CodeUNAVAILABLE,
	syscall.ECONNREFUSED: tcproto.CodeUNAVAILABLE,
	syscall.ECONNRESET:   tcproto.CodeUNAVAILABLE,
	syscall.ECONNABORTED: tcproto.CodeUNAVAILABLE,
	syscall.EPIPE:        tcproto.CodeUNAVAILABLE,
	syscall.ENOTCONN:     tcproto.CodeUNAVAILABLE,
	syscall.ESHUTDOWN:    tcproto.CodeUNAVAILABLE,
	syscall.EHOSTUNREACH: tcproto.CodeUNAVAILABLE,
	syscall.ENETUNREACH:  tcproto.CodeUNAVAILABLE,
	syscall.ENETDOWN:     tcproto.CodeUNAVAILABLE,
	syscall.ECANCELED:    tcproto.CodeUNAVAILABLE,
	syscall.EINTR:        tcproto.CodeUNAVAILABLE,
	syscall.ENOSYS:       tcproto.CodeUNAVAILABLE,
	syscall.EOPNOTSUPP:   tcproto.CodeUNAVAILABLE,
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
