package peer

import "github.com/tensorcast/tensorcast/xfer"

// RemoteSegment is a segment of a peer daemon opened through the peer
// plane (*tcp.Remote): its ID is the plane's own, its Epoch the owner's
// run.
type RemoteSegment interface {
	xfer.Segment
	Epoch() uint64
	Close() error
}

// OpenContext is what a request's context says about how to open a
// remote segment: its lane (which chooses the directory's posture) and
// policy version, as the client sent them; the tenant of the client
// ("" is DefaultTenant) and the tenant whose export it asks for ("": its
// own). The owner serves a client the exports of its own tenant's name,
// or another tenant's that grants it.
type OpenContext struct {
	Lane          string
	PolicyVersion uint32
	Tenant        string
	Owner         string
}
