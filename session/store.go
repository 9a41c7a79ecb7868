package session

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// The KV block store's socket calls (the queue's are in queue_store.go).
// Every connection has one store session, made at its first store call:
// the owner of its pins, leases and reservations, closed when the
// connection is released, which gives them all back.

// connStore is a connection's side of the store.
type connStore struct {
	once sync.Once
	ss   *store.Session // nil until the first store call

	// The serving goroutine's scratch for the socket calls: a call's keys,
	// values and results, compacted to the keys whose extents passed the
	// checks (pos maps them back).
	keys  [][]byte
	vals  [][]byte
	lens  []uint64
	locs  []store.Location
	codes []store.Code
	pos   []int
	out   []Code
	offs  []uint64
	held  []xfer.Segment
	info  []wire.StoreKeyInfo
}

// session is the connection's store session, made on first use; it fails
// with UNAVAILABLE on a daemon without a store. The serving goroutine and
// the queue workers call it.
func (s *Session) storeSession() (*store.Store, *store.Session, error) {
	if s.pool == nil {
		return nil, nil, errNoPool
	}
	kv := s.store
	if kv == nil {
		return nil, nil, fmt.Errorf("%w: this daemon runs no store", ErrUnavailable)
	}
	s.st.once.Do(func() { s.st.ss = kv.NewSession() })
	if s.st.ss == nil {
		return nil, nil, fmt.Errorf("%w: connection released", ErrClosed)
	}
	return kv, s.st.ss, nil
}

// closeStore closes the connection's session, releasing its pins, leases
// and reservations. It runs in release, after the queues are closed (no
// worker can make a session any more).
func (s *Session) closeStore() {
	s.st.once.Do(func() {}) // no session made from here on
	if s.st.ss == nil {
		return
	}
	if err := s.st.ss.Close(); err != nil {
		s.log.Error("closing the store session freed a reservation badly", "err", err)
	}
}

// storeErr is the answer to a store call that returned err: nil when the
// call ran and its codes say what happened (all or nothing refused, a
// transport broken on some keys, which carry INTERNAL), else err.
func (s *Session) storeErr(err error) error {
	switch {
	case err == nil, errors.Is(err, store.ErrNotApplied):
		return nil
	case errors.Is(err, store.ErrTransport):
		s.log.Error("store: the L2 transport broke its contract during a call", "err", err)
		return nil
	}
	return err
}

// memOf resolves a copying call's extent to the bytes it names: pool
// blocks this connection holds, or a client buffer of it (a reference is
// taken and kept in s.st.held until the call ends). Its code says why not.
func (s *Session) memOf(e wire.Extent) ([]byte, Code) {
	if e.Length == 0 {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	end := e.Offset + e.Length
	if end < e.Offset {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	if p := s.pool; p != nil && e.Segment == p.ID() {
		if !s.blocks.covers(e.Offset, e.Length) {
			return nil, tcproto.CodePERMISSION_DENIED
		}
		return p.Bytes()[e.Offset:end:end], tcproto.CodeOK
	}
	s.mu.Lock()
	b, ok := s.buffers[e.Segment]
	_, file := s.files[e.Segment]
	_, remote := s.remotes[e.Segment]
	s.mu.Unlock()
	switch {
	case file || remote:
		return nil, tcproto.CodeINVALID_ARGUMENT // a copying call moves memory only
	case !ok:
		return nil, tcproto.CodeNOT_FOUND
	case end > b.Size():
		return nil, tcproto.CodeINVALID_ARGUMENT
	case !b.Acquire():
		return nil, tcproto.CodeUNAVAILABLE
	}
	s.st.held = append(s.st.held, b)
	return b.Bytes()[e.Offset:end:end], tcproto.CodeOK
}

// releaseHeld drops the buffer references a copying call took.
func (s *Session) releaseHeld() {
	for i, b := range s.st.held {
		b.Release()
		s.st.held[i] = nil
	}
	s.st.held = s.st.held[:0]
}

// resolveExtents checks every key's extent and compacts the keys whose
// extent resolved into s.st.keys and s.st.vals (their positions in pos);
// out gets the code of each refused key and OK for the others.
func (s *Session) resolveExtents(keys [][]byte, ext []wire.Extent) {
	st := &s.st
	n := len(keys)
	st.out = slices.Grow(st.out[:0], n)[:n]
	st.keys, st.vals, st.pos = st.keys[:0], st.vals[:0], st.pos[:0]
	for i, e := range ext {
		mem, code := s.memOf(e)
		st.out[i] = code
		if code == tcproto.CodeOK {
			st.keys = append(st.keys, keys[i])
			st.vals = append(st.vals, mem)
			st.pos = append(st.pos, i)
		}
	}
	k := len(st.keys)
	st.codes = slices.Grow(st.codes[:0], k)[:k]
	st.lens = slices.Grow(st.lens[:0], k)[:k]
}

// scatter puts the codes of the compacted keys back in their positions.
func (s *Session) scatter() []Code {
	st := &s.st
	for j, i := range st.pos {
		st.out[i] = Code(st.codes[j])
	}
	return st.out
}

// codesOf converts a whole call's store codes for the answer.
func (s *Session) codesOf(codes []store.Code) []Code {
	n := len(codes)
	s.st.out = slices.Grow(s.st.out[:0], n)[:n]
	for i, k := range codes {
		s.st.out[i] = Code(k)
	}
	return s.st.out
}

func (s *Session) storeCodes(n int) []store.Code {
	s.st.codes = slices.Grow(s.st.codes[:0], n)[:n]
	return s.st.codes
}

// StorePut puts keys with values copied from the session's memory.
func (s *Session) StorePut(m *wire.StorePutRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	s.resolveExtents(m.Keys, m.Values)
	defer s.releaseHeld()
	_, err = ss.Put(s.st.keys, s.st.vals, m.Durable, s.st.codes, nil, nil, 0)
	if err = s.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StorePutResponse](r).Codes = s.scatter()
	return nil
}

// StoreRead copies keys' values into the session's memory.
func (s *Session) StoreRead(m *wire.StoreReadRequest, r *wire.Response) error {
	kv, _, err := s.storeSession()
	if err != nil {
		return err
	}
	s.resolveExtents(m.Keys, m.Dests)
	defer s.releaseHeld()
	_, err = kv.Read(s.st.keys, s.st.vals, s.st.lens, s.st.codes, nil, nil, 0)
	if err = s.storeErr(err); err != nil {
		return err
	}
	n := len(m.Keys)
	s.st.offs = slices.Grow(s.st.offs[:0], n)[:n]
	clear(s.st.offs)
	for j, i := range s.st.pos {
		s.st.offs[i] = s.st.lens[j]
	}
	a := wire.SetResponse[wire.StoreReadResponse](r)
	a.Codes, a.Lengths = s.scatter(), s.st.offs
	return nil
}

// StoreRemove removes keys.
func (s *Session) StoreRemove(m *wire.StoreRemoveRequest, r *wire.Response) error {
	kv, _, err := s.storeSession()
	if err != nil {
		return err
	}
	codes := s.storeCodes(len(m.Keys))
	_, err = kv.Remove(m.Keys, codes, nil, nil, 0)
	if err = s.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreRemoveResponse](r).Codes = s.codesOf(codes)
	return nil
}

// StorePin pins keys for the session.
func (s *Session) StorePin(m *wire.StorePinRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	codes := s.storeCodes(len(m.Keys))
	err = ss.Pin(m.Keys, time.Duration(m.TTLMS)*time.Millisecond, codes)
	if err = s.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StorePinResponse](r).Codes = s.codesOf(codes)
	return nil
}

// StoreUnpin drops the session's pins of keys.
func (s *Session) StoreUnpin(m *wire.StoreUnpinRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	codes := s.storeCodes(len(m.Keys))
	if err = s.storeErr(ss.Unpin(m.Keys, codes)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreUnpinResponse](r).Codes = s.codesOf(codes)
	return nil
}

// StoreReserve reserves pool blocks for keys, for the session to fill and commit.
func (s *Session) StoreReserve(m *wire.StoreReserveRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	n := len(m.Keys)
	codes := s.storeCodes(n)
	s.st.locs = slices.Grow(s.st.locs[:0], n)[:n]
	if err = s.storeErr(ss.Reserve(m.Keys, m.Sizes, s.st.locs, codes, nil)); err != nil {
		return err
	}
	s.st.offs = slices.Grow(s.st.offs[:0], n)[:n]
	for i, l := range s.st.locs {
		s.st.offs[i] = l.Offset
	}
	a := wire.SetResponse[wire.StoreReserveResponse](r)
	a.Codes, a.Offsets = s.codesOf(codes), s.st.offs
	return nil
}

// StoreCommit commits keys the session reserved.
func (s *Session) StoreCommit(m *wire.StoreCommitRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	codes := s.storeCodes(len(m.Keys))
	_, err = ss.Commit(m.Keys, m.Durable, codes, nil, nil, 0)
	if err = s.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreCommitResponse](r).Codes = s.codesOf(codes)
	return nil
}

// StoreAbort gives back reservations of the session, each key on its
// own; a batch the store refuses as a whole (too many keys, an
// invalid one) is answered INVALID_ARGUMENT.
func (s *Session) StoreAbort(m *wire.StoreAbortRequest, r *wire.Response) error {
	_, ss, err := s.storeSession()
	if err != nil {
		return err
	}
	codes := s.storeCodes(len(m.Keys))
	if err = s.storeErr(ss.Abort(m.Keys, codes, nil)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreAbortResponse](r).Codes = s.codesOf(codes)
	return nil
}

func keyInfo(k store.KeyInfo, withKey bool) wire.StoreKeyInfo {
	w := wire.StoreKeyInfo{Size: k.Size, InL1: k.InL1, InL2: k.InL2, Pins: k.Pins, Dirty: k.Dirty, Tombstone: k.Tombstone}
	if withKey {
		w.Key = k.Key
	}
	return w
}

// StoreStat reports one key.
func (s *Session) StoreStat(m *wire.StoreStatRequest, r *wire.Response) error {
	kv, _, err := s.storeSession()
	if err != nil {
		return err
	}
	k, err := kv.Stat(m.Key)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.StoreStatResponse](r).Info = keyInfo(k, false)
	return nil
}

// listEntryBytes is what one listed key may take in an answer at most (a
// 256-byte key and its figures, with the flatbuffer's overhead); a listing
// is cut so that its answer fits the frame.
const listEntryBytes = 384

// StoreList lists keys by prefix.
func (s *Session) StoreList(m *wire.StoreListRequest, r *wire.Response) error {
	kv, _, err := s.storeSession()
	if err != nil {
		return err
	}
	max := int(m.Max)
	if most := s.h.MaxFrame/listEntryBytes - 1; max == 0 || max > most {
		max = most
	}
	keys, more, err := kv.ListAfter(m.Prefix, m.After, max)
	if err != nil {
		return err
	}
	s.st.info = s.st.info[:0]
	for _, k := range keys {
		s.st.info = append(s.st.info, keyInfo(k, true))
	}
	a := wire.SetResponse[wire.StoreListResponse](r)
	a.Keys, a.More = s.st.info, more
	return nil
}

// StoreFlush waits for the store's writebacks.
func (s *Session) StoreFlush(m *wire.StoreFlushRequest, r *wire.Response) error {
	kv, _, err := s.storeSession()
	if err != nil {
		return err
	}
	d := s.h.DefaultWait
	if m.TimeoutMS > 0 {
		d = time.Duration(m.TimeoutMS) * time.Millisecond
	}
	if err := kv.Flush(d); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreFlushResponse](r)
	return nil
}

// StoreFigures are the session's store's figures for Stats; none without
// a store.
func (s *Session) StoreFigures() []wire.Counter {
	if s.store == nil {
		return nil
	}
	return StoreCounters(s.store.Stats(), nil)
}

// StoreCounters appends the store's figures to dst, as Stats reports them
// (the daemon's metrics read the same Stats).
func StoreCounters(st store.Stats, dst []wire.Counter) []wire.Counter {
	for _, f := range [...]struct {
		name string
		v    uint64
	}{
		{"keys", st.Keys}, {"l1_keys", st.L1Keys}, {"l2_keys", st.L2Keys}, {"reserved", st.Reserved}, {"aborted", st.Aborted},
		{"l1_bytes", st.L1Bytes}, {"l1_capacity", st.L1Capacity}, {"l2_bytes", st.L2Bytes}, {"l2_capacity", st.L2Capacity},
		{"pins", st.Pins}, {"dirty", st.Dirty},
		{"evictions_l1", st.EvictionsL1}, {"evictions_l2", st.EvictionsL2}, {"dropped_unwritten", st.DroppedUnwritten},
		{"l1_full", st.L1Full}, {"writebacks", st.Writebacks}, {"writeback_retries", st.WritebackRetries},
		{"tombstones", st.Tombstones}, {"durable_puts", st.DurablePuts}, {"durable_failures", st.DurableFailures},
		{"promotions", st.Promotions}, {"promotion_failures", st.PromotionFailures}, {"corrupt_reads", st.CorruptReads},
		{"remove_failures", st.RemoveFailures}, {"leases_expired", st.LeasesExpired}, {"prefix_cut", st.PrefixCut},
		{"invalidate_failures", st.InvalidateFailures}, {"recovered", st.Recovered}, {"torn_dropped", st.TornDropped},
		{"corrupt_dropped", st.CorruptDropped}, {"duplicates_dropped", st.DuplicatesDropped},
		{"transport_violations", st.TransportViolations}, {"quarantined_blocks", st.QuarantinedBlocks},
		{"quarantined_slots", st.QuarantinedSlots}, {"quarantined_tasks", st.QuarantinedTasks},
		{"free_errors", st.FreeErrors}, {"io_in_flight", uint64(st.IOInFlight)},
	} {
		dst = append(dst, wire.Counter{Name: f.name, Value: f.v})
	}
	return dst
}
