package grant

import (
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/internal/keyblock"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// testClock is the shared test clock as a Clock: timers run in Advance's
// goroutine.
type testClock struct{ *testutil.Clock }

var _ Clock = testClock{}

func newClock() testClock { return testClock{testutil.NewClock(time.Unix(1_700_000_000, 0))} }

func (c testClock) AfterFunc(d time.Duration, f func()) store.Timer { return c.Clock.AfterFunc(d, f) }

// countPinner pins keys by counting: pinned[key] is how many holds have
// the key now, pins how many Pin calls succeeded. Keys in missing fail.
type countPinner struct {
	mu      sync.Mutex // guards the fields below
	pinned  map[string]int
	pins    int
	missing map[string]bool
	// extends counts Extend calls; extendErr is what they answer.
	extends   int
	extendErr error
}

func newCountPinner() *countPinner {
	return &countPinner{pinned: map[string]int{}, missing: map[string]bool{}}
}

func (p *countPinner) Pin(keys [][]byte, _ time.Duration) (Hold, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range keys {
		if p.missing[string(k)] {
			return nil, fmt.Errorf("key %q: %w", k, store.ErrNotFound)
		}
	}
	for _, k := range keys {
		p.pinned[string(k)]++
	}
	p.pins++
	return &countHold{p: p, keys: keyblock.Clone(keys)}, nil
}

func (p *countPinner) count(k string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pinned[k]
}

func (p *countPinner) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pins
}

type countHold struct {
	p    *countPinner
	keys [][]byte
	once sync.Once
}

func (h *countHold) Extend(time.Duration) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.p.extends++
	return h.p.extendErr
}

func (h *countHold) Release() {
	h.once.Do(func() {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		for _, k := range h.keys {
			h.p.pinned[string(k)]--
		}
	})
}

// members is a fixed membership: daemon id → epoch.
type members map[string]uint64

func (m members) Epoch(id string) (uint64, bool) {
	e, ok := m[id]
	return e, ok
}

// routeTo routes renewals and releases to issuers' Handles by id, as the
// peer plane does; down issuers answer UNAVAILABLE.
type routeTo map[string]*Handles

func (r routeTo) Renew(t Token, token []byte, ttl time.Duration) (Handle, error) {
	h, ok := r[t.Issuer]
	if !ok {
		return Handle{}, fmt.Errorf("issuer %q: %w", t.Issuer, xfer.ErrUnavailable)
	}
	return h.Renew(token, ttl)
}

func (r routeTo) Release(t Token, token []byte) error {
	h, ok := r[t.Issuer]
	if !ok {
		return fmt.Errorf("issuer %q: %w", t.Issuer, xfer.ErrUnavailable)
	}
	_, err := h.Release(token)
	return err
}

func keys(ks ...string) [][]byte {
	out := make([][]byte, len(ks))
	for i, k := range ks {
		out[i] = []byte(k)
	}
	return out
}
