package tcp

import "errors"

// Sentinel errors of the TCP transport. Match them with errors.Is. Transfer
// failures are additionally wrapped so that xfer's sentinels (ErrPermission,
// ErrTimeout, ErrClosed, ErrInvalid) match where they apply.
var (
	// ErrConfig: a Config value is invalid (the message names the key).
	ErrConfig = errors.New("tcp: invalid config")
	// ErrKeyFile: the cluster key file is missing, empty, or readable by
	// group or others.
	ErrKeyFile = errors.New("tcp: unusable cluster key file")
	// ErrFrame: a peer sent a malformed or oversized frame.
	ErrFrame = errors.New("tcp: malformed frame")
	// ErrProtocol: a peer broke the protocol (unknown request id, a count
	// that does not match the request, a frame out of sequence, a
	// flow-control violation).
	ErrProtocol = errors.New("tcp: protocol violation")
	// ErrAuth: the peer handshake failed authentication (wrong cluster key,
	// unexpected daemon id).
	ErrAuth = errors.New("tcp: peer authentication failed")
	// ErrStaleEpoch: a peer presented an epoch that a newer one replaced.
	ErrStaleEpoch = errors.New("tcp: stale epoch")
	// ErrRefused: the peer refused the handshake (its reason is logged).
	ErrRefused = errors.New("tcp: refused by peer")
	// ErrUnknownPeer: the directory has no such peer.
	ErrUnknownPeer = errors.New("tcp: unknown peer")
	// ErrBacklog: the peer's queue holds Config.MaxQueued tasks already
	// (its session is not up, or its window is full); the task was not
	// sent.
	ErrBacklog = errors.New("tcp: too many tasks waiting for the peer")
	// ErrConnLost: the connection carrying a request broke.
	ErrConnLost = errors.New("tcp: connection lost")
	// ErrNotFound: the peer exports no segment of that name.
	ErrNotFound = errors.New("tcp: segment not found")
	// ErrNotifyRejected: the target answered a notification negatively.
	ErrNotifyRejected = errors.New("tcp: notification rejected by target")
	// ErrNoHandler: the peer has no exchange handler for the kind asked
	// for (the feature is off there, or it runs an older daemon).
	ErrNoHandler = errors.New("tcp: peer has no handler for this exchange")
	// ErrExchange: the peer's exchange handler failed; the wrapping error
	// carries the reason the peer gave.
	ErrExchange = errors.New("tcp: exchange failed on the peer")
)
