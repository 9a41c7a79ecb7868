package cluster

import (
	"sync"
	"time"
)

// answers is a reader's cache of its homes' answers: key → the holders a
// home named, kept for the staleness budget (Config.Staleness) and at most
// Config.MaxCached keys (when full, it is emptied: a cache, not a
// record). A cached answer saves the home round trip of a remote get; a
// holder it names that no longer has the value answers so, and the key is
// asked of its home again. Misses are never cached, so a key put elsewhere
// is found as soon as its home knows it.
type answers struct {
	ttl time.Duration
	max int
	// mu guards m.
	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	holders []Holder
	until   time.Time
}

func newAnswers(ttl time.Duration, max int) *answers {
	return &answers{ttl: ttl, max: max, m: map[string]cached{}}
}

// get is key's cached holders while fresh.
func (a *answers) get(key []byte, now time.Time) ([]Holder, bool) {
	if a.ttl <= 0 {
		return nil, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[string(key)]
	if !ok || now.After(e.until) {
		return nil, false
	}
	return e.holders, true
}

// put caches holders (a home's answer naming at least one) for key.
func (a *answers) put(key []byte, holders []Holder, now time.Time) {
	if a.ttl <= 0 || len(holders) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= a.max {
		clear(a.m)
	}
	a.m[string(key)] = cached{holders: holders, until: now.Add(a.ttl)}
}

// drop forgets keys.
func (a *answers) drop(keys [][]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		delete(a.m, string(k))
	}
}

// Staleness is how long a reader here keeps a home's answer
// (Config.Staleness; negative: not at all).
func (c *Cluster) Staleness() time.Duration { return c.cfg.Staleness }
