package store

import (
	"fmt"
	"sync"
	"testing"
)

// check verifies the store's bookkeeping against itself: table, lists and
// flags agree, counters match what the entries hold, and every L2 slot in
// use is owned by the entry that points at it. Nothing may be in flight.
func (s *Store) check(t testing.TB) {
	t.Helper()
	// held is the shard lock the walk holds, released before a failure
	// ends the test: the test's cleanup (Close) takes it too.
	var held *sync.Mutex
	fail := func(format string, args ...any) {
		t.Helper()
		if held != nil {
			held.Unlock()
			held = nil
		}
		t.Fatalf("store check: "+format, args...)
	}
	var keys, l1keys, l2keys, pins, reserved, l1bytes, dirty uint64
	owners := map[uint32]uint64{}
	for si := range s.shards {
		sh := &s.shards[si]
		sh.mu.Lock()
		held = &sh.mu
		inTable := uint32(0)
		for _, slot := range sh.table {
			if slot == 0 {
				continue
			}
			inTable++
			idx := uint32(slot) - 1
			e := sh.ent(idx)
			if e.state == stFree {
				fail("shard %d: table names free entry %d", si, idx)
			}
			if got, ok := sh.find(e.hash, sh.keyOf(e)); !ok || got != idx {
				fail("shard %d: entry %d not found by its own key", si, idx)
			}
		}
		if inTable != sh.count {
			fail("shard %d: %d in table, count %d", si, inTable, sh.count)
		}
		walk := func(name string, l *list, second bool, flag uint16, ok func(e *entry) bool) {
			n := uint32(0)
			prev := nilIdx
			for idx := l.head; idx != nilIdx; {
				e := sh.ent(idx)
				p, nx := sh.links(idx, second)
				if *p != prev {
					fail("shard %d %s: broken back link at %d", si, name, idx)
				}
				if e.flags&flag == 0 || !ok(e) {
					fail("shard %d %s: entry %d (%q) state %d flags %#x pins %d should not be listed",
						si, name, idx, sh.keyOf(e), e.state, e.flags, e.pins)
				}
				prev, idx = idx, *nx
				n++
			}
			if n != l.n || l.tail != prev {
				fail("shard %d %s: walked %d, count %d", si, name, n, l.n)
			}
		}
		walk("lru", &sh.lru, false, fInLRU, func(e *entry) bool {
			return e.state == stReady && e.flags&fL1 != 0 && e.pins == 0
		})
		walk("l2", &sh.l2lru, true, fInL2LRU, func(e *entry) bool { return e.state == stReady && e.flags&fL2 != 0 })
		walk("dirty", &sh.dirty, true, fInDirty, func(e *entry) bool {
			return e.state == stReady && e.flags&(fDirty|fWB|fTomb|fL1) == fDirty|fL1
		})
		var flagged [3]uint32
		for idx := uint32(0); idx < sh.nents; idx++ {
			e := sh.ent(idx)
			if e.state == stFree {
				continue
			}
			for i, f := range []uint16{fInLRU, fInL2LRU, fInDirty} {
				if e.flags&f != 0 {
					flagged[i]++
				}
			}
			if e.io != 0 || e.flags&(fPromote|fWB) != 0 {
				fail("entry %q has I/O in flight (io %d, flags %#x)", sh.keyOf(e), e.io, e.flags)
			}
			pins += uint64(e.pins)
			switch e.state {
			case stReady:
				keys++
				if e.flags&fL1 != 0 {
					l1keys++
					l1bytes += s.blockBytes(uint64(e.size))
					if e.pins == 0 && e.flags&fInLRU == 0 {
						fail("resident unpinned %q is not on the LRU list", sh.keyOf(e))
					}
				}
				if e.flags&fL2 != 0 {
					l2keys++
					owners[e.l2] = ref{uint32(si), idx, e.gen}.packed()
				}
				if e.flags&(fDirty|fTomb) == fDirty {
					dirty++
				}
				if e.flags&(fL1|fL2) == 0 {
					fail("%q is in neither tier", sh.keyOf(e))
				}
			case stReserved:
				reserved++
				l1bytes += s.blockBytes(uint64(e.size))
			default:
				fail("%q in state %d with nothing in flight", sh.keyOf(e), e.state)
			}
		}
		for idx, n := range sh.others {
			if e := sh.ent(idx); n == 0 || e.state == stFree || n > e.pins {
				fail("shard %d: entry %d counts %d pins for others of its %d (state %d)", si, idx, n, e.pins, e.state)
			}
		}
		if flagged[0] != sh.lru.n || flagged[1] != sh.l2lru.n || flagged[2] != sh.dirty.n {
			fail("shard %d: list flags %v, lists %d %d %d", si, flagged, sh.lru.n, sh.l2lru.n, sh.dirty.n)
		}
		held = nil
		sh.mu.Unlock()
	}
	st := s.Stats()
	got := fmt.Sprint(st.Keys, st.L1Keys, st.L2Keys, st.Pins, st.Reserved, st.L1Bytes, st.Dirty)
	want := fmt.Sprint(keys, l1keys, l2keys, pins, reserved, l1bytes+st.QuarantinedBlocks*0, dirty)
	if got != want && st.QuarantinedBlocks == 0 {
		fail("stats keys/l1/l2/pins/reserved/l1bytes/dirty = %s, entries say %s", got, want)
	}
	if t2 := s.l2; t2 != nil {
		t2.mu.Lock()
		defer t2.mu.Unlock()
		live := 0
		var used, quar uint64
		for ri := range t2.regions {
			r := &t2.regions[ri]
			if r.class < 0 {
				continue
			}
			n := uint32(0)
			for j, o := range r.owner {
				if o == noOwner {
					continue
				}
				n++
				if o == quarOwner {
					quar++
					continue
				}
				id := t2.slotID(int32(ri), uint32(j))
				if owners[id] != o {
					fail("slot %d owned by %#x, entry map says %#x", id, o, owners[id])
				}
			}
			used += uint64(n) * t2.g.slotSize(int(r.class))
			if n != r.live {
				fail("region %d: %d owners, live %d", ri, n, r.live)
			}
			seen := map[uint32]bool{}
			for _, j := range r.free {
				if seen[j] || r.owner[j] != noOwner || j >= r.bump {
					fail("region %d: bad free slot %d", ri, j)
				}
				seen[j] = true
			}
			live += int(n)
		}
		if uint64(live) != uint64(len(owners))+quar || quar != t2.quarantined {
			fail("%d slots live, %d entries on L2, %d quarantined (counted %d)", live, len(owners), quar, t2.quarantined)
		}
		if used != t2.used {
			fail("L2 used %d, live slots make %d", t2.used, used)
		}
		if n := t2.inflight.Load(); n != 0 {
			fail("%d tasks in flight", n)
		}
	}
}
