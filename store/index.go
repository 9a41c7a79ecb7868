package store

import (
	"bytes"
	"sync"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// The index is split into shards; a key's shard is chosen by the top bits
// of its hash. A shard holds its entries, their keys, an open-addressing
// hash table and the LRU lists, all in pointer-free slices (so ten million
// keys cost the garbage collector nothing to scan) indexed by uint32.
// Every operation on one key is O(1) (amortized over table growth) and
// allocates nothing once the slices have grown to the working set.

const (
	nilIdx     = ^uint32(0)
	entryShift = 10
	entryChunk = 1 << entryShift
)

// Entry states.
const (
	stFree     uint8 = iota
	stReserved       // a put holds it: Reserve's session, or a copying Put call; invisible
	stPutting        // a durable put's writes are in flight; invisible
	stReady          // visible
	stDropping       // its L2 slot is being invalidated (Remove, L2 eviction); invisible
	// stHidden: removed from another host while pinned here; out of the
	// table (no lookup finds it, a new put of its key is another entry),
	// its block kept for the pins, freed with the last (hide.go).
	stHidden
)

// Entry flags.
const (
	fL1      uint16 = 1 << iota // the value is in the pool at l1
	fL2                         // the value is on L2 in slot l2
	fDirty                      // in L1, not on L2, a writeback is owed
	fWB                         // a writeback is in flight
	fTomb                       // writeback gave up: counted, never retried
	fPromote                    // a promotion (L2 → L1 read) is in flight; next is its task
	fAbandon                    // the reserving session closed during a durable commit
	fInLRU                      // on the shard's L1 LRU list (prev, next)
	fInL2LRU                    // on the shard's L2 list (prev2, next2)
	fInDirty                    // on the shard's dirty FIFO (prev2, next2)
	fCopyPut                    // reserved by a copying Put call, not by a session
	fRemove                     // a Remove waits for the store's own I/O in flight (shard.removing)
	fBgDrop                     // stDropping by the store's own invalidation: L2 eviction, a corrupt block
	fCRC                        // crc holds the value's crc32c though it is not on L2 (announced: remote.go)
	fUnseen                     // a copy fetched from another host, unseen here until its home took it (unseen.go)
	// fSuperseded: out of the table, stDropping with fBgDrop, its key
	// taken by a put while the store's own invalidation was in flight
	// (supersede); that invalidation's end frees it.
	fSuperseded
)

// entry is one key's metadata: 64 bytes, no pointers.
type entry struct {
	hash uint64
	l1   uint64 // pool offset of the value's block (fL1, or while promoting)
	size uint32 // value length
	crc  uint32 // crc32c of the value (valid with fL2)
	l2   uint32 // L2 slot (fL2, or while a write or invalidation is in flight)
	pins uint32 // session pins and active leases, over all sessions
	// prev, next: the L1 LRU list or the free-entry list; next also names
	// the promotion task while fPromote is set (the entry is off the L1
	// list then).
	prev, next uint32
	// prev2, next2: the L2 list (fL2) or the dirty FIFO (fDirty): never
	// both, since a dirty entry is not on L2.
	prev2, next2 uint32
	key          uint32 // key slot in the shard's key arena
	gen          uint32 // bumped each time the entry slot is reused
	klen         uint16
	io           uint16 // I/O in flight that reads the L1 block or uses the slot
	flags        uint16
	state        uint8
	tries        uint8 // failed writebacks so far
}

// list is an intrusive doubly linked list of entries; head is the most
// recently pushed.
type list struct {
	head, tail uint32
	n          uint32
}

func newList() list { return list{head: nilIdx, tail: nilIdx} }

// shard is one part of the index.
type shard struct {
	// mu guards everything in the shard and the entries it holds.
	mu sync.Mutex

	// table is open-addressed with linear probing and backward-shift
	// deletion. A slot is uint64(uint32(hash))<<32 | (entry index + 1); 0
	// is empty. Its length is a power of two, kept at most 3/4 full.
	table []uint64
	mask  uint64
	count uint32 // entries in the table

	chunks  [][]entry
	freeEnt uint32 // head of the free-entry list (through next)
	nents   uint32 // entry slots ever handed out
	keys    keyArena

	lru   list // L1 LRU: resident, ready, unpinned entries (head = most recent)
	l2lru list // entries on L2, by last access
	dirty list // entries owed a writeback, oldest at the tail

	// removing are the Removes waiting for the store's own I/O in flight
	// on an entry (fRemove: a writeback, an invalidation it started), by
	// entry index; made at the first.
	removing map[uint32]waitRec

	// hidden are the shard's stHidden entries, by index (hide.go): an
	// Unpin of a key looks here first while there are any.
	hidden []uint32

	// others counts, by entry index, the pins of sessions for other
	// hosts' reads (NewSessionForOthers) among the entry's pins; made at
	// the first.
	others map[uint32]uint32

	_ [64]byte // keep neighbouring shards' mutexes off one cache line
}

func (sh *shard) init(capacity int) {
	n := 16
	for n*3/4 < capacity {
		n <<= 1
	}
	sh.table = make([]uint64, n)
	sh.mask = uint64(n - 1)
	sh.freeEnt = nilIdx
	sh.lru, sh.l2lru, sh.dirty = newList(), newList(), newList()
}

// ent returns entry idx. sh.mu is held.
func (sh *shard) ent(idx uint32) *entry {
	return &sh.chunks[idx>>entryShift][idx&(entryChunk-1)]
}

// keyOf returns entry e's key bytes (aliasing the arena). sh.mu is held.
func (sh *shard) keyOf(e *entry) []byte { return sh.keys.get(e.key, e.klen) }

// find returns the index of the entry with key k (hash h), in any state
// but free.
func (sh *shard) find(h uint64, k []byte) (uint32, bool) {
	want := uint32(h)
	for i := h & sh.mask; ; i = (i + 1) & sh.mask {
		s := sh.table[i]
		if s == 0 {
			return 0, false
		}
		if uint32(s>>32) != want {
			continue
		}
		idx := uint32(s) - 1
		e := sh.ent(idx)
		if e.hash == h && int(e.klen) == len(k) && bytes.Equal(sh.keyOf(e), k) {
			return idx, true
		}
	}
}

// insert adds an entry for key k (hash h), which must not be in the
// shard, in state st, and returns its index.
func (sh *shard) insert(h uint64, k []byte, st uint8) uint32 {
	if (sh.count+1)*4 > uint32(len(sh.table))*3 {
		sh.grow()
	}
	idx := sh.freeEnt
	if idx != nilIdx {
		sh.freeEnt = sh.ent(idx).next
	} else {
		if sh.nents>>entryShift == uint32(len(sh.chunks)) {
			sh.chunks = append(sh.chunks, make([]entry, entryChunk))
		}
		idx = sh.nents
		sh.nents++
	}
	e := sh.ent(idx)
	gen := e.gen + 1
	*e = entry{
		hash: h, key: sh.keys.put(k), klen: uint16(len(k)), gen: gen, state: st,
		prev: nilIdx, next: nilIdx, prev2: nilIdx, next2: nilIdx, l2: nilIdx,
	}
	sh.place(uint64(uint32(h))<<32 | uint64(idx+1))
	sh.count++
	return idx
}

// place puts slot value s into the table at its first free position.
func (sh *shard) place(s uint64) {
	for i := (s >> 32) & sh.mask; ; i = (i + 1) & sh.mask {
		if sh.table[i] == 0 {
			sh.table[i] = s
			return
		}
	}
}

func (sh *shard) grow() {
	old := sh.table
	sh.table = make([]uint64, 2*len(old))
	sh.mask = uint64(len(sh.table) - 1)
	for _, s := range old {
		if s != 0 {
			sh.place(s)
		}
	}
}

// remove deletes entry idx from the table, frees its key and puts the slot
// on the free list. It must be off every list.
func (sh *shard) remove(idx uint32) {
	e := sh.ent(idx)
	if invariants.Enabled && e.flags&(fInLRU|fInL2LRU|fInDirty) != 0 {
		panic("store: invariant: removing an entry that is still listed")
	}
	sh.unindex(idx)
	sh.release(idx)
}

// unindex takes entry idx out of the table (so that no lookup finds it
// again), leaving the entry itself as it is.
func (sh *shard) unindex(idx uint32) {
	e := sh.ent(idx)
	i := e.hash & sh.mask
	for uint32(sh.table[i]) != idx+1 {
		i = (i + 1) & sh.mask
	}
	// Backward-shift deletion: pull later members of the probe run into
	// the hole when the hole lies between their home and their position.
	for j := i; ; {
		j = (j + 1) & sh.mask
		s := sh.table[j]
		if s == 0 {
			break
		}
		home := (s >> 32) & sh.mask
		if (j-home)&sh.mask >= (j-i)&sh.mask {
			sh.table[i] = s
			i = j
		}
	}
	sh.table[i] = 0
	sh.count--
}

// release frees entry idx's key and puts its slot on the free list; the
// entry is out of the table already.
func (sh *shard) release(idx uint32) {
	e := sh.ent(idx)
	sh.keys.release(e.key, e.klen)
	*e = entry{gen: e.gen, next: sh.freeEnt, state: stFree}
	sh.freeEnt = idx
}

// Intrusive list operations. second selects the (prev2, next2) links.

func (sh *shard) links(idx uint32, second bool) (prev, next *uint32) {
	e := sh.ent(idx)
	if second {
		return &e.prev2, &e.next2
	}
	return &e.prev, &e.next
}

// push puts idx at the head of l.
func (sh *shard) push(l *list, idx uint32, second bool) {
	p, n := sh.links(idx, second)
	*p, *n = nilIdx, l.head
	if l.head != nilIdx {
		hp, _ := sh.links(l.head, second)
		*hp = idx
	} else {
		l.tail = idx
	}
	l.head = idx
	l.n++
}

// unlink takes idx off l.
func (sh *shard) unlink(l *list, idx uint32, second bool) {
	p, n := sh.links(idx, second)
	if *p != nilIdx {
		_, pn := sh.links(*p, second)
		*pn = *n
	} else {
		l.head = *n
	}
	if *n != nilIdx {
		np, _ := sh.links(*n, second)
		*np = *p
	} else {
		l.tail = *p
	}
	*p, *n = nilIdx, nilIdx
	l.n--
}

// toHead puts idx at the head of l, the list that flag marks an entry as
// on, taking it off l first if it is there.
func (sh *shard) toHead(l *list, idx uint32, second bool, flag uint16) {
	e := sh.ent(idx)
	if e.flags&flag != 0 {
		sh.unlink(l, idx, second)
	}
	sh.push(l, idx, second)
	e.flags |= flag
}

// takeOff takes idx off l, the list that flag marks an entry as on, if it
// is there.
func (sh *shard) takeOff(l *list, idx uint32, second bool, flag uint16) {
	e := sh.ent(idx)
	if e.flags&flag != 0 {
		sh.unlink(l, idx, second)
		e.flags &^= flag
	}
}

// lruAdd puts a resident, ready, unpinned entry at the head of the L1 LRU.
func (sh *shard) lruAdd(idx uint32) { sh.toHead(&sh.lru, idx, false, fInLRU) }

func (sh *shard) lruDel(idx uint32) { sh.takeOff(&sh.lru, idx, false, fInLRU) }

// l2Touch puts an entry on L2 at the head of the L2 list.
func (sh *shard) l2Touch(idx uint32) { sh.toHead(&sh.l2lru, idx, true, fInL2LRU) }

func (sh *shard) l2Del(idx uint32) { sh.takeOff(&sh.l2lru, idx, true, fInL2LRU) }

// dirtyAdd queues an entry on the dirty FIFO once: one already on it keeps
// its place.
func (sh *shard) dirtyAdd(idx uint32) {
	e := sh.ent(idx)
	if e.flags&fInDirty == 0 {
		sh.push(&sh.dirty, idx, true)
		e.flags |= fInDirty
	}
}

func (sh *shard) dirtyDel(idx uint32) { sh.takeOff(&sh.dirty, idx, true, fInDirty) }

// unlistAll takes idx off every list it is on.
func (sh *shard) unlistAll(idx uint32) {
	sh.lruDel(idx)
	sh.l2Del(idx)
	sh.dirtyDel(idx)
}

// keyArena stores keys in size classes of 8-byte steps (8..256 bytes), in
// chunks of keyClassSlots slots; freed slots form a list threaded through
// their first four bytes.
const keyClassSlots = 1024

type keyClass struct {
	chunks [][]byte
	free   uint32 // 1 + the first free slot, 0 when none
	n      uint32 // slots ever handed out
}

type keyArena struct {
	cls [MaxKeyLen/8 + 1]keyClass
}

func keyClassOf(n uint16) (c int, size int) {
	c = (int(n) + 7) >> 3
	return c, c << 3
}

func (a *keyArena) put(k []byte) uint32 {
	c, size := keyClassOf(uint16(len(k)))
	kc := &a.cls[c]
	var slot uint32
	if kc.free != 0 {
		slot = kc.free - 1
		b := a.slot(kc, slot, size)
		kc.free = uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
	} else {
		if kc.n/keyClassSlots == uint32(len(kc.chunks)) {
			kc.chunks = append(kc.chunks, make([]byte, keyClassSlots*size))
		}
		slot = kc.n
		kc.n++
	}
	copy(a.slot(kc, slot, size), k)
	return slot
}

func (a *keyArena) slot(kc *keyClass, slot uint32, size int) []byte {
	off := int(slot%keyClassSlots) * size
	return kc.chunks[slot/keyClassSlots][off : off+size : off+size]
}

func (a *keyArena) get(slot uint32, n uint16) []byte {
	c, size := keyClassOf(n)
	return a.slot(&a.cls[c], slot, size)[:n]
}

func (a *keyArena) release(slot uint32, n uint16) {
	c, size := keyClassOf(n)
	kc := &a.cls[c]
	b := a.slot(kc, slot, size)
	f := kc.free
	b[0], b[1], b[2], b[3] = byte(f), byte(f>>8), byte(f>>16), byte(f>>24)
	kc.free = slot + 1
}
