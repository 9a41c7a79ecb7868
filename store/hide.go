package store

import (
	"bytes"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// Removed while pinned. A key removed on another host (RemoveHere: its
// home asks this one to drop its copy) must be gone for every client at
// once, this host's too; yet a client here may hold pins on it, reading
// its block in place, and a pinned block is never freed under its reader.
// So the entry is hidden instead (stHidden): taken out of the shard's
// table, so that no lookup finds it again (Get, Read, Exists,
// LookupPrefix, Pin, the queue's calls, promotion, Holdings and List all
// find the key absent), with its pool block kept for the pins there are.
// The last pin to go (Unpin, a lease's end, a session's Close) frees the
// block and the entry; no one has to ask again.
//
// Its key is free meanwhile: a put of it makes another entry, visible as
// any new value is. The new value wins for new readers, and the old pins
// keep the old bytes. An Unpin of the key drops a pin of the session's on
// a hidden entry of it first (those were all taken before the new value
// existed), then one on the visible entry.
//
// Crash safety: an entry is hidden only once its L2 header is zeroed (the
// removal's invalidation has ended: RemoveHere returns after it), and its
// L1 journal record is dropped when it is hidden, so that a daemon killed
// while the pins remain does not find the key again when it starts.
//
// A local Remove of a pinned key still answers FAILED_PRECONDITION: the
// client that removes a key it pins (or another client's) is told, as it
// always was. Hiding is for removals that come from another host, where
// no one here could be told.

// RecordID names one record of a key stored here: the same key removed
// and put again is another record, with another RecordID, even with the
// same bytes. 0 names none.
type RecordID uint64

func (r ref) id() RecordID { return RecordID(uint64(r.idx)<<32 | uint64(r.gen)) }

// dropEntry ends entry idx, whose key is gone (its L2 header zeroed, or it
// never had one): off every list, its block freed and its slot reused, or,
// while pins hold it, hidden until the last goes. The caller has counted
// the key out of the visible keys. sh.mu is held.
func (s *Store) dropEntry(sh *shard, idx uint32) error {
	e := sh.ent(idx)
	sh.unlistAll(idx)
	if e.pins > 0 {
		s.hide(sh, idx)
		return nil
	}
	var err error
	if e.flags&fL1 != 0 {
		err = s.freeBlock(e.l1, e.size)
	}
	sh.remove(idx)
	return err
}

// hide makes entry idx, pinned and no longer on L2, a hidden one. sh.mu is
// held.
func (s *Store) hide(sh *shard, idx uint32) {
	e := sh.ent(idx)
	if invariants.Enabled && (e.io != 0 || e.flags&(fWB|fPromote) != 0) {
		panic("store: invariant: hiding an entry with I/O in flight")
	}
	if e.flags&fL1 != 0 && s.jr != nil {
		s.jr.drop(e.l1) // a restart must not find the value again
	}
	sh.unindex(idx)
	e.state = stHidden
	e.flags &= fL1 | fCRC
	sh.hidden = append(sh.hidden, idx)
	s.c.hidden.Add(1)
}

// freeHidden frees hidden entry idx, whose last pin went. sh.mu is held.
func (s *Store) freeHidden(sh *shard, idx uint32) {
	e := sh.ent(idx)
	if e.flags&fL1 != 0 {
		if err := s.freeBlock(e.l1, e.size); err != nil {
			s.log.Error("store: free the block of a removed value whose last pin went", "err", err)
		}
	}
	for i, h := range sh.hidden {
		if h == idx {
			last := len(sh.hidden) - 1
			sh.hidden[i] = sh.hidden[last]
			sh.hidden = sh.hidden[:last]
			break
		}
	}
	sh.release(idx)
	s.c.hidden.Add(^uint64(0))
}

// hiddenHold returns the session's hold on a hidden entry of key k, if it
// has one. k's shard is locked (sh.mu), and ss.mu is held.
func (ss *Session) hiddenHold(k []byte) (ref, bool) {
	_, sh, si := ss.s.hash(k)
	for _, idx := range sh.hidden {
		e := sh.ent(idx)
		r := ref{si, idx, e.gen}
		if _, ok := ss.holds[r]; ok && bytes.Equal(sh.keyOf(e), k) {
			return r, true
		}
	}
	return ref{}, false
}
