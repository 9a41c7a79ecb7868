package rdma

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package rdma. Match them with errors.Is; they are
// wrapped with detail where they are returned. Each matches the xfer
// category it belongs to, which decides the code a client sees.
var (
	// ErrNoLibrary: libibverbs could not be opened on this host (it is
	// loaded at run time). It wraps xfer.ErrNotSupported.
	ErrNoLibrary = fmt.Errorf("rdma: libibverbs not found: %w", xfer.ErrNotSupported)
	// ErrNoDevice: no RDMA device (or not the one asked for) is present.
	// It wraps xfer.ErrNotSupported.
	ErrNoDevice = fmt.Errorf("rdma: no RDMA device: %w", xfer.ErrNotSupported)
	// ErrNoGID: the port has no GID usable for RoCE v2 (no IPv4-mapped
	// RoCE v2 entry matching the netdev's address), or a configured index
	// is not valid. Matches xfer.ErrNotSupported: as without a device, this
	// host cannot carry RDMA as configured.
	ErrNoGID = xfer.Categorized(xfer.ErrNotSupported, "rdma: no usable RoCE v2 GID")
	// ErrConnInfo: connection data is malformed (truncated, wrong version,
	// counts or sizes out of range). Matches xfer.ErrUnavailable: the data
	// comes from the peer, and the caller can only try again later.
	ErrConnInfo = xfer.Categorized(xfer.ErrUnavailable, "rdma: malformed connection data")
	// ErrNotRegistered: a request names a segment (or a range of one) that
	// has no memory registration on this transport. Matches
	// xfer.ErrPrecondition: the request is well formed, the segment is not
	// set up for RDMA.
	ErrNotRegistered = xfer.Categorized(xfer.ErrPrecondition, "rdma: segment not registered")
	// ErrCompletion: a work request ended with an error status; the
	// wrapping error names the ibv_wc_status. Matches xfer.ErrUnavailable:
	// the fabric or the peer failed the request (flushed, retries
	// exhausted, keys gone), and a retry over a new link may succeed.
	ErrCompletion = xfer.Categorized(xfer.ErrUnavailable, "rdma: work completion error")
	// ErrConnect: a queue pair could not be brought to RTS with its peer,
	// or the peer did not answer the connection probe in time. Matches
	// xfer.ErrUnavailable: the peer is not reachable over RDMA now.
	ErrConnect = xfer.Categorized(xfer.ErrUnavailable, "rdma: connect failed")
	// ErrQueueFull: the send queues stayed full for the whole submit wait.
	// Matches xfer.ErrBackpressure: the queues drain and the same request
	// may then be posted.
	ErrQueueFull = xfer.Categorized(xfer.ErrBackpressure, "rdma: send queue full")
	// ErrQPDown: the queue pair is in the error state and being
	// re-established; the task was not posted. Matches xfer.ErrUnavailable:
	// the link comes back, and a retry may succeed then.
	ErrQPDown = xfer.Categorized(xfer.ErrUnavailable, "rdma: queue pair down")
)
