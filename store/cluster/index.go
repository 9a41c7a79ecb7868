package cluster

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Tiers a holder announces a value on.
const (
	TierL1 uint8 = 1 // the holder's DRAM pool
	TierL2 uint8 = 2 // the holder's NVMe
	// tierGone, in an announcement, says the holder no longer has the
	// value (evicted).
	tierGone uint8 = 0
	// tierFetched, or-ed into an announcement's tier, says the value is a
	// copy this holder fetched from another (a reader keeping a remote
	// hit), not a put: a home that removed the key moments ago answers
	// "removed" (the fetch read the bytes before the removal).
	tierFetched uint8 = 0x80
)

// Holder is one copy of a key's value as its home knows it.
type Holder struct {
	ID    string // the holder's daemon id
	Epoch uint64 // the holder's run that announced it
	Tier  uint8
	Size  uint64
	CRC   uint32 // crc32c of the value
}

// index is a home's location index: for each key of the shards it is
// home of, its holders. Bounded: at most maxKeys keys (an announcement
// past it is refused and counted) and maxHolders holders per key (the
// oldest announcement makes room for the newest).
type index struct {
	maxKeys, maxHolders int
	// changed, when set (before the index is used), is told of every key
	// whose holders changed (by holder by; "" for a removal), with the
	// shard's lock held: it is quick and does not call into the index
	// (push.go).
	changed func(s int, key []byte, by string)
	keys    atomic.Int64
	refused atomic.Uint64
	shards  []ishard
}

// ishard is one shard's part of the index.
type ishard struct {
	// mu guards m.
	mu sync.Mutex
	// m holds each key's holders by pointer, so that a change of a key
	// indexed already (a holder added or gone) is made in place: assigning
	// a map entry of a key named by its bytes would copy the name each
	// time.
	m map[string]*holders
}

// holders is one key's holders; the first sits in the same allocation.
type holders struct {
	hs    []Holder
	first [1]Holder
}

func newIndex(shards, maxKeys, maxHolders int) *index {
	return &index{maxKeys: maxKeys, maxHolders: maxHolders, shards: make([]ishard, shards)}
}

// add records h as a holder of key (in shard s); a holder of the same id
// replaces its earlier entry (another epoch's is gone with that run). It
// reports false when the index is full.
func (x *index) add(s int, key []byte, h Holder) bool {
	added, _ := x.addUnless(s, key, h, nil)
	return added
}

// addUnless is add, unless removed (when set) reports the copy removed:
// then nothing is added and gone is true. removed runs with the shard's
// lock held, as drop's mark does, so that a removal of the key is either
// wholly before the check (and answers it) or wholly after the add (and
// drops the holder added): never between the check and the add, which
// would index a copy its removal has already passed by.
func (x *index) addUnless(s int, key []byte, h Holder, removed func() bool) (added, gone bool) {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if removed != nil && removed() {
		return false, true
	}
	p, ok := sh.m[string(key)]
	if !ok {
		if x.keys.Load() >= int64(x.maxKeys) {
			x.refused.Add(1)
			return false, false
		}
		if sh.m == nil {
			sh.m = map[string]*holders{}
		}
		x.keys.Add(1)
		p = &holders{}
		p.hs = p.first[:0]
		sh.m[string(key)] = p
	}
	if slices.Contains(p.hs, h) {
		return true, false // a re-announcement: nothing changed
	}
	if x.changed != nil {
		defer x.changed(s, key, h.ID)
	}
	p.hs = slices.DeleteFunc(p.hs, func(o Holder) bool { return o.ID == h.ID })
	if len(p.hs) >= x.maxHolders {
		p.hs = slices.Delete(p.hs, 0, 1)
	}
	p.hs = append(p.hs, h)
	return true, false
}

// get appends key's holders to dst.
func (x *index) get(s int, key []byte, dst []Holder) []Holder {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.m[string(key)]; p != nil {
		return append(dst, p.hs...)
	}
	return dst
}

// drop forgets key and returns the holders it had. mark, when set, runs
// first with the shard's lock held (a removal records itself there for
// addUnless's check).
func (x *index) drop(s int, key []byte, mark func()) []Holder {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if mark != nil {
		mark()
	}
	p, ok := sh.m[string(key)]
	if !ok {
		return nil
	}
	delete(sh.m, string(key))
	x.keys.Add(-1)
	if x.changed != nil {
		defer x.changed(s, key, "")
	}
	return p.hs
}

// dropHolder forgets that id (at epoch, or any epoch when 0) holds key.
func (x *index) dropHolder(s int, key []byte, id string, epoch uint64) {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p, ok := sh.m[string(key)]
	if !ok {
		return
	}
	n := len(p.hs)
	p.hs = slices.DeleteFunc(p.hs, func(o Holder) bool { return o.ID == id && (epoch == 0 || o.Epoch == epoch) })
	if len(p.hs) == n {
		return
	}
	if x.changed != nil {
		defer x.changed(s, key, id)
	}
	if len(p.hs) == 0 {
		delete(sh.m, string(key))
		x.keys.Add(-1)
	}
}

// shardKeys counts the keys of shard s.
func (x *index) shardKeys(s int) int {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.m)
}

// clearShard forgets every key of shard s (this daemon is no longer its
// home).
func (x *index) clearShard(s int) {
	sh := &x.shards[s]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	x.keys.Add(-int64(len(sh.m)))
	sh.m = nil
}
