package store

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/internal/faultcopy"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/xfer"
)

// Calls take caller-owned slices and fill caller-owned, positional results:
// codes[i] (and errs[i], locs[i], lens[i]) is the result of keys[i], one per
// key, on every call. errs may be nil; when given it receives the detailed
// error behind each code that is not OK (nil for OK).
//
// A call's returned error is about the call as a whole:
//   - ErrBadCall (slice lengths disagree, too many keys) or ErrClosed (the
//     store or session is closed): nothing was done and every code is the
//     same (INVALID_ARGUMENT, UNAVAILABLE);
//   - ErrNotApplied: an all-or-nothing batch (Pin, Unpin) was refused
//     because of some of its keys, whose codes say why; nothing changed;
//   - ErrTransport: the L2 transport broke the xfer.Transport contract on
//     the call's dispatch; every key that needed L2 failed (INTERNAL, and
//     its reservation, if any, is as before the call), the others' codes
//     stand. The whole answer of the transport is discarded, never taken
//     as a success.
//
// Calls that may wait for L2 (a durable Put or Commit, a Get or Read of a
// key only on L2, a Remove of a key on L2) are asynchronous: with done !=
// nil they return pending=true when some keys are still in flight, and
// done.StoreDone(tag) is then called once all results are final; until then
// the caller must not touch the result slices. With done == nil they block
// until every result is final and return pending=false. Keys are read only
// during the call.

func fill(codes []Code, c Code) {
	for i := range codes {
		codes[i] = c
	}
}

// setResult sets key i's code and, when errs is given, the error behind
// it.
func setResult(codes []Code, errs []error, i int, c Code, err error) {
	codes[i] = c
	if errs != nil {
		errs[i] = err
	}
}

// setError sets key i's result from err.
func setError(codes []Code, errs []error, i int, err error) {
	setResult(codes, errs, i, status.CodeOf(err), err)
}

// begin checks a call's shape and admits it; on error every code is set.
func (s *Store) begin(n int, codes []Code, errs []error, others ...int) error {
	if len(codes) != n || errs != nil && len(errs) != n || n > s.cfg.MaxKeysPerCall {
		fill(codes, InvalidArgument)
		return fmt.Errorf("%w: %d keys, %d codes, %d errs (at most %d keys)", ErrBadCall, n, len(codes), len(errs), s.cfg.MaxKeysPerCall)
	}
	for _, o := range others {
		if o != n {
			fill(codes, InvalidArgument)
			return fmt.Errorf("%w: %d keys, a result or argument slice of %d", ErrBadCall, n, o)
		}
	}
	if !s.enter() {
		fill(codes, Unavailable)
		return ErrClosed
	}
	return nil
}

// beginSession is begin for a session's call; it returns with ss.mu held.
func (ss *Session) begin(n int, codes []Code, errs []error, others ...int) error {
	s := ss.s
	if err := s.begin(n, codes, errs, others...); err != nil {
		return err
	}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		s.exit()
		fill(codes, Unavailable)
		return ErrClosed
	}
	return nil
}

// visibleCode is the code a writer gets for a key that already has an
// entry in state st.
func busyOrExists(st uint8) error {
	if st == stReady {
		return ErrExists
	}
	return ErrBusy
}

// lock finds key k's entry, in any state but free, and returns with k's
// shard locked: the shard and, when k has an entry (found), its ref. A key
// that is not valid gets ErrBadKey, and nothing is locked.
func (s *Store) lock(k []byte) (sh *shard, r ref, found bool, err error) {
	if !s.validKey(k) {
		return nil, ref{}, false, ErrBadKey
	}
	h, sh, si := s.hash(k)
	sh.mu.Lock()
	idx, found := sh.find(h, k)
	if !found {
		return sh, ref{}, false, nil
	}
	return sh, ref{si, idx, sh.ent(idx).gen}, true, nil
}

// lookup finds stored key k (its entry in stReady, seen by readers: not a
// fetched copy waiting for its home, unseen.go) and returns with its
// shard locked. Otherwise nothing is locked and it returns k's code and
// error: INVALID_ARGUMENT and ErrBadKey for a key that is not valid,
// NOT_FOUND and ErrNotFound for one that is not stored.
func (s *Store) lookup(k []byte) (*shard, ref, Code, error) {
	return s.lookupSeen(k, false)
}

// lookupSeen is lookup, which with unseen also finds a fetched copy its
// home has not taken yet: for the call that fetched it, and for what
// this host holds whoever may read it.
func (s *Store) lookupSeen(k []byte, unseen bool) (*shard, ref, Code, error) {
	sh, r, found, err := s.lock(k)
	if err != nil {
		return nil, ref{}, InvalidArgument, err
	}
	if !found || sh.ent(r.idx).state != stReady || !unseen && sh.ent(r.idx).flags&fUnseen != 0 {
		sh.mu.Unlock()
		return nil, ref{}, NotFound, ErrNotFound
	}
	return sh, r, OK, nil
}

// pinLocked pins stored entry r for the session (mayPin allowed it); a
// pinned entry is off the LRU list. sh.mu is held on entry and released
// on return; ss.mu is held.
func (ss *Session) pinLocked(sh *shard, r ref) {
	size := sh.ent(r.idx).size
	ss.s.pinEntryLocked(sh, r.idx, ss.others)
	sh.mu.Unlock()
	hd, held := ss.holds[r]
	if !held {
		ss.count(&hd, size)
	}
	hd.pins++
	ss.holds[r] = hd
}

// pinEntryLocked takes one pin of stored entry idx, for another host's
// read when others is set, and takes it off the LRU list (unpinEntry
// gives it back). sh.mu is held.
func (s *Store) pinEntryLocked(sh *shard, idx uint32, others bool) {
	sh.ent(idx).pins++
	if others {
		sh.othersPinned(idx, 1)
	}
	sh.lruDel(idx)
	s.c.pins.Add(1)
}

// newCall takes a call record for results (codes, errs) that L2 I/O will
// make final.
func (s *Store) newCall(done Completion, tag uint64, codes []Code, errs []error) *call {
	cl := s.calls.get(done, tag)
	cl.codes, cl.errs = codes, errs
	return cl
}

// dispatch starts the L2 I/O of kind k (kPut, kPromote or kInval) that a
// call gathered in cl, nil when every result is already final, ends the
// call's admission, and says whether results are still pending.
func (s *Store) dispatch(cl *call, k uint8) (pending bool, err error) {
	if cl == nil {
		s.exit()
		return false, nil
	}
	switch {
	case k == kPut:
		err = s.l2.startWrites(cl.its, &cl.sub, &cl.xts)
	case k == kInval:
		err = s.l2.startInvals(cl.its, &cl.xts)
	case len(cl.its) > 0:
		err = s.l2.startReads(cl.its, &cl.xts)
	}
	s.exit()
	return cl.release(&s.calls), err
}

// Exists reports for each key OK when it is stored (on either tier) and
// NOT_FOUND otherwise. It changes nothing: no lease, pin or LRU position is
// renewed by it.
func (s *Store) Exists(keys [][]byte, codes []Code) error {
	if err := s.begin(len(keys), codes, nil); err != nil {
		return err
	}
	for i, k := range keys {
		sh, _, c, _ := s.lookup(k)
		if c == OK {
			sh.mu.Unlock()
		}
		codes[i] = c
	}
	s.presentElsewhere(keys, codes)
	s.exit()
	return nil
}

// LookupPrefix returns how many leading keys are stored. With pin it also
// pins them for the session in the same call, so that a Get that follows
// cannot miss: the n keys are all present and pinned when it returns (each
// is pinned as it is found, under its shard's lock, and a pin keeps it). A
// key past MaxPins, or one the session may not pin within
// Config.MaxSessionPinned, ends the prefix there. Without pin it changes
// nothing.
//
// With the store across hosts (SetRemote), the run goes on past the keys
// stored here with those other hosts hold, as their homes say; with pin
// those are fetched into this store first and pinned here. That waits on
// other hosts (up to the remote deadline): a caller that must not wait
// uses LookupPrefixAsync.
func (ss *Session) LookupPrefix(keys [][]byte, pin bool) (int, error) {
	n, more, err := ss.prefixStart(keys, pin)
	if !more {
		return n, err
	}
	defer ss.s.exit()
	return ss.prefixElsewhere(keys, n, pin)
}

// prefixStart is the part of a LookupPrefix done here: the call's checks
// and the run stored here (n). With more, the run may go on at other hosts
// and the store is left entered for the caller to exit once they answered;
// otherwise n and err are the answer and the store is not entered.
func (ss *Session) prefixStart(keys [][]byte, pin bool) (n int, more bool, err error) {
	s := ss.s
	if len(keys) > s.cfg.MaxKeysPerCall {
		return 0, false, fmt.Errorf("%w: %d keys (at most %d)", ErrBadCall, len(keys), s.cfg.MaxKeysPerCall)
	}
	if !s.enter() {
		return 0, false, ErrClosed
	}
	n, err = ss.prefixHere(keys, pin)
	if err != nil || n == len(keys) || s.rem() == nil {
		s.exit()
		return n, false, err
	}
	return n, true, nil
}

// PrefixResult is the answer of a LookupPrefixAsync that went pending: the
// length of the leading run, and the error that cut it, if any.
type PrefixResult struct {
	N   int
	Err error
}

// LookupPrefixAsync is LookupPrefix for a caller that must not wait on
// other hosts (a queue's worker, which serves other clients' queues). The
// run stored here is looked up (and with pin pinned) at once; when it
// stops short and other hosts may hold the rest, the rest is asked of
// their homes (and with pin fetched here and pinned) in the background,
// pending is true, and done.StoreDone(tag) is called once res holds the
// answer. Otherwise the answer is n and err, and done is not called.
func (ss *Session) LookupPrefixAsync(keys [][]byte, pin bool, res *PrefixResult, done Completion, tag uint64) (int, bool, error) {
	n, more, err := ss.prefixStart(keys, pin)
	if !more {
		return n, false, err
	}
	s := ss.s
	rest := make([][]byte, len(keys)-n)
	for i, k := range keys[n:] {
		rest[i] = bytes.Clone(k)
	}
	// The store stays entered (Close waits) until the other hosts
	// answered: at most the remote deadline, twice with pin (Present,
	// then the fetches).
	here := n // not n itself: a result the goroutine shared would be on the heap at every call
	go func() {
		m, err := ss.prefixElsewhere(rest, 0, pin)
		res.N, res.Err = here+m, err
		s.exit()
		done.StoreDone(tag)
	}()
	return n, true, nil
}

// prefixHere is LookupPrefix over the keys stored here.
func (ss *Session) prefixHere(keys [][]byte, pin bool) (int, error) {
	return ss.prefixSeen(keys, pin, false)
}

// prefixSeen is prefixHere, over unseen copies too with unseen (the keys a
// LookupPrefix has just fetched for itself).
func (ss *Session) prefixSeen(keys [][]byte, pin, unseen bool) (int, error) {
	s := ss.s
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return 0, ErrClosed
	}
	n := 0
	for _, k := range keys {
		sh, r, _, err := s.lookupSeen(k, unseen)
		if err != nil {
			break
		}
		if pin {
			if ss.mayPin(r, sh.ent(r.idx)) != nil {
				sh.mu.Unlock()
				s.c.prefixCut.Add(1)
				break
			}
			ss.pinLocked(sh, r)
		} else {
			sh.mu.Unlock()
		}
		n++
	}
	return n, nil
}

// Pin pins every key for the session, or none: an absent key (NOT_FOUND),
// one at MaxPins or one past the session's Config.MaxSessionPinned
// (RESOURCE_EXHAUSTED) fails the batch, the other keys get
// FAILED_PRECONDITION and nothing changes. With ttl > 0 each pin is a lease
// that ends by itself after ttl (a key holds at most one lease per session;
// pinning it again with a TTL extends the lease, never shortens it). A
// pinned key is never evicted, moved or removed.
func (ss *Session) Pin(keys [][]byte, ttl time.Duration, codes []Code) error {
	s := ss.s
	if ttl < 0 || ttl > s.cfg.MaxLeaseTTL {
		fill(codes, InvalidArgument)
		return fmt.Errorf("%w: ttl %v (want 0..%v)", ErrBadCall, ttl, s.cfg.MaxLeaseTTL)
	}
	if err := ss.begin(len(keys), codes, nil); err != nil {
		return err
	}
	defer s.exit()
	defer ss.mu.Unlock()
	now := s.now()
	exp := now + int64(ttl)
	plan := ss.plan[:0]
	pinned := ss.pinnedBytes
	var first error
	for i, k := range keys {
		codes[i] = OK
		sh, r, c, err := s.lookup(k)
		if err != nil {
			codes[i] = c
			first = firstErr(first, i, err)
			continue
		}
		e := sh.ent(r.idx)
		prev, existed := ss.holds[r]
		hd := prev
		need := true
		if ttl == 0 {
			hd.pins++
		} else if hd.lease != 0 {
			need = false
			if exp > hd.lease {
				hd.lease = exp
				hd.lver++
			}
		} else {
			hd.lease = exp
			hd.lver++
		}
		if need {
			if err := ss.mayPin(r, e); err != nil {
				sh.mu.Unlock()
				codes[i] = ResourceExhausted
				first = firstErr(first, i, err)
				continue
			}
			// Tentative: the entry stays on the LRU list until the batch
			// is known to apply, so an undo leaves its position as it was.
			// Eviction never takes a pinned entry.
			e.pins++
			if ss.others {
				sh.othersPinned(r.idx, 1)
			}
		}
		if !existed {
			ss.count(&hd, e.size)
		}
		sh.mu.Unlock()
		ss.holds[r] = hd
		plan = append(plan, planStep{r: r, prev: prev, existed: existed, entry: need})
	}
	ss.plan = plan
	if first != nil {
		for j := range plan {
			if p := &plan[j]; p.entry {
				s.untakePin(p.r, ss.others)
			}
		}
		ss.undoHolds(plan, pinned)
		notApplied(codes)
		return first
	}
	for j := range plan {
		p := &plan[j]
		if p.entry {
			sh := &s.shards[p.r.sh]
			sh.mu.Lock()
			sh.lruDel(p.r.idx)
			sh.mu.Unlock()
			s.c.pins.Add(1)
		}
		if ttl > 0 {
			if hd := ss.holds[p.r]; hd.lver != p.prev.lver {
				s.addLease(ss, p.r, hd.lver, hd.lease)
			}
		}
	}
	return nil
}

func firstErr(first error, i int, err error) error {
	if first != nil {
		return first
	}
	return fmt.Errorf("%w: key %d: %w", ErrNotApplied, i, err)
}

// undoHolds puts back, last first, the session's holds that plan changed,
// and its pinned bytes as they were before (pinned).
func (ss *Session) undoHolds(plan []planStep, pinned uint64) {
	ss.pinnedBytes = pinned
	for j := len(plan) - 1; j >= 0; j-- {
		p := &plan[j]
		if p.existed {
			ss.holds[p.r] = p.prev
		} else {
			delete(ss.holds, p.r)
		}
	}
}

// notApplied gives FAILED_PRECONDITION to the keys of a batch refused as a
// whole that were not refused themselves.
func notApplied(codes []Code) {
	for i := range codes {
		if codes[i] == OK {
			codes[i] = FailedPrecondition
		}
	}
}

// Unpin drops one pin of the session from every key, or from none: a key
// the session holds no pin or lease on (FAILED_PRECONDITION, an unpin below
// zero) or an absent key (NOT_FOUND) fails the batch, the other keys get
// FAILED_PRECONDITION and nothing changes. An unpin drops an untimed pin
// first, then the key's lease; a pin on a value removed from another host
// while pinned (hidden, hide.go) before one on the key's value now.
func (ss *Session) Unpin(keys [][]byte, codes []Code) error {
	s := ss.s
	if err := ss.begin(len(keys), codes, nil); err != nil {
		return err
	}
	defer s.exit()
	defer ss.mu.Unlock()
	plan := ss.plan[:0]
	pinned := ss.pinnedBytes
	var first error
	for i, k := range keys {
		codes[i] = OK
		sh, r, found, err := s.lock(k)
		if err != nil {
			codes[i] = InvalidArgument
			first = firstErr(first, i, err)
			continue
		}
		if len(sh.hidden) > 0 {
			// A pin on a hidden entry of the key goes first (hide.go).
			if hr, ok := ss.hiddenHold(k); ok {
				r, found = hr, true
			}
		}
		sh.mu.Unlock()
		if !found {
			codes[i] = NotFound
			first = firstErr(first, i, ErrNotFound)
			continue
		}
		prev, existed := ss.holds[r]
		hd := prev
		switch {
		case hd.pins > 0:
			hd.pins--
		case hd.lease != 0:
			hd.lease = 0
			hd.lver++
		default:
			codes[i] = FailedPrecondition
			first = firstErr(first, i, ErrUnderflow)
			continue
		}
		ss.setHold(r, hd)
		plan = append(plan, planStep{r: r, prev: prev, existed: existed, entry: true})
	}
	ss.plan = plan
	if first != nil {
		ss.undoHolds(plan, pinned)
		notApplied(codes)
		return first
	}
	for j := range plan {
		s.unpinEntry(plan[j].r, 1, ss.others)
	}
	return nil
}

// untakePin drops a tentative pin of Pin's (a batch that did not apply).
// The entry stayed on the LRU list meanwhile, unless another session
// pinned and unpinned it in between (its pin took the entry off, and its
// unpin, seeing the tentative pin, did not put it back): then the entry is
// put back as an unpin would, or freed if it was hidden meanwhile.
func (s *Store) untakePin(r ref, others bool) {
	sh := &s.shards[r.sh]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.ent(r.idx)
	e.pins--
	if others {
		sh.othersPinned(r.idx, -1)
	}
	if e.pins == 0 && e.flags&fInLRU == 0 {
		s.lastPinGone(sh, r.idx)
	}
}

// Reserve takes a pool block for each key, to be written in place by the
// client at locs[i] and then committed with Commit. A key already stored
// gets ALREADY_EXISTS, one with a put in flight BUSY; a size of 0 or over
// MaxValueSize INVALID_ARGUMENT; a full L1 RESOURCE_EXHAUSTED. A
// reservation is invisible to readers until committed, and goes when the
// session closes.
func (ss *Session) Reserve(keys [][]byte, sizes []uint64, locs []Location, codes []Code, errs []error) error {
	s := ss.s
	if err := ss.begin(len(keys), codes, errs, len(sizes), len(locs)); err != nil {
		return err
	}
	defer s.exit()
	defer ss.mu.Unlock()
	for i, k := range keys {
		locs[i] = Location{}
		setResult(codes, errs, i, OK, nil)
		size := sizes[i]
		if err := s.checkPut(k, size); err != nil {
			setError(codes, errs, i, err)
			continue
		}
		bs := s.blockBytes(size)
		if ss.resvBytes+bs > s.cfg.MaxSessionReserved {
			setError(codes, errs, i, fmt.Errorf("%w: %d bytes reserved, %d more asked (at most %d per session)",
				ErrReserveLimit, ss.resvBytes, bs, s.cfg.MaxSessionReserved))
			continue
		}
		r, off, err := s.reserve(k, size, 0)
		if err != nil {
			setError(codes, errs, i, err)
			continue
		}
		ss.resv[r] = bs
		ss.resvBytes += bs
		locs[i] = Location{Offset: off, Length: size}
	}
	return nil
}

func (s *Store) checkPut(k []byte, size uint64) error {
	if !s.validKey(k) {
		return ErrBadKey
	}
	if size == 0 || size > s.cfg.MaxValueSize {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrBadSize, size, s.cfg.MaxValueSize)
	}
	return nil
}

// reserve inserts key k in state stReserved with a fresh pool block for
// size bytes. No shard lock is held.
func (s *Store) reserve(k []byte, size uint64, flags uint16) (ref, uint64, error) {
	h, sh, si := s.hash(k)
	sh.mu.Lock()
	if idx, ok := sh.find(h, k); ok && !s.supersede(sh, idx) {
		st := sh.ent(idx).state
		sh.mu.Unlock()
		return ref{}, 0, busyOrExists(st)
	}
	sh.mu.Unlock()
	off, err := s.allocBlock(size)
	if err != nil {
		return ref{}, 0, err
	}
	sh.mu.Lock()
	if idx, ok := sh.find(h, k); ok && !s.supersede(sh, idx) {
		st := sh.ent(idx).state
		sh.mu.Unlock()
		return ref{}, 0, joinFree(busyOrExists(st), s.freeBlock(off, uint32(size)))
	}
	idx := sh.insert(h, k, stReserved)
	e := sh.ent(idx)
	e.l1, e.size, e.flags = off, uint32(size), flags
	r := ref{si, idx, e.gen}
	sh.mu.Unlock()
	s.c.reserved.Add(1)
	return r, off, nil
}

// supersede gives a put the key of entry idx when the store's own
// invalidation of its L2 block is in flight (an eviction from L2, a
// corrupt block dropped) and nothing else holds it: the key is gone for
// every reader already, and that work is no caller's business, so a put
// of the key is not BUSY. The entry leaves the table and the key's
// counts, and endInval frees it; the new value's block headers carry
// higher sequence numbers, so recovery keeps them over the old header
// should it outlive a failed invalidation, and such a header (a ghost,
// tier2.ghosts) is zeroed before the new value's is. Until that
// invalidation ends, every invalidation of the key's newer entries waits
// before it zeroes their own header or drops a value in L1 only
// (reqInval): the older header it is zeroing may outlive it. It reports
// whether the key is free now. sh.mu is held.
func (s *Store) supersede(sh *shard, idx uint32) bool {
	e := sh.ent(idx)
	if e.state != stDropping || e.flags&(fBgDrop|fRemove) != fBgDrop || e.pins != 0 {
		return false
	}
	sh.unindex(idx)
	e.flags |= fSuperseded
	s.l2.olderStarts(sh.keyOf(e))
	s.c.keys.Add(^uint64(0))
	s.evicted(sh, idx) // before the new value's announcement, under the same lock
	return true
}

// joinFree combines an outcome with a failed rollback step, never dropping
// either.
func joinFree(cause, rollback error) error {
	if rollback == nil {
		return cause
	}
	if cause == nil {
		return rollback
	}
	return fmt.Errorf("%w (and rolling back: %w)", cause, rollback)
}

// publish makes a reserved entry visible in L1. sh.mu is held. The caller
// kicks the maintenance loop (once per call) so that it writes back. With
// the store across hosts, crc is the value's crc32c (haveCRC), taken by the
// caller before it locked the shard (crcOutside): the announcement then
// reads nothing under the lock. With unseen it is a fetched copy
// (CommitFetched): stored, and announced, but neither seen by readers here
// nor written back until Confirm (unseen.go).
func (s *Store) publish(sh *shard, r ref, crc uint32, haveCRC, unseen bool) {
	idx := r.idx
	e := sh.ent(idx)
	e.state = stReady
	e.flags = e.flags&^fCopyPut | fL1
	switch {
	case unseen:
		e.flags |= fUnseen
		s.c.unseen.Add(1)
	case s.l2 != nil:
		e.flags |= fDirty
		sh.dirtyAdd(idx)
		s.c.dirtyOwed.Add(1)
	}
	sh.lruAdd(idx)
	s.c.reserved.Add(^uint64(0))
	s.c.keys.Add(1)
	s.c.l1Keys.Add(1)
	s.announce(sh, r, crc, haveCRC)
}

// crcOutside is the crc32c of pool bytes [off, off+size) of a value about
// to be published, when the store across hosts will announce it (else
// false): taken with no shard lock held, so a commit of large values does
// not hold its shard for the checksum. The caller owns the block (a
// reservation of its session, whose mu it holds, or a copying put's).
func (s *Store) crcOutside(off, size uint64) (uint32, bool) {
	if s.rem() == nil {
		return 0, false
	}
	return crc32c(s.poolMem[off : off+size]), true
}

// Commit makes reserved keys visible. Without durable they are visible at
// once in L1 (and written back to L2 later, when there is one). With
// durable each key is written to L2 first and becomes visible (in both
// tiers) only once its block is on the device; if that fails, the key's
// reservation is exactly as before the call (same block, still owned by
// the session, invisible) and L1 and its LRU order are untouched. A key not
// reserved by this session gets FAILED_PRECONDITION, or ALREADY_EXISTS /
// BUSY when it is stored / in flight.
func (ss *Session) Commit(keys [][]byte, durable bool, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	return ss.commit(keys, durable, 0, nil, false, codes, errs, done, tag)
}

// CommitCopies is Commit with copies (this host's included) kept of each
// value by the store across hosts, for this call: 0 is the session's
// number (SetReplicas), 1 none elsewhere (replicate.go).
func (ss *Session) CommitCopies(keys [][]byte, durable bool, copies int, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	return ss.commit(keys, durable, copies, nil, false, codes, errs, done, tag)
}

// CommitChecked is a blocking Commit of values whose crc32c the caller
// took already (crcs[i], checked against what their writer announced):
// the store across hosts commits a value it fetched with it, so that the
// bytes are not read a second time (with durable, the write to L2 takes
// its own).
func (ss *Session) CommitChecked(keys [][]byte, durable bool, crcs []uint32, codes []Code, errs []error) error {
	if len(crcs) != len(keys) {
		return fmt.Errorf("%w: %d checksums for %d keys", ErrBadCall, len(crcs), len(keys))
	}
	_, err := ss.commit(keys, durable, 0, crcs, false, codes, errs, nil, 0)
	return err
}

// CommitFetched is CommitChecked, without durable, of copies the store
// across hosts fetched from another host: each is stored here unseen
// (unseen.go) until Confirm names its record, once the key's home has
// taken its announcement. Only the fetching call reads it meanwhile.
func (ss *Session) CommitFetched(keys [][]byte, crcs []uint32, codes []Code, errs []error) error {
	if len(crcs) != len(keys) {
		return fmt.Errorf("%w: %d checksums for %d keys", ErrBadCall, len(crcs), len(keys))
	}
	_, err := ss.commit(keys, false, 0, crcs, true, codes, errs, nil, 0)
	return err
}

func (ss *Session) commit(keys [][]byte, durable bool, copies int, crcs []uint32, unseen bool, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	s := ss.s
	if copies < 0 || copies > MaxReplicas {
		fill(codes, InvalidArgument)
		return false, fmt.Errorf("%w: %d copies (want 0..%d)", ErrBadCall, copies, MaxReplicas)
	}
	if err := ss.begin(len(keys), codes, errs); err != nil {
		return false, err
	}
	var cl *call
	published := false
	rp, copies := ss.copies(copies)
	var later []int // keys published without durable, copied elsewhere in the background
	for i, k := range keys {
		setResult(codes, errs, i, OK, nil)
		sh, r, found, err := s.lock(k)
		if err != nil {
			setResult(codes, errs, i, InvalidArgument, err)
			continue
		}
		if !found {
			sh.mu.Unlock()
			setResult(codes, errs, i, FailedPrecondition, ErrNotReserved)
			continue
		}
		e := sh.ent(r.idx)
		if _, mine := ss.resv[r]; !mine || e.state != stReserved {
			err := ErrNotReserved
			if e.state == stReady || e.state == stPutting || e.state == stReserved && !mine {
				err = busyOrExists(e.state)
			}
			sh.mu.Unlock()
			setError(codes, errs, i, err)
			continue
		}
		if !durable {
			off, size := e.l1, uint64(e.size)
			crc, haveCRC := uint32(0), false
			if crcs != nil {
				crc, haveCRC = crcs[i], true
			} else if s.rem() != nil {
				// ss.mu is held and the entry is this session's
				// reservation: nobody else moves it meanwhile.
				sh.mu.Unlock()
				crc, haveCRC = s.crcOutside(off, size)
				sh.mu.Lock()
			}
			s.publish(sh, r, crc, haveCRC, unseen)
			sh.mu.Unlock()
			if !unseen {
				s.journalPublished(r, off, size) // an unseen copy's waits for Confirm
			}
			ss.unreserve(r)
			published = true
			if rp != nil {
				later = append(later, i)
			}
			continue
		}
		if s.l2 == nil {
			sh.mu.Unlock()
			setResult(codes, errs, i, FailedPrecondition, ErrNoL2)
			continue
		}
		e.state = stPutting
		e.io++
		if cl == nil {
			cl = s.newCall(done, tag, codes, errs)
		}
		it := s.l2.getTask(false)
		if it == nil {
			// Every task is busy, most likely with the store's own
			// writeback: the key waits for the next one (wait.go).
			cl.left.Add(1)
			s.l2.enqueue(waitKey{kind: kPut, commit: true, ss: ss, rp: rp, copies: copies,
				r: r, l1: e.l1, size: e.size, cl: cl, pos: int32(i)})
			sh.mu.Unlock()
			continue
		}
		it.kind, it.commit, it.r, it.l1, it.size = kPut, true, r, e.l1, e.size
		it.ss = ss
		it.rp, it.copies = rp, copies
		sh.mu.Unlock()
		cl.add(it, i)
	}
	ss.mu.Unlock()
	if published && s.l2 != nil {
		s.kick()
	}
	ss.replicateLater(rp, copies, keys, later)
	return s.dispatch(cl, kPut)
}

// Abort gives back reservations without committing them: each key this
// session reserved (Reserve) and has not committed is released, its pool
// block freed as a closing session frees it, and gets OK. Any other key
// gets FAILED_PRECONDITION (ErrNotReserved) and nothing changes: one never
// reserved, committed or aborted already, or reserved by another session,
// which this call never touches. A key whose durable commit is in flight
// gets BUSY and its commit goes on. Keys are independent (not all or
// nothing); a batch with an invalid key (empty, over MaxKeyLen) is refused
// as a whole, like one with too many keys: ErrBadCall, every code
// INVALID_ARGUMENT, nothing changed. An error in errs[i] with code INTERNAL
// says that a released reservation's block could not be freed (a bug, also
// counted in Stats.FreeErrors).
func (ss *Session) Abort(keys [][]byte, codes []Code, errs []error) error {
	s := ss.s
	for i, k := range keys {
		if !s.validKey(k) {
			fill(codes, InvalidArgument)
			return fmt.Errorf("%w: key %d: %w", ErrBadCall, i, ErrBadKey)
		}
	}
	if err := ss.begin(len(keys), codes, errs); err != nil {
		return err
	}
	defer s.exit()
	defer ss.mu.Unlock()
	for i, k := range keys {
		setResult(codes, errs, i, OK, nil)
		sh, r, found, _ := s.lock(k)
		if !found {
			sh.mu.Unlock()
			setResult(codes, errs, i, FailedPrecondition, ErrNotReserved)
			continue
		}
		st := sh.ent(r.idx).state
		sh.mu.Unlock()
		_, mine := ss.resv[r]
		switch {
		case !mine || st != stReserved && st != stPutting:
			setResult(codes, errs, i, FailedPrecondition, ErrNotReserved)
		case st == stPutting:
			setResult(codes, errs, i, Busy, ErrBusy)
		default:
			// ss.mu is held, so the reservation is still this session's
			// and still stReserved (only a Commit of this session moves
			// it on): abortReservation frees it.
			ss.unreserve(r)
			s.c.aborted.Add(1)
			if err := s.abortReservation(r); err != nil {
				setResult(codes, errs, i, Internal, err)
			}
		}
	}
	return nil
}

// Put stores each key with a copy of its value (vals[i], which the call
// reads only while it runs). Without durable a key is visible when Put
// returns; with durable once its block is on L2, and on failure the key is
// not stored and L1 and its LRU order are as before the call. (Taking the
// key's pool block may have evicted clean values to make room, before the
// write; they are still on L2, so no stored value is lost.) A key already
// stored gets ALREADY_EXISTS, one with a put in flight BUSY; concurrent
// puts of one key store it exactly once.
func (ss *Session) Put(keys, vals [][]byte, durable bool, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	return ss.PutCopies(keys, vals, durable, 0, codes, errs, done, tag)
}

// PutCopies is Put with copies (this host's included) kept of each value
// by the store across hosts, for this call: 0 is the session's number
// (SetReplicas), 1 none elsewhere (replicate.go).
func (ss *Session) PutCopies(keys, vals [][]byte, durable bool, copies int, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	s := ss.s
	if copies < 0 || copies > MaxReplicas {
		fill(codes, InvalidArgument)
		return false, fmt.Errorf("%w: %d copies (want 0..%d)", ErrBadCall, copies, MaxReplicas)
	}
	if err := ss.begin(len(keys), codes, errs, len(vals)); err != nil {
		return false, err
	}
	ss.mu.Unlock() // a copying put holds nothing of the session's
	var cl *call
	published := false
	rp, copies := ss.copies(copies)
	var later []int // keys published without durable, copied elsewhere in the background
	for i, k := range keys {
		setResult(codes, errs, i, OK, nil)
		size := uint64(len(vals[i]))
		if err := s.checkPut(k, size); err != nil {
			setError(codes, errs, i, err)
			continue
		}
		if durable && s.l2 == nil {
			setResult(codes, errs, i, FailedPrecondition, ErrNoL2)
			continue
		}
		r, off, err := s.reserve(k, size, fCopyPut)
		if err != nil {
			setError(codes, errs, i, err)
			continue
		}
		if err := copyGuarded(s.poolMem[off:off+size], vals[i]); err != nil {
			setError(codes, errs, i, joinFree(err, s.dropReserved(r)))
			continue
		}
		sh := &s.shards[r.sh]
		var crc uint32
		var haveCRC bool
		if !durable {
			crc, haveCRC = s.crcOutside(off, size) // the block is this put's own until published
		}
		sh.mu.Lock()
		if !durable {
			s.publish(sh, r, crc, haveCRC, false)
			sh.mu.Unlock()
			s.journalPublished(r, off, size)
			published = true
			if rp != nil {
				later = append(later, i)
			}
			continue
		}
		e := sh.ent(r.idx)
		e.state = stPutting
		e.io++
		if cl == nil {
			cl = s.newCall(done, tag, codes, errs)
		}
		it := s.l2.getTask(false)
		if it == nil {
			// The key waits for the next free task (wait.go).
			cl.left.Add(1)
			s.l2.enqueue(waitKey{kind: kPut, rp: rp, copies: copies, r: r, l1: e.l1, size: e.size, cl: cl, pos: int32(i)})
			sh.mu.Unlock()
			continue
		}
		it.kind, it.commit, it.r, it.l1, it.size = kPut, false, r, e.l1, e.size
		it.rp, it.copies = rp, copies
		sh.mu.Unlock()
		cl.add(it, i)
	}
	if published && s.l2 != nil {
		s.kick()
	}
	ss.replicateLater(rp, copies, keys, later)
	return s.dispatch(cl, kPut)
}

// dropReserved removes a reserved (or failed putting) entry and frees its
// block. No shard lock is held.
func (s *Store) dropReserved(r ref) error {
	sh := &s.shards[r.sh]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.ent(r.idx)
	err := s.freeBlock(e.l1, e.size)
	s.c.reserved.Add(^uint64(0))
	sh.remove(r.idx)
	return err
}

// copyGuarded copies src to dst, turning a fault (memory a client unmapped
// or truncated under the copy) into ErrFault. Every copy here is between
// the pool and a client's memory, and neither side reads the bytes soon (a
// value put waits for its readers, a value read lands in a client's buffer
// that an engine hands to a device): large copies bypass the caches
// (faultcopy.Stream).
func copyGuarded(dst, src []byte) error {
	if !faultcopy.GuardedStream(dst, src) {
		return ErrFault
	}
	return nil
}

// Get pins each stored key for the session and returns where its value
// lies in the pool (locs[i]); the client reads it in place and Unpins it. A
// key only on L2 is promoted first: a pool block is reserved, the value is
// read into it (READ_FIXED) and checked, then pinned. A key that is not
// stored gets NOT_FOUND; past MaxPins, or past the session's
// Config.MaxSessionPinned (a value it does not hold pinned yet, checked
// before a promotion and again when it ends), RESOURCE_EXHAUSTED. A promotion
// that finds every L2 task busy waits for one (wait.go), and readers of a
// key being promoted wait for that promotion.
//
// With the store across hosts (SetRemote), a key stored on another host
// is read from it into a pool block here, checked, kept as a value of this
// store and answered like a local hit.
func (ss *Session) Get(keys [][]byte, locs []Location, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	return ss.get(keys, locs, codes, errs, done, tag, true)
}

// GetHere is a blocking Get of the values stored here only (what a reader
// on another host asks of this one).
func (ss *Session) GetHere(keys [][]byte, locs []Location, codes []Code, errs []error) error {
	_, err := ss.get(keys, locs, codes, errs, nil, 0, false)
	return err
}

func (ss *Session) get(keys [][]byte, locs []Location, codes []Code, errs []error, done Completion, tag uint64, everywhere bool) (pending bool, err error) {
	s := ss.s
	if err := ss.begin(len(keys), codes, errs, len(locs)); err != nil {
		return false, err
	}
	var cl *call
	var reads readCounts
	defer reads.add(&s.c)
	for i, k := range keys {
		again := 0
	lookup:
		locs[i] = Location{}
		sh, r, c, err := s.lookup(k)
		setResult(codes, errs, i, c, err)
		if err != nil {
			reads.miss(c)
			continue
		}
		e := sh.ent(r.idx)
		if again == 0 {
			reads.hit(e)
		}
		if err := ss.mayPin(r, e); err != nil {
			sh.mu.Unlock()
			setResult(codes, errs, i, ResourceExhausted, err)
			continue
		}
		if e.flags&fL1 != 0 {
			if e.flags&fInL2LRU != 0 {
				sh.l2Touch(r.idx)
			}
			locs[i] = Location{Offset: e.l1, Length: uint64(e.size)}
			ss.pinLocked(sh, r)
			continue
		}
		if cl == nil {
			cl = s.newCall(done, tag, codes, errs)
			cl.locs = locs
		}
		if err := s.promote(sh, r, waitRec{cl: cl, pos: int32(i), ss: ss, get: true}); err != nil {
			if err == errAgain && again < maxAgain {
				again++
				goto lookup
			}
			setError(codes, errs, i, err)
		}
	}
	ss.mu.Unlock()
	if everywhere && s.rem() != nil {
		if cl == nil && slices.Contains(codes[:len(keys)], NotFound) {
			// A fetched value may need promoting (landGet): the call
			// carries where its locations go.
			cl = s.newCall(done, tag, codes, errs)
			cl.locs = locs
		}
		cl = s.fetchMisses(cl, keys, codes, errs, done, tag, ss.landGet(locs, codes, errs))
	}
	return s.dispatch(cl, kPromote)
}

// Read copies each stored key's value into dsts[i] (which must be at least
// as long as the value; lens[i] is set to the value's length either way,
// and to 0 for a key not found or whose value could not be read back). A
// key only on L2 is promoted first, as for Get. The copy holds a read
// reference, so the block is neither evicted nor freed under it.
func (s *Store) Read(keys, dsts [][]byte, lens []uint64, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	if err := s.begin(len(keys), codes, errs, len(dsts), len(lens)); err != nil {
		return false, err
	}
	var cl *call
	var reads readCounts
	defer reads.add(&s.c)
	for i, k := range keys {
		again := 0
	lookup:
		lens[i] = 0
		sh, r, c, err := s.lookup(k)
		setResult(codes, errs, i, c, err)
		if err != nil {
			reads.miss(c)
			continue
		}
		e := sh.ent(r.idx)
		if again == 0 {
			reads.hit(e)
		}
		lens[i] = uint64(e.size)
		if uint64(len(dsts[i])) < uint64(e.size) {
			sh.mu.Unlock()
			setResult(codes, errs, i, InvalidArgument, ErrShortBuffer)
			continue
		}
		if e.io == ^uint16(0) {
			sh.mu.Unlock()
			setResult(codes, errs, i, Busy, ErrBusy)
			continue
		}
		if e.flags&fL1 != 0 {
			e.io++
			if e.flags&fInLRU != 0 {
				sh.lruAdd(r.idx)
			}
			if e.flags&fInL2LRU != 0 {
				sh.l2Touch(r.idx)
			}
			off, size := e.l1, uint64(e.size)
			sh.mu.Unlock()
			err := copyGuarded(dsts[i][:size], s.poolMem[off:off+size])
			sh.mu.Lock()
			e.io--
			sh.mu.Unlock()
			if err != nil {
				setError(codes, errs, i, err)
			}
			continue
		}
		if cl == nil {
			cl = s.newCall(done, tag, codes, errs)
			cl.dsts, cl.lens = dsts, lens
		}
		if err := s.promote(sh, r, waitRec{cl: cl, pos: int32(i)}); err != nil {
			if err == errAgain && again < maxAgain {
				again++
				goto lookup
			}
			setError(codes, errs, i, err)
		}
	}
	if s.rem() != nil {
		if cl == nil && slices.Contains(codes[:len(keys)], NotFound) {
			cl = s.newCall(done, tag, codes, errs)
			cl.dsts, cl.lens = dsts, lens
		}
		cl = s.fetchMisses(cl, keys, codes, errs, done, tag, s.landRead(dsts, lens, codes, errs))
	}
	return s.dispatch(cl, kPromote)
}

// readCounts are one call's hits and misses, added to the store's
// counters once per call rather than once per key.
type readCounts struct{ l1, l2, absent uint64 }

// hit counts a stored key by where its value is: L1, or L2 only.
func (rc *readCounts) hit(e *entry) {
	if e.flags&fL1 != 0 {
		rc.l1++
	} else {
		rc.l2++
	}
}

// miss counts a key that is not stored (not one that is not valid).
func (rc *readCounts) miss(c Code) {
	if c == NotFound {
		rc.absent++
	}
}

func (rc *readCounts) add(c *counters) {
	if rc.l1 > 0 {
		c.hitsL1.Add(rc.l1)
	}
	if rc.l2 > 0 {
		c.hitsL2.Add(rc.l2)
	}
	if rc.absent > 0 {
		c.misses.Add(rc.absent)
	}
}

// promote makes w wait for the promotion of L2-only entry r, starting one
// (added to w's call, to be dispatched by the caller) unless one is in
// flight; with no free task the key waits for one (wait.go). errAgain: the
// value came into L1 meanwhile, the caller looks the key up again. sh.mu
// is held on entry and released on return.
func (s *Store) promote(sh *shard, r ref, w waitRec) error {
	return s.promoteAs(sh, r, w, true)
}

// promoteLater is promote for a call whose tasks are dispatched already
// (a fetch's answer that found its value evicted to L2): the promotion
// waits for an L2 task with the keys that found none, and the maintenance
// loop starts it.
func (s *Store) promoteLater(sh *shard, r ref, w waitRec) error {
	return s.promoteAs(sh, r, w, false)
}

func (s *Store) promoteAs(sh *shard, r ref, w waitRec, direct bool) error {
	e := sh.ent(r.idx)
	if e.flags&fPromote != 0 {
		return s.joinPromotion(sh, e, w)
	}
	size := e.size
	sh.mu.Unlock()
	off, err := s.allocBlock(uint64(size))
	if err != nil {
		return err
	}
	sh.mu.Lock()
	e = sh.ent(r.idx)
	switch {
	case e.gen != r.gen || e.state != stReady:
		// Removed, or evicted from L2, while the lock was dropped.
		sh.mu.Unlock()
		return joinFree(ErrNotFound, s.freeBlock(off, size))
	case e.flags&fPromote != 0:
		// Another call started it while the lock was dropped: wait for
		// that one.
		err := s.joinPromotion(sh, e, w)
		return joinFree(err, s.freeBlock(off, size))
	case e.flags&fL1 != 0:
		sh.mu.Unlock()
		return joinFree(errAgain, s.freeBlock(off, size))
	}
	w.cl.left.Add(1)
	var it *ioTask
	if direct {
		it = s.l2.getTask(false)
	}
	if it == nil {
		s.l2.enqueue(waitKey{kind: kPromote, get: w.get, ss: w.ss, r: r, l1: off, size: size, cl: w.cl, pos: w.pos})
		sh.mu.Unlock()
		return nil
	}
	s.startPromotion(sh, r, w, off, it)
	w.cl.its = append(w.cl.its, it)
	return nil
}

// errAgain: look the key up again (promote). A key that moved on each of
// maxAgain lookups answers it as it is: BUSY, the key's own state, which a
// retry may find settled.
var errAgain = xfer.Categorized(xfer.ErrBusy, "store: the value came into L1 meanwhile, on every lookup")

// maxAgain bounds how often one key of a call is looked up again.
const maxAgain = 4

// startPromotion makes task it the promotion of L2-only entry r into pool
// block off, with w its first waiter (whose key its call counts as owed
// already). sh.mu is held on entry and released on return.
func (s *Store) startPromotion(sh *shard, r ref, w waitRec, off uint64, it *ioTask) {
	e := sh.ent(r.idx)
	e.flags |= fPromote
	e.next = uint32(it.idx)
	e.l1 = off
	e.io++
	if !w.get {
		e.io++ // the reader's, as joinPromotion takes it
	}
	it.kind, it.r, it.l1, it.size, it.slot, it.crc = kPromote, r, off, e.size, e.l2, e.crc
	it.waiters = append(it.waiters[:0], w)
	sh.mu.Unlock()
}

// joinPromotion adds w to the waiters of e's promotion in flight. A Read
// takes its I/O reference on the value's block here, as a Read of a value
// in L1 takes it before its copy: a key's count is 16 bits, and readers
// that would carry it past that get BUSY, as there, instead of wrapping it
// (a wrapped count lets eviction free the block under the copies, or
// keeps the key busy for good). sh.mu is held on entry and released on
// return.
func (s *Store) joinPromotion(sh *shard, e *entry, w waitRec) error {
	if !w.get {
		if e.io == ^uint16(0) {
			sh.mu.Unlock()
			return ErrBusy
		}
		e.io++
	}
	it := &s.l2.tasks[e.next]
	w.cl.left.Add(1)
	it.waiters = append(it.waiters, w)
	sh.mu.Unlock()
	return nil
}

// Remove removes each key. An absent key is OK (remove is idempotent); a
// pinned one FAILED_PRECONDITION, unless only other hosts' reads pin it
// (NewSessionForOthers): then it goes all the same, hidden from every reader at
// once and freed with the last of those pins; one with a caller's I/O in
// flight (a promotion, a copy out, another Remove) BUSY. A key on L2 is
// gone once its block header has been overwritten on the device, so it
// does not come back after a restart; if that write fails the key stays and its code and
// error say why. The same holds for the headers of older blocks of the key
// that outlived a failed zeroing (tier2.ghosts), overwritten first, even
// when the key's value is in L1 only (removeLocked). The store's own I/O on a key (a writeback, an eviction
// from L2) is no caller's business: the key is invisible at once, and its
// Remove ends when that I/O has (a header the writeback wrote overwritten
// again). A key named more than once in one call is removed once, and
// each of its positions answers what that removal came to: the call's own
// removal is no other caller's, so never BUSY.
//
// With the store across hosts (SetRemote), every other host's copy of
// each key removed here (OK) goes too, before Remove returns. The other
// hosts are asked once this host's removal has ended (a key on L2 ends
// when its header is overwritten), so that their answer is the key's
// last word: a key removed here whose other copies may remain is not OK.
func (s *Store) Remove(keys [][]byte, codes []Code, errs []error, done Completion, tag uint64) (pending bool, err error) {
	if s.rem() == nil {
		return s.remove(keys, nil, codes, errs, done, tag, true, nil)
	}
	if done != nil {
		done = &removeThen{s: s, keys: keys, codes: codes, errs: errs, done: done}
	}
	// A blocking call (done nil) has ended here; one that is pending asks
	// the other hosts in removeThen.
	if pending, err = s.remove(keys, nil, codes, errs, done, tag, true, nil); err != nil || pending {
		return pending, err
	}
	s.removeElsewhere(keys, codes, errs)
	return false, nil
}

// removeThen is the Completion of an asynchronous Remove whose keys waited
// for L2: it asks the other hosts (removeElsewhere, which blocks on them)
// on a goroutine of its own, not on the L2 completion's, and then ends
// the call.
type removeThen struct {
	s     *Store
	keys  [][]byte
	codes []Code
	errs  []error
	done  Completion
}

func (r *removeThen) StoreDone(tag uint64) {
	go func() {
		r.s.removeElsewhere(r.keys, r.codes, r.errs)
		r.done.StoreDone(tag)
	}()
}

// RemoveHere is Remove of this host's copies only: what a key's home asks
// of its holders when a client removed the key elsewhere. It blocks. A key
// pinned here is removed all the same (OK): hidden from every reader at
// once, its block kept for the pins there are and freed with the last
// (hide.go). A key with a caller's I/O in flight still answers BUSY.
func (s *Store) RemoveHere(keys [][]byte, codes []Code, errs []error) error {
	return s.RemoveRecordsHere(keys, nil, codes, errs)
}

// RemoveRecordsHere is RemoveHere of named records. ids (nil, or one per
// key): with ids[i] != 0 only that record of keys[i] goes (another one,
// the key put again since, stays, and the key answers OK); a key answered
// BUSY gets in ids[i] the record found, so that asking again removes that
// one and never a value put after it.
func (s *Store) RemoveRecordsHere(keys [][]byte, ids []RecordID, codes []Code, errs []error) error {
	if ids != nil && len(ids) != len(keys) {
		fill(codes, InvalidArgument)
		return fmt.Errorf("%w: %d record ids for %d keys", ErrBadCall, len(ids), len(keys))
	}
	var pinned []int
	_, err := s.remove(keys, ids, codes, errs, nil, 0, false, &pinned)
	hid := 0
	for _, i := range pinned {
		if codes[i] == OK {
			hid++
		}
	}
	if hid > 0 {
		s.log.Info("store: keys removed elsewhere are pinned here: hidden from every reader now, freed with their last pin",
			"keys", hid, "first", fmt.Sprintf("%q", keys[pinned[0]]), "hidden", s.c.hidden.Load())
	}
	return err
}

// remove is Remove (everywhere) or RemoveHere; for RemoveHere, pinned
// receives the positions of the keys found pinned, to be hidden.
func (s *Store) remove(keys [][]byte, ids []RecordID, codes []Code, errs []error, done Completion, tag uint64, everywhere bool,
	pinned *[]int) (pending bool, err error) {
	if err := s.begin(len(keys), codes, errs); err != nil {
		return false, err
	}
	var cl *call
	for i, k := range keys {
		sh, r, found, err := s.lock(k)
		var it *ioTask
		if found && ids != nil && ids[i] != 0 && r.id() != ids[i] {
			found = false // the record named is gone: this one came after
		}
		if found && cl != nil && sh.ent(r.idx).state == stDropping {
			if j := cl.removing(r); j >= 0 {
				// Named again: this call's own removal of the record is
				// in flight, and its end answers both positions.
				sh.mu.Unlock()
				setError(codes, errs, i, nil)
				cl.answerAs(i, j)
				continue
			}
		}
		if found {
			e := sh.ent(r.idx)
			// A removal from elsewhere hides what is pinned here; so
			// does one here of a key only other hosts' reads pin.
			hide := !everywhere || sh.pinnedForOthersOnly(r.idx, e)
			if !everywhere && e.pins > 0 {
				*pinned = append(*pinned, i)
			}
			putting := e.state == stReserved || e.state == stPutting
			it, err = s.removeLocked(sh, r, hide)
			if err == ErrBusy && ids != nil {
				ids[i] = r.id()
			}
			if !putting && (err == nil || err == errJoin || err == errNoTask) {
				// Gone from every reader here: the Remote hears it in
				// the order of this shard's publications (under sh.mu),
				// after an announcement of this record still queued and
				// before one of a put that follows.
				s.removedHere(k)
			}
		}
		if err == errJoin {
			if cl == nil {
				cl = s.newCall(done, tag, codes, errs)
			}
			// The writeback's end answers the key, once sh.mu is released.
			setError(codes, errs, i, nil)
			s.joinBackground(sh, r, cl, i)
			cl.removes(i, r)
			sh.mu.Unlock()
			continue
		}
		if err == errNoTask {
			// Every task is busy: the key (invisible already) waits for
			// the next one (wait.go).
			if cl == nil {
				cl = s.newCall(done, tag, codes, errs)
			}
			setError(codes, errs, i, nil)
			cl.left.Add(1)
			s.l2.enqueue(waitKey{kind: kInval, r: r, slot: ownSlot(sh.ent(r.idx)), cl: cl, pos: int32(i)})
			cl.removes(i, r)
			sh.mu.Unlock()
			continue
		}
		if sh != nil {
			sh.mu.Unlock()
		}
		setError(codes, errs, i, err)
		if it != nil {
			if cl == nil {
				cl = s.newCall(done, tag, codes, errs)
			}
			cl.add(it, i)
			cl.removes(i, r)
		}
	}
	return s.dispatch(cl, kInval)
}

// errJoin says that the entry a Remove found has the store's own I/O in
// flight and nothing else (a writeback, or an invalidation of L2 eviction
// or of a corrupt block): the Remove joins it.
var errJoin = errors.New("store: remove after the store's own I/O in flight")

// joinBackground makes entry r, which has the store's own I/O in flight,
// invisible and owes key pos of cl its result when that I/O ends
// (endRemovedWriteback, endInval). sh.mu is held.
func (s *Store) joinBackground(sh *shard, r ref, cl *call, pos int) {
	e := sh.ent(r.idx)
	e.state = stDropping
	e.flags |= fRemove
	sh.unlistAll(r.idx)
	if sh.removing == nil {
		sh.removing = map[uint32]waitRec{}
	}
	sh.removing[r.idx] = waitRec{cl: cl, pos: int32(pos)}
	cl.left.Add(1)
}

// removeLocked removes entry r, or starts its removal from L2: then it
// returns the task that overwrites the key's block header, for the caller
// to dispatch. An entry not stored yet is absent to every reader, so
// removed already. With hide (a removal from another host) a pinned entry
// is removed too, and hidden once its header is zeroed (dropEntry). sh.mu
// is held.
//
// A value in L1 only has no header of its own on L2, but its key may
// have ghosts (tier2.ghosts): older blocks whose headers are still valid,
// which a restart would bring back once the value is gone. Its removal is
// then an invalidation too, of the ghosts alone (a task whose slot is
// noSlot), and it ends as one: the value goes once every ghost is zeroed;
// if a zeroing fails, the key stays as it was, the ghost still the key's
// (zeroed first by its next invalidation), and the Remove answers the
// failure, as when a key's own header cannot be zeroed. Recovery keeps no
// record of removals: a ghost left valid would be found again. The same
// holds while an older entry of the key, superseded by this one, is
// still being invalidated: its zeroing may fail and leave a ghost after
// the Remove has answered, so the removal waits for it (reqInval).
func (s *Store) removeLocked(sh *shard, r ref, hide bool) (*ioTask, error) {
	e := sh.ent(r.idx)
	switch {
	case e.state == stReserved || e.state == stPutting:
		return nil, nil
	case e.state == stDropping && e.flags&(fBgDrop|fRemove) == fBgDrop:
		return nil, errJoin // going already, by the store's own doing
	case e.state == stDropping:
		return nil, ErrBusy // another caller's Remove
	case e.pins > 0 && !hide:
		return nil, ErrPinned
	case e.flags&fWB != 0 && e.io == 1 && e.flags&fPromote == 0:
		return nil, errJoin // the writeback's is the only I/O
	case e.io > 0 || e.flags&(fWB|fPromote) != 0:
		return nil, ErrBusy
	case e.flags&fL2 == 0 && !s.l2.olderHeaders(sh.keyOf(e)):
		if e.flags&(fDirty|fTomb) == fDirty {
			s.c.dirtyOwed.Add(^uint64(0))
		}
		s.c.keys.Add(^uint64(0))
		s.c.l1Keys.Add(^uint64(0))
		ferr := s.dropEntry(sh, r.idx)
		if ferr != nil {
			return nil, fmt.Errorf("store: key removed, its block not freed: %w", ferr)
		}
		return nil, nil
	}
	e.state = stDropping
	sh.unlistAll(r.idx)
	e.io++
	it := s.l2.getTask(false)
	if it == nil {
		return nil, errNoTask
	}
	it.kind, it.r, it.slot = kInval, r, ownSlot(e)
	return it, nil
}

// ownSlot is the slot of e's block on L2 whose header its invalidation
// zeroes, noSlot for a value in L1 only (whose invalidation zeroes its
// key's ghosts alone).
func ownSlot(e *entry) uint32 {
	if e.flags&fL2 == 0 {
		return noSlot
	}
	return e.l2
}

// errNoTask: removeLocked made the entry invisible, but no task is free;
// the caller makes the key wait for one.
var errNoTask = errors.New("store: no free L2 task")
