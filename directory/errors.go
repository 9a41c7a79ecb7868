package directory

import "errors"

// Sentinel errors of the directory. Match them with errors.Is.
var (
	// ErrInvalid: a peer entry is malformed (empty id, empty address for a
	// remote peer, a duplicate id).
	ErrInvalid = errors.New("directory: invalid peer")
	// ErrNotFound: no peer with that id.
	ErrNotFound = errors.New("directory: peer not found")
	// ErrSelf: the entry of this daemon cannot be replaced or removed.
	ErrSelf = errors.New("directory: cannot change this daemon's entry")
)
