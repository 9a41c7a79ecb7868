package store

import (
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// Code is a per-key result: the control protocol's status code, so a
// caller answers a client with it as it is. Package status maps the error
// behind a key to its code.
type Code = wire.Code

// The codes, under the names the store's calls speak of.
const (
	OK                 = tcproto.CodeOK
	InvalidArgument    = tcproto.CodeINVALID_ARGUMENT
	NotFound           = tcproto.CodeNOT_FOUND
	AlreadyExists      = tcproto.CodeALREADY_EXISTS
	Busy               = tcproto.CodeBUSY
	ResourceExhausted  = tcproto.CodeRESOURCE_EXHAUSTED
	FailedPrecondition = tcproto.CodeFAILED_PRECONDITION
	PermissionDenied   = tcproto.CodePERMISSION_DENIED
	DeadlineExceeded   = tcproto.CodeDEADLINE_EXCEEDED
	Unavailable        = tcproto.CodeUNAVAILABLE
	Internal           = tcproto.CodeINTERNAL
)
