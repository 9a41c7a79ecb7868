package queue

import "github.com/tensorcast/tensorcast/xfer"

// Sentinel errors of package queue. Match them with errors.Is; each also
// matches the xfer category it belongs to, which decides the code a client
// sees.
var (
	// ErrGeometry: sizes or a header that do not describe a valid queue.
	// Matches xfer.ErrInvalid: the sizes asked for are wrong, whatever the
	// state.
	ErrGeometry = xfer.Categorized(xfer.ErrInvalid, "queue: invalid geometry")
	// ErrClosed: the queue is closed (by its owner, or by the daemon).
	// Matches xfer.ErrClosed.
	ErrClosed = xfer.Categorized(xfer.ErrClosed, "queue: closed")
	// ErrBroken: the daemon stopped taking entries from this queue because
	// the client wrote an index it refused. Matches xfer.ErrPrecondition:
	// the queue is no longer in a state that takes entries, whatever the
	// next entry holds.
	ErrBroken = xfer.Categorized(xfer.ErrPrecondition, "queue: broken by an invalid index")
	// ErrTimeout: a wait ran out of time. Matches xfer.ErrTimeout.
	ErrTimeout = xfer.Categorized(xfer.ErrTimeout, "queue: wait timed out")
	// ErrDataFull: the data area has no room for a submission's payload
	// until earlier submissions are taken. Matches xfer.ErrBackpressure:
	// the area drains as the daemon takes entries.
	ErrDataFull = xfer.Categorized(xfer.ErrBackpressure, "queue: data area full")
	// ErrNotSupported: queues need Linux (memfd, futexes on shared memory).
	// Matches xfer.ErrNotSupported.
	ErrNotSupported = xfer.Categorized(xfer.ErrNotSupported, "queue: not supported on this system")
)
