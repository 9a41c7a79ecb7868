package peer

import (
	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package peer. Match them with errors.Is; they are
// wrapped with detail where they are returned. The control server maps
// each to the status code a client sees (NOT_FOUND, INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, UNAVAILABLE, PERMISSION_DENIED).
var (
	// ErrNotFound: no segment is exported under the name (or not to the
	// asker's tenant), nobody subscribed to it, or the peer is unknown.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "peer: not found")
	// ErrDenied: a peer's client asked for an export of another tenant
	// that does not grant the client's tenant (or does not exist: a
	// refusal does not say what another tenant exports).
	ErrDenied = xfer.Categorized(xfer.ErrPermission, "peer: not granted to this tenant")
	// ErrInvalid: a name, rights value or lane is not valid.
	ErrInvalid = xfer.Categorized(xfer.ErrInvalid, "peer: invalid argument")
	// ErrLimit: a notification is larger than wire.MaxNotify, or a
	// subscriber's queue is full.
	ErrLimit = xfer.Categorized(xfer.ErrBackpressure, "peer: limit exceeded")
	// ErrUnavailable: the plane cannot serve the request now: transport
	// rdma asked for where there is no RDMA or it cannot carry the
	// request, the directory cannot answer, a peer did not answer as
	// itself.
	ErrUnavailable = xfer.Categorized(xfer.ErrUnavailable, "peer: unavailable")
)
