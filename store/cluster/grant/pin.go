package grant

import (
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/keyblock"
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
type StorePinner struct {
	Store *store.Store
	// Budget bounds the bytes the holds of this pinner (and of any other
	// with the same Budget) pin in all; nil is no bound but each hold's
	// own session's (store.Config.MaxSessionPinned).
	Budget *PinBudget
}

var _ Pinner = StorePinner{}

// Pin implements Pinner: timed store pins in a new session, all or
// nothing. With a Budget, the bytes the pin will count are taken from it
// first, so that a pin past it is refused (ErrPinLimit) before anything
// is pinned.
func (p StorePinner) Pin(keys [][]byte, ttl time.Duration) (Hold, error) {
	var charged uint64
	if p.Budget != nil {
		charged = p.Store.PinBytes(keys)
		if err := p.Budget.take(charged); err != nil {
			return nil, err
		}
	}
	ss := p.Store.NewSession()
	codes := make([]store.Code, len(keys))
	if err := ss.Pin(keys, ttl, codes); err != nil {
		// Pin is all or nothing: the session holds nothing. err names the
		// first key that failed and wraps its error (store.ErrNotFound for
		// a key that is not stored), which decides the code.
		_ = ss.Close()
		p.Budget.give(charged)
		return nil, err
	}
	if p.Budget != nil {
		// A put or removal since PinBytes changes what the pin counted:
		// the budget holds what the session holds pinned.
		n := ss.PinnedBytes()
		if err := p.Budget.settle(charged, n); err != nil {
			_ = ss.Close()
			return nil, err
		}
		charged = n
	}
	return &storeHold{ss: ss, keys: keyblock.Clone(keys), codes: codes, budget: p.Budget, charged: charged}, nil
}

// storeHold is a StorePinner's pins: its session, and its own copy of the
// keys for Extend.
type storeHold struct {
	ss      *store.Session
	budget  *PinBudget
	charged uint64 // the session's pinned bytes, taken from budget
	// mu guards the fields below.
	mu       sync.Mutex
	keys     [][]byte
	codes    []store.Code // Extend's scratch
	released bool
}

// Extend implements Hold: the session's leases on the keys are pushed out
// (a store lease only ever grows). The bytes they count stay as they were:
// a pinned value is never removed or replaced.
func (h *storeHold) Extend(ttl time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ss.Pin(h.keys, ttl, h.codes)
}

// Release implements Hold: the pins go, then their bytes go back to the
// budget.
func (h *storeHold) Release() {
	h.mu.Lock()
	done := h.released
	h.released = true
	h.mu.Unlock()
	if done {
		return
	}
	_ = h.ss.Close() // a session of pins only frees no reservation
	h.budget.give(h.charged)
}

// PinBudget bounds the bytes (at block size) of the values that one
// store's retention handles and placement leases hold pinned in all, their
// StorePinner's Budget. Each handle and lease pins in a store session of
// its own, which the store bounds alone (store.Config.MaxSessionPinned):
// without a bound over all of them, a tenant's handles and leases, many
// of them each within its own bound, could pin most of L1, and every put
// that needs room would then fail. A value held by two handles counts
// twice, as it does in two sessions.
type PinBudget struct {
	limit uint64

	// mu guards the fields below.
	mu      sync.Mutex
	pinned  uint64
	refused uint64
}

// PinBudgetStats are a budget's figures.
type PinBudgetStats struct {
	Limit   uint64 // the bound, in bytes
	Pinned  uint64 // bytes held pinned now
	Refused uint64 // handles and leases refused for the bound (ErrPinLimit)
}

// NewPinBudget makes a budget of limit bytes.
func NewPinBudget(limit uint64) *PinBudget { return &PinBudget{limit: limit} }

// take takes n bytes, or refuses them (counted) when they would pass the
// limit.
func (b *PinBudget) take(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.pinned {
		b.refused++
		return fmt.Errorf("%w: %d bytes more, %d of %d pinned", ErrPinLimit, n, b.pinned, b.limit)
	}
	b.pinned += n
	return nil
}

// give gives back n bytes taken (nothing on a nil budget).
func (b *PinBudget) give(n uint64) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if invariants.Enabled && n > b.pinned {
		panic("grant: invariant: more bytes given back to a pin budget than taken")
	}
	b.pinned -= n
}

// settle turns a charge of from bytes into one of to: the pin counted
// other bytes than it was charged. A charge that grows past the limit is
// refused (counted) and given back whole.
func (b *PinBudget) settle(from, to uint64) error {
	if to <= from {
		b.give(from - to)
		return nil
	}
	if err := b.take(to - from); err != nil {
		b.give(from)
		return err
	}
	return nil
}

// Stats reports the budget's figures.
func (b *PinBudget) Stats() PinBudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return PinBudgetStats{Limit: b.limit, Pinned: b.pinned, Refused: b.refused}
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
