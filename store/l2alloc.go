package store

import (
	"math/bits"
	"math/rand/v2"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// The L2 space allocator. The file is the superblock sector followed by
// regions of RegionSize bytes. A region is given to one slot size class at a
// time; its first sector is the region header, then slots of
// (1 + 2^c) sectors each: the block header sector and a value area of 2^c
// sectors. Classes mirror the pool's power-of-two blocks, so a value read
// back fits the block it came from. Everything here is guarded by tier2.mu,
// and every operation is O(1) except giving a region to a class, which may
// look through the regions once.

// Region states.
const (
	regFree    uint8 = iota // given to no class
	regOpening              // its header write is in flight; slots may be handed out
	regOpen                 // its header is on the device
	regBroken               // its header write failed; no new slots; freed when empty
	// regLost: its header could not be read at open (a bad sector). Its
	// slot size, and so its blocks, are unknown: it is never used, so that
	// a restart that can read it finds what it holds.
	regLost
)

const noRegion = -1

// Marks in region.owner other than an entry: noOwner, a free slot;
// staleOwner, one holding a block no key uses, about to be zeroed
// (recovery); quarOwner, one kept out of use for good. An entry's mark is
// below all three.
const (
	noOwner    = ^uint64(0)
	staleOwner = ^uint64(0) - 1
	quarOwner  = ^uint64(0) - 2
)

type region struct {
	nonce  uint64
	class  int16
	state  uint8
	listed bool // on its class's list of regions with a free slot
	live   uint32
	// stuck counts its live slots kept out of use for good (quarantine):
	// a region with one never empties, so it is never emptied for
	// another slot size.
	stuck      uint32
	bump       uint32   // next never-used slot
	free       []uint32 // freed slots, a stack
	owner      []uint64 // per slot: shard<<32 | entry index, or noOwner
	prev, next int32    // its class's list of regions with a free slot
	// waitHead is the first task whose block header waits for this
	// region's header (linked through ioTask.nextWait).
	waitHead int32
	// broken is why the region header could not be written (regBroken).
	broken error
}

type l2class struct {
	units    uint64 // slot size in sectors: 1 + 2^c
	per      uint32 // slots per region
	partial  int32  // head of the regions with a free slot
	regions  uint32
	starving bool // an allocation found no slot and no region for it
}

// l2geom is the file's geometry.
type l2geom struct {
	align      uint64 // sector size
	regionSize uint64
	nregions   int
	perMax     uint32 // slots per region of the smallest class: slot ids are region*perMax + j
	nclasses   int
}

func (g *l2geom) regionOff(r int32) uint64 { return g.align + uint64(r)*g.regionSize }

func (g *l2geom) slotSize(c int) uint64 { return g.align * (1 + 1<<c) }

// slotOff is the file offset of slot j of region r of class c.
func (g *l2geom) slotOff(r int32, c int, j uint32) uint64 {
	return g.regionOff(r) + g.align + uint64(j)*g.slotSize(c)
}

// classOf is the class whose value area fits n bytes.
func (g *l2geom) classOf(n uint64) int {
	sectors := (n + g.align - 1) / g.align
	if sectors <= 1 {
		return 0
	}
	return bits.Len64(sectors - 1)
}

func (t *tier2) initRegions() {
	g := &t.g
	t.regions = make([]region, g.nregions)
	t.classes = make([]l2class, g.nclasses)
	for c := range t.classes {
		cl := &t.classes[c]
		cl.units = 1 + 1<<c
		cl.per = uint32((g.regionSize - g.align) / g.slotSize(c))
		cl.partial = noRegion
	}
	t.freeRegions = t.freeRegions[:0]
	for i := g.nregions - 1; i >= 0; i-- {
		r := &t.regions[i]
		r.class, r.prev, r.next, r.waitHead = -1, noRegion, noRegion, -1
		t.freeRegions = append(t.freeRegions, int32(i))
	}
	t.capacity = uint64(g.nregions) * (g.regionSize - g.align)
}

// slotID packs region r and slot j.
func (t *tier2) slotID(r int32, j uint32) uint32 { return uint32(r)*t.g.perMax + j }

// slotAt unpacks a slot id: its region, class, index and file offset.
func (t *tier2) slotAt(id uint32) (r int32, c int, j uint32, off uint64) {
	r = int32(id / t.g.perMax)
	j = id % t.g.perMax
	c = int(t.regions[r].class)
	return r, c, j, t.g.slotOff(r, c, j)
}

// assign gives region ri to class c. The region is empty. It returns the
// new nonce.
func (t *tier2) assign(ri int32, c int, st uint8, nonce uint64) {
	r := &t.regions[ri]
	cl := &t.classes[c]
	r.class, r.state, r.nonce = int16(c), st, nonce
	r.live, r.stuck, r.bump = 0, 0, 0
	r.free = r.free[:0]
	if cap(r.owner) < int(cl.per) {
		r.owner = make([]uint64, cl.per)
	}
	r.owner = r.owner[:cl.per]
	for i := range r.owner {
		r.owner[i] = noOwner
	}
	r.waitHead = -1
	cl.regions++
	t.link(ri)
}

// unassign takes an empty region away from its class.
func (t *tier2) unassign(ri int32) {
	r := &t.regions[ri]
	if r.listed {
		t.unlink(ri)
	}
	t.classes[r.class].regions--
	r.class, r.state = -1, regFree
	r.free = r.free[:0]
}

func (t *tier2) link(ri int32) {
	r := &t.regions[ri]
	cl := &t.classes[r.class]
	r.prev, r.next, r.listed = noRegion, cl.partial, true
	if cl.partial != noRegion {
		t.regions[cl.partial].prev = ri
	}
	cl.partial = ri
}

func (t *tier2) unlink(ri int32) {
	r := &t.regions[ri]
	cl := &t.classes[r.class]
	if r.prev != noRegion {
		t.regions[r.prev].next = r.next
	} else {
		cl.partial = r.next
	}
	if r.next != noRegion {
		t.regions[r.next].prev = r.prev
	}
	r.prev, r.next, r.listed = noRegion, noRegion, false
}

// takeRegion finds an empty region for class c: a free one, else an empty
// one of another class. It returns noRegion when there is none.
func (t *tier2) takeRegion(c int) int32 {
	if n := len(t.freeRegions); n > 0 {
		ri := t.freeRegions[n-1]
		t.freeRegions = t.freeRegions[:n-1]
		return ri
	}
	for i := range t.regions {
		r := &t.regions[i]
		if r.live == 0 && r.state == regOpen && int(r.class) != c && r.waitHead == -1 {
			t.unassign(int32(i))
			return int32(i)
		}
	}
	return noRegion
}

// alloc takes a slot of class c for owner. When it had to give a region to
// the class, opener is the region whose header the caller must write
// (before any block header in it); else opener is noRegion.
func (t *tier2) alloc(c int, owner uint64) (slot uint32, opener int32, err error) {
	cl := &t.classes[c]
	opener = noRegion
	ri := cl.partial
	if ri == noRegion {
		ri = t.takeRegion(c)
		if ri == noRegion {
			cl.starving = true
			return 0, noRegion, ErrL2Full
		}
		t.assign(ri, c, regOpening, rand.Uint64()|1)
		opener = ri
	}
	r := &t.regions[ri]
	var j uint32
	if n := len(r.free); n > 0 {
		j = r.free[n-1]
		r.free = r.free[:n-1]
	} else {
		j = r.bump
		r.bump++
	}
	r.live++
	r.owner[j] = owner
	if r.live == cl.per {
		t.unlink(ri)
	}
	t.used += t.g.slotSize(c)
	return t.slotID(ri, j), opener, nil
}

// release returns a slot whose on-device header is blank (or was never
// written).
func (t *tier2) release(id uint32) {
	ri, c, j, _ := t.slotAt(id)
	r := &t.regions[ri]
	if invariants.Enabled && (r.owner[j] == noOwner || r.live == 0) {
		panic("store: invariant: L2 slot released twice")
	}
	r.owner[j] = noOwner
	r.live--
	t.used -= t.g.slotSize(c)
	if r.state == regBroken {
		if r.live == 0 {
			t.unassign(ri)
			t.freeRegions = append(t.freeRegions, ri)
		}
		return
	}
	r.free = append(r.free, j)
	if !r.listed {
		t.link(ri)
	}
}

// quarantine keeps a live slot out of use for good: its on-device state
// is unknown (a header write and the invalidation after it both failed,
// or the transport broke its contract while the slot was in flight). It
// stays live: its region never empties.
func (t *tier2) quarantine(id uint32) {
	ri, _, j, _ := t.slotAt(id)
	t.regions[ri].owner[j] = quarOwner
	t.regions[ri].stuck++
	t.quarantined++
}

// addGhost records that quarantined slot id may hold a valid header of
// key, which no longer uses it (see tier2.ghosts), and arms the sweep
// (sweep.go) if nothing has. t.mu is held.
func (t *tier2) addGhost(key string, id uint32) {
	if t.ghosts == nil {
		t.ghosts = map[string][]uint32{}
	}
	t.ghosts[key] = append(t.ghosts[key], id)
	t.nghosts.Add(1)
	if !t.sweepArmed && t.sweepRunning == 0 {
		t.armSweep(t.sweepDelay) // a pass that runs arms the next at its end
	}
}

// takeGhostLocked claims one of key's ghosts, the last recorded, for a
// zeroing: it is no longer among t.ghosts, so nothing else zeroes it. It
// returns noSlot when key has none. t.mu is held.
func (t *tier2) takeGhostLocked(key string) uint32 {
	gs := t.ghosts[key]
	if len(gs) == 0 {
		return noSlot
	}
	id := gs[len(gs)-1]
	if len(gs) == 1 {
		delete(t.ghosts, key)
	} else {
		t.ghosts[key] = gs[:len(gs)-1]
	}
	t.nghosts.Add(-1)
	return id
}

// olderHeaders reports whether an older header of key may still be valid
// on L2 once its own is gone: it has ghosts, or a superseded entry of it
// is being invalidated, or the sweep is zeroing one of its ghosts, and
// that zeroing may fail and leave one (none without an L2). Its shard's
// mu may be held: t.mu is a leaf.
func (t *tier2) olderHeaders(key []byte) bool {
	if t == nil || t.nghosts.Load() == 0 && t.nolder.Load() == 0 {
		return false
	}
	t.mu.Lock()
	n := len(t.ghosts[string(key)])
	_, older := t.older[string(key)]
	t.mu.Unlock()
	return n > 0 || older
}

// olderStarts records that the invalidation of a superseded entry of key
// is in flight (supersede). Its shard's mu is held.
func (t *tier2) olderStarts(key []byte) {
	t.mu.Lock()
	t.olderStartsLocked(string(key))
	t.mu.Unlock()
}

// olderStartsLocked records that a zeroing of an older header of key is
// in flight: a superseded entry's invalidation (olderStarts) or the
// sweep's zeroing of a ghost it claimed (sweepGhosts). t.mu is held.
func (t *tier2) olderStartsLocked(key string) {
	if t.older == nil {
		t.older = map[string]*olderZeroings{}
	}
	o := t.older[key]
	if o == nil {
		o = &olderZeroings{}
		t.older[key] = o
		t.nolder.Add(1)
	}
	o.n++
}

// olderEnds records the end of a zeroing of an older header of key (the
// invalidation of a superseded entry, endInval, or a sweep's zeroing,
// sweepDone), a ghost of key already recorded if it failed, and returns
// the key's parked invalidations, for the caller to take up again
// (resumeInval): those that still have older headers to wait for park
// again. t.mu is held.
func (t *tier2) olderEnds(key string) []*ioTask {
	o := t.older[key]
	if o == nil {
		return nil
	}
	o.n--
	p := o.parked
	o.parked = nil
	if o.n == 0 {
		delete(t.older, key)
		t.nolder.Add(-1)
	}
	return p
}

// taint records that a quarantined task may still write quarantined
// slot id (tier2.tainted). t.mu is held.
func (t *tier2) taint(id uint32) {
	if t.tainted == nil {
		t.tainted = map[uint32]struct{}{}
	}
	t.tainted[id] = struct{}{}
}

// unquarantine returns a quarantined slot whose header has been zeroed
// since, unless a quarantined task may still write it (tier2.tainted):
// that one stays out of use. t.mu is held.
func (t *tier2) unquarantine(id uint32) {
	if _, ok := t.tainted[id]; ok {
		return
	}
	ri, _, _, _ := t.slotAt(id)
	t.regions[ri].stuck--
	t.quarantined--
	t.release(id)
}

// keyOf is a copy of the key of entry r. Its shard's mu is not held.
func (t *tier2) keyOf(r ref) string {
	sh := &t.s.shards[r.sh]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return string(sh.keyOf(sh.ent(r.idx)))
}

// setOwner records which entry uses a slot (recovery, duplicate handling).
func (t *tier2) setOwner(id uint32, owner uint64) {
	ri, _, j, _ := t.slotAt(id)
	t.regions[ri].owner[j] = owner
}
