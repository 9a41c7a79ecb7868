package link

import "github.com/tensorcast/tensorcast/xfer"

// Errors of package link. Match them with errors.Is; they are wrapped
// with detail where they are returned.
var (
	// errOwnerBusy: a remote segment's owner kept answering that it was
	// registering exports (busyAnswer) until the request's deadline.
	// Matches xfer.ErrBusy: the registrations end, and the same request
	// may succeed then. The worker does not remember it against the
	// segment: a later request asks again.
	errOwnerBusy = xfer.Categorized(xfer.ErrBusy, "rdma: the segment's owner stayed busy")
)
