package store

import "github.com/tensorcast/tensorcast/xfer"

// The maintenance loop is the store's one goroutine. Each wake-up (a kick:
// a commit, an allocation over the high watermark, a finished writeback or
// eviction, a retry or a pass of the ghost sweep coming due, a task freed
// while callers' keys wait for one) runs one round: tasks to the waiting
// keys (wait.go), due retries back in line, L1 eviction down to the low
// watermark, L2 eviction, a pass of the ghost sweep when one is due
// (sweep.go), then writebacks up to WritebackDepth in flight. A round that
// can make no progress ends; the next kick starts another, so the loop
// never spins.

// retryRec is a failed writeback waiting for its delay.
type retryRec struct {
	r  ref
	at int64
}

// maintScratch is the loop's own reusable memory.
type maintScratch struct {
	due   []retryRec
	batch []*ioTask
	// the tasks given to waiting keys (wait.go), by kind
	wput, wread, winval []*ioTask
	sub                 []*ioTask
	xts                 []*xfer.Task
	owners              []uint64
	from                uint32
}

func (s *Store) maintain() {
	defer close(s.done)
	var m maintScratch
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		}
		if s.l2 != nil {
			s.serveWaiting(&m) // first: the callers' keys before the store's own work
		}
		s.runRetries(&m)
		s.evictL1()
		if s.l2 != nil {
			s.l2.flushReady(&m.batch, &m.xts)
			s.evictL2(&m)
			s.sweepGhosts(&m)
			s.writeback(&m)
		}
	}
}

// addRetry schedules entry r's writeback again at at. Any lock may be held
// (retryMu is a leaf).
func (s *Store) addRetry(r ref, at int64) {
	s.retryMu.Lock()
	s.retries = append(s.retries, retryRec{r: r, at: at})
	if s.retryAt == 0 || at < s.retryAt {
		s.armRetry(at)
	}
	s.retryMu.Unlock()
	s.ev.fire()
}

// armRetry arms the retry timer for at. retryMu is held.
func (s *Store) armRetry(at int64) {
	if s.retryTimer != nil {
		s.retryTimer.Stop()
	}
	s.retryAt = at
	s.retryTimer = s.clock.AfterFunc(durationNS(max(at-s.now(), 0)), s.kick)
}

// runRetries puts writebacks whose delay has passed back on their shard's
// dirty list.
func (s *Store) runRetries(m *maintScratch) {
	now := s.now()
	s.retryMu.Lock()
	n := 0
	for n < len(s.retries) && s.retries[n].at <= now {
		n++
	}
	m.due = append(m.due[:0], s.retries[:n]...)
	k := copy(s.retries, s.retries[n:])
	clear(s.retries[k:])
	s.retries = s.retries[:k]
	if n > 0 {
		s.retryAt = 0
		if k > 0 {
			s.armRetry(s.retries[0].at)
		}
	}
	s.retryMu.Unlock()
	for _, d := range m.due {
		sh := &s.shards[d.r.sh]
		sh.mu.Lock()
		e := sh.ent(d.r.idx)
		if e.gen == d.r.gen && e.state == stReady && e.flags&(fDirty|fWB|fTomb|fInDirty) == fDirty {
			sh.dirtyAdd(d.r.idx)
		}
		sh.mu.Unlock()
	}
}

// evictL1 brings the store's pool use under the low watermark when it is
// over the high one.
func (s *Store) evictL1() {
	capacity := float64(s.cfg.L1Capacity)
	if float64(s.l1Bytes.Load()) <= s.cfg.HighWatermark*capacity {
		return
	}
	low := uint64(s.cfg.LowWatermark * capacity)
	for {
		v := s.l1Bytes.Load()
		if v <= low || s.evict(v-low, 256) == 0 {
			return
		}
	}
}

// evict frees at least need bytes of pool if it can, looking at up to scan
// entries from the cold end of each shard's L1 LRU list. A victim is
// unpinned with no I/O in flight; a clean one (on L2) leaves L1 only, one
// that cannot be written back (no L2, its writeback gave up, or an unseen
// fetched copy) leaves the store. It returns the bytes freed. No shard lock may be held.
//
// What it takes from each shard is in proportion to the shard's list: the
// coldest 1/64 of every shard, then the next 1/32, and so on, so that what
// goes is close to the coldest of the whole store (keys hash evenly over
// the shards, so a shard's coldest entries are as old as its list is
// long). Taking the coldest entry of every shard alike would evict a
// value just put into a shard that holds few while older ones stay in
// others.
func (s *Store) evict(need uint64, scan int) uint64 {
	var freed uint64
	n := uint32(len(s.shards))
	start := s.evictFrom.Add(1)
	for frac := 64; frac >= 1 && freed < need; frac /= 2 {
		for k := uint32(0); k < n && freed < need; k++ {
			sh := &s.shards[(start+k)&(n-1)]
			sh.mu.Lock()
			quota := min(int(sh.lru.n)/frac, scan)
			idx := sh.lru.tail
			for c := 0; c < quota && idx != nilIdx && freed < need; c++ {
				e := sh.ent(idx)
				prev := e.prev
				freed += s.evictOne(sh, idx, e)
				idx = prev
			}
			sh.mu.Unlock()
		}
	}
	return freed
}

// evictOne evicts entry idx of sh if it may go and returns the pool bytes
// that freed (0 when it stays). sh.mu is held.
func (s *Store) evictOne(sh *shard, idx uint32, e *entry) uint64 {
	if e.pins != 0 || e.io != 0 || e.flags&fWB != 0 {
		return 0
	}
	switch {
	case e.flags&fL2 != 0:
		if err := s.freeBlock(e.l1, e.size); err != nil {
			s.log.Error("store: evict", "err", err)
		}
		e.flags &^= fL1
		sh.lruDel(idx)
		s.c.l1Keys.Add(^uint64(0))
		s.c.evictL1.Add(1)
		return s.blockBytes(uint64(e.size))
	case s.l2 == nil || e.flags&(fTomb|fUnseen) != 0:
		if e.flags&fTomb != 0 {
			s.c.droppedUnwritten.Add(1)
		}
		if err := s.freeBlock(e.l1, e.size); err != nil {
			s.log.Error("store: evict", "err", err)
		}
		freed := s.blockBytes(uint64(e.size))
		s.evicted(sh, idx)
		sh.unlistAll(idx)
		sh.remove(idx)
		s.c.keys.Add(^uint64(0))
		s.c.l1Keys.Add(^uint64(0))
		s.c.evictL1.Add(1)
		return freed
	}
	return 0
}

// evictL2 frees L2 slots: by LRU when usage is over the high watermark,
// and a whole region when a slot size found no room at all.
func (s *Store) evictL2(m *maintScratch) {
	t := s.l2
	t.mu.Lock()
	used := t.used - t.evicting
	high := uint64(t.cfg.HighWatermark * float64(t.capacity))
	low := uint64(t.cfg.LowWatermark * float64(t.capacity))
	starving := -1
	for c := range t.classes {
		if t.classes[c].starving {
			t.classes[c].starving = false
			starving = c
		}
	}
	t.mu.Unlock()
	batch := m.batch[:0]
	if used > high {
		batch = s.evictL2LRU(used-low, batch)
	}
	if starving >= 0 {
		batch = s.evictRegion(starving, m, batch)
	}
	m.batch = batch
	if len(batch) > 0 {
		t.startInvals(batch, &m.xts) // a violation has failed the tasks already
		clear(batch)
	}
}

// evictL2LRU starts invalidations of L2-only, unpinned entries from the
// cold end of each shard's L2 list, for about need bytes.
func (s *Store) evictL2LRU(need uint64, batch []*ioTask) []*ioTask {
	var got uint64
	n := uint32(len(s.shards))
	start := s.evictFrom.Add(1)
	for k := uint32(0); k < n && got < need; k++ {
		si := (start + k) & (n - 1)
		sh := &s.shards[si]
		sh.mu.Lock()
		idx := sh.l2lru.tail
		for c := 0; c < 256 && idx != nilIdx && got < need; c++ {
			prev := sh.ent(idx).prev2
			b, it, st := s.evictL2One(sh, si, idx)
			if st == evNoTask {
				sh.mu.Unlock()
				return batch // the next kick continues
			}
			if st == evStarted {
				got += b
				batch = append(batch, it)
			}
			idx = prev
		}
		sh.mu.Unlock()
	}
	return batch
}

// Outcomes of evictL2One.
const (
	evSkipped = iota // not evictable now
	evStarted
	evNoTask
)

// evictL2One starts the eviction of entry idx from L2 if it is L2-only and
// unpinned with nothing in flight, and returns its slot's bytes and task.
// sh.mu is held.
func (s *Store) evictL2One(sh *shard, si, idx uint32) (uint64, *ioTask, int) {
	t := s.l2
	e := sh.ent(idx)
	if e.state != stReady || e.flags&(fL1|fPromote|fWB) != 0 || e.flags&fL2 == 0 || e.pins != 0 || e.io != 0 {
		return 0, nil, evSkipped
	}
	it := t.getTask(true)
	if it == nil {
		return 0, nil, evNoTask
	}
	e.state = stDropping
	e.flags |= fBgDrop
	sh.unlistAll(idx)
	e.io++
	it.kind, it.r, it.slot = kInval, ref{si, idx, e.gen}, e.l2
	t.mu.Lock()
	_, c, _, _ := t.slotAt(e.l2)
	b := t.g.slotSize(c)
	t.evicting += b
	t.mu.Unlock()
	return b, it, evStarted
}

// evictRegion empties, as far as it can, the region of another slot size
// with the fewest live slots, so that class c can be given one. Only
// L2-only, unpinned entries go; a region holding others stays. A region
// with a slot quarantined for good never empties and is passed over: the
// region with the fewest live slots is often such a one, and choosing it
// left c without a region for as long as the store ran.
func (s *Store) evictRegion(c int, m *maintScratch, batch []*ioTask) []*ioTask {
	t := s.l2
	t.mu.Lock()
	best := int32(noRegion)
	for i := range t.regions {
		r := &t.regions[i]
		if r.state == regOpen && int(r.class) != c && r.waitHead == -1 && r.stuck == 0 &&
			(best == noRegion || r.live < t.regions[best].live) {
			best = int32(i)
		}
	}
	m.owners = m.owners[:0]
	if best != noRegion {
		r := &t.regions[best]
		for j, o := range r.owner {
			if o < quarOwner {
				m.owners = append(m.owners, o, uint64(t.slotID(best, uint32(j))))
			}
		}
	}
	t.mu.Unlock()
	for i := 0; i+1 < len(m.owners); i += 2 {
		o, slot := m.owners[i], uint32(m.owners[i+1])
		si, idx := uint32(o>>32), uint32(o)
		sh := &s.shards[si]
		sh.mu.Lock()
		st := evSkipped
		if idx < sh.nents && sh.ent(idx).flags&fL2 != 0 && sh.ent(idx).l2 == slot {
			var it *ioTask
			_, it, st = s.evictL2One(sh, si, idx)
			if st == evStarted {
				batch = append(batch, it)
			}
		}
		sh.mu.Unlock()
		if st == evNoTask {
			break
		}
	}
	return batch
}

// writeback dispatches writebacks of dirty entries, oldest first per
// shard, until WritebackDepth are in flight or L2 has no room.
func (s *Store) writeback(m *maintScratch) {
	t := s.l2
	depth := int32(s.cfg.WritebackDepth)
	n := uint32(len(s.shards))
	for {
		room := depth - t.wbInflight.Load()
		if room <= 0 {
			return
		}
		batch := m.batch[:0]
		noTask := false
		m.from++
		for k := uint32(0); k < n && int32(len(batch)) < room && !noTask; k++ {
			si := (m.from + k) & (n - 1)
			sh := &s.shards[si]
			sh.mu.Lock()
			for taken := 0; taken < 8 && int32(len(batch)) < room && sh.dirty.tail != nilIdx; taken++ {
				it := t.getTask(true)
				if it == nil {
					noTask = true
					break
				}
				idx := sh.dirty.tail
				e := sh.ent(idx)
				sh.dirtyDel(idx)
				e.flags |= fWB
				e.io++
				it.kind, it.r, it.l1, it.size = kWB, ref{si, idx, e.gen}, e.l1, e.size
				batch = append(batch, it)
			}
			sh.mu.Unlock()
		}
		m.batch = batch
		if len(batch) == 0 {
			return
		}
		t.wbInflight.Add(int32(len(batch)))
		t.l2Short.Store(false)
		t.startWrites(batch, &m.sub, &m.xts) // a violation has failed the tasks already
		clear(batch)
		if noTask || t.l2Short.Load() {
			return
		}
	}
}
