package store

// Fetched copies, unseen until their home took them. The store across
// hosts keeps a copy of a value it fetched from another host (a remote
// hit kept near its readers). The key's home must know of that copy before
// anyone reads it here: a removal the home takes before the copy's
// announcement arrives cannot name it, and until the announcement arrives
// (and is answered "removed") the copy would be served as if the removal
// had never been. So a fetched copy (Session.CommitFetched) is stored
// unseen (fUnseen):
//   - no reader here finds it: Get, Read, Exists, LookupPrefix, Pin, the
//     queue's calls, another daemon's read (ReadHere, a hold's pin),
//     Holdings, List and Stat take the key for absent. The fetching call
//     alone answers from it (landGet, landRead, and LookupPrefix's pin of
//     what it fetched), since that call asked the key's home or holder
//     itself;
//   - nothing makes it outlive the daemon: it has no L1 journal record and
//     owes no writeback, so a restart never finds a copy its home may not
//     know of; eviction drops it like any value that cannot go to L2;
//   - what would hold it here treats it as held: a removal (Remove,
//     RemoveHere), HeldHere and RecordHere find it.
//
// Confirm makes it seen (and journaled, and owed a writeback) once the
// home has indexed it: named by its record, so that a later copy of the
// key, whose own announcement is still on its way, stays unseen. A copy
// the home answers "removed", or whose announcement fails, is dropped by
// the store across hosts instead. A second get of the key meanwhile misses
// here and asks again (a fetch finding the unseen copy stored answers from
// it, since that fetch asked the home or a holder).

// Confirm makes the unseen fetched copies named by ids (keys[i]'s record
// ids[i], from Remote.Stored) seen by readers here. A record removed,
// evicted or replaced since is left as it is.
func (s *Store) Confirm(keys [][]byte, ids []RecordID) {
	if len(keys) != len(ids) || !s.enter() {
		return
	}
	defer s.exit()
	dirty := false
	for i, k := range keys {
		sh, r, found, err := s.lock(k)
		if err != nil {
			continue
		}
		e := sh.ent(r.idx)
		if !found || r.id() != ids[i] || e.state != stReady || e.flags&fUnseen == 0 {
			sh.mu.Unlock()
			continue
		}
		e.flags &^= fUnseen
		s.c.confirmed.Add(1)
		if s.l2 != nil {
			e.flags |= fDirty
			sh.dirtyAdd(r.idx)
			s.c.dirtyOwed.Add(1)
			dirty = true
		}
		if e.flags&fL1 != 0 {
			s.journal(sh, r.idx, e.crc) // announced: e.crc is known (fCRC)
		}
		sh.mu.Unlock()
	}
	if dirty {
		s.kick()
	}
}
