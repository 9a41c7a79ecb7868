package directory

import "errors"

// Sentinel errors of the directory. Match them with errors.Is.
var (
	// ErrInvalid: a peer entry, record or lane is malformed (empty id,
	// empty address for a remote peer, a duplicate id, a record that does
	// not decode, a lane the directory does not know).
	ErrInvalid = errors.New("directory: invalid peer")
	// ErrNotFound: no peer (or export) with that name, as of an answer
	// within the staleness budget.
	ErrNotFound = errors.New("directory: peer not found")
	// ErrSelf: the entry of this daemon cannot be replaced or removed.
	ErrSelf = errors.New("directory: cannot change this daemon's entry")
	// ErrUnavailable: the directory cannot answer within its staleness
	// budget (the store is unreachable and the cache is older than the
	// budget, or the lane does not wait on the store and nothing is
	// cached). Nothing is guessed: the lookup fails.
	ErrUnavailable = errors.New("directory: unavailable")
	// ErrIDInUse: another live daemon holds this daemon's id in the store.
	ErrIDInUse = errors.New("directory: daemon id held by another live daemon")
	// ErrConfig: a backend setting is invalid (the message names it).
	ErrConfig = errors.New("directory: invalid config")
	// ErrClosed: the directory is closed.
	ErrClosed = errors.New("directory: closed")
)
