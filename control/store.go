package control

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
func (c *conn) session() (*store.Store, *store.Session, error) {
	if c.tenant == nil {
		return nil, nil, errNoPool
	}
	s := c.tenant.Store
	if s == nil {
		return nil, nil, fmt.Errorf("%w: this daemon runs no store", ErrUnavailable)
	}
	c.st.once.Do(func() { c.st.ss = s.NewSession() })
	if c.st.ss == nil {
		return nil, nil, fmt.Errorf("%w: connection released", ErrClosed)
	}
	return s, c.st.ss, nil
}

// closeStore closes the connection's session, releasing its pins, leases
// and reservations. It runs in release, after the queues are closed (no
// worker can make a session any more).
func (c *conn) closeStore() {
	c.st.once.Do(func() {}) // no session made from here on
	if c.st.ss == nil {
		return
	}
	if err := c.st.ss.Close(); err != nil {
		c.log.Error("closing the store session freed a reservation badly", "err", err)
	}
}

// storeErr is the answer to a store call that returned err: nil when the
// call ran and its codes say what happened (all or nothing refused, a
// transport broken on some keys, which carry INTERNAL), else err.
func (c *conn) storeErr(err error) error {
	switch {
	case err == nil, errors.Is(err, store.ErrNotApplied):
		return nil
	case errors.Is(err, store.ErrTransport):
		c.log.Error("store: the L2 transport broke its contract during a call", "err", err)
		return nil
	}
	return err
}

// memOf resolves a copying call's extent to the bytes it names: pool
// blocks this connection holds, or a client buffer of it (a reference is
// taken and kept in c.st.held until the call ends). Its code says why not.
func (c *conn) memOf(e wire.Extent) ([]byte, Code) {
	if e.Length == 0 {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	end := e.Offset + e.Length
	if end < e.Offset {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	if p := c.pool; p != nil && e.Segment == p.ID() {
		if !c.blocks.covers(e.Offset, e.Length) {
			return nil, tcproto.CodePERMISSION_DENIED
		}
		return p.Bytes()[e.Offset:end:end], tcproto.CodeOK
	}
	c.mu.Lock()
	b, ok := c.buffers[e.Segment]
	_, file := c.files[e.Segment]
	_, remote := c.remotes[e.Segment]
	c.mu.Unlock()
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
	c.st.held = append(c.st.held, b)
	return b.Bytes()[e.Offset:end:end], tcproto.CodeOK
}

// releaseHeld drops the buffer references a copying call took.
func (c *conn) releaseHeld() {
	for i, b := range c.st.held {
		b.Release()
		c.st.held[i] = nil
	}
	c.st.held = c.st.held[:0]
}

// resolveExtents checks every key's extent and compacts the keys whose
// extent resolved into c.st.keys and c.st.vals (their positions in pos);
// out gets the code of each refused key and OK for the others.
func (c *conn) resolveExtents(keys [][]byte, ext []wire.Extent) {
	st := &c.st
	n := len(keys)
	st.out = slices.Grow(st.out[:0], n)[:n]
	st.keys, st.vals, st.pos = st.keys[:0], st.vals[:0], st.pos[:0]
	for i, e := range ext {
		mem, code := c.memOf(e)
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
func (c *conn) scatter() []Code {
	st := &c.st
	for j, i := range st.pos {
		st.out[i] = Code(st.codes[j])
	}
	return st.out
}

// codesOf converts a whole call's store codes for the answer.
func (c *conn) codesOf(codes []store.Code) []Code {
	n := len(codes)
	c.st.out = slices.Grow(c.st.out[:0], n)[:n]
	for i, k := range codes {
		c.st.out[i] = Code(k)
	}
	return c.st.out
}

func (c *conn) storeCodes(n int) []store.Code {
	c.st.codes = slices.Grow(c.st.codes[:0], n)[:n]
	return c.st.codes
}

func (c *conn) storePut(m *wire.StorePutRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	c.resolveExtents(m.Keys, m.Values)
	defer c.releaseHeld()
	_, err = ss.Put(c.st.keys, c.st.vals, m.Durable, c.st.codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StorePutResponse](&c.resp).Codes = c.scatter()
	return nil
}

func (c *conn) storeRead(m *wire.StoreReadRequest) error {
	s, _, err := c.session()
	if err != nil {
		return err
	}
	c.resolveExtents(m.Keys, m.Dests)
	defer c.releaseHeld()
	_, err = s.Read(c.st.keys, c.st.vals, c.st.lens, c.st.codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	n := len(m.Keys)
	c.st.offs = slices.Grow(c.st.offs[:0], n)[:n]
	clear(c.st.offs)
	for j, i := range c.st.pos {
		c.st.offs[i] = c.st.lens[j]
	}
	r := wire.SetResponse[wire.StoreReadResponse](&c.resp)
	r.Codes, r.Lengths = c.scatter(), c.st.offs
	return nil
}

func (c *conn) storeRemove(m *wire.StoreRemoveRequest) error {
	s, _, err := c.session()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	_, err = s.Remove(m.Keys, codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreRemoveResponse](&c.resp).Codes = c.codesOf(codes)
	return nil
}

func (c *conn) storePin(m *wire.StorePinRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	err = ss.Pin(m.Keys, time.Duration(m.TTLMS)*time.Millisecond, codes)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StorePinResponse](&c.resp).Codes = c.codesOf(codes)
	return nil
}

func (c *conn) storeUnpin(m *wire.StoreUnpinRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	if err = c.storeErr(ss.Unpin(m.Keys, codes)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreUnpinResponse](&c.resp).Codes = c.codesOf(codes)
	return nil
}

func (c *conn) storeReserve(m *wire.StoreReserveRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	n := len(m.Keys)
	codes := c.storeCodes(n)
	c.st.locs = slices.Grow(c.st.locs[:0], n)[:n]
	if err = c.storeErr(ss.Reserve(m.Keys, m.Sizes, c.st.locs, codes, nil)); err != nil {
		return err
	}
	c.st.offs = slices.Grow(c.st.offs[:0], n)[:n]
	for i, l := range c.st.locs {
		c.st.offs[i] = l.Offset
	}
	r := wire.SetResponse[wire.StoreReserveResponse](&c.resp)
	r.Codes, r.Offsets = c.codesOf(codes), c.st.offs
	return nil
}

func (c *conn) storeCommit(m *wire.StoreCommitRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	_, err = ss.Commit(m.Keys, m.Durable, codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreCommitResponse](&c.resp).Codes = c.codesOf(codes)
	return nil
}

// storeAbort gives back reservations of the connection's session, each
// key on its own; a batch the store refuses as a whole (too many keys, an
// invalid one) is answered INVALID_ARGUMENT.
func (c *conn) storeAbort(m *wire.StoreAbortRequest) error {
	_, ss, err := c.session()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	if err = c.storeErr(ss.Abort(m.Keys, codes, nil)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreAbortResponse](&c.resp).Codes = c.codesOf(codes)
	return nil
}

func keyInfo(k store.KeyInfo, withKey bool) wire.StoreKeyInfo {
	w := wire.StoreKeyInfo{Size: k.Size, InL1: k.InL1, InL2: k.InL2, Pins: k.Pins, Dirty: k.Dirty, Tombstone: k.Tombstone}
	if withKey {
		w.Key = k.Key
	}
	return w
}

func (c *conn) storeStat(m *wire.StoreStatRequest) error {
	s, _, err := c.session()
	if err != nil {
		return err
	}
	k, err := s.Stat(m.Key)
	if err != nil {
		return err
	}
	wire.SetResponse[wire.StoreStatResponse](&c.resp).Info = keyInfo(k, false)
	return nil
}

// listEntryBytes is what one listed key may take in an answer at most (a
// 256-byte key and its figures, with the flatbuffer's overhead); a listing
// is cut so that its answer fits the frame.
const listEntryBytes = 384

func (c *conn) storeList(m *wire.StoreListRequest) error {
	s, _, err := c.session()
	if err != nil {
		return err
	}
	max := int(m.Max)
	if most := c.s.cfg.MaxFrame/listEntryBytes - 1; max == 0 || max > most {
		max = most
	}
	keys, more, err := s.ListAfter(m.Prefix, m.After, max)
	if err != nil {
		return err
	}
	c.st.info = c.st.info[:0]
	for _, k := range keys {
		c.st.info = append(c.st.info, keyInfo(k, true))
	}
	r := wire.SetResponse[wire.StoreListResponse](&c.resp)
	r.Keys, r.More = c.st.info, more
	return nil
}

func (c *conn) storeFlush(m *wire.StoreFlushRequest) error {
	s, _, err := c.session()
	if err != nil {
		return err
	}
	d := c.s.cfg.DefaultWait
	if m.TimeoutMS > 0 {
		d = time.Duration(m.TimeoutMS) * time.Millisecond
	}
	if err := s.Flush(d); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreFlushResponse](&c.resp)
	return nil
}

// storeCounters are the store's figures for Stats; none without a store.
func (c *conn) storeCounters() []wire.Counter {
	if c.tenant == nil || c.tenant.Store == nil {
		return nil
	}
	s := c.tenant.Store
	return StoreCounters(s.Stats(), nil)
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
