package control

import (
	"errors"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// codeOfExtra maps the errors of the packages the server is wired to that
// CodeOf does not know by an xfer or syscall cause.
func codeOfExtra(err error) (Code, bool) {
	switch {
	case errors.Is(err, shm.ErrPoolExhausted), errors.Is(err, shm.ErrTooLarge):
		return tcproto.CodeRESOURCE_EXHAUSTED, true
	case errors.Is(err, shm.ErrInvalidSize), errors.Is(err, shm.ErrInvalidID), errors.Is(err, shm.ErrNotMappable),
		errors.Is(err, shm.ErrShortFile), errors.Is(err, shm.ErrUnsealed):
		return tcproto.CodeINVALID_ARGUMENT, true
	case errors.Is(err, shm.ErrBadFree), errors.Is(err, xfer.ErrNoSegment):
		return tcproto.CodeNOT_FOUND, true
	case errors.Is(err, xfer.ErrExists):
		return tcproto.CodeALREADY_EXISTS, true
	case errors.Is(err, xfer.ErrBatchLimit):
		return tcproto.CodeRESOURCE_EXHAUSTED, true
	case errors.Is(err, xfer.ErrFault):
		return tcproto.CodeFAILED_PRECONDITION, true
	case errors.Is(err, peer.ErrNotFound):
		return tcproto.CodeNOT_FOUND, true
	case errors.Is(err, peer.ErrInvalid):
		return tcproto.CodeINVALID_ARGUMENT, true
	case errors.Is(err, peer.ErrLimit):
		return tcproto.CodeRESOURCE_EXHAUSTED, true
	case errors.Is(err, peer.ErrUnavailable):
		return tcproto.CodeUNAVAILABLE, true
	}
	// The store's errors map by its own table (the protocol's codes).
	if c := store.CodeOf(err); c != store.Internal {
		return Code(c), true
	}
	return 0, false
}
