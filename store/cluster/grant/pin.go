package grant

import "github.com/tensorcast/tensorcast/store"

// Pinner keeps keys from eviction on behalf of a handle or lease. The
// daemon's is StorePinner over its store; the cluster's pins keys at their
// holders across hosts.
type Pinner interface {
	// Pin pins every key or none (an error says why, wrapping the
	// category of the first key that failed). The Hold gives them back.
	Pin(keys [][]byte) (Hold, error)
}

// Hold is pinned keys; Release gives them back, once (later calls do
// nothing).
type Hold interface {
	Release()
}

// StorePinner pins keys in a local store with counted pins of a store
// session of their own: a handle's or lease's keys stay in L1 (never
// evicted or moved) until the hold is released, whatever the clients that
// put them do.
type StorePinner struct{ Store *store.Store }

var _ Pinner = StorePinner{}

// Pin implements Pinner: untimed store pins in a new session, all or
// nothing.
func (p StorePinner) Pin(keys [][]byte) (Hold, error) {
	ss := p.Store.NewSession()
	codes := make([]store.Code, len(keys))
	if err := ss.Pin(keys, 0, codes); err != nil {
		// Pin is all or nothing: the session holds nothing. err names the
		// first key that failed and wraps its error (store.ErrNotFound for
		// a key that is not stored), which decides the code.
		_ = ss.Close()
		return nil, err
	}
	return storeHold{ss}, nil
}

type storeHold struct{ ss *store.Session }

func (h storeHold) Release() { _ = h.ss.Close() } // a session of pins only frees no reservation

// releaseAll releases holds (taken off a table under its mutex, released
// after it).
func releaseAll(holds []Hold) {
	for _, h := range holds {
		h.Release()
	}
}
