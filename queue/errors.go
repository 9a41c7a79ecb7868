package queue

import "errors"

// Sentinel errors of package queue. Match them with errors.Is.
var (
	// ErrGeometry: sizes or a header that do not describe a valid queue.
	ErrGeometry = errors.New("queue: invalid geometry")
	// ErrClosed: the queue is closed (by its owner, or by the daemon).
	ErrClosed = errors.New("queue: closed")
	// ErrBroken: the daemon stopped taking entries from this queue because
	// the client wrote an index it refused.
	ErrBroken = errors.New("queue: broken by an invalid index")
	// ErrTimeout: a wait ran out of time.
	ErrTimeout = errors.New("queue: wait timed out")
	// ErrDataFull: the data area has no room for a submission's payload
	// until earlier submissions are taken.
	ErrDataFull = errors.New("queue: data area full")
	// ErrNotSupported: queues need Linux (memfd, futexes on shared memory).
	ErrNotSupported = errors.New("queue: not supported on this system")
)
