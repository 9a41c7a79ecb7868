package session

import (
	"fmt"

	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Code is the status of a call or of one item of a batch call; package
// status maps an error to it.
type Code = wire.Code

// Sentinel errors of a session. Match them with errors.Is; each is in the
// category that decides the code a client sees (package status), and the
// session wraps them with detail for the log.
var (
	// ErrMalformed: a request's arguments are not valid (a bad name,
	// rights or range).
	ErrMalformed = xfer.Categorized(xfer.ErrInvalid, "session: malformed request")
	// ErrLimit: a count or length in a request, or a per-session quota,
	// exceeds its configured limit.
	ErrLimit = xfer.Categorized(xfer.ErrBackpressure, "session: limit exceeded")
	// ErrNotFound: the request names a segment, queue, export or batch
	// that this session does not hold.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "session: not found")
	// ErrPermission: the session may not touch the named resource (pool
	// blocks it does not hold; a pool, when it has none).
	ErrPermission = xfer.Categorized(xfer.ErrPermission, "session: permission denied")
	// ErrUnavailable: what the request needs is not configured (a file
	// opener, the peer plane, the store), or the server is closing.
	ErrUnavailable = xfer.Categorized(xfer.ErrUnavailable, "session: unavailable")
	// ErrClosed: the session is closed.
	ErrClosed = xfer.Categorized(xfer.ErrUnavailable, "session: closed")
)

// errClientGone ends a handler's wait whose client hung up (SetGone): the
// answer is written to nobody, and the connection is released at once.
var errClientGone = fmt.Errorf("%w: client gone", ErrUnavailable)
