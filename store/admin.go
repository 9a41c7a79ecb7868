package store

import (
	"bytes"
	"fmt"
	"slices"
)

// KeyInfo describes one stored key, for operators (tcctl stat, ls).
type KeyInfo struct {
	Key  []byte // a copy
	Size uint64 // value length
	InL1 bool   // the value is in the pool
	InL2 bool   // the value is on L2
	Pins uint32 // pins and active leases, over all sessions
	// Dirty: in L1 only, a writeback owed; Tombstone: that writeback gave
	// up.
	Dirty, Tombstone bool
}

func (sh *shard) info(e *entry) KeyInfo {
	return KeyInfo{
		Key: bytes.Clone(sh.keyOf(e)), Size: uint64(e.size), InL1: e.flags&fL1 != 0, InL2: e.flags&fL2 != 0,
		Pins: e.pins, Dirty: e.flags&(fDirty|fTomb) == fDirty, Tombstone: e.flags&fTomb != 0,
	}
}

// MaxKeysPerCall is the most keys one call may carry (Config.MaxKeysPerCall).
func (s *Store) MaxKeysPerCall() int { return s.cfg.MaxKeysPerCall }

// ReserveBytes is what a reservation of a value of size bytes counts
// against a session's Config.MaxSessionReserved (its block's size), and
// limit that bound: a caller that reserves many values in one session
// (the store across hosts landing a holder's values) sizes its batches
// by them.
func (s *Store) ReserveBytes(size uint64) (n, limit uint64) {
	return s.blockBytes(size), s.cfg.MaxSessionReserved
}

// PinBytes is what a Pin of keys by a session that holds nothing pinned
// would count against its Config.MaxSessionPinned: the block bytes of the
// distinct values of keys stored here (a key that is not counts nothing;
// such a Pin fails). It changes nothing. A caller that bounds the pins of
// many sessions in all (a tenant's retention handles and placement leases,
// a session each) reserves it before it pins, and settles on the
// session's PinnedBytes after: a put or removal in between may change it.
func (s *Store) PinBytes(keys [][]byte) uint64 {
	if !s.enter() {
		return 0
	}
	defer s.exit()
	var seen map[ref]struct{}
	var n uint64
	for _, k := range keys {
		sh, r, _, err := s.lookup(k)
		if err != nil {
			continue
		}
		size := sh.ent(r.idx).size
		sh.mu.Unlock()
		if len(keys) > 1 {
			if seen == nil {
				seen = make(map[ref]struct{}, len(keys))
			}
			if _, dup := seen[r]; dup {
				continue
			}
			seen[r] = struct{}{}
		}
		n += s.blockBytes(uint64(size))
	}
	return n
}

// Stat describes a stored key (ErrNotFound when it is not). Like Exists, it
// changes nothing. With the store across hosts (SetRemote), a key stored
// only on other hosts is described as its home knows it: its size, on
// neither tier here.
func (s *Store) Stat(key []byte) (KeyInfo, error) {
	if !s.validKey(key) {
		return KeyInfo{}, ErrBadKey
	}
	if !s.enter() {
		return KeyInfo{}, ErrClosed
	}
	defer s.exit()
	if k, err := s.statHere(key); err == nil || s.rem() == nil {
		return k, err
	}
	size, ok := s.rem().SizeOf(key)
	if !ok {
		return KeyInfo{}, ErrNotFound
	}
	return KeyInfo{Key: bytes.Clone(key), Size: size}, nil
}

func (s *Store) statHere(key []byte) (KeyInfo, error) {
	h, sh, _ := s.hash(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx, ok := sh.find(h, key)
	if !ok || sh.ent(idx).state != stReady || sh.ent(idx).flags&fUnseen != 0 {
		return KeyInfo{}, ErrNotFound
	}
	return sh.info(sh.ent(idx)), nil
}

// List returns up to max stored keys that start with prefix (all keys for
// an empty prefix), sorted, and whether there were more. It walks the whole
// index one shard at a time, for operators; it is not a hot call and it
// allocates. max is at most 100000.
func (s *Store) List(prefix []byte, max int) ([]KeyInfo, bool, error) {
	return s.ListAfter(prefix, nil, max)
}

// ListAfter is List of the keys that sort after after (all of them for an
// empty after): a listing longer than one answer goes on from its last key.
func (s *Store) ListAfter(prefix, after []byte, max int) ([]KeyInfo, bool, error) {
	if max < 1 || max > 100000 {
		return nil, false, fmt.Errorf("%w: max %d (want 1..100000)", ErrBadCall, max)
	}
	if !s.enter() {
		return nil, false, ErrClosed
	}
	defer s.exit()
	var out []KeyInfo
	more := false
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for idx := uint32(0); idx < sh.nents; idx++ {
			e := sh.ent(idx)
			if e.state != stReady || e.flags&fUnseen != 0 || !bytes.HasPrefix(sh.keyOf(e), prefix) ||
				len(after) > 0 && bytes.Compare(sh.keyOf(e), after) <= 0 {
				continue
			}
			out = append(out, sh.info(e))
		}
		sh.mu.Unlock()
		// Keep the max smallest keys seen so far, so the result is the
		// first max keys in order whatever the shard layout.
		if len(out) > max {
			slices.SortFunc(out, func(a, b KeyInfo) int { return bytes.Compare(a.Key, b.Key) })
			out, more = out[:max], true
		}
	}
	slices.SortFunc(out, func(a, b KeyInfo) int { return bytes.Compare(a.Key, b.Key) })
	return out, more, nil
}
