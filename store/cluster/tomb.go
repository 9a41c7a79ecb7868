package cluster

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"
)

// Remove tombstones. A home removing a key has every holder drop its copy;
// a holder it cannot reach keeps its copy meanwhile. The home remembers
// that copy (a tombstone: the key, the holder, the size and crc32c it had
// announced); when the holder comes back, the home asks it again to drop
// what the tombstones name (retryDrops), and when it re-announces a copy
// the home answers "removed" instead of indexing it, and the holder drops
// it; either spends the tombstone. A
// copy announced with other bytes (a put after the removal) is not the
// one removed, and is indexed. The table is bounded by
// Config.MaxTombstones (the oldest goes first, counted) and
// Config.TombstoneTTL (a holder away longer keeps its copy: counted and
// logged when it expires).

// tomb is one removed copy a holder was not reached for.
type tomb struct {
	key    string
	holder string
	size   uint64
	crc    uint32
	at     time.Time
	el     *list.Element
}

type tombKey struct{ key, holder string }

// tombs is a home's tombstone table.
type tombs struct {
	max int
	ttl time.Duration
	// mu guards m and order.
	mu    sync.Mutex
	m     map[tombKey]*tomb
	order list.List // oldest first

	added, hits, expired, evicted atomic.Uint64
}

func newTombs(max int, ttl time.Duration) *tombs {
	return &tombs{max: max, ttl: ttl, m: map[tombKey]*tomb{}}
}

// add records that holder's copy of key (size bytes of crc) was removed
// without it being told.
func (t *tombs) add(key []byte, h Holder, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	k := tombKey{string(key), h.ID}
	if old, ok := t.m[k]; ok {
		t.order.Remove(old.el)
		delete(t.m, k)
	}
	for len(t.m) >= t.max {
		t.dropLocked(t.order.Front().Value.(*tomb))
		t.evicted.Add(1)
	}
	tb := &tomb{key: k.key, holder: h.ID, size: h.Size, crc: h.CRC, at: now}
	tb.el = t.order.PushBack(tb)
	t.m[k] = tb
	t.added.Add(1)
}

// removed reports whether holder's announcement of key (size bytes of
// crc) is of a copy removed meanwhile; the tombstone is then spent.
func (t *tombs) removed(key []byte, holder string, size uint64, crc uint32, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == 0 {
		return false
	}
	t.expireLocked(now)
	tb, ok := t.m[tombKey{string(key), holder}]
	if !ok {
		return false
	}
	t.dropLocked(tb)
	if tb.size != size || tb.crc != crc {
		return false // another value, put after the removal
	}
	t.hits.Add(1)
	return true
}

// forget drops holder's tombstone of key (it announced the copy gone, or
// dropped it when asked again), reporting whether there was one.
func (t *tombs) forget(key []byte, holder string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, ok := t.m[tombKey{string(key), holder}]
	if ok {
		t.dropLocked(tb)
	}
	return ok
}

func (t *tombs) expireLocked(now time.Time) {
	for e := t.order.Front(); e != nil; e = t.order.Front() {
		tb := e.Value.(*tomb)
		if now.Sub(tb.at) < t.ttl {
			return
		}
		t.dropLocked(tb)
		t.expired.Add(1)
	}
}

func (t *tombs) dropLocked(tb *tomb) {
	t.order.Remove(tb.el)
	delete(t.m, tombKey{tb.key, tb.holder})
}

// of returns the keys (at most max) of holder's tombstones.
func (t *tombs) of(holder string, max int) [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys [][]byte
	for k := range t.m {
		if k.holder == holder && len(keys) < max {
			keys = append(keys, []byte(k.key))
		}
	}
	return keys
}

// live is how many tombstones the table holds.
func (t *tombs) live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// retryDrops asks holder id, back after being away, to drop the copies
// its tombstones here name; those it drops are forgotten. It runs in the
// background.
func (c *Cluster) retryDrops(id string) {
	keys := c.tombs.of(id, c.cfg.MaxTombstones)
	if len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.fetchWG.Add(1)
	go func() {
		defer c.fetchWG.Done()
		pos := make([]int, len(keys))
		for i := range pos {
			pos[i] = i
		}
		done := 0
		for _, ch := range chunks(keys, pos, 2) {
			part := make([][]byte, len(ch))
			for i, p := range ch {
				part[i] = keys[p]
			}
			if _, err := c.exchange(id, c.epochOf(id), kindDrop, encodeKeys(part)); err != nil {
				c.log.Info("a holder back did not drop removed keys yet: asked again when it re-announces them", "holder", id,
					"keys", len(part), "err", err)
				continue
			}
			for _, k := range part {
				if c.tombs.forget(k, id) {
					done++ // not spent meanwhile by a "removed" answer
				}
			}
		}
		if done > 0 {
			c.c.tombRetried.Add(uint64(done))
			c.log.Info("copies removed while their holder was away dropped now", "holder", id, "keys", done)
		}
	}()
}
