package store

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/xfer"
)

// The stages of L2 operations. Each runs on the goroutine that learned the
// result of the previous I/O: a transport's completion goroutine, or the
// submitting goroutine for a completion that came during Submit or for a
// tail the transport refused. None blocks.

var errRegionBroken = errors.New("store: the region's header could not be written")

// startWrites begins durable puts and writebacks: each value's checksum,
// its slot (giving a region to the slot size when needed, whose header is
// written in the same submission), its block header in the task's staging
// sector, then the value writes, all in one Submit. A key that gets no slot
// ends at once. When no task is free for a region header, the write that
// needed the region writes it with its own task first (stgOpen), then its
// value: a write never fails for want of a second task.
func (t *tier2) startWrites(its []*ioTask, sub *[]*ioTask, xts *[]*xfer.Task) error {
	s := t.s
	out := (*sub)[:0]
	short := false
	for _, it := range its {
		it.crc = crc32c(s.poolMem[it.l1 : it.l1+uint64(it.size)])
		c := t.g.classOf(uint64(it.size))
		t.mu.Lock()
		slot, opener, err := t.alloc(c, it.r.packed())
		if err != nil {
			t.mu.Unlock()
			it.err = err
			short = short || it.kind == kPut
			t.endWrite(it, false)
			continue
		}
		ri, _, _, off := t.slotAt(slot)
		nonce, units := t.regions[ri].nonce, t.classes[c].units
		t.mu.Unlock()
		it.slot, it.region, it.off = slot, ri, off
		var ot *ioTask
		if opener != noRegion {
			if ot = t.takeAny(); ot == nil {
				ot = it // its value waits for the region header (writeDone)
			}
			ot.region, ot.off = opener, t.g.regionOff(opener)
			encodeHeader(t.sector(ot), &header{magic: magicRegion, units: uint32(units), seq: t.fileNonce,
				nonce: nonce, offset: ot.off})
			t.reqSector(ot, xfer.OpWrite, ot.off, false)
			out = append(out, ot)
			if ot == it {
				it.stage, it.off = stgOpen, off
				continue
			}
			ot.kind = kOpen
		}
		it.stage = stgValue
		t.encodeBlock(it, nonce, units)
		t.reqValue(it, xfer.OpWrite, off+t.g.align)
		out = append(out, it)
	}
	if short {
		// A caller's put found no slot (ErrL2Full): the maintenance loop
		// makes room for the next one, by LRU past the high watermark and
		// by emptying a region for a slot size that has none. Nothing
		// else may come to start it: a durable put takes no L1 past its
		// watermark. A writeback that finds no slot is the loop's own,
		// which pauses instead (l2Short): a kick would spin it.
		s.kick()
	}
	*sub = out
	err := t.submit(out, xts)
	clear(out)
	return err
}

// encodeBlock puts the block header of write it (its slot in a region of
// nonce, slot size units) in its staging sector.
func (t *tier2) encodeBlock(it *ioTask, nonce, units uint64) {
	sh := &t.s.shards[it.r.sh]
	sh.mu.Lock()
	encodeHeader(t.sector(it), &header{magic: magicBlock, units: uint32(units), seq: t.seq.Add(1),
		nonce: nonce, offset: it.off, valueLen: uint64(it.size), valueCRC: it.crc, key: sh.keyOf(sh.ent(it.r.idx))})
	sh.mu.Unlock()
}

// breakRegion marks a region whose header will not be written. t.mu is
// held.
func (t *tier2) breakRegion(ri int32) {
	r := &t.regions[ri]
	r.state = regBroken
	if r.listed {
		t.unlink(ri)
	}
	if r.live == 0 {
		t.unassign(ri)
		t.freeRegions = append(t.freeRegions, ri)
	}
}

func (t *tier2) writeDone(it *ioTask, err error) {
	switch it.stage {
	case stgOpen:
		// Its own region's header: the writes waiting for it go to the
		// maintenance loop (this completion submits one write: its own).
		head := t.regionOpened(it.region, err, false)
		if err != nil {
			t.failOpenWaiters(head, err)
			t.mu.Lock()
			t.release(it.slot)
			t.mu.Unlock()
			it.err = fmt.Errorf("%w: %w", errRegionBroken, err)
			t.endWrite(it, false)
			return
		}
		t.mu.Lock()
		r := &t.regions[it.region]
		nonce, units := r.nonce, t.classes[r.class].units
		t.mu.Unlock()
		it.stage = stgValue
		t.encodeBlock(it, nonce, units)
		t.reqValue(it, xfer.OpWrite, it.off+t.g.align)
		t.submitOne(it)
	case stgValue:
		if err != nil {
			t.mu.Lock()
			t.release(it.slot) // no header was written: the slot's header is still blank
			t.mu.Unlock()
			it.err = err
			t.endWrite(it, false)
			return
		}
		t.mu.Lock()
		r := &t.regions[it.region]
		switch r.state {
		case regOpening:
			it.nextWait, r.waitHead = r.waitHead, it.idx
			t.mu.Unlock()
			return
		case regBroken:
			it.err = fmt.Errorf("%w: %w", errRegionBroken, r.broken)
			t.release(it.slot)
			t.mu.Unlock()
			t.endWrite(it, false)
			return
		}
		t.mu.Unlock()
		t.sendHeader(it)
	case stgHeader:
		if err == nil {
			t.endWrite(it, true)
			return
		}
		it.err = err
		if it.xt.Undispatched() {
			t.mu.Lock()
			t.release(it.slot)
			t.mu.Unlock()
			t.endWrite(it, false)
			return
		}
		// The header may be partly on the device: zero it before the slot
		// is used again.
		it.stage = stgUndo
		t.reqSector(it, xfer.OpWrite, it.off, true)
		t.submitOne(it)
	case stgUndo:
		// The failed header write may have reached the device whole: a
		// valid header of the key, its sequence number above every other
		// of the key's, that recovery would keep over them (a writeback's
		// value, a durable put that answered failure). Kept out of use, it
		// is also a ghost of the key, so that the key's next invalidation
		// zeroes it first and a removal does not leave it behind.
		var key string
		if err != nil {
			key = t.keyOf(it.r)
		}
		t.mu.Lock()
		if err == nil {
			t.release(it.slot)
		} else {
			t.quarantine(it.slot)
			t.addGhost(key, it.slot)
		}
		t.mu.Unlock()
		if err != nil {
			t.s.rare(&t.s.c.l2InvalFailed, "store: could not zero a block header after its write failed; the slot stays out of use",
				"slot", it.slot, "err", err)
		}
		t.endWrite(it, false)
	}
}

func (t *tier2) sendHeader(it *ioTask) {
	it.stage = stgHeader
	t.reqSector(it, xfer.OpWrite, it.off, false)
	t.submitOne(it)
}

func (t *tier2) openDone(it *ioTask, err error) {
	head := t.regionOpened(it.region, err, true)
	t.freeTask(it)
	if err != nil {
		t.failOpenWaiters(head, err)
		return
	}
	if head != -1 {
		t.sendHeader(&t.tasks[head])
	}
}

// regionOpened records the end of region ri's header write and returns
// the first of the writes that wait for it, -1 when none. On success, with
// keepOne that one is the caller's to submit and the others are handed to
// the maintenance loop (t.ready), since a completion callback may submit
// only as many tasks as it was handed back; without keepOne all of them
// are. On failure the region is broken and every waiting write is the
// caller's to fail (failOpenWaiters).
func (t *tier2) regionOpened(ri int32, err error, keepOne bool) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &t.regions[ri]
	head := r.waitHead
	r.waitHead = -1
	if err != nil {
		r.broken = err
		t.breakRegion(ri)
		return head
	}
	r.state = regOpen
	if head == -1 {
		return -1
	}
	rest := head
	if keepOne {
		rest = t.tasks[head].nextWait
		t.tasks[head].nextWait = -1
	}
	if rest != -1 {
		tail := rest
		for t.tasks[tail].nextWait != -1 {
			tail = t.tasks[tail].nextWait
		}
		t.tasks[tail].nextWait = t.ready
		t.ready = rest
		t.s.kick()
	}
	if !keepOne {
		return -1
	}
	return head
}

// failOpenWaiters fails the writes that waited for a region header that
// could not be written.
func (t *tier2) failOpenWaiters(head int32, err error) {
	for w := head; w != -1; {
		wt := &t.tasks[w]
		w, wt.nextWait = wt.nextWait, -1
		t.mu.Lock()
		t.release(wt.slot)
		t.mu.Unlock()
		wt.err = fmt.Errorf("%w: %w", errRegionBroken, err)
		t.endWrite(wt, false)
	}
}

// endWrite ends a durable put or a writeback. ok: its block is on the
// device (the slot is the entry's now); else it.err says why and the slot
// has been dealt with.
func (t *tier2) endWrite(it *ioTask, ok bool) {
	if it.kind == kWB {
		t.endWriteback(it, ok)
		return
	}
	s := t.s
	ss := it.ss
	if it.commit {
		ss.mu.Lock()
	}
	sh := &s.shards[it.r.sh]
	sh.mu.Lock()
	idx := it.r.idx
	e := sh.ent(idx)
	e.io--
	var ferr error
	var repKey []byte // the key whose copies elsewhere its result waits for
	if ok {
		e.state = stReady
		e.flags = e.flags&^(fCopyPut|fAbandon) | fL1 | fL2
		e.l2, e.crc = it.slot, it.crc
		sh.lruAdd(idx)
		sh.l2Touch(idx)
		s.journal(sh, idx, it.crc)
		s.c.reserved.Add(^uint64(0))
		s.c.keys.Add(1)
		s.c.l1Keys.Add(1)
		s.c.l2Keys.Add(1)
		s.c.durable.Add(1)
		if it.commit {
			ss.unreserve(it.r)
		}
		s.announce(sh, it.r, it.crc, true)
		if it.rp != nil {
			repKey = bytes.Clone(sh.keyOf(e))
		}
	} else {
		ferr = s.unput(sh, idx, it.commit)
	}
	sh.mu.Unlock()
	if it.commit {
		ss.mu.Unlock()
	}
	cl, pos, err := it.cl, it.pos, it.err
	if !ok {
		err = joinFree(err, ferr)
		// Counted, and said in the log (rate-limited): a full or failing
		// device shows there as well as in the key's code.
		s.rare(&s.c.durableFail, "store: a durable put failed; the key is as before the call", "err", err)
	}
	rp, copies := it.rp, it.copies
	t.freeTask(it)
	if repKey != nil {
		s.replicateDurable(rp, copies, repKey, cl, pos)
		return
	}
	cl.result(pos, err)
	cl.finish1(&s.calls)
}

// unput undoes a durable put that failed (or never got its I/O): a
// commit's reservation is back exactly as before the commit (unless its
// session closed meanwhile), a copying put's entry goes with its block.
// sh.mu is held, and ss.mu for a commit.
func (s *Store) unput(sh *shard, idx uint32, commit bool) error {
	e := sh.ent(idx)
	if commit && e.flags&fAbandon == 0 {
		e.state = stReserved
		return nil
	}
	err := s.freeBlock(e.l1, e.size)
	s.c.reserved.Add(^uint64(0))
	sh.remove(idx)
	return err
}

func (t *tier2) endWriteback(it *ioTask, ok bool) {
	s := t.s
	sh := &s.shards[it.r.sh]
	sh.mu.Lock()
	idx := it.r.idx
	e := sh.ent(idx)
	if e.flags&fRemove != 0 {
		t.endRemovedWriteback(sh, it, ok)
		return
	}
	e.io--
	e.flags &^= fWB
	tomb := false
	switch {
	case ok:
		e.flags = e.flags&^fDirty | fL2
		e.l2, e.crc, e.tries = it.slot, it.crc, 0
		sh.l2Touch(idx)
		s.c.l2Keys.Add(1)
		s.c.writebacks.Add(1)
		s.c.dirtyOwed.Add(^uint64(0))
	case errors.Is(it.err, ErrL2Full):
		// Not the action failing: room is short. Back in line, no try
		// counted; the loop pauses until room is made.
		sh.dirtyAdd(idx)
	default:
		if e.tries < 255 {
			e.tries++
		}
		if int(e.tries) > s.cfg.WritebackRetries {
			e.flags |= fTomb
			tomb = true
			s.c.dirtyOwed.Add(^uint64(0))
		} else {
			s.c.wbRetries.Add(1)
			s.addRetry(it.r, s.now()+int64(s.cfg.WritebackBackoff))
		}
	}
	var key []byte
	if tomb {
		key = append([]byte(nil), sh.keyOf(e)...)
	}
	sh.mu.Unlock()
	if tomb {
		s.rare(&s.c.tombstones, "store: writeback gave up after its retry budget; the value stays in L1 only",
			"key", fmt.Sprintf("%q", key), "tries", s.cfg.WritebackRetries+1, "err", it.err)
	}
	full := errors.Is(it.err, ErrL2Full)
	if full {
		t.l2Short.Store(true)
	}
	t.wbInflight.Add(-1)
	t.freeTask(it)
	if !full {
		s.kick()
	}
}

// endRemovedWriteback ends the writeback of an entry a Remove joined
// (joinWriteback). A block the writeback put on the device has its header
// overwritten by the same task, now an invalidation whose end (endInval)
// removes the key and answers the Remove; without one the key goes at
// once, unless it has ghosts: the task zeroes those first, as the
// removal of any value in L1 only (removeLocked). sh.mu is held on entry
// and released on return.
func (t *tier2) endRemovedWriteback(sh *shard, it *ioTask, ok bool) {
	s := t.s
	idx := it.r.idx
	e := sh.ent(idx)
	w := sh.removing[idx]
	delete(sh.removing, idx)
	e.flags &^= fWB | fRemove
	if ok {
		// The writeback's I/O count is the invalidation's now.
		s.c.dirtyOwed.Add(^uint64(0))
		e.flags = e.flags&^fDirty | fL2
		e.l2, e.crc = it.slot, it.crc
		s.c.l2Keys.Add(1)
		s.c.writebacks.Add(1)
		sh.mu.Unlock()
		t.wbInflight.Add(-1)
		it.kind, it.cl, it.pos = kInval, w.cl, w.pos
		t.resumeInval(it)
		return
	}
	if t.olderHeaders(sh.keyOf(e)) {
		// Nothing written, but older blocks of the key are still valid,
		// or may be: the same task zeroes them (removeLocked) before the
		// value goes, its I/O count the invalidation's. The value stays
		// owed its writeback until then.
		sh.mu.Unlock()
		if errors.Is(it.err, ErrL2Full) {
			t.l2Short.Store(true)
		}
		t.wbInflight.Add(-1)
		it.kind, it.slot, it.err, it.cl, it.pos = kInval, noSlot, nil, w.cl, w.pos
		t.resumeInval(it)
		return
	}
	s.c.dirtyOwed.Add(^uint64(0))
	e.io--
	s.c.keys.Add(^uint64(0))
	s.c.l1Keys.Add(^uint64(0))
	ferr := s.dropEntry(sh, idx) // hidden while pinned (RemoveHere)
	sh.mu.Unlock()
	if errors.Is(it.err, ErrL2Full) {
		t.l2Short.Store(true)
	}
	t.wbInflight.Add(-1)
	t.freeTask(it)
	if ferr != nil {
		ferr = fmt.Errorf("store: key removed, its block not freed: %w", ferr)
	}
	w.cl.result(w.pos, ferr)
	w.cl.finish1(&s.calls)
	s.kick()
}

// startReads dispatches promotions: each reads a value from its slot
// straight into the pool block reserved for it.
func (t *tier2) startReads(its []*ioTask, xts *[]*xfer.Task) error {
	for _, it := range its {
		t.mu.Lock()
		_, _, _, off := t.slotAt(it.slot)
		t.mu.Unlock()
		it.off = off
		t.reqValue(it, xfer.OpRead, off+t.g.align)
	}
	return t.submit(its, xts)
}

// readDoneHook, when set (benchmarks), runs as each promotion's read
// completes, before its value is checked. One atomic load otherwise.
var readDoneHook atomic.Pointer[func()]

// promoteDone ends a promotion's read: it checks the value's crc32c (read
// without error); a value that does not match is a miss for every waiter,
// counted, logged (rarely) and dropped from L2.
func (t *tier2) promoteDone(it *ioTask, err error) {
	if h := readDoneHook.Load(); h != nil {
		(*h)()
	}
	corrupt := false
	if err == nil && t.verify {
		if got := crc32c(t.s.poolMem[it.l1 : it.l1+uint64(it.size)]); got != it.crc {
			err = fmt.Errorf("%w: slot %d at file offset %d: crc32c %#x, header says %#x", ErrCorrupt, it.slot, it.off, got, it.crc)
			corrupt = true
			t.s.rare(&t.s.c.corruptReads, "store: a value read back from L2 does not match its checksum; the key is dropped", "err", err)
		}
	}
	t.endPromote(it, err, true, corrupt)
}

// endPromote ends a promotion: on success the entry is resident and every
// waiter gets its pin or its copy. canFree is false when the block must be
// kept out of use (a transport violation). A corrupt block's entry is
// dropped and its slot zeroed by the same task.
func (t *tier2) endPromote(it *ioTask, err error, canFree, corrupt bool) {
	s := t.s
	sh := &s.shards[it.r.sh]
	idx := it.r.idx
	sh.mu.Lock()
	e := sh.ent(idx)
	e.flags &^= fPromote
	e.next = nilIdx
	e.io--
	// Nobody joins once fPromote is cleared: ws is this call's alone.
	ws := it.waiters
	var ferr error
	if err == nil {
		e.flags |= fL1
		// Each reader holds its I/O reference since it joined
		// (joinPromotion) until its copy below is made. Gets are pinned
		// here, up to MaxPins as any pin: they were checked against it
		// before they joined, but each joined unpinned. Each session's
		// bound (MaxSessionPinned) is checked again below, under its mu,
		// and a Get past it gives its pin back.
		for j := range ws {
			w := &ws[j]
			if w.get {
				if e.pins >= s.cfg.MaxPins {
					w.over = true
					continue
				}
				e.pins++
				if w.ss.others {
					sh.othersPinned(idx, 1)
				}
				s.c.pins.Add(1)
			}
		}
		s.relist(sh, idx)
		sh.l2Touch(idx)
		s.c.l1Keys.Add(1)
		s.c.promotions.Add(1)
		s.journal(sh, idx, e.crc)
	} else {
		s.c.promoteFail.Add(1)
		for _, w := range ws {
			if !w.get {
				e.io-- // the reader's: it copies nothing
			}
		}
		if canFree {
			ferr = s.freeBlock(e.l1, e.size)
		}
		if corrupt {
			e.state = stDropping
			e.flags |= fBgDrop
			sh.unlistAll(idx)
			e.io++
		}
	}
	loc := Location{Offset: e.l1, Length: uint64(e.size)}
	sh.mu.Unlock()
	for _, w := range ws {
		switch {
		case err != nil:
			if !w.get {
				w.cl.lens[w.pos] = 0 // a miss, as when the key was not there
			}
			w.cl.result(w.pos, joinFree(err, ferr))
		case w.over:
			w.cl.result(w.pos, ErrOverflow)
		case w.get:
			w.ss.mu.Lock()
			if w.ss.closed {
				w.ss.mu.Unlock()
				s.unpinEntry(it.r, 1, w.ss.others)
				w.cl.result(w.pos, ErrClosed)
				break
			}
			hd, held := w.ss.holds[it.r]
			if w.ss.overPinLimit(held, it.size) {
				// The session pinned other values while this one was read.
				w.ss.mu.Unlock()
				s.unpinEntry(it.r, 1, w.ss.others)
				w.cl.result(w.pos, ErrPinLimit)
				break
			}
			if !held {
				w.ss.count(&hd, it.size)
			}
			hd.pins++
			w.ss.holds[it.r] = hd
			w.ss.mu.Unlock()
			w.cl.locs[w.pos] = loc
			w.cl.result(w.pos, nil)
		default:
			cerr := copyGuarded(w.cl.dsts[w.pos][:loc.Length], s.poolMem[loc.Offset:loc.Offset+loc.Length])
			w.cl.lens[w.pos] = loc.Length
			sh.mu.Lock()
			sh.ent(idx).io--
			sh.mu.Unlock()
			w.cl.result(w.pos, cerr)
		}
		w.cl.finish1(&s.calls)
	}
	clear(it.waiters)
	it.waiters = it.waiters[:0]
	if corrupt {
		it.kind, it.drop, it.cl = kInval, true, nil
		t.resumeInval(it)
		return
	}
	t.freeTask(it)
}

// startInvals dispatches header invalidations (Remove, L2 eviction). A
// removal of a value in L1 only that finds no ghost of its key left to
// zero (another invalidation of the key took them meanwhile) ends at
// once, and one that must wait for an older entry's invalidation parks
// (reqInval); both are taken out of its: the slice holds the tasks
// dispatched.
func (t *tier2) startInvals(its []*ioTask, xts *[]*xfer.Task) error {
	n := 0
	for _, it := range its {
		if it.slot != noSlot {
			t.mu.Lock()
			_, _, _, off := t.slotAt(it.slot)
			t.mu.Unlock()
			it.off = off
		}
		switch t.reqInval(it) {
		case invNone:
			t.endInval(it, nil, true)
			continue
		case invParked:
			continue
		}
		its[n] = it
		n++
	}
	clear(its[n:])
	return t.submit(its[:n], xts)
}

// What reqInval has made of an invalidation.
const (
	invWrite  = iota // a header to zero: the caller submits the task
	invNone          // nothing left to zero: the caller ends it (endInval)
	invParked        // it waits for an older entry's invalidation (tier2.older)
)

// reqInval makes it zero the header of its slot (at it.off), or first
// that of an older block of its key left valid in a quarantined slot
// (tier2.ghosts), claimed for it: the key's newest header is zeroed only
// once no older one is left for a restart to bring back, so a crash at
// any write finds the key's newest value or nothing. It says invNone when
// there is no write to do: once the ghosts are zeroed when the task has
// no slot of its own (a value in L1 only, removeLocked).
//
// An older header may also be one that a superseded entry's invalidation
// is zeroing right now (supersede), or a ghost such an invalidation or the
// maintenance loop's sweep (sweep.go) has claimed: that zeroing may fail
// and leave a ghost. The invalidation of a newer entry of the key then
// parks, its ghosts zeroed, before its own header (invParked): its key
// may not go, nor its Remove answer, until the older zeroing has ended
// (endInval or sweepDone takes it up again, resumeInval). A superseded
// entry's own invalidation never waits: it is the older one.
func (t *tier2) reqInval(it *ioTask) int {
	it.ghost = noSlot
	if t.nghosts.Load() > 0 || t.nolder.Load() > 0 {
		// The shard's mu is held with t.mu, so that neither a supersede
		// nor the end of an older invalidation (which records its ghost
		// and ends under both) falls between finding no ghost and
		// parking.
		sh := &t.s.shards[it.r.sh]
		sh.mu.Lock()
		e := sh.ent(it.r.idx)
		key := sh.keyOf(e)
		t.mu.Lock()
		parked := false
		it.ghost = t.takeGhostLocked(string(key))
		if o := t.older[string(key)]; it.ghost == noSlot && o != nil && e.flags&fSuperseded == 0 {
			o.parked = append(o.parked, it)
			parked = true
		}
		t.mu.Unlock()
		sh.mu.Unlock()
		if parked {
			return invParked
		}
	}
	if it.ghost != noSlot {
		_, _, _, off := t.slotAt(it.ghost)
		t.reqSector(it, xfer.OpWrite, off, true)
		return invWrite
	}
	if it.slot == noSlot {
		return invNone
	}
	t.reqSector(it, xfer.OpWrite, it.off, true)
	return invWrite
}

// resumeInval goes on with invalidation it: its next write submitted, its
// end if none is left, nothing if it parks (reqInval).
func (t *tier2) resumeInval(it *ioTask) {
	switch t.reqInval(it) {
	case invWrite:
		t.submitOne(it)
	case invNone:
		t.endInval(it, nil, true)
	}
}

func (t *tier2) invalDone(it *ioTask, err error) {
	if it.ghost == noSlot {
		t.endInval(it, err, true)
		return
	}
	g := it.ghost
	it.ghost = noSlot
	if err != nil {
		// The older block may still be valid: the key's own header is
		// left as it is (a Remove fails, an eviction keeps the key), and
		// the older block stays a ghost.
		key := t.keyOf(it.r)
		t.mu.Lock()
		t.addGhost(key, g)
		t.mu.Unlock()
		t.endInval(it, fmt.Errorf("store: zeroing an older L2 block of the key (kept out of use): %w", err), true)
		return
	}
	t.mu.Lock()
	t.unquarantine(g)
	t.ghostZeroed()
	t.mu.Unlock()
	t.resumeInval(it) // the next ghost of the key, or its own header
}

// unremove puts entry idx, whose invalidation did not take place (a
// zeroing failed, or the store closed while it waited for a task), back
// as it was before: stored, on the lists of the tiers it is on, a value
// in L1 only owed its writeback again. It drops the invalidation's I/O
// count. sh.mu is held.
func (s *Store) unremove(sh *shard, idx uint32) {
	e := sh.ent(idx)
	e.state = stReady
	e.flags &^= fBgDrop | fRemove
	e.io--
	s.relist(sh, idx)
	switch {
	case e.flags&fL2 != 0:
		sh.l2Touch(idx)
	case e.flags&(fDirty|fTomb) == fDirty:
		sh.dirtyAdd(idx)
		s.kick()
	}
}

// endInval ends an invalidation. When the header is zeroed (or the block
// was corrupt anyway) the key goes; when the write failed the key stays as
// it was, and a Remove reports why. canRelease is false after a transport
// violation: the slot is kept out of use and the key goes. A task with no
// slot of its own (a value in L1 only, removeLocked) zeroed its key's
// ghosts alone: the value goes once all of them are zeroed.
func (t *tier2) endInval(it *ioTask, err error, canRelease bool) {
	s := t.s
	sh := &s.shards[it.r.sh]
	idx := it.r.idx
	evict := it.cl == nil && !it.drop
	sh.mu.Lock()
	e := sh.ent(idx)
	var w waitRec // a Remove that joined the store's own invalidation
	if e.flags&fRemove != 0 {
		w = sh.removing[idx]
		delete(sh.removing, idx)
	}
	slotBytes := uint64(0)
	t.mu.Lock()
	if evict {
		_, c, _, _ := t.slotAt(it.slot)
		slotBytes = t.g.slotSize(c)
		t.evicting -= slotBytes
	}
	// A superseded entry goes whatever the write did: its key is another
	// entry's now.
	superseded := e.flags&fSuperseded != 0
	gone := err == nil || it.drop || !canRelease || superseded
	if gone && it.slot != noSlot {
		switch {
		case err == nil && canRelease:
			t.release(it.slot)
		case canRelease:
			t.quarantine(it.slot)
			t.addGhost(string(sh.keyOf(e)), it.slot)
			s.c.l2InvalFailed.Add(1)
		}
	}
	var resume []*ioTask // the key's newer invalidations that waited for this one
	if superseded {
		resume = t.olderEnds(string(sh.keyOf(e)))
	}
	t.mu.Unlock()
	var ferr error
	if gone {
		if e.flags&fL1 != 0 {
			s.c.l1Keys.Add(^uint64(0))
		}
		if e.flags&fL2 != 0 {
			s.c.l2Keys.Add(^uint64(0))
		}
		if e.flags&(fDirty|fTomb) == fDirty {
			s.c.dirtyOwed.Add(^uint64(0)) // a value in L1 only (removeLocked)
		}
		if evict {
			s.c.evictL2.Add(1)
		}
		e.io--
		e.flags &^= fL2
		if superseded {
			// Counted out of the keys, and announced gone, by supersede;
			// out of the table and unpinned, with no block in L1.
			sh.release(idx)
		} else {
			s.c.keys.Add(^uint64(0))
			if evict {
				s.evicted(sh, idx)
			}
			// The slot is released (or quarantined): a pinned entry
			// (removed from elsewhere, or a corrupt one a pin held) is
			// hidden until its last pin goes, its block kept for the
			// pins.
			ferr = s.dropEntry(sh, idx)
		}
	} else {
		s.unremove(sh, idx)
		if it.cl != nil {
			s.c.removeFail.Add(1)
		} else {
			s.c.l2InvalFailed.Add(1)
		}
	}
	sh.mu.Unlock()
	cl, pos := it.cl, it.pos
	t.freeTask(it)
	for _, p := range resume {
		// Each zeroes the ghost this one may have left first.
		t.resumeInval(p)
	}
	if w.cl != nil {
		// The key is gone as the Remove asked, or stays as it was: the
		// header write failed, said in the Remove's code.
		werr := err
		if gone {
			werr = nil
		} else {
			s.c.removeFail.Add(1)
		}
		w.cl.result(w.pos, werr)
		w.cl.finish1(&s.calls)
	}
	if cl != nil {
		if gone {
			if !canRelease {
				err = fmt.Errorf("store: key dropped, its L2 slot quarantined: %w", err)
			} else {
				err = nil
			}
		}
		cl.result(pos, joinFree(err, ferr))
		cl.finish1(&s.calls)
	} else if evict && err == nil {
		// Room was made: the loop goes on evicting, or gives it to a slot
		// size starving for it. An eviction that failed kicks nothing: on
		// a device that fails every write, each failure would start the
		// next round of them at once, the maintenance loop writing as
		// fast as the device answers for as long as it fails. The next
		// event (a put, a commit, a freed task) tries again.
		s.kick()
	}
}
