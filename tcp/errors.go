package tcp

import (
	"github.com/tensorcast/tensorcast/xfer"
)

// Sentinel errors of the TCP transport. Match them with errors.Is. Transfer
// failures are additionally wrapped so that xfer's sentinels (ErrPermission,
// ErrTimeout, ErrClosed, ErrInvalid) match where they apply.
var (
	// ErrConfig: a Config value is invalid (the message names the key).
	// Matches xfer.ErrInvalid: the value is wrong, whatever the state.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "tcp: invalid config")
	// ErrKeyFile: the cluster key file is missing, empty, or readable by
	// group or others. Matches xfer.ErrInvalid: the setting names a file
	// the node cannot use, a start-up error.
	ErrKeyFile = xfer.Categorized(xfer.ErrInvalid, "tcp: unusable cluster key file")
	// ErrFrame: a peer sent a malformed or oversized frame.
	ErrFrame = xfer.Categorized(xfer.ErrUnavailable, "tcp: malformed frame")
	// ErrProtocol: a peer broke the protocol (unknown request id, a count
	// that does not match the request, a frame out of sequence, a
	// flow-control violation).
	ErrProtocol = xfer.Categorized(xfer.ErrUnavailable, "tcp: protocol violation")
	// ErrAuth: the peer handshake failed authentication (wrong cluster key,
	// unexpected daemon id).
	ErrAuth = xfer.Categorized(xfer.ErrUnavailable, "tcp: peer authentication failed")
	// ErrStaleEpoch: a peer presented an epoch that a newer one replaced.
	ErrStaleEpoch = xfer.Categorized(xfer.ErrUnavailable, "tcp: stale epoch")
	// ErrRefused: the peer refused the handshake (its reason is logged).
	ErrRefused = xfer.Categorized(xfer.ErrUnavailable, "tcp: refused by peer")
	// ErrUnknownPeer: the directory has no such peer.
	ErrUnknownPeer = xfer.Categorized(xfer.ErrNotFound, "tcp: unknown peer")
	// ErrBacklog: the peer's queue holds Config.MaxQueued tasks already
	// (its session is not up, or its window is full); the task was not
	// sent. Matches xfer.ErrBackpressure: the queue drains and the same
	// task may then be taken.
	ErrBacklog = xfer.Categorized(xfer.ErrBackpressure, "tcp: too many tasks waiting for the peer")
	// ErrWindowFull: a data exchange found no room for its payload in the
	// flow-control windows of the peer's connections, and was not sent
	// (ExchangeInto does not wait). Matches xfer.ErrBackpressure: room
	// frees as the requests in flight end.
	ErrWindowFull = xfer.Categorized(xfer.ErrBackpressure, "tcp: no room in the peer's flow-control window")
	// ErrConnLost: the connection carrying a request broke.
	ErrConnLost = xfer.Categorized(xfer.ErrUnavailable, "tcp: connection lost")
	// ErrNotFound: the peer exports no segment of that name.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "tcp: segment not found")
	// ErrNotifyRejected: the target answered a notification negatively.
	ErrNotifyRejected = xfer.Categorized(xfer.ErrPrecondition, "tcp: notification rejected by target")
	// ErrNoHandler: the peer has no exchange handler for the kind asked
	// for (the feature is off there, or it runs an older daemon). Matches
	// xfer.ErrNotSupported: the peer cannot do what was asked.
	ErrNoHandler = xfer.Categorized(xfer.ErrNotSupported, "tcp: peer has no handler for this exchange")
	// ErrExchange: the peer's exchange handler failed; the wrapping error
	// carries the reason the peer gave. Matches xfer.ErrUnavailable: the
	// peer could not serve the exchange now.
	ErrExchange = xfer.Categorized(xfer.ErrUnavailable, "tcp: exchange failed on the peer")
	// ErrPeerBusy: the peer refused the exchange before running it, its
	// handlers all taken (it is there, and did nothing of the request).
	// Wrapped with ErrExchange.
	ErrPeerBusy = xfer.Categorized(xfer.ErrUnavailable, "tcp: peer busy, too many exchanges in progress")
)
