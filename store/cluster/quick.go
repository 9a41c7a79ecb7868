package cluster

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// One-round-trip reads (kindRead). A reader whose key's holders come from
// its cache of home answers, and whose Mover reads the first holder's
// value so (KeyReader: a tcp link, or an rdma one for a get of one small
// value), asks the holder for the value by key and gets the bytes in the
// answer, straight into blocks of its own pool: the holder's claim and
// the read are one exchange, where a hold followed by a READ costs two
// round trips and a release besides. The holder serves it on its connection's event loop
// (QuickPeers.HandleInline): it admits the reader against its per-key
// limit (Config.ClaimsPerKey, shared with the holds) and the mode's serve
// budget, lends the value from its memory while the answer is written,
// and is done with it (the claim released) once the write returns, so
// nothing stays claimed whatever becomes of the reader. The reader checks
// the crc32c the home gave, commits the value as its own copy and
// answers; the announcement of that copy is sent after the answer.
// Nothing on the reader's way blocks or starts a goroutine: the requests
// of every cached key of a call whose cached values come to at most
// quickCallBytes are written at once by the caller of Fetch (the queue's
// worker), and each answer is taken on the reader's event loop.
//
// Whatever this way cannot do goes the two-step way (fetch), on a
// goroutine of its own: the whole of a call over quickCallBytes; at once
// for a key not in the cache (a key whose home this daemon is takes a
// claim there, which spreads a hot key's readers over its copies), a
// holder the Mover reads by rdma, has no session with yet or no room in
// the window to, and a value larger than a data frame; once the call's
// other keys are in for a holder that answers busy, not found or "not in
// memory" (its value is on L2: the hold promotes it), one that does not
// serve kindRead (an older release), a failed or late answer and bytes
// whose crc32c does not match.
//
//	read      key → a holder: key, u64 size (the size the home gave)
//	          answer: u8 code (a store.Code; Unavailable: not in memory),
//	          u64 size, then the value's bytes as the payload when OK

// kindRead is the one-round-trip read.
const kindRead = "tc.store.read"

// QuickPeers is what Peers may also do: serve a data exchange on the
// connection's event loop (tcp.Node.HandleInline). A holder serves
// kindRead with it.
type QuickPeers interface {
	HandleInline(kind string, h func(from string, epoch uint64, req []byte, reply func(resp, payload []byte)) error) error
}

// KeyReader is what a Mover may also do: a data exchange with a holder,
// whose payload lands in dst (tcp.Node.ExchangeInto); alone says the value
// is the only one its get reads. It never blocks: false when it cannot or
// should not (the link to the holder is rdma and dst too large to copy or
// one of several values, which one hold and a batch of READs move for
// less; no session yet, dst larger than a data frame, no room for dst in
// the flow-control window); else done runs exactly once, on any
// goroutine, possibly before ReadKey returns, and dst is not written
// after it ran.
type KeyReader interface {
	ReadKey(holder string, epoch uint64, kind string, req, dst []byte, alone bool, deadline time.Time,
		done func(resp []byte, got int, err error)) bool
}

// encodeRead encodes a read: key, u64 size.
func encodeRead(key []byte, size uint64) []byte {
	e := newEnc()
	e.key(key)
	e.u64(size)
	return e.bytes()
}

func decodeRead(b []byte) ([]byte, uint64, error) {
	d := newDec(b)
	k := d.key()
	size := d.u64()
	return k, size, d.end()
}

// encodeReadAnswer encodes a read's answer: u8 code, u64 size.
func encodeReadAnswer(code store.Code, size uint64) []byte {
	e := newEnc()
	e.u8(uint8(code))
	e.u64(size)
	return e.bytes()
}

func decodeReadAnswer(b []byte) (store.Code, uint64, error) {
	d := newDec(b)
	code := store.Code(d.u8())
	size := d.u64()
	return code, size, d.end()
}

// onRead serves a one-round-trip read on the connection's event loop: it
// must not block.
func (c *Cluster) onRead(from string, epoch uint64, req []byte, reply func(resp, payload []byte)) error {
	c.served[kindRead].Add(1)
	key, size, err := decodeRead(req)
	if err != nil {
		return err
	}
	if c.closedLocked() {
		return ErrClosed
	}
	k := string(key)
	c.holdMu.Lock()
	if c.isGoneLocked(k) { // removed, here until its I/O ends
		c.holdMu.Unlock()
		reply(encodeReadAnswer(store.NotFound, 0), nil)
		return nil
	}
	if c.holdKeys[k] >= c.cfg.ClaimsPerKey {
		c.holdMu.Unlock()
		c.c.readersRefused.Add(1)
		reply(encodeReadAnswer(store.Busy, 0), nil)
		return nil
	}
	c.holdKeys[k]++
	c.holdMu.Unlock()
	defer c.uncount([]string{k})
	sent := false
	code, inMem := c.st.ReadHere(key, func(val []byte) {
		if uint64(len(val)) != size {
			reply(encodeReadAnswer(store.OK, uint64(len(val))), nil)
			sent = true
			return
		}
		if a := c.cfg.Admission; a != nil {
			// The mode's budget for serving other hosts' reads.
			if err := a.Serve(size); err != nil {
				c.c.overBudget.Add(1)
				reply(encodeReadAnswer(store.ResourceExhausted, 0), nil)
				sent = true
				return
			}
		}
		reply(encodeReadAnswer(store.OK, size), val)
		sent = true
		c.c.quickServed.Add(1)
	})
	switch {
	case sent:
	case code != store.OK:
		reply(encodeReadAnswer(code, 0), nil)
	case !inMem:
		reply(encodeReadAnswer(store.Unavailable, 0), nil) // on L2 (or busy): the hold promotes it
	}
	return nil
}

// quickCallBytes bounds a Fetch that reads in one-round-trip reads: one
// whose cached values come to more goes the two-step way whole. Its hold
// costs little beside so many bytes, its READs queue for room in the
// flow-control windows where a one-round-trip read finding no room would
// only fail and fall back, and reading part of such a call so was measured
// to cost more CPU per GB than the hold alone (BENCHMARKS).
const quickCallBytes = 4 << 20

// quickFetch tries the one-round-trip read of keys (the caller's Fetch
// admitted them and holds one fetch slot for them all); false when not one
// could start, or their cached values come to more than quickCallBytes,
// and the caller goes the two-step way with them all. Once it returns
// true, finish(j, …) runs exactly once for each key j, and end once after
// the last of them (it gives the fetch slot back):
//   - a key whose read started ends from its answer;
//   - the keys that could not start (no fresh answer cached, a value the
//     Mover does not read so, no room in the windows to the holder) go
//     the two-step way at once, on one goroutine, so that their hold is
//     asked while the started reads' bytes move;
//   - the keys whose read fell back (busy, not in memory, a failed or late
//     answer, bytes whose crc32c does not match) go the two-step way
//     together once every other key of the call has ended.
func (c *Cluster) quickFetch(keys [][]byte, finish func(int, error), end func()) bool {
	kr, ok := c.mover.(KeyReader)
	if !ok {
		return false
	}
	now := time.Now()
	hs := make([]Holder, len(keys))
	total := uint64(0)
	for j, key := range keys {
		if h, ok := c.quickHolder(key, now); ok {
			hs[j], total = h, total+h.Size
		}
	}
	if total == 0 || total > quickCallBytes || c.backlogged() {
		return false // backlogged: the two-step way says why
	}
	q := &quickCall{c: c, keys: keys, finish: finish, end: end, deadline: now.Add(c.cfg.Timeout)}
	q.left.Store(1) // this loop's own count, until it has started them all
	var slow []int
	// refused is, per holder, the smallest value the Mover would not read
	// so in this call (a link whose bulk bytes go by rdma, no room in the
	// windows): a value as large is not reserved for, only to be refused.
	var refused map[string]uint64
	for j, key := range keys {
		h := hs[j]
		if r, seen := refused[h.ID]; h.ID == "" || seen && h.Size >= r {
			slow = append(slow, j)
			continue
		}
		switch q.start(kr, j, key, h) {
		case started:
			continue
		case moverRefused:
			if refused == nil {
				refused = map[string]uint64{}
			}
			refused[h.ID] = h.Size
		}
		slow = append(slow, j)
	}
	if len(slow) == len(keys) {
		return false
	}
	if len(slow) > 0 {
		q.left.Add(1)
		go func() {
			defer q.release()
			q.fetch(slow)
		}()
	}
	q.release()
	return true
}

// quickCall is one Fetch's one-round-trip reads.
type quickCall struct {
	c      *Cluster
	keys   [][]byte
	finish func(int, error)
	end    func()
	// deadline ends the call: its one-round-trip reads, and the two-step
	// way of the keys that could not go so or fell back (the latter may
	// have no time left: a holder that never answered took it).
	deadline time.Time
	// left counts the reads in flight, the two-step fetch of the keys
	// that could not start and quickFetch's own loop; the last of them
	// to end sends the keys whose read fell back the two-step way, then
	// ends the call.
	left atomic.Int32
	mu   sync.Mutex
	late []int // keys whose read fell back
}

// fetch reads the keys at pos the two-step way, by the call's deadline.
func (q *quickCall) fetch(pos []int) {
	ks := make([][]byte, len(pos))
	for i, p := range pos {
		ks[i] = q.keys[p]
	}
	q.c.fetch(ks, q.deadline, func(i int, err error) { q.finish(pos[i], err) })
}

// release ends one of q's counted parts.
func (q *quickCall) release() {
	if q.left.Add(-1) != 0 {
		return
	}
	q.mu.Lock()
	late := q.late
	q.mu.Unlock()
	if len(late) == 0 {
		q.end()
		return
	}
	go func() {
		defer q.end()
		q.fetch(late)
	}()
}

// quickHolder is the holder that key's one-round-trip read asks: the
// first other daemon that a fresh cached home answer names.
func (c *Cluster) quickHolder(key []byte, now time.Time) (Holder, bool) {
	hs, _ := c.answers.get(key, now)
	for _, h := range hs {
		if h.ID != c.self {
			return h, h.Size != 0
		}
	}
	return Holder{}, false
}

// What quickCall.start did.
const (
	notStarted   = iota // the key goes the two-step way
	moverRefused        // so does the key: the Mover would not read it so
	started
)

// start starts key j's one-round-trip read from h; unless it says
// started, nothing was sent and nothing is reserved.
func (q *quickCall) start(kr KeyReader, j int, key []byte, h Holder) int {
	c := q.c
	ss := c.st.NewSession()
	_ = ss.SetReplicas(1) // 1 is in range
	keys := [][]byte{key}
	locs := make([]store.Location, 1)
	codes := make([]store.Code, 1)
	errs := make([]error, 1)
	if err := ss.Reserve(keys, []uint64{h.Size}, locs, codes, errs); err != nil || codes[0] != store.OK {
		_ = ss.Close()
		return notStarted // the two-step way says why (stored here meanwhile, no room)
	}
	dst := c.cfg.Pool[locs[0].Offset : locs[0].Offset+h.Size]
	slow := func(why error) {
		_ = ss.Close()
		c.c.quickFallbacks.Add(1)
		c.log.Debug("one-round-trip read fell back to a hold and a read", "key", string(key), "holder", h.ID, "err", why)
		q.mu.Lock()
		q.late = append(q.late, j)
		q.mu.Unlock()
		q.release()
	}
	q.left.Add(1)
	sent := time.Now()
	ok := kr.ReadKey(h.ID, h.Epoch, kindRead, encodeRead(key, h.Size), dst, len(q.keys) == 1, q.deadline, func(resp []byte, got int, err error) {
		var code store.Code
		var size uint64
		if err == nil {
			code, size, err = decodeReadAnswer(resp)
		}
		switch {
		case err != nil:
			if c.peers.Unreachable(err) && !errors.Is(err, xfer.ErrTimeout) {
				c.lost(h.ID, err, sent)
			}
			slow(fmt.Errorf("holder %s: %w", h.ID, err))
			return
		case code != store.OK:
			slow(fmt.Errorf("holder %s answered code %d", h.ID, code))
			return
		case size != h.Size || uint64(got) != h.Size:
			slow(fmt.Errorf("holder %s has %d bytes (%d sent), its home said %d", h.ID, size, got, h.Size))
			return
		}
		if sum := store.CRC(dst); sum != h.CRC {
			c.c.crcMismatch.Add(1)
			slow(fmt.Errorf("%w: value from %s has crc32c %#x, its home said %#x", ErrHolderFailed, h.ID, sum, h.CRC))
			return
		}
		c.c.remoteBytes.Add(h.Size)
		c.byPeer.add(h.ID, h.Size)
		ccodes := make([]store.Code, 1)
		cerrs := make([]error, 1)
		err = ss.CommitFetched(keys, []uint32{h.CRC}, ccodes, cerrs)
		_ = ss.Close()
		if err == nil && ccodes[0] != store.OK {
			err = cerrs[0]
		}
		if err != nil {
			c.c.remoteFailed.Add(1)
		} else {
			c.c.remoteHits.Add(1)
			c.c.cacheHits.Add(1)
			c.c.quickReads.Add(1)
		}
		q.finish(j, err)
		q.release()
	})
	if !ok {
		q.left.Add(-1)
		_ = ss.Close()
		return moverRefused
	}
	return started
}
