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
// announced); when the holder comes back and re-announces it, the home
// answers "removed" instead of indexing it, and the holder drops it. A
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

// forget drops holder's tombstone of key (it announced the copy gone).
func (t *tombs) forget(key []byte, holder string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tb, ok := t.m[tombKey{string(key), holder}]; ok {
		t.dropLocked(tb)
	}
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

// live is how many tombstones the table holds.
func (t *tombs) live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
