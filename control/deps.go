package control

import (
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/session"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
)

// The interfaces of what a server drives are package session's: its
// sessions drive them.
type (
	Engine           = session.Engine
	Pool             = session.Pool
	Registry         = session.Registry
	Buffer           = session.Buffer
	MapBufferFunc    = session.MapBufferFunc
	FileSegment      = session.FileSegment
	FileOpener       = session.FileOpener
	TenantFileOpener = session.TenantFileOpener
	RemoteSegment    = session.RemoteSegment
	OpenContext      = session.OpenContext
	PeerPlane        = session.PeerPlane
)

// RDMAReporter reports the daemon's RDMA plane, or why it has none
// (*plane.Plane, plane.RDMAOff). It is called once per Rdma request, from
// the connection's goroutine.
type RDMAReporter interface {
	RDMAInfo() wire.RDMAResponse
}

// Deps are what the server serves from. Engine, Registry and either Pool
// (one default tenant) or Tenants (each with its pool) are required;
// MapBuffer defaults to mapping the memfd with package shm; FileOpener is
// optional (RegisterFile then answers UNAVAILABLE); Exports defaults to a
// table of the server's own; Peers is optional (OpenRemote and
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
	// Exports is the daemon's export table, which the peer plane serves
	// peers from; the server exports, unexports and subscribes in it on
	// its clients' behalf.
	Exports *peer.Exports
	Peers   PeerPlane
	// RDMA reports the RDMA plane for tcctl rdma; optional (the answer is
	// then "off").
	RDMA RDMAReporter
	// TransportStats appends the transports' features and counters (ring
	// depths, flags in use) to dst for Stats; optional.
	TransportStats func(dst []wire.Counter) []wire.Counter
	// Directory reports the directory for tcctl directory; optional.
	Directory directory.Reporter
	// Reactors serve the clients' queues; the server never closes them.
	// Nil: the server starts its own pool (reactor.Config's defaults, each
	// worker on its own thread) and closes it with the server.
	Reactors *reactor.Pool
	// Store is the default tenant's KV block store (without Tenants; each
	// Tenant has its own), which the store calls and queue ops serve;
	// optional (they then answer UNAVAILABLE). The server never closes it.
	Store *store.Store
	// Grants are the default tenant's retention handles and placement
	// leases (without Tenants; each Tenant has its own); optional.
	Grants *grant.Grants
	// Admission is the daemon's mode and its budgets for remote work,
	// which tcctl mode shows and changes; optional (Mode then answers
	// UNAVAILABLE).
	Admission *grant.Admission
	// Locate says where a key lives in the store across hosts (tcctl
	// cluster locate); optional (the call then answers UNAVAILABLE).
	Locate func(key []byte) (wire.ClusterLocateResponse, error)
	// Shards describes the store across hosts' shards, count from first:
	// their homes and generations, and the read claims outstanding (tcctl
	// cluster shards); optional like Locate.
	Shards func(first, count uint32) (wire.ClusterShardsResponse, error)
}
