package status_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Each category maps to its code, wrapped or not, and so does a package's
// sentinel declared in it.
func TestCodeOfCategories(t *testing.T) {
	for _, c := range []struct {
		err  error
		want wire.Code
	}{
		{nil, tcproto.CodeOK},
		{xfer.ErrInvalid, tcproto.CodeINVALID_ARGUMENT},
		{xfer.ErrNotFound, tcproto.CodeNOT_FOUND},
		{xfer.ErrAlreadyExists, tcproto.CodeALREADY_EXISTS},
		{xfer.ErrBusy, tcproto.CodeBUSY},
		{xfer.ErrBackpressure, tcproto.CodeRESOURCE_EXHAUSTED},
		{xfer.ErrPrecondition, tcproto.CodeFAILED_PRECONDITION},
		{xfer.ErrPermission, tcproto.CodePERMISSION_DENIED},
		{xfer.ErrTimeout, tcproto.CodeDEADLINE_EXCEEDED},
		{xfer.ErrUnavailable, tcproto.CodeUNAVAILABLE},
		{xfer.ErrClosed, tcproto.CodeUNAVAILABLE},
		{xfer.ErrCanceled, tcproto.CodeUNAVAILABLE},
		{xfer.ErrNotSupported, tcproto.CodeUNAVAILABLE},
		{xfer.ErrTransport, tcproto.CodeINTERNAL},
		{errors.New("anything else"), tcproto.CodeINTERNAL},
		{fmt.Errorf("detail: %w", xfer.ErrBatchBusy), tcproto.CodeBUSY},
		{xfer.Categorized(xfer.ErrBackpressure, "some: queue full"), tcproto.CodeRESOURCE_EXHAUSTED},
		{wire.ErrMalformed, tcproto.CodeINVALID_ARGUMENT},
		{wire.ErrLimit, tcproto.CodeRESOURCE_EXHAUSTED},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, tcproto.CodeNOT_FOUND},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}, tcproto.CodePERMISSION_DENIED},
		{syscall.EMFILE, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.EINVAL, tcproto.CodeINVALID_ARGUMENT},
		// The kernel could not reach a client's memory (it shrank its
		// unsealed buffer under an io_uring read or write).
		{os.NewSyscallError("io_uring write", syscall.EFAULT), tcproto.CodeFAILED_PRECONDITION},
	} {
		if got := status.CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// A raw errno (a syscall's, wrapped or not, or a device completion's that
// a transport passes on) has the code of the category an operator would
// file it under, never INTERNAL for the ones a file, a device or a socket
// returns; a category the error also carries decides first.
func TestCodeOfErrnos(t *testing.T) {
	for _, c := range []struct {
		errno syscall.Errno
		want  wire.Code
	}{
		{syscall.EIO, tcproto.CodeUNAVAILABLE},
		{syscall.ENODEV, tcproto.CodeUNAVAILABLE},
		{syscall.ENXIO, tcproto.CodeUNAVAILABLE},
		{syscall.ECONNRESET, tcproto.CodeUNAVAILABLE},
		{syscall.EPIPE, tcproto.CodeUNAVAILABLE},
		{syscall.ECANCELED, tcproto.CodeUNAVAILABLE},
		{syscall.EOPNOTSUPP, tcproto.CodeUNAVAILABLE},
		{syscall.ENOSYS, tcproto.CodeUNAVAILABLE},
		{syscall.ENOSPC, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.EDQUOT, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.ENOMEM, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.EAGAIN, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.EFBIG, tcproto.CodeRESOURCE_EXHAUSTED},
		{syscall.EFAULT, tcproto.CodeFAILED_PRECONDITION},
		{syscall.ENOENT, tcproto.CodeNOT_FOUND},
		{syscall.EEXIST, tcproto.CodeALREADY_EXISTS},
		{syscall.EBUSY, tcproto.CodeBUSY},
		{syscall.EACCES, tcproto.CodePERMISSION_DENIED},
		{syscall.EPERM, tcproto.CodePERMISSION_DENIED},
		{syscall.EROFS, tcproto.CodePERMISSION_DENIED},
		{syscall.ETIMEDOUT, tcproto.CodeDEADLINE_EXCEEDED},
		{syscall.EINVAL, tcproto.CodeINVALID_ARGUMENT},
		{syscall.EBADF, tcproto.CodeINVALID_ARGUMENT},
		{syscall.EISDIR, tcproto.CodeINVALID_ARGUMENT},
		{syscall.EXDEV, tcproto.CodeINTERNAL}, // not expected of any transport
	} {
		for _, err := range []error{
			c.errno,
			os.NewSyscallError("pwritev2", c.errno),
			fmt.Errorf("uring: write of 4096 bytes at file offset 0: %w", os.NewSyscallError("io_uring", c.errno)),
		} {
			if got := status.CodeOf(err); got != c.want {
				t.Errorf("CodeOf(%v) = %s, want %s", err, got, c.want)
			}
		}
	}
	// The category a package put the error in decides over the errno.
	for _, c := range []struct {
		err  error
		want wire.Code
	}{
		{fmt.Errorf("%w: %w", xfer.ErrPrecondition, syscall.ENOSPC), tcproto.CodeFAILED_PRECONDITION},
		{fmt.Errorf("%w: %w", xfer.ErrNotSupported, syscall.EINVAL), tcproto.CodeUNAVAILABLE},
		{fmt.Errorf("%w: %w", xfer.ErrInvalid, syscall.EIO), tcproto.CodeINVALID_ARGUMENT},
	} {
		if got := status.CodeOf(c.err); got != c.want {
			t.Errorf("CodeOf(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// A categorized sentinel keeps its own message and identity.
func TestCategorized(t *testing.T) {
	e := xfer.Categorized(xfer.ErrNotFound, "pkg: thing not found")
	if e.Error() != "pkg: thing not found" {
		t.Errorf("message %q", e.Error())
	}
	w := fmt.Errorf("op: %w", e)
	if !errors.Is(w, e) || !errors.Is(w, xfer.ErrNotFound) || errors.Is(w, xfer.ErrInvalid) {
		t.Errorf("errors.Is on %v: itself %v, its category %v, another category %v",
			w, errors.Is(w, e), errors.Is(w, xfer.ErrNotFound), errors.Is(w, xfer.ErrInvalid))
	}
}

func TestForState(t *testing.T) {
	for _, c := range []struct {
		st   xfer.State
		err  error
		want wire.Code
	}{
		{xfer.StateCompleted, nil, tcproto.CodeOK},
		{xfer.StateTimeout, xfer.ErrTimeout, tcproto.CodeDEADLINE_EXCEEDED},
		{xfer.StatePending, nil, tcproto.CodeDEADLINE_EXCEEDED},
		{xfer.StateWaiting, nil, tcproto.CodeDEADLINE_EXCEEDED},
		{xfer.StateCanceled, xfer.ErrCanceled, tcproto.CodeUNAVAILABLE},
		{xfer.StateFailed, nil, tcproto.CodeINTERNAL},
		{xfer.StateFailed, xfer.ErrNoSegment, tcproto.CodeNOT_FOUND},
	} {
		if got := status.ForState(c.st, c.err); got != c.want {
			t.Errorf("ForState(%v, %v) = %s, want %s", c.st, c.err, got, c.want)
		}
	}
}

// TestCategoryOfInvertsCodeOf: an error of another daemon's code, wrapped
// in the category CategoryOf gives, maps back to that code here, for
// every code the protocol has; an unknown code is INTERNAL.
func TestCategoryOfInvertsCodeOf(t *testing.T) {
	if err := status.CategoryOf(tcproto.CodeOK); err != nil {
		t.Fatalf("status.CategoryOf(OK) = %v, want nil", err)
	}
	for c := range tcproto.EnumNamesCode {
		if c == tcproto.CodeOK {
			continue
		}
		err := fmt.Errorf("%w: the peer answered %v", status.CategoryOf(c), c)
		if got := status.CodeOf(err); got != c {
			t.Errorf("status.CodeOf(status.CategoryOf(%v)) = %v", c, got)
		}
	}
	if got := status.CodeOf(status.CategoryOf(tcproto.Code(250))); got != tcproto.CodeINTERNAL {
		t.Errorf("an unknown code maps to %v, want INTERNAL", got)
	}
}
