package session

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
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
func (c *Session) storeSession() (*store.Store, *store.Session, error) {
	if c.pool == nil {
		return nil, nil, errNoPool
	}
	kv := c.store
	if kv == nil {
		return nil, nil, fmt.Errorf("%w: this daemon runs no store", ErrUnavailable)
	}
	c.st.once.Do(func() { c.st.ss = kv.NewSession() })
	if c.st.ss == nil {
		return nil, nil, fmt.Errorf("%w: connection released", ErrClosed)
	}
	return kv, c.st.ss, nil
}

// closeStore closes the connection's session, releasing its pins, leases
// and reservations. It runs in release, after the queues are closed (no
// worker can make a session any more).
func (c *Session) closeStore() {
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
func (c *Session) storeErr(err error) error {
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
// taken and kept in s.st.held until the call ends). Its code says why not.
func (c *Session) memOf(e wire.Extent) ([]byte, Code) {
	if e.Length == 0 {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	end := e.Offset + e.Length
	if end < e.Offset {
		return nil, tcproto.CodeINVALID_ARGUMENT
	}
	if p := c.pool; p != nil && e.Segment == p.ID() {
		if !c.blocks.Covers(e.Offset, e.Length) {
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
func (c *Session) releaseHeld() {
	for i, b := range c.st.held {
		b.Release()
		c.st.held[i] = nil
	}
	c.st.held = c.st.held[:0]
}

// resolveExtents checks every key's extent and compacts the keys whose
// extent resolved into s.st.keys and s.st.vals (their positions in pos);
// out gets the code of each refused key and OK for the others.
func (c *Session) resolveExtents(keys [][]byte, ext []wire.Extent) {
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
func (c *Session) scatter() []Code {
	st := &c.st
	for j, i := range st.pos {
		st.out[i] = Code(st.codes[j])
	}
	return st.out
}

// codesOf converts a whole call's store codes for the answer.
func (c *Session) codesOf(codes []store.Code) []Code {
	n := len(codes)
	c.st.out = slices.Grow(c.st.out[:0], n)[:n]
	for i, k := range codes {
		c.st.out[i] = Code(k)
	}
	return c.st.out
}

func (c *Session) storeCodes(n int) []store.Code {
	c.st.codes = slices.Grow(c.st.codes[:0], n)[:n]
	return c.st.codes
}

// partMin is the fewest bytes a part of a cut socket put or read moves
// (inParts): a goroutine's start and the wait for it cost microseconds, a
// part's copy at least a hundred.
const partMin = 4 << 20

// maxParts bounds the goroutines one call is cut among.
const maxParts = 4

// inParts runs fn over the keys of a copying call whose memory is mem
// (the values of a put, the destinations of a read), cut by bytes into
// consecutive ranges [lo, hi) of at least partMin bytes each, one per
// processor the runtime runs (at most maxParts): the first on this
// goroutine, the others on goroutines of their own that it waits for, so
// that one large call's copies run on every core (a socket call holds its
// connection's serving goroutine until it is answered). Each range is a
// call of its own to the store, its results in place in the call's
// slices. The first error of a range is returned.
//
// A panic of a part (a bug: the store turns a fault in the client's memory
// into a key's error) is raised again here once every part ended: on a
// goroutine of its own it would kill the daemon, here the connection's
// recover ends this call alone. Every part ends before inParts returns or
// unwinds, since they write the call's results and the memory of buffers
// whose references the caller drops as it returns.
func (c *Session) inParts(mem [][]byte, fn func(lo, hi int) error) error {
	var total uint64
	for _, b := range mem {
		total += uint64(len(b))
	}
	parts := min(runtime.GOMAXPROCS(0), maxParts, int(total/partMin), len(mem))
	if parts <= 1 {
		return fn(0, len(mem))
	}
	// Cut points: the key at which each part's share of the bytes is
	// reached.
	var cuts [maxParts + 1]int
	cuts[parts] = len(mem)
	var sum uint64
	p := 1
	for i, b := range mem {
		if p < parts && sum >= total*uint64(p)/uint64(parts) {
			cuts[p] = i
			p++
		}
		sum += uint64(len(b))
	}
	for ; p < parts; p++ {
		cuts[p] = len(mem)
	}
	var errs [maxParts]error
	var panics [maxParts]*partPanic
	var wg sync.WaitGroup
	for k := 1; k < parts; k++ {
		if cuts[k] == cuts[k+1] {
			continue
		}
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					panics[k] = &partPanic{v: r, stack: debug.Stack()}
				}
			}()
			errs[k] = fn(cuts[k], cuts[k+1])
		})
	}
	defer wg.Wait() // the first part's panic unwinds after the others end
	errs[0] = fn(0, cuts[1])
	wg.Wait()
	for _, pp := range panics[1:parts] {
		if pp != nil {
			panic(pp)
		}
	}
	for _, err := range errs[:parts] {
		if err != nil {
			return err
		}
	}
	return nil
}

// partPanic is the panic of a part inParts ran on a goroutine of its own,
// raised again on the caller's: it says where the part panicked, which the
// caller's stack does not.
type partPanic struct {
	v     any
	stack []byte
}

func (p *partPanic) Error() string {
	return fmt.Sprintf("%v [in a part of a store call, on its own goroutine:\n%s]", p.v, p.stack)
}

// keysFit refuses, as the store refuses a call of too many keys, a
// copying call of n keys: the store sees it in parts (inParts), each a call
// of fewer keys, and in fewer keys still once the extents refused are left
// out, so the bound is the whole call's.
func keysFit(kv *store.Store, n int) error {
	if most := kv.MaxKeysPerCall(); n > most {
		return fmt.Errorf("%w: %d keys (at most %d)", store.ErrBadCall, n, most)
	}
	return nil
}

// StorePut puts keys with values copied from the session's memory;
// replicas, when not 0, is the call's copies across hosts (the request
// context's).
func (c *Session) StorePut(m *wire.StorePutRequest, r *wire.Response, replicas uint8) error {
	kv, ss, err := c.storeSession()
	if err != nil {
		return err
	}
	if err := keysFit(kv, len(m.Keys)); err != nil {
		return err
	}
	c.resolveExtents(m.Keys, m.Values)
	defer c.releaseHeld()
	keys, vals, codes := c.st.keys, c.st.vals, c.st.codes
	err = c.inParts(vals, func(lo, hi int) error {
		_, err := ss.PutCopies(keys[lo:hi], vals[lo:hi], m.Durable, int(replicas), codes[lo:hi], nil, nil, 0)
		return c.storeErr(err)
	})
	if err != nil {
		return err
	}
	wire.SetResponse[wire.StorePutResponse](r).Codes = c.scatter()
	return nil
}

// StoreRead copies keys' values into the session's memory.
func (c *Session) StoreRead(m *wire.StoreReadRequest, r *wire.Response) error {
	kv, _, err := c.storeSession()
	if err != nil {
		return err
	}
	if err := keysFit(kv, len(m.Keys)); err != nil {
		return err
	}
	c.resolveExtents(m.Keys, m.Dests)
	defer c.releaseHeld()
	keys, dsts, lens, codes := c.st.keys, c.st.vals, c.st.lens, c.st.codes
	err = c.inParts(dsts, func(lo, hi int) error {
		_, err := kv.Read(keys[lo:hi], dsts[lo:hi], lens[lo:hi], codes[lo:hi], nil, nil, 0)
		return c.storeErr(err)
	})
	if err != nil {
		return err
	}
	n := len(m.Keys)
	c.st.offs = slices.Grow(c.st.offs[:0], n)[:n]
	clear(c.st.offs)
	for j, i := range c.st.pos {
		c.st.offs[i] = c.st.lens[j]
	}
	a := wire.SetResponse[wire.StoreReadResponse](r)
	a.Codes, a.Lengths = c.scatter(), c.st.offs
	return nil
}

// StoreRemove removes keys.
func (c *Session) StoreRemove(m *wire.StoreRemoveRequest, r *wire.Response) error {
	kv, _, err := c.storeSession()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	_, err = kv.Remove(m.Keys, codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreRemoveResponse](r).Codes = c.codesOf(codes)
	return nil
}

// StorePin pins keys for the session.
func (c *Session) StorePin(m *wire.StorePinRequest, r *wire.Response) error {
	_, ss, err := c.storeSession()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	err = ss.Pin(m.Keys, time.Duration(m.TTLMS)*time.Millisecond, codes)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StorePinResponse](r).Codes = c.codesOf(codes)
	return nil
}

// StoreUnpin drops the session's pins of keys.
func (c *Session) StoreUnpin(m *wire.StoreUnpinRequest, r *wire.Response) error {
	_, ss, err := c.storeSession()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	if err = c.storeErr(ss.Unpin(m.Keys, codes)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreUnpinResponse](r).Codes = c.codesOf(codes)
	return nil
}

// StoreReserve reserves pool blocks for keys, for the session to fill and commit.
func (c *Session) StoreReserve(m *wire.StoreReserveRequest, r *wire.Response) error {
	_, ss, err := c.storeSession()
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
	a := wire.SetResponse[wire.StoreReserveResponse](r)
	a.Codes, a.Offsets = c.codesOf(codes), c.st.offs
	return nil
}

// StoreCommit commits keys the session reserved.
func (c *Session) StoreCommit(m *wire.StoreCommitRequest, r *wire.Response, replicas uint8) error {
	_, ss, err := c.storeSession()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	_, err = ss.CommitCopies(m.Keys, m.Durable, int(replicas), codes, nil, nil, 0)
	if err = c.storeErr(err); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreCommitResponse](r).Codes = c.codesOf(codes)
	return nil
}

// StoreAbort gives back reservations of the session, each key on its
// own; a batch the store refuses as a whole (too many keys, an
// invalid one) is answered INVALID_ARGUMENT.
func (c *Session) StoreAbort(m *wire.StoreAbortRequest, r *wire.Response) error {
	_, ss, err := c.storeSession()
	if err != nil {
		return err
	}
	codes := c.storeCodes(len(m.Keys))
	if err = c.storeErr(ss.Abort(m.Keys, codes, nil)); err != nil {
		return err
	}
	wire.SetResponse[wire.StoreAbortResponse](r).Codes = c.codesOf(codes)
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
func (c *Session) StoreStat(m *wire.StoreStatRequest, r *wire.Response) error {
	kv, _, err := c.storeSession()
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
func (c *Session) StoreList(m *wire.StoreListRequest, r *wire.Response) error {
	kv, _, err := c.storeSession()
	if err != nil {
		return err
	}
	max := int(m.Max)
	if most := c.h.MaxFrame/listEntryBytes - 1; max == 0 || max > most {
		max = most
	}
	keys, more, err := kv.ListAfter(m.Prefix, m.After, max)
	if err != nil {
		return err
	}
	c.st.info = c.st.info[:0]
	for _, k := range keys {
		c.st.info = append(c.st.info, keyInfo(k, true))
	}
	a := wire.SetResponse[wire.StoreListResponse](r)
	a.Keys, a.More = c.st.info, more
	return nil
}

// StoreFlush waits for the store's writebacks.
func (c *Session) StoreFlush(m *wire.StoreFlushRequest, r *wire.Response) error {
	kv, _, err := c.storeSession()
	if err != nil {
		return err
	}
	d := c.h.DefaultWait
	if m.TimeoutMS > 0 {
		d = time.Duration(m.TimeoutMS) * time.Millisecond
	}
	// In slices, as the batch waits: the client chose how long, and a
	// closing server or a client that hung up must not wait that out.
	deadline := time.Now().Add(d)
	for {
		err := kv.Flush(max(min(time.Until(deadline), waitSlice), 0))
		switch {
		case err == nil:
			wire.SetResponse[wire.StoreFlushResponse](r)
			return nil
		case !errors.Is(err, xfer.ErrTimeout), !time.Now().Before(deadline):
			return err
		case c.h.closing():
			return fmt.Errorf("%w: server closing", ErrUnavailable)
		case c.clientGone():
			return errClientGone
		}
	}
}

// StoreFigures are the session's store's figures for Stats; none without
// a store.
func (c *Session) StoreFigures() []wire.Counter {
	if c.store == nil {
		return nil
	}
	return c.grantCounters(StoreCounters(c.store.Stats(), nil))
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
		{"pins", st.Pins}, {"hidden", st.Hidden}, {"unseen", st.Unseen}, {"confirmed", st.Confirmed}, {"dirty", st.Dirty}, {"hits_l1", st.HitsL1}, {"hits_l2", st.HitsL2}, {"misses", st.Misses},
		{"evictions_l1", st.EvictionsL1}, {"evictions_l2", st.EvictionsL2}, {"dropped_unwritten", st.DroppedUnwritten},
		{"l1_full", st.L1Full}, {"writebacks", st.Writebacks}, {"writeback_retries", st.WritebackRetries},
		{"tombstones", st.Tombstones}, {"durable_puts", st.DurablePuts}, {"durable_failures", st.DurableFailures},
		{"promotions", st.Promotions}, {"promotion_failures", st.PromotionFailures}, {"corrupt_reads", st.CorruptReads},
		{"remove_failures", st.RemoveFailures}, {"leases_expired", st.LeasesExpired}, {"prefix_cut", st.PrefixCut}, {"pin_limit", st.PinLimit},
		{"invalidate_failures", st.InvalidateFailures}, {"ghosts_zeroed", st.GhostsZeroed}, {"ghost_zero_failures", st.GhostZeroFailures},
		{"recovered", st.Recovered}, {"torn_dropped", st.TornDropped},
		{"corrupt_dropped", st.CorruptDropped}, {"duplicates_dropped", st.DuplicatesDropped},
		{"l1_recovered", st.L1Recovered}, {"l1_dropped", st.L1Dropped}, {"l1_torn", st.L1Torn},
		{"l1_journal_full", st.L1JournalFull},
		{"transport_violations", st.TransportViolations}, {"quarantined_blocks", st.QuarantinedBlocks},
		{"quarantined_slots", st.QuarantinedSlots}, {"quarantined_tasks", st.QuarantinedTasks},
		{"free_errors", st.FreeErrors}, {"io_in_flight", uint64(st.IOInFlight)},
		{"io_waiting", uint64(st.IOWaiting)}, {"io_waits", st.IOWaits},
	} {
		dst = append(dst, wire.Counter{Name: f.name, Value: f.v})
	}
	return dst
}
