package cluster

import "github.com/tensorcast/tensorcast/xfer"

// Errors of the store across hosts, as store calls and peers see them.
var (
	// ErrNotHome: a daemon asked about a shard it is not home of under its
	// view of the members (the sender's view differs; it asks again once
	// the views agree). A key whose home refuses is a miss meanwhile.
	ErrNotHome = xfer.Categorized(xfer.ErrUnavailable, "cluster: not the home of the key's shard")
	// ErrHomeUnreachable: a key's home did not answer (down, restarted or
	// too slow) within the deadline.
	ErrHomeUnreachable = xfer.Categorized(xfer.ErrUnavailable, "cluster: the key's home did not answer")
	// ErrHolderFailed: every holder the home named failed to give the
	// value (unreachable, the value gone, or bytes whose crc32c did not
	// match).
	ErrHolderFailed = xfer.Categorized(xfer.ErrUnavailable, "cluster: no holder gave the value")
	// ErrCopyKept: a key's home took its removal (no reader finds the key
	// through the home now), but a holder that is a member did not drop
	// its copy within the removal's time (busy or slow): a reader with a
	// cached home answer may still be served that copy. The home asks the
	// holder again until it drops it; the same remove, sent again, asks it
	// too and answers OK once it has.
	ErrCopyKept = xfer.Categorized(xfer.ErrUnavailable, "cluster: a holder did not drop its copy of the removed key in time")
	// ErrBusy: too many fetches or holds in flight.
	ErrBusy = xfer.Categorized(xfer.ErrBackpressure, "cluster: too many remote reads in flight")
	// ErrClosed: the cluster is closing.
	ErrClosed = xfer.Categorized(xfer.ErrClosed, "cluster: closed")
	// ErrStaleGeneration: a home refused a message sent for a generation
	// of the shard it no longer holds (or never held), and refreshing what
	// the sender knows of the shard's home did not help in time (fence.go).
	ErrStaleGeneration = xfer.Categorized(xfer.ErrUnavailable, "cluster: the home no longer holds the generation the message was sent for")
	// ErrReplicas: fewer daemons are up than the copies a put asked for
	// need (a durable put answers it; one without durable logs it).
	ErrReplicas = xfer.Categorized(xfer.ErrUnavailable, "cluster: too few daemons up for the copies asked")
	// ErrReplicaFailed: a daemon asked for a copy of a value did not make
	// it (unreachable, no room, no L2 for a durable copy, bytes that did
	// not match).
	ErrReplicaFailed = xfer.Categorized(xfer.ErrUnavailable, "cluster: a copy on another daemon failed")
	// ErrMessage: a peer's message did not decode.
	ErrMessage = xfer.Categorized(xfer.ErrInvalid, "cluster: malformed message")
)
