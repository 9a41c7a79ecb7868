package store

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/keyblock"
	"github.com/tensorcast/tensorcast/status"
)

// Remote is the store across hosts as this store sees it (package
// store/cluster implements it): whom it tells what became visible or was
// removed here, and whom it asks for the keys it misses. A store without
// one (SetRemote never called) is the host's store alone, exactly as
// before.
type Remote interface {
	// Stored says that key is stored here (a commit, a put, or a value
	// fetched from another host and kept), with size bytes whose crc32c
	// is crc; onL2 when it is on L2 already (a durable commit's is). A
	// fetched copy (CommitFetched) is unseen by readers here until
	// Confirm names its record, unseen (0 for any other value). It runs
	// with the key's shard locked: it copies key and queues the
	// announcement, and must neither block nor call into the store.
	Stored(key []byte, size uint64, crc uint32, onL2 bool, unseen RecordID)
	// Evicted says that key's value left this store: by eviction (from
	// both tiers) or by a removal here. Like Stored, it runs with the
	// key's shard locked and only queues.
	Evicted(key []byte)
	// Removed says that a client removed keys here (each one absent here
	// now); every other copy is to go too. errs[i] is set when keys[i]'s
	// other copies may remain (its home did not take the removal): the
	// key's remove then answers that error, not OK. It blocks at most the
	// remote deadline and must not call into the store with keys' locks
	// held (it holds none: it runs after the local removal).
	Removed(keys [][]byte, errs []error)
	// Fetch brings keys (copies the callee owns from then on) from the
	// hosts that hold them into this store, as values of its own, and
	// calls done(i, err) exactly once per key: nil when keys[i] is stored
	// here now, an error wrapping ErrNotFound when no host holds it, or
	// an error that names what failed. It must not block; done runs on
	// any goroutine, possibly before Fetch returns, and may call into the
	// store.
	Fetch(keys [][]byte, done func(i int, err error))
	// Present sets found[i] for each key that another host holds, as its
	// home says (asking at most once per home, in parallel); keys with
	// found[i] set already are not asked about. It blocks at most the
	// remote deadline; a home that does not answer leaves its keys
	// unfound.
	Present(keys [][]byte, found []bool)
	// SizeOf is the size of key's value on another host, as its home
	// says; false when no other host holds it. It blocks at most the
	// remote deadline.
	SizeOf(key []byte) (uint64, bool)
}

// RemotePresence is what a Remote may also do: Present without blocking
// its caller (the queue's Exists).
type RemotePresence interface {
	// PresentAsync is Present run in the background: it sets found[i] as
	// Present does, then calls done, exactly once (possibly before
	// PresentAsync returns). keys and found are the callee's until done.
	PresentAsync(keys [][]byte, found []bool, done func())
}

// remoteBox holds the Remote, set once the daemon has built it.
type remoteBox struct{ r Remote }

// SetRemote makes r the store across hosts of s (nil: the host's store
// alone). The daemon sets it once, before clients are served.
func (s *Store) SetRemote(r Remote) {
	if r == nil {
		s.remote.Store(nil)
		return
	}
	s.remote.Store(&remoteBox{r})
}

// rem is the Remote, or nil.
func (s *Store) rem() Remote {
	if b := s.remote.Load(); b != nil {
		return b.r
	}
	return nil
}

// remoteState is the Store's field for its Remote.
type remoteState = atomic.Pointer[remoteBox]

// announce tells the Remote that entry rf of sh is stored (visible, or an
// unseen fetched copy); sh.mu is held.
func (s *Store) announce(sh *shard, rf ref, crc uint32, haveCRC bool) {
	r := s.rem()
	if r == nil {
		return
	}
	e := sh.ent(rf.idx)
	if !haveCRC {
		crc = crc32c(s.poolMem[e.l1 : e.l1+uint64(e.size)])
	}
	e.crc = crc
	e.flags |= fCRC
	var unseen RecordID
	if e.flags&fUnseen != 0 {
		unseen = rf.id()
	}
	r.Stored(sh.keyOf(e), uint64(e.size), crc, e.flags&fL2 != 0, unseen)
}

// evicted tells the Remote that entry idx of sh is evicted; sh.mu is
// held.
func (s *Store) evicted(sh *shard, idx uint32) { s.removedHere(sh.keyOf(sh.ent(idx))) }

// removedHere tells the Remote that key's record here is gone: removed (a
// Remove or RemoveHere took it) or evicted; the shard's lock is held. A
// removal is news to the key's home like an eviction: the home forgets
// this holder of it once what was announced before has arrived.
func (s *Store) removedHere(key []byte) {
	if r := s.rem(); r != nil {
		r.Evicted(key)
	}
}

// Held is one value stored here, as the store across hosts re-announces
// it.
type Held struct {
	Key  []byte // a copy
	Size uint64
	CRC  uint32   // crc32c of the value
	OnL2 bool     // on L2 (in L1 as well or not): announced as durable
	ID   RecordID // the record (Recheck)
}

// IndexShards is how many shards the store's own index has (Holdings
// walks one at a time).
func (s *Store) IndexShards() int { return len(s.shards) }

// Holdings appends to dst the values stored here in index shard i for
// which keep(key) holds, with their crc32c (read from the pool now for a
// value whose crc is not known yet). It walks the shard under its lock:
// keep must be quick and must not call into the store.
func (s *Store) Holdings(i int, keep func(key []byte) bool, dst []Held) []Held {
	if i < 0 || i >= len(s.shards) || !s.enter() {
		return dst
	}
	defer s.exit()
	sh := &s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for idx := uint32(0); idx < sh.nents; idx++ {
		e := sh.ent(idx)
		if e.state != stReady || e.flags&fUnseen != 0 || !keep(sh.keyOf(e)) {
			continue
		}
		dst = append(dst, Held{Key: bytes.Clone(sh.keyOf(e)), Size: uint64(e.size), CRC: s.knownCRC(e), OnL2: e.flags&fL2 != 0,
			ID: ref{uint32(i), idx, e.gen}.id()})
	}
	return dst
}

// knownCRC is stored entry e's crc32c, taken from its L1 block (and kept)
// when not known yet (an entry on L2 has it); sh.mu is held.
func (s *Store) knownCRC(e *entry) uint32 {
	if e.flags&(fL2|fCRC) == 0 {
		e.crc = crc32c(s.poolMem[e.l1 : e.l1+uint64(e.size)])
		e.flags |= fCRC
	}
	return e.crc
}

// HeldHere reports whether key is stored here now (visible; its value in
// either tier). It asks no other host and pins nothing.
func (s *Store) HeldHere(key []byte) bool {
	if !s.enter() {
		return false
	}
	defer s.exit()
	sh, _, code, _ := s.lookupSeen(key, true) // an unseen copy is held here
	if code != OK {
		return false
	}
	sh.mu.Unlock()
	return true
}

// RemoteRestate is what a Remote may also take: a value stored here
// before, told again (Recheck), as Stored tells a value put or fetched
// now; it runs like Stored. A Remote without it hears Stored.
type RemoteRestate interface {
	Restated(key []byte, size uint64, crc uint32, onL2 bool)
}

// RecordHere names key's record stored here, if one is (for
// RemoveRecordsHere).
func (s *Store) RecordHere(key []byte) (RecordID, bool) {
	if !s.enter() {
		return 0, false
	}
	defer s.exit()
	sh, r, code, _ := s.lookupSeen(key, true)
	if code != OK {
		return 0, false
	}
	sh.mu.Unlock()
	return r.id(), true
}

// Recheck tells the Remote the state now of each value of held (from
// Holdings) whose record is no longer the one stored here (for one
// without an ID, always): Restated (or Stored) for a
// record put since, Evicted when none is (removed, evicted, or being
// removed or put). A re-announcement walk calls it once its announcement
// of held has been answered, so that what changed while that was on its
// way is queued after it, in order, and the key's home ends with the
// key's state here, not with the walk's older one.
func (s *Store) Recheck(held []Held) {
	r := s.rem()
	if r == nil || !s.enter() {
		return
	}
	defer s.exit()
	for _, h := range held {
		sh, ref, found, err := s.lock(h.Key)
		if err != nil {
			continue
		}
		var e *entry
		if found {
			e = sh.ent(ref.idx)
		}
		switch {
		case found && e.state == stReady && ref.id() == h.ID:
			// Unchanged.
		case found && e.state == stReady && e.flags&fUnseen != 0:
			// A fetched copy since: its own announcement is queued
			// (unseen.go), and tells its home it is fetched.
		case found && e.state == stReady:
			if rs, ok := r.(RemoteRestate); ok {
				rs.Restated(h.Key, uint64(e.size), s.knownCRC(e), e.flags&fL2 != 0)
			} else {
				r.Stored(h.Key, uint64(e.size), s.knownCRC(e), e.flags&fL2 != 0, 0)
			}
		default:
			r.Evicted(h.Key)
		}
		sh.mu.Unlock()
	}
}

// CRC is the crc32c the store uses for values (Castagnoli).
func CRC(b []byte) uint32 { return crc32c(b) }

// fetchMisses asks the Remote for the keys of a call that missed here
// (code NOT_FOUND) and makes the call wait for them: land(pos, key)
// answers key pos (setting its code and outputs) once its value is stored
// here, or returns why not. It returns the call, made when needed. The
// fetch holds the store open (Close waits for it; it ends by the remote
// deadline).
func (s *Store) fetchMisses(cl *call, keys [][]byte, codes []Code, errs []error, done Completion, tag uint64,
	land func(cl *call, pos int, key []byte) error) *call {
	r := s.rem()
	if r == nil {
		return cl
	}
	var miss []int
	for i, c := range codes {
		if c == NotFound {
			miss = append(miss, i)
		}
	}
	if len(miss) == 0 {
		return cl
	}
	if !s.enter() {
		for _, i := range miss {
			setResult(codes, errs, i, Unavailable, ErrClosed)
		}
		return cl
	}
	if cl == nil {
		cl = s.newCall(done, tag, codes, errs)
	}
	cl.left.Add(int32(len(miss)))
	own := make([][]byte, len(miss))
	for j, i := range miss {
		own[j] = keys[i]
	}
	own = keyblock.Clone(own) // the caller's keys may change once it returns
	var left atomic.Int32
	left.Store(int32(len(miss)))
	r.Fetch(own, func(j int, err error) {
		pos := miss[j]
		if err == nil {
			err = land(cl, pos, own[j])
		}
		if err != nil {
			cl.result(int32(pos), err)
		}
		if left.Add(-1) == 0 {
			s.exit()
		}
		cl.finish1(&s.calls)
	})
	return cl
}

// landGet answers key pos of a Get whose value a fetch stored here: it
// pins it for ss and sets its location, like a local hit. A value the
// store evicted to L2 since it landed is promoted for the call, as a Get
// of any key on L2 is (cl.locs is the call's locs).
func (ss *Session) landGet(locs []Location, codes []Code, errs []error) func(cl *call, pos int, key []byte) error {
	s := ss.s
	return func(cl *call, pos int, key []byte) error {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.closed {
			return ErrClosed
		}
		for again := 0; ; again++ {
			sh, r, _, err := s.lookupSeen(key, true) // fetched for this call: seen by it
			if err != nil {
				return err
			}
			e := sh.ent(r.idx)
			if err := ss.mayPin(r, e); err != nil {
				sh.mu.Unlock()
				return err
			}
			if e.flags&fL1 == 0 {
				err := s.promoteLater(sh, r, waitRec{cl: cl, pos: int32(pos), ss: ss, get: true})
				if err == errAgain && again < maxAgain {
					continue
				}
				return err
			}
			locs[pos] = Location{Offset: e.l1, Length: uint64(e.size)}
			ss.pinLocked(sh, r)
			setResult(codes, errs, pos, OK, nil)
			return nil
		}
	}
}

// landRead answers key pos of a Read whose value a fetch stored here: it
// copies it out, like a local hit, or promotes it first when the store
// evicted it to L2 since it landed (cl.dsts and cl.lens are the call's).
func (s *Store) landRead(dsts [][]byte, lens []uint64, codes []Code, errs []error) func(cl *call, pos int, key []byte) error {
	return func(cl *call, pos int, key []byte) error {
		for again := 0; ; again++ {
			sh, r, _, err := s.lookupSeen(key, true) // fetched for this call: seen by it
			if err != nil {
				return err
			}
			e := sh.ent(r.idx)
			lens[pos] = uint64(e.size)
			switch {
			case uint64(len(dsts[pos])) < uint64(e.size):
				sh.mu.Unlock()
				return ErrShortBuffer
			case e.io == ^uint16(0):
				sh.mu.Unlock()
				return ErrBusy
			case e.flags&fL1 == 0:
				err := s.promoteLater(sh, r, waitRec{cl: cl, pos: int32(pos)})
				if err == errAgain && again < maxAgain {
					continue
				}
				return err
			}
			e.io++
			off, size := e.l1, uint64(e.size)
			sh.mu.Unlock()
			err = copyGuarded(dsts[pos][:size], s.poolMem[off:off+size])
			sh.mu.Lock()
			e.io--
			sh.mu.Unlock()
			if err != nil {
				return err
			}
			setResult(codes, errs, pos, OK, nil)
			return nil
		}
	}
}

// presentElsewhere sets codes[i] to OK for each key NOT_FOUND here that
// another host holds.
func (s *Store) presentElsewhere(keys [][]byte, codes []Code) {
	r := s.rem()
	if r == nil {
		return
	}
	ask := false
	for _, c := range codes {
		ask = ask || c == NotFound
	}
	if !ask {
		return // nothing allocated when every key is here
	}
	found := make([]bool, len(keys))
	for i, c := range codes {
		found[i] = c != NotFound
	}
	r.Present(keys, found)
	for i, f := range found {
		if f && codes[i] == NotFound {
			codes[i] = OK
		}
	}
}

// fetchHere brings keys into this store from the hosts that hold them and
// waits: codes[i] is OK for each key stored here when it returns.
func (s *Store) fetchHere(keys [][]byte, codes []Code) {
	r := s.rem()
	if r == nil {
		fill(codes, NotFound)
		return
	}
	var left sync.WaitGroup
	left.Add(len(keys))
	own := keyblock.Clone(keys)
	r.Fetch(own, func(i int, err error) {
		codes[i] = OK
		if err != nil {
			codes[i] = status.CodeOf(err)
		}
		left.Done()
	})
	left.Wait()
}

// prefixElsewhere goes on with LookupPrefix past keys[:n], the run stored
// here: the keys other hosts hold, as their homes say, and with pin those
// fetched here and pinned.
func (ss *Session) prefixElsewhere(keys [][]byte, n int, pin bool) (int, error) {
	s := ss.s
	rest := keys[n:]
	found := make([]bool, len(rest))
	s.rem().Present(rest, found)
	run := 0
	for run < len(found) && found[run] {
		run++
	}
	if !pin || run == 0 {
		return n + run, nil
	}
	codes := make([]Code, run)
	s.fetchHere(rest[:run], codes)
	got := 0
	for got < run && codes[got] == OK {
		got++
	}
	m, err := ss.prefixSeen(rest[:got], true, true)
	return n + m, err
}

// removeElsewhere removes every other host's copy of the keys removed
// here (code OK); a key whose other copies may remain gets the error
// that says why instead of OK.
func (s *Store) removeElsewhere(keys [][]byte, codes []Code, errs []error) {
	r := s.rem()
	if r == nil {
		return
	}
	var gone [][]byte
	var at []int
	for i, c := range codes {
		if c == OK {
			gone, at = append(gone, keys[i]), append(at, i)
		}
	}
	if len(gone) == 0 {
		return
	}
	rerrs := make([]error, len(gone))
	r.Removed(gone, rerrs)
	for j, err := range rerrs {
		if err != nil {
			// Removed here, maybe not elsewhere: not OK, so that the
			// caller does not take the key for gone everywhere (a retry
			// is idempotent).
			setError(codes, errs, at[j], err)
		}
	}
}

// ExistsAsync is Exists for a caller that must not block on other hosts
// (the queue's worker): the keys stored here are answered at once; when
// some are not and the Remote can ask their homes in the background, it
// returns pending, and done.StoreDone(tag) follows once codes holds every
// answer. Otherwise it is Exists.
func (s *Store) ExistsAsync(keys [][]byte, codes []Code, done Completion, tag uint64) (pending bool, err error) {
	r, ok := s.rem().(RemotePresence)
	if !ok || done == nil {
		return false, s.Exists(keys, codes)
	}
	if err := s.begin(len(keys), codes, nil); err != nil {
		return false, err
	}
	var miss []int
	for i, k := range keys {
		sh, _, c, _ := s.lookup(k)
		if c == OK {
			sh.mu.Unlock()
		}
		codes[i] = c
		if c == NotFound {
			miss = append(miss, i)
		}
	}
	if len(miss) == 0 {
		s.exit()
		return false, nil
	}
	own := make([][]byte, len(miss))
	for j, i := range miss {
		own[j] = bytes.Clone(keys[i])
	}
	found := make([]bool, len(miss))
	// The store stays entered (Close waits) until the homes answered.
	r.PresentAsync(own, found, func() {
		for j, f := range found {
			if f {
				codes[miss[j]] = OK
			}
		}
		s.exit()
		done.StoreDone(tag)
	})
	return true, nil
}

// ReadHere lends the value of key stored here in memory (L1) to f, which
// must not keep it. While f runs the block is pinned as for another
// host's read (NewSessionForOthers): neither evicted nor freed, and a
// Remove meanwhile is not refused: the key goes at once for every reader,
// and its block when f returns. It never waits: inMem is false (and f
// not called) when the value is only on L2, code is NotFound when it is
// not stored here. A holder serves another daemon's one-round-trip read
// with it (store/cluster); the read is not counted as a hit of this
// store's clients.
func (s *Store) ReadHere(key []byte, f func(val []byte)) (code Code, inMem bool) {
	if !s.enter() {
		return Unavailable, false
	}
	defer s.exit()
	sh, r, c, _ := s.lookup(key)
	if c != OK {
		return c, false
	}
	e := sh.ent(r.idx)
	if e.flags&fL1 == 0 {
		sh.mu.Unlock()
		return OK, false
	}
	s.pinEntryLocked(sh, r.idx, true)
	off, size := e.l1, uint64(e.size)
	sh.mu.Unlock()
	f(s.poolMem[off : off+size])
	s.unpinEntry(r, 1, true)
	return OK, true
}
