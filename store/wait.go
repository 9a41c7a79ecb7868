package store

import (
	"github.com/tensorcast/tensorcast/internal/invariants"
)

// Keys waiting for an L2 task.
//
// The task table has IODepth tasks, and the store's own work (writeback,
// L2 eviction) may hold up to three quarters of them. A caller's key that
// needs L2 (a durable Put or Commit, a promotion for a Get or Read, a
// Remove of a key on L2) and finds no free task is not the caller's
// problem: it waits in the tier's FIFO for the next task that frees, and
// its call's result waits with it (the call returns pending, or a blocking
// caller blocks in it as it does for the I/O itself). Nothing waits on the
// calling goroutine: a queue worker's call returns at once.
//
// Who serves the FIFO: the maintenance loop, at the start of every round.
// A task freed while keys wait kicks it (freeTask), and a key that starts
// waiting kicks it too (enqueue), so no wake-up is lost: either the freeing
// sees the waiting key or the waiting key's kick finds the free task. The
// loop holds no lock when it serves, so nothing is re-entered from a
// completion.
//
// Order: first come, first served. While a key waits, getTask gives no
// task to a newcomer, foreground or background, so foreground work gets the
// freed tasks before the next writeback or eviction starts, in the order it
// asked.
//
// Bound: a key waits only while its call is owed its result, and a call has
// at most MaxKeysPerCall keys, so the FIFO holds at most (calls in flight)
// × MaxKeysPerCall keys; enqueue checks it under -tags invariants. Its
// memory is reused (a slice that only grows to the largest backlog seen).
//
// Close: the loop has stopped; failWaiting ends every key still waiting
// with ErrClosed, as a failed I/O would end it (a commit's reservation back
// as before the call, a put's block freed, a Remove's key back, a
// promotion's block freed), before the store frees its pool blocks.

// waitKey is one key waiting for a task: what starting its I/O needs.
type waitKey struct {
	cl     *call
	pos    int32
	kind   uint8 // kPut, kPromote or kInval
	commit bool  // kPut from Commit
	get    bool  // kPromote for a Get (pin for ss), else for a Read
	ss     *Session
	rp     Replicator
	copies int
	r      ref
	l1     uint64 // kPut: the value's block; kPromote: the block reserved for it
	size   uint32
	slot   uint32 // kInval: the slot whose header is zeroed
}

// enqueue makes wk wait for a task; the key's call counts it as owed
// (the caller has added it to cl.left). Any lock may be held (ioMu is a
// leaf; kick and fire take none but their own).
func (t *tier2) enqueue(wk waitKey) {
	t.ioMu.Lock()
	if t.whead > 0 && t.whead == len(t.waitq) {
		t.waitq, t.whead = t.waitq[:0], 0
	}
	t.waitq = append(t.waitq, wk)
	n := t.nwaiting.Add(1)
	t.ioMu.Unlock()
	if invariants.Enabled {
		if max := t.s.calls.live.Load() * int64(t.s.cfg.MaxKeysPerCall); int64(n) > max {
			panic("store: invariant: more keys wait for an L2 task than the calls in flight can have")
		}
	}
	t.s.c.ioWaits.Add(1)
	t.s.kick()
	t.s.ev.fire()
}

// nextWaiting takes the first waiting key and a free task for it; false
// when no key waits or no task is free.
func (t *tier2) nextWaiting() (waitKey, *ioTask, bool) {
	t.ioMu.Lock()
	n := len(t.freeTasks)
	if t.nwaiting.Load() == 0 || n == 0 {
		t.ioMu.Unlock()
		return waitKey{}, nil, false
	}
	wk := t.waitq[t.whead]
	t.waitq[t.whead] = waitKey{}
	t.whead++
	t.nwaiting.Add(-1)
	i := t.freeTasks[n-1]
	t.freeTasks = t.freeTasks[:n-1]
	t.ioMu.Unlock()
	return wk, t.taken(i), true
}

// serveWaiting gives free tasks to the waiting keys, first come first
// served, and dispatches them. The maintenance loop runs it.
func (s *Store) serveWaiting(m *maintScratch) {
	t := s.l2
	puts, reads, invals := m.wput[:0], m.wread[:0], m.winval[:0]
	for {
		wk, it, ok := t.nextWaiting()
		if !ok {
			break
		}
		switch wk.kind {
		case kPut:
			it.kind, it.commit, it.r, it.l1, it.size = kPut, wk.commit, wk.r, wk.l1, wk.size
			it.ss, it.rp, it.copies, it.cl, it.pos = wk.ss, wk.rp, wk.copies, wk.cl, wk.pos
			puts = append(puts, it)
		case kInval:
			it.kind, it.r, it.slot, it.cl, it.pos = kInval, wk.r, wk.slot, wk.cl, wk.pos
			invals = append(invals, it)
		case kPromote:
			if s.servePromote(&wk, it) {
				reads = append(reads, it)
			}
		}
	}
	// A transport violation has failed the tasks already.
	if len(puts) > 0 {
		t.startWrites(puts, &m.sub, &m.xts)
	}
	if len(reads) > 0 {
		t.startReads(reads, &m.xts)
	}
	if len(invals) > 0 {
		t.startInvals(invals, &m.xts)
	}
	clear(puts)
	clear(reads)
	clear(invals)
	m.wput, m.wread, m.winval = puts, reads, invals
}

// servePromote gives task it to a waiting promotion: it reports whether
// the task is to be dispatched (a promotion started), else the key has its
// answer (the value is in L1 by now, another promotion took the key's
// waiter, or the key is gone) and the task is free again.
func (s *Store) servePromote(wk *waitKey, it *ioTask) bool {
	w := waitRec{cl: wk.cl, pos: wk.pos, ss: wk.ss, get: wk.get}
	if w.get {
		w.ss.mu.Lock() // a pin is recorded in the session's holds
		if w.ss.closed {
			w.ss.mu.Unlock()
			s.l2.freeTask(it)
			w.cl.result(w.pos, joinFree(ErrClosed, s.freeBlock(wk.l1, wk.size)))
			w.cl.finish1(&s.calls)
			return false
		}
	}
	sh := &s.shards[wk.r.sh]
	sh.mu.Lock()
	e := sh.ent(wk.r.idx)
	var err error
	answered := true
	switch {
	case e.gen != wk.r.gen || e.state != stReady:
		sh.mu.Unlock()
		err = ErrNotFound // removed, or evicted from L2, while it waited
	case e.flags&fL1 != 0:
		err = s.hitL1(sh, wk.r, w)
	case e.flags&fPromote != 0:
		err = s.joinPromotion(sh, e, w)
		answered = err != nil
	default:
		// The key's owed count passes to the promotion's waiter.
		s.startPromotion(sh, wk.r, w, wk.l1, it)
		if w.get {
			w.ss.mu.Unlock()
		}
		return true
	}
	if w.get {
		w.ss.mu.Unlock()
	}
	s.l2.freeTask(it)
	ferr := s.freeBlock(wk.l1, wk.size)
	if answered {
		w.cl.result(w.pos, joinFree(err, ferr))
	} else if ferr != nil {
		s.log.Error("store: free a promotion's unused block", "err", ferr)
	}
	w.cl.finish1(&s.calls)
	return false
}

// hitL1 answers waiter w from stored entry r, whose value is in L1: a pin
// for a Get (w.ss.mu is held), a copy for a Read. sh.mu is held on entry
// and released on return.
func (s *Store) hitL1(sh *shard, r ref, w waitRec) error {
	e := sh.ent(r.idx)
	if w.get {
		if err := w.ss.mayPin(r, e); err != nil {
			sh.mu.Unlock()
			return err
		}
		w.cl.locs[w.pos] = Location{Offset: e.l1, Length: uint64(e.size)}
		w.ss.pinLocked(sh, r)
		return nil
	}
	if e.io == ^uint16(0) {
		sh.mu.Unlock()
		return ErrBusy
	}
	e.io++
	if e.flags&fInLRU != 0 {
		sh.lruAdd(r.idx)
	}
	off, size := e.l1, uint64(e.size)
	sh.mu.Unlock()
	err := copyGuarded(w.cl.dsts[w.pos][:size], s.poolMem[off:off+size])
	w.cl.lens[w.pos] = size
	sh.mu.Lock()
	sh.ent(r.idx).io--
	sh.mu.Unlock()
	return err
}

// failWaiting ends every key still waiting with err. The maintenance loop
// has stopped and no call is in progress (Close), so none starts waiting
// after this.
func (t *tier2) failWaiting(err error) {
	s := t.s
	t.ioMu.Lock()
	q := t.waitq[t.whead:]
	t.waitq, t.whead = nil, 0
	t.nwaiting.Store(0)
	t.ioMu.Unlock()
	for i := range q {
		wk := &q[i]
		var ferr error
		switch wk.kind {
		case kPut:
			if wk.commit {
				wk.ss.mu.Lock()
			}
			sh := &s.shards[wk.r.sh]
			sh.mu.Lock()
			sh.ent(wk.r.idx).io--
			ferr = s.unput(sh, wk.r.idx, wk.commit)
			sh.mu.Unlock()
			if wk.commit {
				wk.ss.mu.Unlock()
			}
		case kInval:
			sh := &s.shards[wk.r.sh]
			sh.mu.Lock()
			s.unremove(sh, wk.r.idx) // the key stays, as when its invalidation fails
			sh.mu.Unlock()
		case kPromote:
			ferr = s.freeBlock(wk.l1, wk.size)
		}
		wk.cl.result(wk.pos, joinFree(err, ferr))
		wk.cl.finish1(&s.calls)
		*wk = waitKey{}
	}
}
