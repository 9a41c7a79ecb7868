package rdma

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of package rdma. Match them with errors.Is; they are
// wrapped with detail where they are returned.
var (
	// ErrNoLibrary: libibverbs could not be opened on this host (it is
	// loaded at run time). It wraps xfer.ErrNotSupported.
	ErrNoLibrary = fmt.Errorf("rdma: libibverbs not found: %w", xfer.ErrNotSupported)
	// ErrNoDevice: no RDMA device (or not the one asked for) is present.
	// It wraps xfer.ErrNotSupported.
	ErrNoDevice = fmt.Errorf("rdma: no RDMA device: %w", xfer.ErrNotSupported)
	// ErrNoGID: the port has no GID usable for RoCE v2 (no IPv4-mapped
	// RoCE v2 entry matching the netdev's address), or a configured index
	// is not valid.
	ErrNoGID = errors.New("rdma: no usable RoCE v2 GID")
	// ErrConnInfo: connection data is malformed (truncated, wrong version,
	// counts or sizes out of range).
	ErrConnInfo = errors.New("rdma: malformed connection data")
	// ErrNotRegistered: a request names a segment (or a range of one) that
	// has no memory registration on this transport.
	ErrNotRegistered = errors.New("rdma: segment not registered")
	// ErrCompletion: a work request ended with an error status; the
	// wrapping error names the ibv_wc_status.
	ErrCompletion = errors.New("rdma: work completion error")
	// ErrConnect: a queue pair could not be brought to RTS with its peer,
	// or the peer did not answer the connection probe in time.
	ErrConnect = errors.New("rdma: connect failed")
	// ErrQueueFull: the send queues stayed full for the whole submit wait.
	ErrQueueFull = errors.New("rdma: send queue full")
	// ErrQPDown: the queue pair is in the error state and being
	// re-established; the task was not posted.
	ErrQPDown = errors.New("rdma: queue pair down")
)
