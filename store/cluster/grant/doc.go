// Package grant holds what a daemon grants others over the KV store across
// hosts (seed 003, DESIGN.md 8 and 8a), each a table in the daemon's
// memory, off any directory's hot path, with an injected clock:
//
//	Claims      a home's reservations of its holders' read capacity: a
//	            bounded number of concurrent readers per holder and key,
//	            released when the read ends or at its deadline; a hot key
//	            spreads over its replicas
//	Handles     the issuer's retention handles: signed tokens (issuer id,
//	            epoch, expiry, handle id, digest of the keys) that keep keys
//	            from eviction; renewed and released only at the issuer;
//	            anything uncertain about a token is refused (fail closed)
//	Leases      placement leases: keys pinned for a TTL under an operation
//	            id that joins retried creates, so a retry never pins twice
//	Admission   the modes (local-first, budgeted-hybrid, global-governed):
//	            admission budgets for remote gets in flight and for the bytes
//	            per second served to other hosts; budgets only, never
//	            correctness
//
// Handles and leases pin through a Pinner, for their TTL, and a renewal
// extends the pins before the handle: StorePinner pins in the local store
// (timed store pins of a session of their own, so eviction never takes
// those keys, and they end by themselves even if the table never releases
// them), and its PinBudget, shared by a store's handles and leases,
// bounds the bytes they pin in all; the cluster's pinner pins at the keys'
// holders. A renewal or release of another issuer's handle goes through a
// Router (the peer plane, by daemon id); Members tells the epochs of the
// other daemons for verifying their tokens.
//
// # Where the store across hosts calls in
//
//   - A home answering a lookup takes a claim per key,
//     Claims.Acquire(reader, key, holders, read deadline), sends the reader
//     to Claim.Holder (ErrBusy, BUSY: every replica is at its reader limit)
//     and releases it, Claims.Release(reader, ids...), when that reader
//     says its read ended (another reader's release is refused).
//   - A reader calls Admission.BeginRemoteGets before remote gets and
//     EndRemoteGets as each admitted one ends; a holder calls Admission.Serve
//     with the bytes before it serves another daemon's read. Either refusal
//     is ErrOverBudget, RESOURCE_EXHAUSTED.
//   - A Pinner that pins keys at their holders (for the TTL it is given,
//     extended by Hold.Extend) makes handles and leases cover keys of other
//     hosts; a holder that pins for a handle checks its token first with
//     Handles.Verify(token, keys).
//   - The daemon already wires the rest: PeerRouter and ServeHandles on the
//     peer channel (ExchangeKind), DirectoryMembers over its directory.
//
// # Goroutines and stop order
//
// The package starts no goroutine. Each table arms one timer on its clock
// for its earliest deadline (claims, handles and leases expire by
// themselves, so nothing is held after a holder of them dies); the timer's
// call takes the table's mutex. Close disarms it, gives back every pin and
// refuses later calls; the daemon closes the tables before the store.
// Pins are taken and released outside the tables' mutexes.
package grant
