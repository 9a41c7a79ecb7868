package link

import "github.com/tensorcast/tensorcast/xfer"

// Errors of package link. Match them with errors.Is; they are wrapped
// with detail where they are returned.
var (
	// errOwnerBusy: a remote segment's owner kept answering busy to the
	// request for its registration until the request's deadline: it was
	// registering exports (busyAnswer), or its node had no exchange
	// handler free (tcp.ErrPeerBusy). Matches xfer.ErrBusy: what keeps
	// the owner busy ends, and the same request may succeed then. The
	// worker does not remember it against the segment: a later request
	// asks again.
	errOwnerBusy = xfer.Categorized(xfer.ErrBusy, "rdma: the segment's owner stayed busy")
)
