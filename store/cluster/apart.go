package cluster

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Puts made while apart. A removal whose drop reaches a holder late (a
// tombstone, spent when the holder is back: tomb.go) must take the copy
// the holder had when the key was removed, never a value put there since:
// that one is a new put, acknowledged to its client after the removal was
// to the remover's, and the removal is ordered before it. A tombstone that
// names no value (tombAway: the home standing in knew no copy) covers
// whatever value the member has, and one that names a value cannot tell a
// put of the same bytes after the removal from the copy removed; so every
// drop a tombstone sends says how long ago its removal was, and the holder
// keeps a value put after that.
//
// The holder knows when a value was put only while it remembers: it
// notes the time of each put (not of a fetched copy) while a member is
// away from it and for Config.TombstoneTTL after the last came back (a
// tombstone lives no longer), at most Config.MaxTombstones keys (the
// oldest go first, counted and logged); an eviction or removal of the key
// here forgets it. The table's order holds at most twice that many marks,
// the forgotten and noted-again ones included: a daemon that puts and
// removes at a high rate while a member is away would otherwise keep a
// mark per put for the whole TTL (1.5k puts a second in a soak grew its
// heap by 3 MB a minute). A put this daemon did not note (made while it saw
// every member, or pushed out of the table) is dropped by a tombstone
// older than it: the removal wins, as it did before.

// putsApart is the table of puts noted while apart.
type putsApart struct {
	max int
	ttl time.Duration
	// until is the time (UnixNano) up to which puts are noted:
	// math.MaxInt64 while a member is away, the last one's return plus
	// ttl after, 0 before any member was away.
	until atomic.Int64
	// n is len(at), read without mu by the eviction path.
	n atomic.Int32

	mu   sync.Mutex
	at   map[string]putMark // each key's latest note
	fifo []putMark          // in the order noted; a mark whose key was noted again or forgotten since is stale
	head int
	seq  uint64 // the last note's number

	noted, over atomic.Uint64
}

// putMark is one put in the table's order: its number tells the key's
// latest note (live) from earlier ones (stale).
type putMark struct {
	key string
	at  time.Time
	seq uint64
}

func newPutsApart(max int, ttl time.Duration) *putsApart {
	return &putsApart{max: max, ttl: ttl, at: map[string]putMark{}}
}

// liveLocked reports whether m is its key's latest note (p.mu held).
func (p *putsApart) liveLocked(m putMark) bool {
	n, ok := p.at[m.key]
	return ok && n.seq == m.seq
}

// setApart records whether members are away now (at now).
func (p *putsApart) setApart(away bool, now time.Time) {
	switch {
	case away:
		p.until.Store(math.MaxInt64)
	case p.until.Load() == math.MaxInt64:
		p.until.Store(now.Add(p.ttl).UnixNano())
	}
}

// note notes a put of key now, if puts are noted now (the clock is not
// read while no member was ever away). It reports whether the table was
// full (the oldest note went). It runs under the key's store shard lock.
func (p *putsApart) note(key []byte) (full bool) {
	if p.until.Load() == 0 {
		return false
	}
	if now := time.Now(); p.noting(now) {
		return p.put(key, now)
	}
	return false
}

// noting reports whether a put at now is to be noted.
func (p *putsApart) noting(now time.Time) bool {
	u := p.until.Load()
	return u != 0 && now.UnixNano() < u
}

// put notes that key's value was put at now. It runs under the key's
// store shard lock (Stored), in the order of the key's puts, and only
// takes p.mu. It reports whether the table was full (the oldest note
// went).
func (p *putsApart) put(key []byte, now time.Time) (full bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expireLocked(now)
	k := string(key)
	// A key noted again takes no more room.
	_, again := p.at[k]
	for !again && len(p.at) >= p.max && p.head < len(p.fifo) {
		m := p.fifo[p.head]
		p.fifo[p.head] = putMark{}
		p.head++
		if p.liveLocked(m) {
			delete(p.at, m.key)
			full = true
		}
	}
	if full {
		p.over.Add(1)
	}
	p.seq++
	m := putMark{k, now, p.seq}
	p.at[k] = m
	p.fifo = append(p.fifo, m)
	switch {
	case len(p.fifo)-p.head > 2*p.max:
		// Mostly stale marks (keys forgotten or noted again): keep the
		// live ones, at most max, in order.
		live := p.fifo[:0]
		for _, m := range p.fifo[p.head:] {
			if p.liveLocked(m) {
				live = append(live, m)
			}
		}
		clear(p.fifo[len(live):])
		p.fifo, p.head = live, 0
	case p.head > len(p.fifo)/2:
		p.fifo = append(p.fifo[:0], p.fifo[p.head:]...)
		p.head = 0
	}
	p.n.Store(int32(len(p.at)))
	p.noted.Add(1)
	return full
}

// expireLocked drops the notes older than the ttl (p.mu held).
func (p *putsApart) expireLocked(now time.Time) {
	for p.head < len(p.fifo) && now.Sub(p.fifo[p.head].at) >= p.ttl {
		m := p.fifo[p.head]
		p.fifo[p.head] = putMark{}
		p.head++
		if p.liveLocked(m) {
			delete(p.at, m.key)
		}
	}
	if p.head == len(p.fifo) {
		p.fifo, p.head = p.fifo[:0], 0
	}
	p.n.Store(int32(len(p.at)))
}

// forget drops key's note (its value left this store). Like put, it runs
// under the key's store shard lock.
func (p *putsApart) forget(key []byte) {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.at, string(key))
	p.n.Store(int32(len(p.at)))
}

// after reports whether key's value here was put after t, as noted.
func (p *putsApart) after(key []byte, t time.Time) bool {
	if p.n.Load() == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.at[string(key)]
	return ok && n.at.After(t)
}

// len is how many puts the table notes.
func (p *putsApart) len() int { return int(p.n.Load()) }
