package control

import (
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Engine is the part of the transfer engine the server drives; *xfer.Engine
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

// Pool is the daemon's DRAM pool as the server uses it; *shm.Pool
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
type RemoteSegment interface {
	xfer.Segment
	Epoch() uint64
	Close() error
}

// PeerPlane is the daemon's peer data plane as the server uses it.
type PeerPlane interface {
	// OpenRemote opens segment on daemon peer with rights (wire.RightRead
	// | wire.RightWrite); transport (wire.TransportAuto, TransportTCP,
	// TransportRDMA) says how its requests travel.
	OpenRemote(peer, segment string, rights, transport uint8) (RemoteSegment, error)
	// Peers reports the known peers.
	Peers() []wire.PeerInfo
	// Code maps the plane's own errors (a lost connection, a rejected
	// notification) to the code a client sees; false for errors it does
	// not know.
	Code(err error) (Code, bool)
}

// OpenContext is what a request's context says about how to open a
// remote segment: its lane (which chooses the directory's posture) and
// policy version, as the client sent them.
type OpenContext struct {
	Lane          string
	PolicyVersion uint32
}

// LaneOpener is a PeerPlane that takes the request's context into account
// when it opens a remote segment (the multi-host directory's posture).
// When Peers implements it, OpenRemote goes through OpenRemoteIn.
type LaneOpener interface {
	OpenRemoteIn(ctx OpenContext, peer, segment string, rights, transport uint8) (RemoteSegment, error)
}

// ExportCatalog is told about the daemon's exports so that daemons that
// do not list this one in their config can find them (the multi-host
// directory's catalog). Both calls come from the exporting connection's
// goroutine and must not wait on the network.
type ExportCatalog interface {
	Exported(name string, size uint64, rights uint8)
	Unexported(name string)
}

// Deps are what the server serves from. Engine, Registry and either Pool
// (one default tenant) or Tenants (each with its pool) are required; MapBuffer defaults to ShmMapBuffer; FileOpener is optional
// (RegisterFile then answers UNAVAILABLE); Peers is optional (OpenRemote and
// notifications then answer UNAVAILABLE; exports are still listed); RDMA
// is optional.
type Deps struct {
	Engine Engine
	// Pool is the default tenant's pool when Tenants is empty; it must be
	// nil when Tenants is set.
	Pool Pool
	// Tenants are the tenants, each with its pool (see Tenant); empty
	// means one, DefaultTenant, of Config.AllowedUIDs/AllowedGIDs on Pool.
	Tenants    []Tenant
	Registry   Registry
	MapBuffer  MapBufferFunc
	FileOpener FileOpener
	Peers      PeerPlane
	// RDMA reports the RDMA plane for tcctl rdma; optional (the answer is
	// then "off").
	RDMA RDMAReporter
	// TransportStats appends the transports' features and counters (ring
	// depths, flags in use) to dst for Stats; optional.
	TransportStats func(dst []wire.Counter) []wire.Counter
	// Catalog is told about exports (the multi-host directory); optional.
	Catalog ExportCatalog
	// Directory reports the directory for tcctl directory; optional.
	Directory directory.Reporter
	// Store is the default tenant's KV block store (without Tenants; each
	// Tenant has its own), which the store calls and queue ops serve;
	// optional (they then answer UNAVAILABLE). The server never closes it.
	Store *store.Store
}
