package cluster

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/store"
)

// The holder's announcements and the home's side: announce, lookup and
// remove.

// Stored queues key's announcement to its home (store.Remote), at the
// tier the store has it on: L2 once it is there (a durable commit's). It
// runs under the store's shard lock: it copies the key and only queues.
//
// A replica's durable copy is announced twice, by this announcement and
// by the replicate's own before it answers (onReplicate), in either order
// at the home, which keeps the later: both say L2, so the home knows the
// copy durable whichever comes last.
//
// A value put here whose announcement finds the queue full is not
// announced (counted; it is found here, and re-announced by a later walk).
// A fetched copy's is queued all the same: a copy its home does not know
// of would outlive the key's removal. Their number past the bound is
// small, since no fetch lands while the queue is full (backlogged).
//
// A fetched copy (unseen: its record) stays unseen by readers here until
// its home has taken the announcement (confirm), so that a removal the
// home took before it never misses a copy that is served.
func (c *Cluster) Stored(key []byte, size uint64, crc uint32, onL2 bool, unseen store.RecordID) {
	if unseen == 0 {
		c.notePut(key)
	}
	c.queueStored(key, size, crc, onL2, unseen)
}

// Restated is Stored for a value stored here before, told again
// (store.Recheck): queued the same, but no new put (never an unseen copy:
// its own announcement is queued).
func (c *Cluster) Restated(key []byte, size uint64, crc uint32, onL2 bool) {
	c.queueStored(key, size, crc, onL2, 0)
}

// notePut notes the time of a put of key here while members are away, or
// were lately (apart.go). It runs under the key's store shard lock.
func (c *Cluster) notePut(key []byte) {
	if c.apart.note(key) {
		if n := c.apart.over.Load(); n&(n-1) == 0 {
			c.log.Warn("too many puts while members are away to note them all: a removal made elsewhere before the oldest, told late, takes them",
				"max", c.cfg.MaxTombstones, "times", n)
		}
	}
}

// queueStored queues the announcement of key's value (on L2 with onL2; a
// fetched copy's, record unseen, when that is not 0).
func (c *Cluster) queueStored(key []byte, size uint64, crc uint32, onL2 bool, unseen store.RecordID) {
	fetched := unseen != 0
	tier := TierL1
	if onL2 {
		tier = TierL2
	}
	if fetched {
		tier |= tierFetched
	}
	c.mu.Lock()
	if c.closed || len(c.pending) >= c.cfg.MaxPending && !fetched {
		c.mu.Unlock()
		c.c.announceDropped.Add(1)
		return
	}
	c.pending = append(c.pending, entry{key: c.keys.Copy(key), tier: tier, size: size, crc: crc, id: unseen})
	c.mu.Unlock()
	if c.goneN.Load() > 0 { // no lock per put while none waits (nearly always)
		// A value put after the removal: the removed copy is gone.
		c.holdMu.Lock()
		delete(c.gone, string(key))
		c.goneN.Store(int32(len(c.gone)))
		c.holdMu.Unlock()
	}
	c.c.announced.Add(1)
	if !fetched {
		c.kickAnnouncer()
	} // a fetched copy's: the fetch kicks once it has answered
}

// backlogged reports whether the announcements waiting to be sent have
// reached Config.MaxPending: a fetch does not land a copy then (its
// announcement would go past the bound).
func (c *Cluster) backlogged() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) >= c.cfg.MaxPending
}

// kickAnnouncer wakes the announcer (it sends what is queued).
func (c *Cluster) kickAnnouncer() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Evicted queues the news that key left this daemon's store to its home
// (store.Remote): the home forgets this holder of it.
func (c *Cluster) Evicted(key []byte) {
	c.apart.forget(key)
	c.mu.Lock()
	if c.closed || len(c.pending) >= c.cfg.MaxPending {
		c.mu.Unlock()
		c.c.announceDropped.Add(1)
		return
	}
	c.pending = append(c.pending, entry{key: c.keys.Copy(key), tier: tierGone})
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// announcer sends what Stored queued, one batch at a time: each batch
// grouped by home, one exchange per home (per maxMsgKeys keys), the homes
// in parallel. It is the Cluster's goroutine, stopped by Close.
func (c *Cluster) announcer() {
	defer close(c.done)
	c.greet()
	close(c.greeted)
	// This run's index of the shards it is home of is empty: the members
	// it greeted are asked for their copies now, not a probe round later
	// (a member does not send them on its own when it sees a restart).
	c.pullUnwalked(c.view.Load())
	var batch []entry
	var lastWarn time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		c.mu.Lock()
		batch, c.pending = c.pending, batch[:0]
		c.sending = true
		c.mu.Unlock()
		if failed := c.announce(latestOnly(batch)); failed > 0 && time.Since(lastWarn) > 10*time.Second {
			lastWarn = time.Now()
			c.log.Warn("announcements to a home failed: those keys are found only here until re-announced",
				"keys", failed, "failed_total", c.c.announceFailed.Load())
		}
		clear(batch)
		c.mu.Lock()
		c.sending = false
		c.mu.Unlock()
	}
}

// latestOnly keeps, of the entries of batch with the same key, the last
// one queued (in place; the order of the rest kept). Each entry is the
// key's whole state here (held, with its tier, size and crc, or gone), so
// the last one says all; and the entries of one home may go in several
// messages at once (toHomes), which must not put a put's announcement
// after the removal or eviction that followed it.
//
// It finds repeats by the keys' 64-bit hashes (no allocation per key, as
// a map of the keys' names would make); a batch in which two keys share a
// hash goes by their names instead.
func latestOnly(batch []entry) []entry {
	if len(batch) < 2 {
		return batch
	}
	last := make(map[uint64]int, len(batch))
	for i, e := range batch {
		h := keyHash(e.key)
		if j, ok := last[h]; ok && !bytes.Equal(batch[j].key, e.key) {
			return latestOnlyByName(batch)
		}
		last[h] = i
	}
	if len(last) == len(batch) {
		return batch
	}
	return keepLast(batch, func(i int, key []byte) bool { return last[keyHash(key)] == i })
}

// latestOnlyByName is latestOnly by the keys' names.
func latestOnlyByName(batch []entry) []entry {
	last := make(map[string]int, len(batch))
	for i, e := range batch {
		last[string(e.key)] = i
	}
	return keepLast(batch, func(i int, key []byte) bool { return last[string(key)] == i })
}

// keepLast keeps the entries of batch isLast reports (in place, in order).
func keepLast(batch []entry, isLast func(i int, key []byte) bool) []entry {
	out := batch[:0]
	for i, e := range batch {
		if isLast(i, e.key) {
			out = append(out, e)
		}
	}
	clear(batch[len(out):])
	return out
}

// hashSeed seeds keyHash for this run.
var hashSeed = maphash.MakeSeed()

// keyHash is a key's 64-bit hash for latestOnly (a variable: a test makes
// keys share one).
var keyHash = func(key []byte) uint64 { return maphash.Bytes(hashSeed, key) }

// announce sends batch to the homes and returns how many keys failed.
func (c *Cluster) announce(batch []entry) int { return c.announceNoting(batch, nil) }

// announceNoting is announce, with failedAt (when not nil) told each home
// an announcement to which failed, under a lock of announceNoting's own.
func (c *Cluster) announceNoting(batch []entry, failedAt func(home string)) int {
	if len(batch) == 0 {
		return 0
	}
	keys := make([][]byte, len(batch))
	pos := make([]int, len(batch))
	for i, e := range batch {
		keys[i], pos[i] = e.key, i
	}
	var mu sync.Mutex
	failed := 0
	c.toHomes(keys, pos, homeMsg{
		kind:  kindAnnounceAges,
		older: kindAnnounce,
		per:   entryBytes(entry{}),
		build: func(ps []int) []byte {
			es := make([]entry, len(ps))
			for j, p := range ps {
				es[j] = batch[p]
			}
			return encodeAnnounce(es)
		},
		local: func(ps []int) {
			var gone [][]byte
			var ats []time.Time
			var refused []int
			now := time.Now()
			for _, p := range ps {
				e := batch[p]
				// This daemon's own copy, as its home: a tombstone
				// (handed over with the shard) or a removal just now
				// answers it as another holder's.
				added, removed, at := c.index(c.shardOf(e.key), e, c.self, c.peers.Epoch(), now)
				switch {
				case removed:
					gone, ats = append(gone, e.key), append(ats, at)
				case !added:
					refused = append(refused, p)
				}
				if removed || !added {
					batch[p].id = 0 // nothing to confirm
				}
			}
			if len(gone) > 0 {
				c.dropRemoved(c.self, gone, ats)
			}
			c.dropUnannounced(batch, refused)
			c.confirm(batch, ps)
		},
		got: func(ps []int, home string, body []byte, err error) {
			if err == nil {
				err = c.announced(home, batch, ps, body)
			}
			if err != nil {
				c.log.Debug("announcements to a home failed", "home", home, "keys", len(ps), "err", err)
				c.dropUnannounced(batch, ps)
				c.c.announceFailed.Add(uint64(len(ps)))
				mu.Lock()
				failed += len(ps)
				if failedAt != nil {
					failedAt(home)
				}
				mu.Unlock()
				return
			}
			c.c.announceSent.Add(uint64(len(ps)))
		},
	}, time.Now().Add(c.cfg.Timeout))
	return failed
}

// announced takes in a home's answer to announcements (the entries of
// batch at ps).
func (c *Cluster) announced(home string, batch []entry, ps []int, body []byte) error {
	d := newDec(body)
	refused := d.u32()
	n := d.count(len(ps))
	var gone [][]byte
	for i := 0; i < n && d.err == nil; i++ {
		j := int(d.u32())
		if d.err == nil && j >= len(ps) {
			d.fail("removed key %d of %d", j, len(ps))
		}
		if d.err == nil {
			gone = append(gone, batch[ps[j]].key)
			batch[ps[j]].id = 0 // answered removed: nothing to confirm
		}
	}
	var ages []uint32
	if d.err == nil && len(d.b) > 0 {
		// When each removal was: a value put here since stays.
		ages = make([]uint32, len(gone))
		for i := range ages {
			ages[i] = d.u32()
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	if refused > 0 {
		c.log.Debug("a home refused announcements (another view of the members, or its index is full)", "home", home,
			"refused", refused)
		c.dropUnannounced(batch, ps)
	}
	if len(gone) > 0 {
		// Removed while this daemon was not reached: its copies go now.
		c.dropRemoved(home, gone, atsOf(ages, time.Now()))
	}
	if refused == 0 {
		c.confirm(batch, ps)
	}
	return nil
}

// confirm makes the fetched copies among the entries of batch at ps that
// their home has indexed (those it did not have their id cleared) seen
// by readers here (store.Confirm).
func (c *Cluster) confirm(batch []entry, ps []int) {
	var keys [][]byte
	var ids []store.RecordID
	for _, p := range ps {
		if e := batch[p]; e.tier&tierFetched != 0 && e.id != 0 {
			keys, ids = append(keys, e.key), append(ids, e.id)
		}
	}
	if len(keys) > 0 {
		c.st.Confirm(keys, ids)
	}
}

// dropRemoved drops this daemon's copies of keys that their home (home)
// answered "removed" when they were announced: removals made while this
// daemon was not reached, at ats (zero: whatever is here now goes). A
// value put here after its key's removal stays, and is announced again
// (dropHere; the tombstone that answered is spent).
func (c *Cluster) dropRemoved(home string, keys [][]byte, ats []time.Time) {
	kept := c.dropHere(keys, ats)
	c.c.tombDrops.Add(uint64(len(keys) - len(kept)))
	c.log.Info("copies removed while this daemon was away dropped, as their home says", "home", home,
		"keys", len(keys)-len(kept), "put_since_kept", len(kept))
}

// dropUnannounced drops the fetched copies among the entries of batch at
// ps, whose announcement failed (or may have been refused): a reader's copy
// of a remote hit is a cache its home must know of, or a removal of the
// key would leave it behind. Values put here are kept (they are re-announced).
func (c *Cluster) dropUnannounced(batch []entry, ps []int) {
	var gone [][]byte
	for _, p := range ps {
		if batch[p].tier&tierFetched != 0 {
			gone = append(gone, batch[p].key)
		}
	}
	if len(gone) > 0 {
		c.log.Info("fetched copies whose home did not take their announcement dropped", "keys", len(gone))
		c.dropHere(gone, nil)
	}
}

// onAnnounce indexes a holder's announced keys of the shards this daemon
// is home of; it answers how many it refused, and which copies a removal
// passed by.
func (c *Cluster) onAnnounce(from string, epoch uint64, req []byte) ([]byte, error) {
	return c.announcedHere(from, epoch, req, false)
}

// onAnnounceAges is onAnnounce answered with the removals' ages
// (kindAnnounceAges).
func (c *Cluster) onAnnounceAges(from string, epoch uint64, req []byte) ([]byte, error) {
	return c.announcedHere(from, epoch, req, true)
}

// announcedHere indexes the announcements req of holder from (at epoch)
// and answers, with the removals' ages when aged.
func (c *Cluster) announcedHere(from string, epoch uint64, req []byte, aged bool) ([]byte, error) {
	es, err := decodeAnnounce(req)
	if err != nil {
		return nil, err
	}
	v := c.view.Load()
	refused := uint32(0)
	var removed, ages []uint32
	now := time.Now()
	for i, e := range es {
		s := c.shardOf(e.key)
		if c.homeFor(v, s) != c.self {
			refused++
			continue
		}
		added, gone, at := c.index(s, e, from, epoch, now)
		switch {
		case gone:
			removed = append(removed, uint32(i))
			if aged {
				ages = append(ages, ageOf(at, now))
			}
		case !added:
			refused++
		}
	}
	e := newEnc()
	e.u32(refused)
	e.u32(uint32(len(removed)))
	for _, i := range removed {
		e.u32(i)
	}
	for _, a := range ages {
		e.u32(a)
	}
	return e.bytes(), nil
}

// index records announcement e of holder id (at epoch) in shard s at now:
// a value it holds, or one it no longer holds (tierGone). added is false
// when the index is full; removed is true (and nothing added) when the
// copy announced is one a removal passed by: a tombstone names it, or it
// is a fetched copy of a key removed moments ago (read before the
// removal). The check and the add are one step against removeHere's
// (index.addUnless). at is when a tombstone's removal was (zero for a
// fetched copy's: it goes whatever the holder has put since).
func (c *Cluster) index(s int, e entry, id string, epoch uint64, now time.Time) (added, removed bool, at time.Time) {
	fetched := e.tier&tierFetched != 0
	e.tier &^= tierFetched
	if e.tier == tierGone {
		// Its tombstone stays a little (settled) for an announcement
		// of the copy sent before it went (a re-announcement walk) and
		// arriving after this.
		c.tombs.settle(e.key, id, now, c.cfg.Timeout)
		c.idx.dropHolder(s, e.key, id, 0)
		return true, false, time.Time{}
	}
	added, removed = c.idx.addUnless(s, e.key, Holder{ID: id, Epoch: epoch, Tier: e.tier, Size: e.size, CRC: e.crc}, func() bool {
		var gone bool
		if gone, at = c.tombs.removed(e.key, id, e.size, e.crc, now); gone {
			return true
		}
		return fetched && c.tombs.justRemoved(e.key, now)
	})
	return added, removed, at
}

// lookupHere answers keys from this daemon's index.
func (c *Cluster) lookupHere(keys [][]byte) []lookupAnswer {
	v := c.view.Load()
	as := make([]lookupAnswer, len(keys))
	for i, k := range keys {
		s := c.shardOf(k)
		if c.homeFor(v, s) != c.self {
			as[i].code = codeNotHome
			c.route.notHome.Add(1)
			continue
		}
		as[i].holders = c.idx.get(s, k, nil)
	}
	c.c.lookupsLocal.Add(uint64(len(keys)))
	return as
}

func (c *Cluster) onLookup(from string, epoch uint64, req []byte) ([]byte, error) {
	keys, err := decodeKeys(req)
	if err != nil {
		return nil, err
	}
	if len(keys) > maxMsgKeys {
		return nil, ErrMessage
	}
	c.asked(from, epoch, keys)
	return encodeLookupAnswer(c.lookupHere(keys)), nil
}

// removeHere is the home's removal of keys: it forgets them and has every
// holder but from remove its copy (the holders in parallel), and every
// member whose tombstone names a copy an earlier removal of the key did
// not drop. It returns the positions of the keys it is not home of (under
// its view), which it did not remove, and of those whose copy a holder
// that is a member still did not drop within half the timeout (busy or
// slow: it is asked again until it does, retryDrops). A holder that is
// not a member keeps its copy until it is back (tombstones).
func (c *Cluster) removeHere(from string, keys [][]byte) (notHome, kept []int) {
	v := c.view.Load()
	type dest struct {
		id    string
		epoch uint64
	}
	type drop struct {
		keys   [][]byte
		pos    []int // in keys
		copies []Holder
		// maybe marks the copies asked of a member the index does not
		// name as a holder (unwalked): one not dropped is not
		// tombstoned, since its value is unknown and may be a put made
		// after the removal, but the remove is not OK.
		maybe []bool
	}
	drops := map[dest]*drop{}
	now := time.Now()
	// Half the timeout: the remover, which waits for this home within the
	// whole timeout, hears back in time.
	deadline := now.Add(c.cfg.Timeout / 2)
	away := c.away()
	var awayTombs []tomb
	type unwalkedShard struct {
		ask  []string
		away bool
	}
	unwalked := map[int]unwalkedShard{}
	for i, k := range keys {
		s := c.shardOf(k)
		if c.homeFor(v, s) != c.self {
			notHome = append(notHome, i)
			continue
		}
		hs := c.idx.drop(s, k, func() { c.tombs.removedNow(k, now) })
		for _, h := range c.tombs.unsettled(k, v.members) {
			if !slices.ContainsFunc(hs, func(o Holder) bool { return o.ID == h.ID }) {
				h.Epoch = c.epochOf(h.ID)
				hs = append(hs, h)
			}
		}
		named := len(hs)
		u, ok := unwalked[s]
		if !ok {
			u.ask, u.away = c.unwalked(s, v, away, now)
			unwalked[s] = u
		}
		// The index may not name every copy yet (the members whose
		// re-announcement of the shard, which this daemon gained, is not
		// done): each is asked to drop whatever copy of the key it has,
		// as a holder is.
		for _, m := range u.ask {
			if !slices.ContainsFunc(hs, func(o Holder) bool { return o.ID == m }) {
				hs = append(hs, Holder{ID: m, Epoch: c.epochOf(m)})
			}
		}
		c.c.removeAsksUnnamed.Add(uint64(len(hs) - named))
		for j, h := range hs {
			if h.ID != from {
				d := dest{h.ID, h.Epoch}
				dr := drops[d]
				if dr == nil {
					dr = &drop{}
					drops[d] = dr
				}
				dr.keys, dr.pos, dr.copies = append(dr.keys, k), append(dr.pos, i), append(dr.copies, h)
				dr.maybe = append(dr.maybe, j >= named)
			}
		}
		if homeAway(v, s, away) || u.away {
			// A member away may hold a copy this index never named: it
			// goes when the member is back (puts there are noted while
			// it is away, so a value put after the removal stays).
			awayTombs = c.tombAway(awayTombs, k, hs[:named], away, now)
		}
	}
	if len(awayTombs) > 0 {
		c.awayRemovals.Event(slog.Any("away", away), slog.Int("tombstones", len(awayTombs)))
		c.keepTombs(v, awayTombs, time.Now().Add(c.cfg.Timeout/4))
	}
	c.c.removes.Add(uint64(len(keys)))
	var wg sync.WaitGroup
	var keptMu sync.Mutex
	for d, dr := range drops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d.id == c.self {
				c.dropHere(dr.keys, nil)
				return
			}
			pos := make([]int, len(dr.keys))
			for i := range pos {
				pos[i] = i
			}
			for _, ch := range chunks(dr.keys, pos, 2) {
				part := make([][]byte, len(ch))
				for i, p := range ch {
					part[i] = dr.keys[p]
				}
				_, err := c.exchangeBy(d.id, d.epoch, kindDrop, encodeKeys(part), deadline)
				if err == nil {
					c.tombs.settleAll(part, d.id, time.Now(), c.cfg.Timeout) // an earlier removal's, dropped now
					continue
				}
				// Remembered: when it re-announces them, it is told
				// they were removed; and kept by others too, before the
				// removal is answered, in case this daemon dies first.
				// A holder that is a member still (busy, or slow) is
				// asked again within the removal's time, and after it
				// in rounds (retryDrops), not left serving them until
				// it re-announces them.
				now := time.Now()
				ts := make([]tomb, 0, len(ch))
				maybe := 0
				for i, p := range ch {
					if dr.maybe[p] {
						maybe++
						continue
					}
					ts = append(ts, c.tombs.add(part[i], dr.copies[p], now))
				}
				if c.view.Load().has(d.id) && c.dropSoon(d.id, part, now, deadline) {
					continue
				}
				if len(ts) > 0 {
					c.keepTombs(v, ts, time.Now().Add(c.cfg.Timeout/4))
				}
				up := c.view.Load().has(d.id)
				if len(ts) > 0 {
					c.log.Info("a holder did not drop removed keys: asked again while it is a member, and when it re-announces them",
						"holder", d.id, "member", up, "keys", len(ts), "err", err)
				}
				if maybe > 0 {
					c.log.Info("a member did not take the drop of removed keys this home's index, being rebuilt, may lack: those removes are not OK",
						"member", d.id, "keys", maybe, "err", err)
				}
				keptMu.Lock()
				for _, p := range ch {
					if up || dr.maybe[p] {
						kept = append(kept, dr.pos[p])
					}
				}
				keptMu.Unlock()
				if up && len(ts) > 0 {
					c.retryDrops(d.id)
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(kept)
	kept = slices.Compact(kept)
	c.c.removesKept.Add(uint64(len(kept)))
	return notHome, kept
}

// dropSoon asks holder id, a member that did not take a removal's drop of
// keys (busy or slow; at, when its tombstones say the removal was), again
// until deadline, pausing dropRetryFirst, doubling, between tries; it
// reports whether the holder dropped them in time (dropped: their
// tombstones settled).
func (c *Cluster) dropSoon(id string, keys [][]byte, at, deadline time.Time) bool {
	ages := make([]uint32, len(keys))
	for pause := dropRetryFirst; time.Until(deadline) > pause+busyBackoff; pause = min(2*pause, dropRetryMost) {
		if !c.pause(pause) || !c.view.Load().has(id) {
			return false
		}
		age := ageOf(at, time.Now())
		for i := range ages {
			ages[i] = age
		}
		put, err := c.dropAged(id, keys, ages, deadline)
		if err == nil {
			c.c.dropsSoon.Add(uint64(c.dropped(id, keys, put)))
			return true
		}
	}
	return false
}

// homeAway reports whether shard s's home among every member known, those
// away included, is one of away: this daemon (v's home of s) stands in
// for it, and its index knows only what was announced here since.
func homeAway(v *view, s int, away []string) bool {
	best := func(ids []string) (top uint64) {
		for _, id := range ids {
			top = max(top, score(fnv1a(fnvOffset, []byte(id)), s))
		}
		return top
	}
	return len(away) > 0 && best(away) > best(v.members)
}

// tombAway appends to ts a tombstone of key for each member away (not
// up) that its index did not name as a holder (hs, those it had: they are
// asked to drop their copies, and tombstoned if they do not answer). It is
// for a key whose home is away (homeAway): a copy the members away hold is
// unknown here, and without a tombstone it would come back with them
// (their home's stale index naming it, their re-announcement indexed).
// The tombstone carries the size and crc32c of the value removed, as hs
// has them; with no holder known (this home's index still being rebuilt,
// or the remover's own copy forgotten already) it carries none and covers
// whatever value of key the member had when the key was removed
// (tomb.covers): one put there before the removal goes, one put after it
// stays (the drop says when the removal was: apart.go).
func (c *Cluster) tombAway(ts []tomb, key []byte, hs []Holder, away []string, now time.Time) []tomb {
	var known Holder
	if len(hs) > 0 {
		known = hs[0]
	}
	for _, m := range away {
		if !slices.ContainsFunc(hs, func(h Holder) bool { return h.ID == m }) {
			ts = append(ts, c.tombs.add(key, Holder{ID: m, Size: known.Size, CRC: known.CRC}, now))
		}
	}
	return ts
}

// msgKeysBound refuses a message of kind with n keys, more than a
// conforming sender puts in one (maxMsgKeys): the codec takes as many as
// the bytes hold, but the answer to that many may not fit an exchange.
func msgKeysBound(kind string, n int) error {
	if n > maxMsgKeys {
		return fmt.Errorf("%w: %s of %d keys (at most %d)", ErrMessage, kind, n, maxMsgKeys)
	}
	return nil
}

func (c *Cluster) onRemove(from string, epoch uint64, req []byte) ([]byte, error) {
	keys, err := decodeKeys(req)
	if err != nil {
		return nil, err
	}
	if err := msgKeysBound("remove", len(keys)); err != nil {
		return nil, err // before any removal: its answer would not fit an exchange
	}
	return encodeRemoveAnswer(c.removeHere(from, keys)), nil
}

// dropHere removes this daemon's copies of keys (a home asked), and tells
// their homes they are gone. A copy a client or a reader's hold pins here
// goes all the same: the store hides it from every reader at once, this
// daemon's clients too, and frees it with its last pin (store.RemoveHere),
// so it is never served nor re-announced again. A copy with a caller's
// I/O in flight (a copy out, a promotion) cannot go yet: it goes once the
// I/O has ended (dropLater), hidden from the other daemons meanwhile.
//
// ats, when set, are when each key's removal was (a tombstone's drop,
// told late; a zero one: whatever is here goes): a value put here after
// it, as noted (putsApart), is a new one and stays, announced again (its
// home may have heard of it only as removed). Such a drop names the
// record it removes (one put after this look is another, and stays) and
// then queues the key's state here for its home (store.Recheck), as for
// the keys kept. It returns the positions of the keys kept.
func (c *Cluster) dropHere(keys [][]byte, ats []time.Time) (kept []int) {
	defer func() { c.c.putsKept.Add(uint64(len(kept))) }()
	c.answers.drop(keys)
	drop := keys
	ids := make([]store.RecordID, len(keys))
	var named []store.Held // kept, dropped by record, or none here: their state now goes to their homes
	if ats != nil {
		drop = make([][]byte, 0, len(keys))
		n := 0
		for i, k := range keys {
			if ats[i].IsZero() {
				drop, ids[n] = append(drop, k), 0
				n++
				continue
			}
			id, ok := c.st.RecordHere(k)
			switch {
			case ok && c.apart.after(k, ats[i]):
				kept = append(kept, i)
				named = append(named, store.Held{Key: k})
			case ok:
				drop, ids[n] = append(drop, k), id
				n++
			default:
				named = append(named, store.Held{Key: k}) // none here now
			}
		}
		ids = ids[:n]
	}
	codes := make([]store.Code, len(drop))
	for len(drop) > 0 {
		n := min(len(drop), c.st.MaxKeysPerCall())
		if err := c.st.RemoveRecordsHere(drop[:n], ids[:n], codes[:n], nil); err != nil {
			c.log.Info("dropping removed keys failed", "keys", n, "err", err)
		}
		var later, gone [][]byte
		var laterIDs []store.RecordID
		for i, code := range codes[:n] {
			switch {
			case code == store.Busy:
				// Still here: its home forgets it all the same.
				gone = append(gone, drop[i])
				later, laterIDs = append(later, drop[i]), append(laterIDs, ids[i])
			case code == store.OK && ids[i] == 0:
				gone = append(gone, drop[i])
			case code == store.OK:
				named = append(named, store.Held{Key: drop[i]})
			}
		}
		for _, k := range gone {
			// Its home forgets this holder of it (the home that asked
			// has already; a keeper's or a tombstone's drop may come
			// while another is home).
			c.Evicted(k)
		}
		if len(later) > 0 {
			c.dropLater(later, laterIDs)
		}
		drop, codes, ids = drop[n:], codes[n:], ids[n:]
	}
	if len(named) > 0 {
		c.st.Recheck(named)
	}
	return kept
}

// dropLater removes the records ids of keys, which had a caller's I/O in
// flight when their removal came, once it has ended: asked again with a
// growing pause (at most a second) for as long as it takes, by one
// goroutine for all (dropper); meanwhile they are hidden from the other
// daemons (isGone). Only the record removed goes: a value put after the
// removal is another record, which stays. At most Config.MaxTombstones
// keys wait so; past that a key stays, logged.
func (c *Cluster) dropLater(keys [][]byte, ids []store.RecordID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	added, over := 0, 0
	c.holdMu.Lock()
	for i, k := range keys {
		_, ok := c.gone[string(k)]
		switch {
		case ok:
		case len(c.gone) >= c.cfg.MaxTombstones:
			over++
		default:
			c.gone[string(k)] = ids[i]
			added++
		}
	}
	c.goneN.Store(int32(len(c.gone)))
	start := added > 0 && !c.dropping
	if start {
		c.dropping = true
	}
	c.holdMu.Unlock()
	if over > 0 {
		c.c.goneOver.Add(uint64(over))
		c.log.Error("too many removed keys with I/O in flight here to track: these stay, served here and re-announced, until removed again",
			"keys", over, "max", c.cfg.MaxTombstones)
	}
	if added > 0 {
		c.log.Info("removed keys with I/O in flight here are hidden from the other daemons and go once it ends", "keys", added,
			"first", string(keys[0]))
	}
	if start {
		c.fetchWG.Add(1)
		go c.dropper()
	}
}

// dropper asks the store again to remove the records dropLater keeps
// until none is left, or the cluster closes.
func (c *Cluster) dropper() {
	defer c.fetchWG.Done()
	pause := 10 * time.Millisecond
	for {
		if !c.pause(pause) {
			return
		}
		pause = min(2*pause, time.Second)
		c.holdMu.Lock()
		keys := make([][]byte, 0, len(c.gone))
		ids := make([]store.RecordID, 0, len(c.gone))
		for k, id := range c.gone {
			keys = append(keys, []byte(k))
			ids = append(ids, id)
		}
		c.holdMu.Unlock()
		done := 0
		for len(keys) > 0 {
			n := min(len(keys), c.st.MaxKeysPerCall())
			codes := make([]store.Code, n)
			// The record named, or nothing: a key removed here since and
			// put again (even with the same bytes) is another record.
			if err := c.st.RemoveRecordsHere(keys[:n], ids[:n], codes, nil); err != nil {
				c.log.Info("dropping removed keys with I/O in flight here failed: asked again", "keys", n, "err", err)
			} else {
				c.holdMu.Lock()
				for i, code := range codes {
					if code != store.Busy && c.gone[string(keys[i])] == ids[i] {
						delete(c.gone, string(keys[i]))
						done++
					}
				}
				c.goneN.Store(int32(len(c.gone)))
				c.holdMu.Unlock()
			}
			keys, ids = keys[n:], ids[n:]
		}
		if done > 0 {
			c.log.Info("removed keys dropped once their I/O ended", "keys", done)
		}
		c.holdMu.Lock()
		if len(c.gone) == 0 {
			c.dropping = false
			c.holdMu.Unlock()
			return
		}
		c.holdMu.Unlock()
	}
}

// isGoneLocked reports whether key was removed while I/O was in flight on
// it here and is still here (holdMu held): hidden from the other daemons.
func (c *Cluster) isGoneLocked(key string) bool {
	_, ok := c.gone[key]
	return ok
}

// isGone is isGoneLocked taking holdMu.
func (c *Cluster) isGone(key []byte) bool {
	if c.goneN.Load() == 0 {
		return false
	}
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	return c.isGoneLocked(string(key))
}

// GonePinned is how many removed keys stay here until the I/O in flight
// on them ends (those pinned are hidden by the store: store.Stats.Hidden).
func (c *Cluster) GonePinned() int {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	return len(c.gone)
}

// onDrop drops the copies a home asks this holder to drop (kindDrop):
// whatever record of them is here, as an older release asks.
func (c *Cluster) onDrop(from string, epoch uint64, req []byte) ([]byte, error) {
	return c.dropAsked(from, req, false)
}

// onDropAges is onDrop for a tombstone's drop, which has the removals'
// ages (kindDropAges).
func (c *Cluster) onDropAges(from string, epoch uint64, req []byte) ([]byte, error) {
	return c.dropAsked(from, req, true)
}

// dropAsked drops the copies a drop from member from names (aged: the
// message must have the removals' ages) and answers which it kept.
func (c *Cluster) dropAsked(from string, req []byte, aged bool) ([]byte, error) {
	keys, ages, err := decodeDrop(req, aged)
	if err != nil {
		return nil, err
	}
	if err := msgKeysBound("drop", len(keys)); err != nil {
		return nil, err // before any drop: its answer would not fit an exchange
	}
	kept := c.dropHere(keys, atsOf(ages, time.Now()))
	if len(kept) > 0 {
		c.log.Info("values put here after their removal elsewhere kept, a late drop of the removed copies notwithstanding",
			"from", from, "keys", len(kept), "first", string(keys[kept[0]]))
	}
	return encodePositions(kept), nil
}

// greet opens a session with every member this daemon can dial (an empty
// lookup), so that members listed without an address learn this one's
// and every side knows the others' epochs before the first store call.
// A member that does not answer is left to the first call that needs it.
func (c *Cluster) greet() {
	var wg sync.WaitGroup
	for _, m := range c.view.Load().members {
		if m == c.self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.hello(m); err != nil {
				c.log.Debug("member not reached at start-up", "member", m, "err", err)
			}
		}()
	}
	wg.Wait()
}
