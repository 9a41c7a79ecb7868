package wire

import "github.com/tensorcast/tensorcast/fbs/tcproto"

// Code is the status of a call or of one item of a batch call (the
// tcproto.Code* constants).
type Code = tcproto.Code

// StatusText is the short generic message a response carries for code c;
// the detail of a failure stays in the daemon's log.
func StatusText(c Code) string {
	switch c {
	case tcproto.CodeOK:
		return ""
	case tcproto.CodeINVALID_ARGUMENT:
		return "invalid argument"
	case tcproto.CodeNOT_FOUND:
		return "not found"
	case tcproto.CodeALREADY_EXISTS:
		return "already exists"
	case tcproto.CodeBUSY:
		return "busy"
	case tcproto.CodeRESOURCE_EXHAUSTED:
		return "resource exhausted"
	case tcproto.CodeFAILED_PRECONDITION:
		return "failed precondition"
	case tcproto.CodePERMISSION_DENIED:
		return "permission denied"
	case tcproto.CodeDEADLINE_EXCEEDED:
		return "deadline exceeded"
	case tcproto.CodeUNAVAILABLE:
		return "unavailable"
	}
	return "internal error"
}
