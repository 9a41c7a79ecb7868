package wire

import "errors"

// Errors of the decoder. Match them with errors.Is; decode errors wrap them
// with detail.
var (
	// ErrMalformed: the bytes are not a well-formed message (a bad
	// flatbuffer, an unknown body, a missing or empty required field, a
	// positional vector of the wrong length).
	ErrMalformed = errors.New("wire: malformed message")
	// ErrLimit: a count or length in the message exceeds its DecodeLimits.
	ErrLimit = errors.New("wire: limit exceeded")
)
