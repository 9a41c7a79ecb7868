package session

import (
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Engine is the part of the transfer engine a session drives; *xfer.Engine
// implements it.
type Engine interface {
	AllocateBatch(capacity int) (BatchID, error)
	Submit(id BatchID, reqs []xfer.Request, opts SubmitOptions, results []error) error
	Status(id BatchID, i int) (TaskStatus, error)
	BatchStatus(id BatchID) (BatchSummary, error)
	Wait(id BatchID, deadline time.Time) (BatchSummary, error)
	Free(id BatchID) error
	Abandon(id BatchID)
	// NewStream opens the engine side of a client queue.
	NewStream(capacity int, r Resolver, sink xfer.StreamSink) (*xfer.Stream, error)
}

// Pool is the daemon's DRAM pool as a session uses it; *shm.Pool
// implements it.
type Pool interface {
	xfer.MemSegment
	Fd() int
	Alloc(size uint64) (uint64, error)
	AllocN(size uint64, offs []uint64) error
	Free(off uint64) error
	BlockSize(off uint64) (uint64, bool)
}

// Registry is the daemon's segment table; *xfer.Registry implements it.
type Registry interface {
	Add(s xfer.Segment) error
	Remove(id xfer.SegmentID) (xfer.Segment, bool)
	Resolve(id xfer.SegmentID) (xfer.Segment, bool)
	NextID() xfer.SegmentID
}

// Buffer is a client buffer mapped in the daemon (*shm.Buffer).
type Buffer interface {
	xfer.MemSegment
	Close() error
}

// MapBufferFunc maps a client's memfd as segment id; it takes ownership of
// fd whatever it returns. size is what the client declared, limit the
// largest size the server accepts.
type MapBufferFunc func(id xfer.SegmentID, fd int, size, limit uint64) (Buffer, error)

// MapShmBuffer is the MapBufferFunc over shm.MapBuffer, the default when
// Deps.MapBuffer is nil.
func MapShmBuffer(id xfer.SegmentID, fd int, size, limit uint64) (Buffer, error) {
	b, err := shm.MapBuffer(id, fd, size, limit)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// FileSegment is a file or block device opened for transfers.
type FileSegment interface {
	xfer.Segment
	Close() error
}

// FileOpener opens files for RegisterFile. It decides which paths a client
// may open; the server only passes the request through.
type FileOpener interface {
	OpenFile(id xfer.SegmentID, path string, direct bool, size uint64) (FileSegment, error)
}

// TenantFileOpener is a FileOpener that confines each tenant to its own
// files. When Deps.FileOpener implements it, RegisterFile goes through
// OpenFileFor with the connection's tenant ("" for a connection without
// one).
type TenantFileOpener interface {
	OpenFileFor(tenant string, id xfer.SegmentID, path string, direct bool, size uint64) (FileSegment, error)
}

// RemoteSegment is a segment of a peer daemon opened through the peer
// plane (*tcp.Remote). Its ID is the plane's own; the server names it to
// its client by an id from the Registry.
type RemoteSegment = peer.RemoteSegment

// OpenContext is what a request's context says about how to open a remote
// segment: its lane and policy version, as the client sent them.
type OpenContext = peer.OpenContext

// PeerPlane is the daemon's peer data plane as a session uses it;
// *peer.Plane implements it.
type PeerPlane interface {
	// OpenRemote opens segment on daemon peerID with rights
	// (wire.RightRead | wire.RightWrite); transport (wire.TransportAuto,
	// TransportTCP, TransportRDMA) says how its requests travel, and ctx
	// how the peer may be looked up (the directory's posture for its
	// lane).
	OpenRemote(ctx OpenContext, peerID, segment string, rights, transport uint8) (RemoteSegment, error)
	// Peers reports the known peers.
	Peers() []wire.PeerInfo
}
