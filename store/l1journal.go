package store

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"
)

// The L1 journal lets a restarted daemon find its L1 values again. The pool
// memfd outlives the daemon in systemd's file descriptor store, and so does
// the journal: a second memfd of the daemon's own (never mapped by clients)
// holding one fixed-size record per value in L1, written when the value
// becomes visible and invalidated before its block is freed. A record says
// which key's value lies where in the pool, how long it is and its crc32c.
//
// A record is valid only when its check word matches the rest of it, and
// the check word is stored last (atomically) and cleared first: a record
// half written when the daemon died is not valid, and a block whose record
// was cleared may be reused. A value being written (reserved, or a put in
// flight) has no record, so it is dropped at the restart, never served.
// At start-up each valid record's value is checked against its crc32c, the
// allocator claims the blocks that pass (newest record first, so a block
// can never be given twice), and the index takes their keys; everything
// else in the pool is free.
//
// Layout: a 4096-byte header, then records of l1RecSize bytes.
//
//	header  0 magic u64, 8 version u32, 12 record size u32, 16 records u64,
//	        24 pool size u64, 32 min block u64, 40 max block u64,
//	        48 pool dev u64, 56 pool inode u64, 64 crc32c of [0, 64) u32
//	record  0 check u32 (crc32c of [4, 32+keyLen) xor l1RecMagic; 0: none)
//	        4 keyLen u16, 6 0 u16, 8 seq u64, 16 pool offset u64,
//	        24 value length u32, 28 value crc32c u32, 32 key [256]

const (
	l1HeaderSize = 4096
	l1RecSize    = 320
	l1Magic      = 0x316e726a4c316374 // "tcL1jrn1"
	l1Version    = 1
	l1RecMagic   = 0x4c315243
	// maxL1Records bounds a journal (a record index is a uint32 with a
	// tag beside it in one word).
	maxL1Records = 1 << 30
)

// L1JournalSize is the size of an L1 journal of records records, the
// memory Config.L1Journal must have.
func L1JournalSize(records int) uint64 {
	return l1HeaderSize + uint64(records)*l1RecSize
}

// l1Journal is the store's side of the journal memory.
type l1Journal struct {
	mem []byte
	n   uint32 // records
	// free is a lock-free stack of free record slots: tag<<32 | (slot+1),
	// 0 in the low half when empty; the tag, bumped on every change, keeps
	// a slot popped and pushed back meanwhile from being mistaken for the
	// same head. next links it.
	free atomic.Uint64
	next []atomic.Uint32
	// slotOf maps a live block's pool offset >> minShift to its record
	// (slot+1; 0 for none). An entry is touched only by the holder of the
	// block (under its shard's lock, or before the block is freed), and the
	// pool's allocator orders one holder after the next.
	slotOf   []uint32
	minShift uint
	seq      atomic.Uint64
	// keep is set when the store closes: freeing its blocks then leaves
	// their records, for the next daemon.
	keep atomic.Bool
}

// l1Rec is a valid record found at start-up.
type l1Rec struct {
	slot uint32
	seq  uint64
	off  uint64
	size uint32
	crc  uint32
}

func (j *l1Journal) rec(slot uint32) []byte {
	o := l1HeaderSize + uint64(slot)*l1RecSize
	return j.mem[o : o+l1RecSize : o+l1RecSize]
}

// check is the record's check word, for atomic access: the mapping is page
// aligned and records are 4-byte aligned.
func check(rec []byte) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&rec[0])) }

func recCheck(rec []byte, klen int) uint32 { return crc32c(rec[4:32+klen]) ^ l1RecMagic }

func (j *l1Journal) pop() (uint32, bool) {
	for {
		h := j.free.Load()
		top := uint32(h)
		if top == 0 {
			return 0, false
		}
		n := j.next[top-1].Load()
		if j.free.CompareAndSwap(h, (h>>32+1)<<32|uint64(n)) {
			return top - 1, true
		}
	}
}

func (j *l1Journal) push(slot uint32) {
	for {
		h := j.free.Load()
		j.next[slot].Store(uint32(h))
		if j.free.CompareAndSwap(h, (h>>32+1)<<32|uint64(slot+1)) {
			return
		}
	}
}

// journal writes entry idx's record: its value, of crc32c crc, is in L1
// and visible. A full journal is counted and logged; the value is then
// simply not kept across a restart. sh.mu is held.
func (s *Store) journal(sh *shard, idx uint32, crc uint32) {
	j := s.jr
	if j == nil {
		return
	}
	e := sh.ent(idx)
	bi := e.l1 >> j.minShift
	if j.slotOf[bi] != 0 {
		j.drop(e.l1)
	}
	slot, ok := j.pop()
	if !ok {
		s.rare(&s.c.l1JournalFull, "store: the L1 journal is full; this value will not be kept across a restart (raise store_l1_journal_records)",
			"records", j.n)
		return
	}
	rec := j.rec(slot)
	k := sh.keyOf(e)
	binary.LittleEndian.PutUint16(rec[4:], uint16(len(k)))
	binary.LittleEndian.PutUint16(rec[6:], 0)
	binary.LittleEndian.PutUint64(rec[8:], j.seq.Add(1))
	binary.LittleEndian.PutUint64(rec[16:], e.l1)
	binary.LittleEndian.PutUint32(rec[24:], e.size)
	binary.LittleEndian.PutUint32(rec[28:], crc)
	copy(rec[32:], k)
	check(rec).Store(recCheck(rec, len(k)))
	j.slotOf[bi] = slot + 1
}

// journalPublished records entry r, just published (visible in L1 at off,
// size bytes), before the call that published it answers: the value's
// crc32c is taken without the shard's lock, and the record written only if
// the entry still holds that block (an eviction or removal meanwhile owes
// it none).
func (s *Store) journalPublished(r ref, off, size uint64) {
	if s.jr == nil {
		return
	}
	sh := &s.shards[r.sh]
	held := func(e *entry) bool { return e.gen == r.gen && e.state == stReady && e.flags&fL1 != 0 && e.l1 == off }
	sh.mu.Lock()
	if e := sh.ent(r.idx); held(e) && e.flags&(fCRC|fL2) != 0 {
		// The store across hosts took the crc32c when it announced the
		// value (remote.go): one checksum per commit, not two.
		s.journal(sh, r.idx, e.crc)
		sh.mu.Unlock()
		return
	}
	sh.mu.Unlock()
	crc := crc32c(s.poolMem[off : off+size])
	sh.mu.Lock()
	if e := sh.ent(r.idx); held(e) {
		s.journal(sh, r.idx, crc)
	}
	sh.mu.Unlock()
}

// drop clears the record of the block at off, if it has one, before the
// block is freed.
func (j *l1Journal) drop(off uint64) {
	bi := off >> j.minShift
	v := j.slotOf[bi]
	if v == 0 || j.keep.Load() {
		return
	}
	j.slotOf[bi] = 0
	check(j.rec(v - 1)).Store(0)
	j.push(v - 1)
}

// openJournal takes Config.L1Journal: a journal written by an earlier
// daemon over this very pool gives back the records whose values are
// intact, and their blocks are claimed in the pool; any other memory is
// formatted. It runs in New before the L2 recovery (which allocates
// blocks), with s.l2 set when there is one (block sizes depend on it).
func (s *Store) openJournal() ([]l1Rec, error) {
	mem := s.cfg.L1Journal
	if uint64(len(mem)) < L1JournalSize(1) || (uint64(len(mem))-l1HeaderSize)/l1RecSize > maxL1Records {
		return nil, fmt.Errorf("%w: L1 journal of %d bytes (want %d + %d per record, 1..%d records)",
			ErrConfig, len(mem), l1HeaderSize, l1RecSize, maxL1Records)
	}
	id, err := s.pool.Identity()
	if err != nil {
		return nil, fmt.Errorf("store: L1 journal: %w", err)
	}
	ps := s.pool.Stats()
	j := &l1Journal{mem: mem, n: uint32((uint64(len(mem)) - l1HeaderSize) / l1RecSize)}
	j.minShift = uint(bits.TrailingZeros64(s.minBlock))
	j.next = make([]atomic.Uint32, j.n)
	j.slotOf = make([]uint32, ps.Size>>j.minShift)
	s.jr = j

	var hdr [l1HeaderSize]byte
	le := binary.LittleEndian
	le.PutUint64(hdr[0:], l1Magic)
	le.PutUint32(hdr[8:], l1Version)
	le.PutUint32(hdr[12:], l1RecSize)
	le.PutUint64(hdr[16:], uint64(j.n))
	le.PutUint64(hdr[24:], ps.Size)
	le.PutUint64(hdr[32:], s.minBlock)
	le.PutUint64(hdr[40:], s.maxBlock)
	le.PutUint64(hdr[48:], id.Dev)
	le.PutUint64(hdr[56:], id.Ino)
	le.PutUint32(hdr[64:], crc32c(hdr[:64]))
	same := string(mem[:l1HeaderSize]) == string(hdr[:])
	if !same {
		why := "new"
		if le.Uint64(mem) == l1Magic {
			why = "written over another pool or with another geometry"
		}
		clear(mem)
		copy(mem, hdr[:])
		s.log.Info("store: L1 journal formatted: the pool's earlier values, if any, are not kept", "journal", why, "records", j.n)
		for slot := j.n; slot > 0; slot-- {
			j.push(slot - 1)
		}
		return nil, nil
	}

	// Scan: valid records whose values are intact.
	var recs []l1Rec
	for slot := uint32(0); slot < j.n; slot++ {
		rec := j.rec(slot)
		ck := check(rec).Load()
		if ck == 0 {
			continue
		}
		klen := int(le.Uint16(rec[4:]))
		r := l1Rec{slot: slot, seq: le.Uint64(rec[8:]), off: le.Uint64(rec[16:]), size: le.Uint32(rec[24:]), crc: le.Uint32(rec[28:])}
		switch {
		case klen < 1 || klen > s.cfg.MaxKeyLen || recCheck(rec, klen) != ck:
			s.c.l1Torn.Add(1)
		case r.size == 0 || uint64(r.size) > s.cfg.MaxValueSize || r.off > ps.Size || uint64(r.size) > ps.Size-r.off ||
			r.off&(s.minBlock-1) != 0:
			s.c.l1Dropped.Add(1)
		case crc32c(s.poolMem[r.off:r.off+uint64(r.size)]) != r.crc:
			s.c.l1Dropped.Add(1)
		default:
			recs = append(recs, r)
			continue
		}
		check(rec).Store(0)
	}
	// Newest first: if two records claim one block (or one key), the
	// newer wins.
	slices.SortFunc(recs, func(a, b l1Rec) int {
		switch {
		case a.seq > b.seq:
			return -1
		case a.seq < b.seq:
			return 1
		}
		return 0
	})
	offs, sizes, ok := make([]uint64, len(recs)), make([]uint64, len(recs)), make([]bool, len(recs))
	for i, r := range recs {
		offs[i], sizes[i] = r.off, s.allocSize(uint64(r.size))
	}
	if err := s.pool.Claim(offs, sizes, ok); err != nil {
		return nil, fmt.Errorf("store: L1 journal: claiming the pool's blocks: %w", err)
	}
	kept := recs[:0]
	used := make([]bool, j.n)
	for i, r := range recs {
		if !ok[i] {
			s.c.l1Dropped.Add(1)
			check(j.rec(r.slot)).Store(0)
			continue
		}
		j.slotOf[r.off>>j.minShift] = r.slot + 1
		used[r.slot] = true
		s.l1Bytes.Add(s.blockBytes(uint64(r.size)))
		kept = append(kept, r)
		if r.seq > j.seq.Load() {
			j.seq.Store(r.seq)
		}
	}
	for slot := j.n; slot > 0; slot-- {
		if !used[slot-1] {
			j.push(slot - 1)
		}
	}
	return kept, nil
}

// adoptL1 indexes the values openJournal kept (newest first), after the L2
// recovery: a key L2 holds too gets its L1 copy when the two agree (same
// length and crc32c), a key only in L1 is owed a writeback, and a record
// that loses to a newer record of its key is dropped with its block. The
// L1 LRU lists take them oldest first, so that the newest are evicted
// last.
//
// A record that disagrees with the key's L2 block wins over it. A valid
// record is of its key's value when the daemon went: it is cleared before
// its block is freed (l1Journal.drop), and a key is put again only once
// its entry, and so its L1 block, has gone; a put over an entry being
// evicted from L2 (supersede) finds it with no block in L1. The L2 block
// is then older: a header that outlived a failed zeroing (a ghost of the
// key, in a quarantined slot the journal knows nothing of), or one a
// failed write left (stgUndo). It is zeroed here, as recovery zeroes the
// loser of two headers of a key (a ghost of the key if that fails), and
// the key's value is the record's, in L1 only and owed its writeback.
// Letting the block win served the key's older value after the restart.
func (s *Store) adoptL1(recs []l1Rec) {
	j := s.jr
	le := binary.LittleEndian
	kept := make([]ref, 0, len(recs))
	var stale []staleSlot // L2 blocks older than a record of their key
	for _, r := range recs {
		rec := j.rec(r.slot)
		key := rec[32 : 32+int(le.Uint16(rec[4:]))]
		h, sh, si := s.hash(key)
		sh.mu.Lock()
		idx, found := sh.find(h, key)
		switch {
		case !found:
			idx = sh.insert(h, key, stReady)
			e := sh.ent(idx)
			e.l1, e.size, e.crc, e.flags = r.off, r.size, r.crc, fL1
			if s.l2 != nil {
				e.flags |= fDirty
				sh.dirtyAdd(idx)
				s.c.dirtyOwed.Add(1)
			}
			s.c.keys.Add(1)
		case sh.ent(idx).flags&fL1 == 0 && sh.ent(idx).size == r.size && sh.ent(idx).crc == r.crc:
			e := sh.ent(idx)
			e.l1 = r.off
			e.flags |= fL1
		case s.l2 != nil && sh.ent(idx).flags&fL1 == 0:
			// Only on L2, with another value: an older one.
			e := sh.ent(idx)
			stale = append(stale, staleSlot{e.l2, string(key)})
			s.l2.disown(e.l2)
			sh.l2Del(idx)
			e.l1, e.size, e.crc = r.off, r.size, r.crc
			e.flags = e.flags&^fL2 | fL1 | fDirty
			sh.dirtyAdd(idx)
			s.c.dirtyOwed.Add(1)
			s.c.l2Keys.Add(^uint64(0))
			s.c.recovered.Add(^uint64(0))
		default:
			sh.mu.Unlock()
			s.c.l1Dropped.Add(1)
			if err := s.freeBlock(r.off, r.size); err != nil {
				s.log.Error("store: L1 journal: dropping a record", "err", err)
			}
			continue
		}
		kept = append(kept, ref{si, idx, sh.ent(idx).gen})
		sh.mu.Unlock()
		s.c.l1Keys.Add(1)
		s.c.l1Recovered.Add(1)
	}
	for i := len(kept) - 1; i >= 0; i-- {
		sh := &s.shards[kept[i].sh]
		sh.mu.Lock()
		sh.lruAdd(kept[i].idx)
		sh.mu.Unlock()
	}
	if len(stale) > 0 {
		s.l2.zeroOlder(stale)
	}
	s.log.Info("store: L1 values kept across the restart", "recovered", s.c.l1Recovered.Load(),
		"dropped", s.c.l1Dropped.Load(), "torn", s.c.l1Torn.Load(), "journal_records", j.n)
}
