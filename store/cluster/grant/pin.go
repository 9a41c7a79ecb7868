package grant

import (
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/store"
)

// Pinner keeps keys from eviction on behalf of a handle or lease, for a
// time to live that the holder extends: pins that outlive their TTL go by
// themselves, so nothing stays pinned after the daemon that took them (or
// its table) is gone. The daemon's is StorePinner over its store; the
// cluster's pins keys at their holders across hosts.
type Pinner interface {
	// Pin pins every key or none for ttl (an error says why, wrapping the
	// category of the first key that failed). The Hold extends or gives
	// them back. keys may be reused by the caller once Pin returns.
	Pin(keys [][]byte, ttl time.Duration) (Hold, error)
}

// Hold is pinned keys.
type Hold interface {
	// Extend makes the pins last ttl from now (a handle's renewal); an
	// error leaves them as they were.
	Extend(ttl time.Duration) error
	// Release gives them back, once (later calls do nothing).
	Release()
}

// StorePinner pins keys in a local store with timed pins (store leases) of
// a store session of their own: a handle's or lease's keys stay in L1
// (never evicted or moved) until the hold is released or its TTL ends,
// whatever the clients that put them do.
type StorePinner struct{ Store *store.Store }

var _ Pinner = StorePinner{}

// Pin implements Pinner: timed store pins in a new session, all or
// nothing.
func (p StorePinner) Pin(keys [][]byte, ttl time.Duration) (Hold, error) {
	ss := p.Store.NewSession()
	codes := make([]store.Code, len(keys))
	if err := ss.Pin(keys, ttl, codes); err != nil {
		// Pin is all or nothing: the session holds nothing. err names the
		// first key that failed and wraps its error (store.ErrNotFound for
		// a key that is not stored), which decides the code.
		_ = ss.Close()
		return nil, err
	}
	return &storeHold{ss: ss, keys: cloneKeys(keys), codes: codes}, nil
}

// storeHold is a StorePinner's pins: its session, and its own copy of the
// keys for Extend.
type storeHold struct {
	ss *store.Session
	// mu guards codes, Extend's scratch.
	mu    sync.Mutex
	keys  [][]byte
	codes []store.Code
}

// Extend implements Hold: the session's leases on the keys are pushed out
// (a store lease only ever grows).
func (h *storeHold) Extend(ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ss.Pin(h.keys, ttl, h.codes)
}

// Release implements Hold.
func (h *storeHold) Release() { _ = h.ss.Close() } // a session of pins only frees no reservation

// cloneKeys copies keys into one allocation.
func cloneKeys(keys [][]byte) [][]byte {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		buf = append(buf, k...)
		out[i] = buf[len(buf)-len(k) : len(buf) : len(buf)]
	}
	return out
}

// releaseAll releases holds (taken off a table under its mutex, released
// after it).
func releaseAll(holds []Hold) {
	for _, h := range holds {
		h.Release()
	}
}

// pinUnlocked pins keys for ttl with mu released (a Pinner takes the
// store's locks) and returns with mu held again. A table that closed
// meanwhile (*closed) gets the pins back: the answer is then ErrClosed,
// and the caller undoes its reservation as for any failed pin.
func pinUnlocked(mu *sync.Mutex, closed *bool, p Pinner, keys [][]byte, ttl time.Duration) (Hold, error) {
	mu.Unlock()
	hold, err := p.Pin(keys, ttl)
	mu.Lock()
	if err == nil && *closed {
		hold.Release()
		return nil, ErrClosed
	}
	return hold, err
}
