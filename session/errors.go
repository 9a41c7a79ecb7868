package session

import (
	"fmt"
	"io/fs"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Code is the status of a call or of one item of a batch call.
type Code = wire.Code

// Sentinel errors of a session. Match them with errors.Is; each wraps the
// category that decides the code a client sees, and the session wraps
// them with detail for the log.
var (
	// ErrMalformed: a request's arguments are not valid (a bad name,
	// rights or range).
	ErrMalformed = fmt.Errorf("session: malformed request: %w", wire.ErrMalformed)
	// ErrLimit: a count or length in a request, or a per-session quota,
	// exceeds its configured limit.
	ErrLimit = fmt.Errorf("session: limit exceeded: %w", wire.ErrLimit)
	// ErrNotFound: the request names a segment, queue, export or batch
	// that this session does not hold.
	ErrNotFound = fmt.Errorf("session: not found: %w", fs.ErrNotExist)
	// ErrPermission: the session may not touch the named resource (pool
	// blocks it does not hold, a pool it has none of).
	ErrPermission = fmt.Errorf("session: permission denied: %w", xfer.ErrPermission)
	// ErrUnavailable: what the request needs is not configured (a file
	// opener, the peer plane, the store), or the server is closing.
	ErrUnavailable = fmt.Errorf("session: unavailable: %w", peer.ErrUnavailable)
	// ErrClosed: the session is closed.
	ErrClosed = fmt.Errorf("session: closed: %w", xfer.ErrClosed)
)
