package xfer

import "fmt"

// RemoteRouter picks the transport of a request to a peer's segment (the
// peer plane: that peer's RDMA link, or TCP).
type RemoteRouter interface {
	Route(local, target Segment) Transport
}

// KindRouter is the Router by the kind of a request's target: memory
// (pool and client segments) goes to Mem, files to File, peers' segments
// to the transport Remote picks. A request's local side must be memory. A
// nil File or Remote means there is no transport for that kind: such
// requests are refused ErrNotSupported.
type KindRouter struct {
	Mem    Transport
	File   Transport
	Remote RemoteRouter
}

var _ Router = KindRouter{}

// Route implements Router.
func (r KindRouter) Route(local, target Segment) (Transport, error) {
	if _, ok := local.(MemSegment); !ok {
		return nil, fmt.Errorf("%w: local side of a request must be memory, not %s", ErrInvalid, local.Kind())
	}
	switch target.Kind() {
	case KindPool, KindClient:
		return r.Mem, nil
	case KindFile:
		if r.File != nil {
			return r.File, nil
		}
	case KindRemote:
		if r.Remote != nil {
			return r.Remote.Route(local, target), nil
		}
	}
	return nil, fmt.Errorf("%w: no transport for %s segments on this daemon", ErrNotSupported, target.Kind())
}
