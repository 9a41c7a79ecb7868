package wire

import "github.com/tensorcast/tensorcast/xfer"

// Errors of the decoder. Match them with errors.Is; decode errors wrap them
// with detail. Each also matches the xfer category it belongs to, which
// decides the code the sender gets.
var (
	// ErrMalformed: the bytes are not a well-formed message (a bad
	// flatbuffer, an unknown body, a missing or empty required field, a
	// positional vector of the wrong length). Matches xfer.ErrInvalid.
	ErrMalformed = xfer.Categorized(xfer.ErrInvalid, "wire: malformed message")
	// ErrLimit: a count or length in the message exceeds its DecodeLimits.
	// Matches xfer.ErrBackpressure: the limits are the daemon's
	// configured quotas, as the protocol's RESOURCE_EXHAUSTED says.
	ErrLimit = xfer.Categorized(xfer.ErrBackpressure, "wire: limit exceeded")
)
