package store

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// ref names an entry: its shard, index and generation.
type ref struct{ sh, idx, gen uint32 }

func (r ref) packed() uint64 { return uint64(r.sh)<<32 | uint64(r.idx) }

// hold is what one session holds on one key: untimed pins, and at most one
// lease (a timed pin) that expires by itself. The entry's pin count carries
// pins + 1 while lease != 0. A hold exists while it carries a pin or a
// lease (refs() > 0), and its value's bytes count in the session's
// pinnedBytes as long.
type hold struct {
	lease int64  // expiry in store nanoseconds; 0 when there is no lease
	bytes uint64 // the value's block bytes, counted in Session.pinnedBytes
	pins  uint32
	lver  uint32 // bumped each time the lease changes; matches its heap record
}

func (h hold) refs() uint32 {
	if h.lease != 0 {
		return h.pins + 1
	}
	return h.pins
}

// Session owns pins, leases and reservations for one client connection.
// Its methods are safe for concurrent use (a client's queues may share one
// session); Close releases everything it holds.
type Session struct {
	s  *Store
	id uint32

	// mu guards the fields below. Lock order: mu, then a shard's mu.
	mu     sync.Mutex
	closed bool
	holds  map[ref]hold
	resv   map[ref]uint64 // keys reserved by Reserve and not yet committed: their block bytes
	// resvBytes is the sum of resv (bounded by Config.MaxSessionReserved).
	resvBytes uint64
	// pinnedBytes is the sum of holds' bytes: each value the session holds
	// pinned counts once (bounded by Config.MaxSessionPinned).
	pinnedBytes uint64
	plan        []planStep // Pin/Unpin's undo log, reused

	// replicas is SetReplicas' number of copies (0: the Remote's); atomic
	// so that a copying put reads it without mu.
	replicas atomic.Int32

	// others marks a session whose pins are other hosts' reads
	// (NewSessionForOthers); set before its first call, never changed.
	others bool
}

// planStep is one key of an all-or-nothing Pin or Unpin: the hold before
// the call changed it, and whether an entry pin was taken (Pin) or is to be
// dropped (Unpin).
type planStep struct {
	r       ref
	prev    hold
	existed bool
	entry   bool
}

// Close releases every pin and lease the session holds and aborts its
// reservations. Durable commits in flight finish on their own (a commit
// that then fails drops its reservation). Later calls on the session fail
// with ErrClosed. It is idempotent; an error says that a reservation's
// block could not be freed (a bug, also counted in Stats.FreeErrors).
func (ss *Session) Close() error {
	s := ss.s
	entered := s.enter()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		if entered {
			s.exit()
		}
		return nil
	}
	ss.closed = true
	var errs []error
	if entered {
		for r, h := range ss.holds {
			s.unpinEntry(r, h.refs(), ss.others)
		}
		for r := range ss.resv {
			if err := s.abortReservation(r); err != nil {
				errs = append(errs, err)
			}
		}
		s.exit()
	}
	clear(ss.holds)
	clear(ss.resv)
	ss.resvBytes = 0
	ss.pinnedBytes = 0
	return errors.Join(errs...)
}

// PinnedBytes is the bytes (at block size) of the values the session
// holds pinned: what counts against Config.MaxSessionPinned, each value
// once.
func (ss *Session) PinnedBytes() uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.pinnedBytes
}

// overPinLimit reports whether a first pin (held is false: the session
// holds no pin on it yet) of a value of size bytes would take the
// session's pinned bytes past Config.MaxSessionPinned, and counts the
// refusal. ss.mu is held. A session for others (a holder's hold of
// another host's read) is not bounded here: what it pins is one peer
// message's keys, which the store across hosts bounds by MaxHolds and by
// the reader's reservation limit, and a part of it refused would fail a
// read the holder has already answered for.
func (ss *Session) overPinLimit(held bool, size uint32) bool {
	s := ss.s
	if held || ss.others || ss.pinnedBytes+s.blockBytes(uint64(size)) <= s.cfg.MaxSessionPinned {
		return false
	}
	s.c.pinLimit.Add(1)
	return true
}

// mayPin checks a pin of stored entry r (e) for the session: ErrOverflow
// at MaxPins, ErrPinLimit past the session's bound. sh.mu and ss.mu are
// held.
func (ss *Session) mayPin(r ref, e *entry) error {
	if e.pins >= ss.s.cfg.MaxPins {
		return ErrOverflow
	}
	if _, held := ss.holds[r]; ss.overPinLimit(held, e.size) {
		return ErrPinLimit
	}
	return nil
}

// count counts a value of size bytes that the session did not hold
// pinned in its pinned bytes, recorded in hd, its new hold. ss.mu is held.
func (ss *Session) count(hd *hold, size uint32) {
	hd.bytes = ss.s.blockBytes(uint64(size))
	ss.pinnedBytes += hd.bytes
}

// setHold stores hold hd of entry r, or, when it carries nothing any more,
// forgets it and its value's count. ss.mu is held.
func (ss *Session) setHold(r ref, hd hold) {
	if hd.refs() != 0 {
		ss.holds[r] = hd
		return
	}
	if invariants.Enabled && ss.pinnedBytes < hd.bytes {
		panic("store: invariant: a session's pinned bytes below a value it held")
	}
	ss.pinnedBytes -= hd.bytes
	delete(ss.holds, r)
}

// unreserve forgets reservation r (committed, aborted or dropped). ss.mu
// is held.
func (ss *Session) unreserve(r ref) {
	if b, ok := ss.resv[r]; ok {
		ss.resvBytes -= b
		delete(ss.resv, r)
	}
}

// unpinEntry drops n pins from entry r, a session for others' when others
// is set; an entry whose last pin goes back on the L1 LRU list, at its
// head, or, hidden (hide.go), is freed.
func (s *Store) unpinEntry(r ref, n uint32, others bool) {
	if n == 0 {
		return
	}
	sh := &s.shards[r.sh]
	sh.mu.Lock()
	e := sh.ent(r.idx)
	if invariants.Enabled && (e.gen != r.gen || e.pins < n) {
		panic("store: invariant: unpin of an entry that does not carry the pins")
	}
	e.pins -= n
	if others {
		sh.othersPinned(r.idx, -int(n))
	}
	s.c.pins.Add(^uint64(n - 1))
	if e.pins == 0 {
		s.lastPinGone(sh, r.idx)
	}
	sh.mu.Unlock()
}

// lastPinGone: entry idx, whose last pin went, goes back on the L1 LRU
// list, at its head, or, hidden (hide.go), is freed. sh.mu is held.
func (s *Store) lastPinGone(sh *shard, idx uint32) {
	if sh.ent(idx).state == stHidden {
		s.freeHidden(sh, idx)
	} else {
		s.relist(sh, idx)
	}
}

// relist puts an unpinned, ready, resident entry back on the L1 LRU. sh.mu
// is held.
func (s *Store) relist(sh *shard, idx uint32) {
	e := sh.ent(idx)
	if e.pins == 0 && e.state == stReady && e.flags&fL1 != 0 && e.flags&fPromote == 0 {
		sh.lruAdd(idx)
	}
}

// abortReservation drops a reservation of a closing session, or one given
// back by Session.Abort: a reserved entry goes (its block is freed), one
// whose durable commit is in flight is marked so that a failing commit
// drops it (Abort answers BUSY for those and never gets here with one).
func (s *Store) abortReservation(r ref) error {
	sh := &s.shards[r.sh]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.ent(r.idx)
	if e.gen != r.gen {
		return nil
	}
	var err error
	switch e.state {
	case stReserved:
		err = s.freeBlock(e.l1, e.size)
		s.c.reserved.Add(^uint64(0))
		sh.remove(r.idx)
	case stPutting:
		e.flags |= fAbandon
	}
	return err
}

// Leases: one heap of (expiry, session, key) records for the whole store,
// and one timer armed for the earliest. A renewed lease leaves its old
// record behind, recognized as stale by its version.

type leaseRec struct {
	at   int64
	ss   *Session
	r    ref
	lver uint32
}

// leaseHeap is a min-heap of lease records by expiry (typed, so pushing
// allocates nothing once the slice has grown).
type leaseHeap []leaseRec

func (h *leaseHeap) push(r leaseRec) {
	*h = append(*h, r)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if q[p].at <= q[i].at {
			break
		}
		q[p], q[i] = q[i], q[p]
		i = p
	}
}

func (h *leaseHeap) pop() leaseRec {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = leaseRec{}
	q = q[:last]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < len(q) && q[l].at < q[m].at {
			m = l
		}
		if r := l + 1; r < len(q) && q[r].at < q[m].at {
			m = r
		}
		if m == i {
			break
		}
		q[m], q[i] = q[i], q[m]
		i = m
	}
	*h = q
	return top
}

// addLease records a lease expiring at (store nanoseconds).
func (s *Store) addLease(ss *Session, r ref, lver uint32, at int64) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	s.leases.push(leaseRec{at: at, ss: ss, r: r, lver: lver})
	if s.leaseAt == 0 || at < s.leaseAt {
		s.armLeases(at)
	}
}

// armLeases (re)arms the lease timer for at. leaseMu is held.
func (s *Store) armLeases(at int64) {
	if s.leaseTimer != nil {
		s.leaseTimer.Stop()
	}
	s.leaseAt = at
	d := at - s.now()
	if d < 0 {
		d = 0
	}
	s.leaseTimer = s.clock.AfterFunc(durationNS(d), s.expireLeases)
}

// expireLeases ends every lease that is due and re-arms the timer.
func (s *Store) expireLeases() {
	if !s.enter() {
		return
	}
	defer s.exit()
	now := s.now()
	s.leaseMu.Lock()
	s.leaseAt = 0
	var due []leaseRec
	for len(s.leases) > 0 && s.leases[0].at <= now {
		due = append(due, s.leases.pop())
	}
	if len(s.leases) > 0 {
		s.armLeases(s.leases[0].at)
	}
	s.leaseMu.Unlock()
	for i := range due {
		d := &due[i]
		ss := d.ss
		ss.mu.Lock()
		if !ss.closed {
			if h, ok := ss.holds[d.r]; ok && h.lease != 0 && h.lver == d.lver && h.lease <= now {
				h.lease = 0
				h.lver++
				ss.setHold(d.r, h)
				s.unpinEntry(d.r, 1, ss.others)
				s.c.leasesExpired.Add(1)
			}
		}
		ss.mu.Unlock()
		*d = leaseRec{}
	}
}

// NewSessionForOthers opens a session whose pins are other hosts' reads
// (a holder's hold of a remote reader's keys): a Remove here of a key
// only such sessions pin hides it, as RemoveHere does, instead of
// answering FAILED_PRECONDITION, since a read of another host is no
// caller's pin; the reads keep the exact bytes they pinned. The store
// counts these pins under the same shard lock as the pins themselves
// (shard.others), so no Remove sees one without its count.
func (s *Store) NewSessionForOthers() *Session {
	ss := s.NewSession()
	ss.others = true
	return ss
}

// othersPinned counts n more (or, negative, fewer) pins of entry idx
// taken by sessions for others; sh.mu is held.
func (sh *shard) othersPinned(idx uint32, n int) {
	if sh.others == nil {
		sh.others = map[uint32]uint32{}
	}
	c := int(sh.others[idx]) + n
	if invariants.Enabled && c < 0 {
		panic("store: invariant: more pins for others dropped than taken")
	}
	if c <= 0 {
		delete(sh.others, idx)
		return
	}
	sh.others[idx] = uint32(c)
}

// pinnedForOthersOnly reports whether every pin of entry idx (e) is a
// session's for others; sh.mu is held.
func (sh *shard) pinnedForOthersOnly(idx uint32, e *entry) bool {
	return e.pins > 0 && sh.others[idx] >= e.pins
}
