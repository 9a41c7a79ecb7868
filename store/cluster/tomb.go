package cluster

import (
	"container/list"
	"log/slog"
	"slices"
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
// one removed, and is indexed; and both ways tell the holder when the
// removal was, so that a value it put after it, the same bytes or any
// (a tombstone may name none), stays (apart.go). A copy a reader fetched (not a put) that is
// announced within a short while of its key's removal (twice
// Config.Timeout, the longest a fetch takes) was read before the removal
// and is answered "removed" too, whatever its holder: otherwise a fetch
// racing a remove would bring the value back. Tombstones move with their shard: a home
// that stops being a shard's home (members joined or left, or another
// claimed it) hands the shard's tombstones to its new home (handTombs),
// so a holder that comes back after the move and re-announces a removed
// copy to the new home is answered "removed" there; a new home that had
// indexed such a copy already forgets it and asks its holder to drop it.
//
// A home that dies cannot hand its tombstones on, so it gives a copy of
// each to keepers when it makes it, before it answers the removal
// (keepTombs): the tombKeepers members that follow it in the shard's
// rendezvous order (those that become its home as the ones before them
// go), the holder excepted. A keeper's copy is standby: it answers like
// the home's own while the keeper is the shard's home, it is handed to
// the shard's home whenever that changes (and kept: the home it went to
// may die in turn), and the keeper asks the holder to drop the copy when
// it sees it back (retryDrops), whoever is home then. So a removal holds
// when its home dies, unless every keeper dies with it. The table is
// bounded by Config.MaxTombstones (the oldest goes first, counted) and
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
	// until, when set, is when a settled tombstone goes (its holder
	// dropped the copy; it only answers a late announcement meanwhile).
	until time.Time
	// standby marks a keeper's copy of a home's tombstone; handedTo is
	// the home it was last handed to (or came from).
	standby  bool
	handedTo string
}

// covers reports whether tb names a copy of size bytes of crc: the value
// removed, or any value when tb does not know it (size and crc 0: a
// removal while the holder was away, whose home knew no copy to take them
// from; tombAway).
func (tb *tomb) covers(size uint64, crc uint32) bool {
	return tb.size == 0 && tb.crc == 0 || tb.size == size && tb.crc == crc
}

// tombKeepers is how many members keep a copy of each tombstone a home
// makes (keepTombs).
const tombKeepers = 2

type tombKey struct{ key, holder string }

// tombs is a home's tombstone table.
type tombs struct {
	max int
	ttl time.Duration
	// mu guards m, order, recent and rorder.
	mu    sync.Mutex
	m     map[tombKey]*tomb
	order list.List // oldest first
	// recent are the keys removed here in the last recentTTL, whatever
	// their holders (a fetched copy announced of one of them was read
	// before its removal: justRemoved), oldest first in rorder.
	recent    map[string]*list.Element
	rorder    list.List // of recentRemoval
	recentTTL time.Duration
	// settled counts the tombstones with until set, standby the keepers'
	// copies without it.
	settled, standby int

	added, hits, expired, evicted atomic.Uint64
}

// recentRemoval is one key removed lately.
type recentRemoval struct {
	key string
	at  time.Time
}

func newTombs(max int, ttl, recentTTL time.Duration) *tombs {
	return &tombs{max: max, ttl: ttl, m: map[tombKey]*tomb{}, recent: map[string]*list.Element{}, recentTTL: recentTTL}
}

// removedNow records that key was removed at now (its home took the
// removal).
func (t *tombs) removedNow(key []byte, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireRecentLocked(now)
	if el, ok := t.recent[string(key)]; ok {
		t.rorder.Remove(el)
	}
	for len(t.recent) >= t.max {
		old := t.rorder.Front()
		delete(t.recent, old.Value.(recentRemoval).key)
		t.rorder.Remove(old)
	}
	t.recent[string(key)] = t.rorder.PushBack(recentRemoval{string(key), now})
}

// justRemoved reports whether key was removed within the last recentTTL:
// a fetched copy of it announced now was read before the removal.
func (t *tombs) justRemoved(key []byte, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.recent) == 0 {
		return false
	}
	t.expireRecentLocked(now)
	_, ok := t.recent[string(key)]
	if ok {
		t.hits.Add(1)
	}
	return ok
}

func (t *tombs) expireRecentLocked(now time.Time) {
	for el := t.rorder.Front(); el != nil; el = t.rorder.Front() {
		r := el.Value.(recentRemoval)
		if now.Sub(r.at) < t.recentTTL {
			return
		}
		delete(t.recent, r.key)
		t.rorder.Remove(el)
	}
}

// add records that holder's copy of key (size bytes of crc) was removed
// without it being told, and returns the tombstone made.
func (t *tombs) add(key []byte, h Holder, now time.Time) tomb {
	tb := tomb{key: string(key), holder: h.ID, size: h.Size, crc: h.CRC, at: now}
	t.adopt(tb, now)
	return tb
}

// adopt records tombstone tb (dated tb.at: one handed over keeps its
// age; it goes at the back of the order all the same, so it may outlive
// the TTL until those before it have gone).
func (t *tombs) adopt(tb tomb, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if now.Sub(tb.at) >= t.ttl {
		t.expired.Add(1)
		return
	}
	k := tombKey{tb.key, tb.holder}
	standby := tb.standby
	if old, ok := t.m[k]; ok {
		// The home's own (not standby) wins: it must be handed on when
		// the shard moves away from here.
		standby = standby && old.standby
		t.dropLocked(old)
	}
	for len(t.m) >= t.max {
		t.dropLocked(t.order.Front().Value.(*tomb))
		t.evicted.Add(1)
	}
	p := &tomb{key: tb.key, holder: tb.holder, size: tb.size, crc: tb.crc, at: tb.at, standby: standby, handedTo: tb.handedTo}
	p.el = t.order.PushBack(p)
	t.m[k] = p
	if standby {
		t.standby++
	}
	t.added.Add(1)
}

// moving returns copies of the tombstones whose key to names a new home
// of (by home), a standby one only when it was not handed to that home
// last.
func (t *tombs) moving(to func(key []byte) (string, bool)) map[string][]tomb {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out map[string][]tomb
	for _, tb := range t.m {
		if !tb.until.IsZero() {
			continue // settled: the copy is gone
		}
		home, ok := to([]byte(tb.key))
		if !ok || tb.standby && home == tb.handedTo {
			continue
		}
		if out == nil {
			out = map[string][]tomb{}
		}
		out[home] = append(out[home], tomb{key: tb.key, holder: tb.holder, size: tb.size, crc: tb.crc, at: tb.at, standby: tb.standby})
	}
	return out
}

// handed records that tombstone tb went to home, which took it: the home's
// own is forgotten here if it is still the one handed over (not spent,
// nor replaced by a newer removal meanwhile); a keeper's stays, marked
// handed to home.
func (t *tombs) handed(tb tomb, home string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.m[tombKey{tb.key, tb.holder}]
	if !ok || !cur.at.Equal(tb.at) || cur.size != tb.size || cur.crc != tb.crc {
		return
	}
	if cur.standby {
		cur.handedTo = home
		return
	}
	t.dropLocked(cur)
}

// removed reports whether holder's announcement of key (size bytes of
// crc) is of a copy removed meanwhile, and when that removal was; the
// tombstone is then spent.
func (t *tombs) removed(key []byte, holder string, size uint64, crc uint32, now time.Time) (bool, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == 0 {
		return false, time.Time{}
	}
	t.expireLocked(now)
	tb, ok := t.m[tombKey{string(key), holder}]
	if !ok {
		return false, time.Time{}
	}
	settled := !tb.until.IsZero()
	t.dropLocked(tb)
	if !tb.covers(size, crc) {
		return false, time.Time{} // another value, put after the removal
	}
	if !settled { // a settled one was counted when its holder dropped the copy
		t.hits.Add(1)
	}
	return true, tb.at
}

// unsettled returns the holders among ids whose tombstones of key name a
// copy not dropped yet (a removal of key that they did not take).
func (t *tombs) unsettled(key []byte, ids []string) []Holder {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == t.settled {
		return nil
	}
	var hs []Holder
	k := string(key)
	for _, id := range ids {
		if tb, ok := t.m[tombKey{k, id}]; ok && tb.until.IsZero() {
			hs = append(hs, Holder{ID: id, Size: tb.size, CRC: tb.crc})
		}
	}
	return hs
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

// settle shortens holder's tombstone of key to grace from now (the holder
// dropped the copy when asked again): an announcement of the copy the
// holder sent before it dropped it, arriving late, is still answered
// "removed". It reports whether there was one not spent: settled now, or
// settled already (the holder's own announcement that the copy is gone,
// which the drop made, can come first).
func (t *tombs) settle(key []byte, holder string, now time.Time, grace time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, ok := t.m[tombKey{string(key), holder}]
	if ok {
		t.settleLocked(tb, now, grace)
	}
	return ok
}

// settleLocked settles tb, unless it is settled already.
func (t *tombs) settleLocked(tb *tomb, now time.Time, grace time.Duration) {
	if !tb.until.IsZero() {
		return
	}
	tb.until = now.Add(grace)
	t.settled++
	if tb.standby {
		t.standby--
	}
}

// settleAll settles holder's tombstones of keys not settled yet (the
// holder dropped its copies), as settle does each.
func (t *tombs) settleAll(keys [][]byte, holder string, now time.Time, grace time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) == t.settled {
		return
	}
	for _, k := range keys {
		if tb, ok := t.m[tombKey{string(k), holder}]; ok {
			t.settleLocked(tb, now, grace)
		}
	}
}

// expireSettledLocked drops the settled tombstones whose time is up.
func (t *tombs) expireSettledLocked(now time.Time) {
	if t.settled == 0 {
		return
	}
	for _, tb := range t.m {
		if !tb.until.IsZero() && !now.Before(tb.until) {
			t.dropLocked(tb)
		}
	}
}

func (t *tombs) expireLocked(now time.Time) {
	t.expireSettledLocked(now)
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
	switch {
	case !tb.until.IsZero():
		t.settled--
	case tb.standby:
		t.standby--
	}
	t.order.Remove(tb.el)
	delete(t.m, tombKey{tb.key, tb.holder})
}

// of returns the keys (at most max) of holder's tombstones, and when each
// removal was.
func (t *tombs) of(holder string, max int) ([][]byte, []time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys [][]byte
	var ats []time.Time
	for k, tb := range t.m {
		if k.holder == holder && tb.until.IsZero() && len(keys) < max {
			keys, ats = append(keys, []byte(k.key)), append(ats, tb.at)
		}
	}
	return keys, ats
}

// live is how many tombstones of its own (not keepers' copies) the table
// holds, not counting the settled ones.
func (t *tombs) live() int {
	own, _ := t.count()
	return own
}

// count is how many tombstones the table holds, not counting the settled
// ones (their copies are gone): its own, and keepers' copies.
func (t *tombs) count() (own, standby int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireSettledLocked(time.Now())
	return len(t.m) - t.settled - t.standby, t.standby
}

// retryDrops asks holder id (back after being away, or up and not
// reached by a removal's drop) to drop the copies its tombstones here
// name; those it drops are settled. It runs in the background, one round
// per holder at a time: a call while one runs asks for one more round
// once it ends (the tombstones made meanwhile are in it). A round that
// failed while the holder is still a member (up, but busy or slow) is
// asked again after a pause that doubles from dropRetryFirst to
// dropRetryMost, until its tombstones are spent or expire, or the holder
// goes (its return asks again).
func (c *Cluster) retryDrops(id string) {
	if !c.dropRounds.start(id) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.dropRounds.end(id)
		return
	}
	c.fetchWG.Add(1)
	go func() {
		defer c.fetchWG.Done()
		pause := dropRetryFirst
		for {
			failed := c.dropRound(id)
			up := failed && c.view.Load().has(id)
			if !c.dropRounds.next(id, up) {
				return
			}
			if !up {
				pause = dropRetryFirst
				continue
			}
			c.c.dropRetryRounds.Add(1)
			if !c.pause(pause) {
				c.dropRounds.end(id)
				return
			}
			pause = min(2*pause, dropRetryMost)
		}
	}()
}

// The pauses between rounds of retryDrops to a holder that is a member
// and did not drop what it was asked.
const (
	dropRetryFirst = 50 * time.Millisecond
	dropRetryMost  = 2 * time.Second
)

// dropRound is one round of retryDrops: it asks holder id to drop what
// its tombstones here name, and reports whether a part of it failed. A
// holder that answers busy is sent no more of it.
func (c *Cluster) dropRound(id string) (failed bool) {
	keys, ats := c.tombs.of(id, c.cfg.MaxTombstones)
	if len(keys) == 0 {
		return false
	}
	pos := make([]int, len(keys))
	for i := range pos {
		pos[i] = i
	}
	done, kept := 0, 0
	for _, ch := range chunks(keys, pos, 2) {
		part := make([][]byte, len(ch))
		ages := make([]uint32, len(ch))
		now := time.Now()
		for i, p := range ch {
			part[i] = keys[p]
			ages[i] = ageOf(ats[p], now)
		}
		put, err := c.dropAged(id, part, ages, time.Now().Add(c.cfg.Timeout)) // the holder's values put after the removal, kept
		if err != nil {
			c.log.Info("a holder did not drop removed keys yet: asked again while it is a member, and when it re-announces them",
				"holder", id, "keys", len(part), "err", err)
			failed = true
			if c.peers.Busy(err) {
				break // no room there now: the next round sends the rest
			}
			continue
		}
		kept += len(put)
		done += c.dropped(id, part, put)
	}
	if done > 0 {
		c.c.tombRetried.Add(uint64(done))
		c.log.Info("removed copies a holder had kept dropped now", "holder", id, "keys", done,
			"put_since_kept", kept)
	}
	return failed
}

// rounds runs at most one round of a background job per name (a holder,
// a home) at a time, so that events asking for the job do not pile up
// rounds that each send the same messages.
type rounds struct {
	mu sync.Mutex
	// m: the names with a round running, true when another was asked
	// for meanwhile.
	m map[string]bool
}

// start reports whether the caller runs a round for name now; when one
// runs already, it is asked to go once more and start reports false.
func (r *rounds) start(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]bool{}
	}
	if _, ok := r.m[name]; ok {
		r.m[name] = true
		return false
	}
	r.m[name] = false
	return true
}

// next, at the end of a round for name, reports whether another one runs
// (asked for meanwhile, or want); when not, name has none running.
func (r *rounds) next(name string, want bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[name] || want {
		r.m[name] = false
		return true
	}
	delete(r.m, name)
	return false
}

// end records that name's round ended with none to follow.
func (r *rounds) end(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, name)
}

// dropAged asks holder id to drop keys removed ages ms ago (a tombstone's
// drop) and returns the positions of those it kept: values put there
// after the removal. A holder of an older release (members.go,
// exchangeNewer) is asked to drop what it has, which it does whatever the
// age.
func (c *Cluster) dropAged(id string, keys [][]byte, ages []uint32, deadline time.Time) ([]int, error) {
	body, asOlder, err := c.exchangeNewer(id, c.epochOf(id), kindDropAges, encodeDrop(keys, ages),
		kindDrop, func() []byte { return encodeKeys(keys) }, deadline)
	if err != nil || asOlder {
		return nil, err
	}
	return decodePositions(body, len(keys))
}

// dropped records that holder id dropped its copies of keys when asked
// again (but those at positions put, values it put after the removal),
// and returns how many tombstones that settled. The index (when this
// daemon is still a key's home) forgets each copy, unless the holder has
// a value put since (it announces that one again); and each tombstone
// stays a little for an announcement of the copy still on its way.
func (c *Cluster) dropped(id string, keys [][]byte, put []int) (settled int) {
	v := c.view.Load()
	for i, k := range keys {
		if s := c.shardOf(k); c.homeFor(v, s) == c.self && !slices.Contains(put, i) {
			c.idx.dropHolder(s, k, id, 0)
		}
		if c.tombs.settle(k, id, time.Now(), c.cfg.Timeout) {
			settled++ // not spent meanwhile by a "removed" answer (counted as a hit)
		}
	}
	c.goneHere(keys)
	return settled
}

// goneHere tells the homes of keys, removed while a holder was away, that
// this daemon holds none of them it does not hold now: it may have been a
// holder of one when the key's home (away then, back now) last heard, and
// that home would name it still. Queued like an eviction, after anything
// this daemon announced before; a key held here (put again) is left to
// its own announcement.
func (c *Cluster) goneHere(keys [][]byte) {
	for _, k := range keys {
		if !c.st.HeldHere(k) {
			c.Evicted(k)
		}
	}
}

// handTombs hands the tombstones of the shards this daemon is no longer
// home of to their new homes (newHome says which, for a shard that
// moved), in the background; those a new home took are forgotten here,
// the others stay (and are asked of their holders here when they come
// back, retryDrops). One hand-off per home runs at a time, and it stops
// at the first message the home did not take: a home just back may hold
// many (the removals made while it was away), and a call meanwhile, or
// a message sent on into a home that is busy, would send them again and
// again while it is least able to take them. What stays here goes with
// the next call: every probe round makes one (members.go).
func (c *Cluster) handTombs(newHome func(s int) (string, bool)) {
	by := c.tombs.moving(func(key []byte) (string, bool) {
		home, ok := newHome(c.shardOf(key))
		return home, ok && home != c.self
	})
	if len(by) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for home, ts := range by {
		if !c.handing.start(home) {
			continue // the next call hands what this one did not
		}
		c.fetchWG.Add(1)
		go func() {
			defer c.fetchWG.Done()
			defer c.handing.end(home)
			handed := 0
			for _, part := range tombChunks(ts) {
				if _, err := c.exchange(home, c.epochOf(home), kindTombs, encodeTombs(part, time.Now())); err != nil {
					c.c.handStopped.Add(1)
					c.log.Warn("a new home did not take the tombstones of its shards: handed again with the next probe; "+
						"removed copies of holders away may come back there meanwhile",
						"home", home, "tombstones", len(ts)-handed, "err", err)
					break
				}
				keys := make([][]byte, len(part))
				for i, tb := range part {
					c.tombs.handed(tb, home)
					keys[i] = []byte(tb.key)
				}
				c.goneHere(keys)
				handed += len(part)
			}
			if handed > 0 {
				c.c.tombsHanded.Add(uint64(handed))
				c.log.Info("tombstones handed to the new home of their shards", "home", home, "tombstones", handed)
			}
		}()
	}
}

// tombChunks splits ts into messages of at most maxMsgKeys tombstones and
// maxMsgBytes bytes.
func tombChunks(ts []tomb) [][]tomb {
	var out [][]tomb
	for len(ts) > 0 {
		n, size := 0, 16
		for n < len(ts) && n < maxMsgKeys && size+tombBytes(ts[n].key, ts[n].holder) <= maxMsgBytes {
			size += tombBytes(ts[n].key, ts[n].holder)
			n++
		}
		out = append(out, ts[:n])
		ts = ts[n:]
	}
	return out
}

// keepTombs gives copies of tombstones ts, just made here as the home of
// their shards under v, to their keepers (the members next in each
// shard's rendezvous order, the holder excepted), the keepers in
// parallel, by deadline. A keeper that does not take them is logged and
// counted: the removal then holds only while this daemon lives.
func (c *Cluster) keepTombs(v *view, ts []tomb, deadline time.Time) {
	by := map[string][]tomb{}
	for _, tb := range ts {
		for _, k := range v.ranked(c.shardOf([]byte(tb.key)), tombKeepers, c.self, tb.holder) {
			by[k] = append(by[k], tb)
		}
	}
	if len(by) == 0 {
		c.c.keepNone.Add(uint64(len(ts)))
		c.noKeepers.Event(slog.Int("tombstones", len(ts)), slog.Uint64("tombstones_total", c.c.keepNone.Load()))
		return
	}
	var wg sync.WaitGroup
	for keeper, kts := range by {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, part := range tombChunks(kts) {
				if _, err := c.exchangeBy(keeper, c.epochOf(keeper), kindKeep, encodeTombs(part, time.Now()), deadline); err != nil {
					c.c.keepFailed.Add(uint64(len(part)))
					c.log.Warn("a keeper did not take copies of tombstones: if this home dies, those removed copies may come back",
						"keeper", keeper, "tombstones", len(part), "err", err)
					continue
				}
				c.c.tombsKept.Add(uint64(len(part)))
			}
		}()
	}
	wg.Wait()
}

// onKeep takes in copies of tombstones their home (from) just made, as
// standby ones: they go to the shard's home whenever it changes (the
// prober's handTombs), and their holders are asked to drop the copies
// when seen back (retryDrops); a holder this daemon sees up is asked at
// once (the home may not reach it when this daemon does).
func (c *Cluster) onKeep(from string, epoch uint64, req []byte) ([]byte, error) {
	now := time.Now()
	ts, err := decodeTombs(req, now)
	if err != nil {
		return nil, err
	}
	v := c.view.Load()
	ask := map[string]bool{}
	for _, tb := range ts {
		tb.standby, tb.handedTo = true, from
		c.tombs.adopt(tb, now)
		if tb.holder != c.self && v.has(tb.holder) {
			ask[tb.holder] = true
		}
	}
	for id := range ask {
		c.retryDrops(id)
	}
	return []byte{msgVersion}, nil
}

// onTombs takes in tombstones handed over by a shard's previous home. It
// takes them whatever its view says (a tombstone only answers an
// announcement of a shard this daemon is home of, and ages out): the
// sender's view may have changed first. A copy one of them names that the
// index has already (its holder re-announced it here before the hand-over
// came) is forgotten and its holder asked to drop it.
func (c *Cluster) onTombs(from string, epoch uint64, req []byte) ([]byte, error) {
	now := time.Now()
	ts, err := decodeTombs(req, now)
	if err != nil {
		return nil, err
	}
	again := map[string]bool{}
	var mine [][]byte
	var ats []time.Time
	for _, tb := range ts {
		c.tombs.adopt(tb, now)
		// A copy fetched from the removed one (its holder back and not
		// yet told) and announced here soon is answered "removed" too.
		c.tombs.removedNow([]byte(tb.key), now)
		s := c.shardOf([]byte(tb.key))
		for _, h := range c.idx.get(s, []byte(tb.key), nil) {
			if h.ID == tb.holder && tb.covers(h.Size, h.CRC) {
				c.idx.dropHolder(s, []byte(tb.key), h.ID, 0)
				if h.ID == c.self {
					// This daemon's own copy, removed while it was away
					// and indexed here since (it became the home).
					mine, ats = append(mine, []byte(tb.key)), append(ats, tb.at)
					c.tombs.forget([]byte(tb.key), c.self)
					continue
				}
				again[h.ID] = true
			}
		}
	}
	if len(mine) > 0 {
		// As a tombstone handed here says.
		c.dropRemoved(from, mine, ats)
	}
	for id := range again {
		c.retryDrops(id)
	}
	c.c.tombsTaken.Add(uint64(len(ts)))
	return []byte{msgVersion}, nil
}
