package reactor

import "github.com/tensorcast/tensorcast/xfer"

// Sentinel errors of package reactor.
var (
	// ErrConfig: a Config value is out of range. Matches xfer.ErrInvalid.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "reactor: invalid config")
	// ErrStopped: the pool (or the ring hosting a worker) stopped, so no
	// queue can be attached. Matches xfer.ErrClosed.
	ErrStopped = xfer.Categorized(xfer.ErrClosed, "reactor: stopped")
)
