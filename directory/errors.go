package directory

import "github.com/tensorcast/tensorcast/xfer"

// Sentinel errors of the directory. Match them with errors.Is; each also
// matches the xfer category it belongs to, which decides the code a client
// sees.
var (
	// ErrInvalid: a peer entry, record or lane is malformed (empty id,
	// empty address for a remote peer, a duplicate id, a record that does
	// not decode, a lane the directory does not know). Matches
	// xfer.ErrInvalid.
	ErrInvalid = xfer.Categorized(xfer.ErrInvalid, "directory: invalid peer")
	// ErrNotFound: no peer (or export) with that name, as of an answer
	// within the staleness budget. Matches xfer.ErrNotFound.
	ErrNotFound = xfer.Categorized(xfer.ErrNotFound, "directory: peer not found")
	// ErrSelf: the entry of this daemon cannot be replaced or removed.
	// Matches xfer.ErrPrecondition: the call is well formed, and refused
	// for the entry it names.
	ErrSelf = xfer.Categorized(xfer.ErrPrecondition, "directory: cannot change this daemon's entry")
	// ErrUnavailable: the directory cannot answer within its staleness
	// budget (the store is unreachable and the cache is older than the
	// budget, or the lane does not wait on the store and nothing is
	// cached). Nothing is guessed: the lookup fails. Matches
	// xfer.ErrUnavailable.
	ErrUnavailable = xfer.Categorized(xfer.ErrUnavailable, "directory: unavailable")
	// ErrIDInUse: another live daemon holds this daemon's id in the store.
	// Matches xfer.ErrAlreadyExists: the id is registered already, a
	// start-up error.
	ErrIDInUse = xfer.Categorized(xfer.ErrAlreadyExists, "directory: daemon id held by another live daemon")
	// ErrConfig: a backend setting is invalid (the message names it).
	// Matches xfer.ErrInvalid.
	ErrConfig = xfer.Categorized(xfer.ErrInvalid, "directory: invalid config")
	// ErrClosed: the directory is closed. Matches xfer.ErrClosed.
	ErrClosed = xfer.Categorized(xfer.ErrClosed, "directory: closed")
)
