package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// The reader's side: lookups at the homes, fetches from the holders,
// Present and Removed.

// lookupAll asks the homes of the keys not skipped about them, every home
// at once, by deadline; as[i] or errs[i] is key i's answer. With cache, a
// fresh cached answer stands for the home's (cached[i] says so).
func (c *Cluster) lookupAll(keys [][]byte, skip []bool, deadline time.Time, cache bool) (as []lookupAnswer, errs []error, cached []bool) {
	as = make([]lookupAnswer, len(keys))
	errs = make([]error, len(keys))
	cached = make([]bool, len(keys))
	now := time.Now()
	var pos []int
	for i, k := range keys {
		if skip != nil && skip[i] {
			continue
		}
		if cache {
			if hs, ok := c.answers.get(k, now); ok {
				as[i].holders, cached[i] = hs, true
				c.c.cacheHits.Add(1)
				continue
			}
		}
		pos = append(pos, i)
	}
	if len(pos) == 0 {
		return as, errs, cached
	}
	part := func(ps []int) [][]byte {
		ks := make([][]byte, len(ps))
		for j, p := range ps {
			ks[j] = keys[p]
		}
		return ks
	}
	take := func(ps []int, home string, got []lookupAnswer) {
		for j, p := range ps {
			if got[j].code == codeNotHome {
				errs[p] = fmt.Errorf("%w: %s", ErrNotHome, home)
				continue
			}
			as[p] = got[j]
			if home != c.self {
				c.answers.put(keys[p], got[j].holders, now)
			}
		}
	}
	c.toHomes(keys, pos, homeMsg{
		kind:  kindLookup,
		per:   2 + 1 + maxHoldersCap*(1+maxIDLen+21),
		build: func(ps []int) []byte { return encodeKeys(part(ps)) },
		local: func(ps []int) { take(ps, c.self, c.lookupHere(part(ps))) },
		got: func(ps []int, home string, body []byte, err error) {
			c.c.lookups.Add(uint64(len(ps)))
			var got []lookupAnswer
			if err == nil {
				got, err = decodeLookupAnswer(body, len(ps))
			}
			if err != nil {
				c.c.lookupFailed.Add(uint64(len(ps)))
				if !errors.Is(err, ErrStaleGeneration) {
					err = fmt.Errorf("%w: %s: %w", ErrHomeUnreachable, home, err)
				}
				for _, p := range ps {
					errs[p] = err
				}
				return
			}
			take(ps, home, got)
		},
	}, deadline)
	return as, errs, cached
}

// Present sets found[i] for each key not found yet that another daemon
// holds, as its home says (store.Remote).
func (c *Cluster) Present(keys [][]byte, found []bool) {
	as, _, _ := c.lookupAll(keys, found, time.Now().Add(c.cfg.Timeout), true)
	for i := range keys {
		if found[i] {
			continue
		}
		for _, h := range as[i].holders {
			if h.ID != c.self {
				found[i] = true
				break
			}
		}
	}
}

// PresentAsync is Present on a goroutine of its own (store.RemotePresence),
// ending by Config.Timeout; when closing, done runs at once with nothing
// found.
func (c *Cluster) PresentAsync(keys [][]byte, found []bool, done func()) {
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.fetchWG.Add(1)
	}
	c.mu.Unlock()
	if closed {
		done()
		return
	}
	go func() {
		defer c.fetchWG.Done()
		c.Present(keys, found)
		done()
	}()
}

// SizeOf is the size of key's value at another holder, as its home says
// (store.Remote).
func (c *Cluster) SizeOf(key []byte) (uint64, bool) {
	as, errs, _ := c.lookupAll([][]byte{key}, nil, time.Now().Add(c.cfg.Timeout), true)
	if errs[0] != nil {
		return 0, false
	}
	for _, h := range as[0].holders {
		if h.ID != c.self {
			return h.Size, true
		}
	}
	return 0, false
}

// Removed has the keys' homes remove every other copy (store.Remote); a
// home that cannot be reached is logged.
func (c *Cluster) Removed(keys [][]byte) {
	c.answers.drop(keys)
	pos := make([]int, len(keys))
	for i := range pos {
		pos[i] = i
	}
	part := func(ps []int) [][]byte {
		ks := make([][]byte, len(ps))
		for j, p := range ps {
			ks[j] = keys[p]
		}
		return ks
	}
	c.toHomes(keys, pos, homeMsg{
		kind:  kindRemove,
		per:   2,
		build: func(ps []int) []byte { return encodeKeys(part(ps)) },
		local: func(ps []int) { c.removeHere(c.self, part(ps)) },
		got: func(ps []int, home string, _ []byte, err error) {
			if err != nil {
				c.log.Info("a home did not take a removal: other copies may stay until re-announced",
					"home", home, "keys", len(ps), "err", err)
			}
		},
	}, time.Now().Add(c.cfg.Timeout))
}

// Fetch brings keys from their holders into this daemon's store
// (store.Remote): it runs on a goroutine of its own, at most MaxFetches at
// once (past that each key gets ErrBusy), and ends by Config.Timeout. A key
// another fetch is bringing already joins that one and gets its answer, so
// that readers of one hot key fetch it once.
func (c *Cluster) Fetch(keys [][]byte, done func(i int, err error)) {
	var own [][]byte
	var pos []int
	c.flyMu.Lock()
	for i, k := range keys {
		if ws, ok := c.flying[string(k)]; ok {
			c.flying[string(k)] = append(ws, func(err error) { done(i, err) })
			continue
		}
		c.flying[string(k)] = nil
		own, pos = append(own, k), append(pos, i)
	}
	c.flyMu.Unlock()
	if len(own) == 0 {
		return
	}
	finish := func(j int, err error) {
		k := string(own[j])
		c.flyMu.Lock()
		joined := c.flying[k]
		delete(c.flying, k)
		c.flyMu.Unlock()
		done(pos[j], err)
		for _, w := range joined {
			w(err)
		}
	}
	select {
	case c.fetchSem <- struct{}{}:
	default:
		for j := range own {
			finish(j, ErrBusy)
		}
		return
	}
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.fetchWG.Add(1)
	}
	c.mu.Unlock()
	if closed {
		<-c.fetchSem
		for j := range own {
			finish(j, ErrClosed)
		}
		return
	}
	go func() {
		defer c.fetchWG.Done()
		defer func() { <-c.fetchSem }()
		c.fetch(own, finish)
	}()
}

// want is one key of a fetch: the holders to try, in order.
type want struct {
	i      int
	cands  []Holder
	next   int
	last   error
	cached bool // cands came from the cache of home answers
}

func (c *Cluster) fetch(keys [][]byte, done func(int, error)) {
	deadline := time.Now().Add(c.cfg.Timeout)
	ws := c.wants(keys, nil, deadline, true, done)
	for len(ws) > 0 {
		if !time.Now().Before(deadline) {
			for _, w := range ws {
				c.c.remoteFailed.Add(1)
				done(w.i, fmt.Errorf("%w: remote read not done within %v (last: %v)", xfer.ErrTimeout, c.cfg.Timeout, w.last))
			}
			return
		}
		type src struct {
			id    string
			epoch uint64
		}
		groups := map[src][]*want{}
		for _, w := range ws {
			h := w.cands[w.next]
			groups[src{h.ID, h.Epoch}] = append(groups[src{h.ID, h.Epoch}], w)
		}
		var wg sync.WaitGroup
		for s, g := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.readFrom(s.id, s.epoch, keys, g, deadline)
			}()
		}
		wg.Wait()
		rest := ws[:0]
		var again []bool // keys whose cached holders all failed: asked of the home now
		for _, w := range ws {
			switch {
			case w.last == nil:
				c.c.remoteHits.Add(1)
				done(w.i, nil)
			case w.next+1 < len(w.cands):
				w.next++
				rest = append(rest, w)
			case w.cached:
				if again == nil {
					again = make([]bool, len(keys))
					for i := range again {
						again[i] = true // skip
					}
				}
				again[w.i] = false
				c.answers.drop(keys[w.i : w.i+1])
			default:
				c.c.remoteFailed.Add(1)
				c.logFailed(keys[w.i], w.last)
				done(w.i, fmt.Errorf("%w: %w", ErrHolderFailed, w.last))
			}
		}
		ws = rest
		if again != nil {
			ws = append(ws, c.wants(keys, again, deadline, false, done)...)
		}
	}
}

// wants looks the keys not skipped up (with cache: a fresh cached answer
// stands for the home's) and returns what to read of each from whom; a
// key no other daemon holds, or whose home failed, is answered at once.
func (c *Cluster) wants(keys [][]byte, skip []bool, deadline time.Time, cache bool, done func(int, error)) []*want {
	as, errs, cached := c.lookupAll(keys, skip, deadline, cache)
	var ws []*want
	for i := range keys {
		if skip != nil && skip[i] {
			continue
		}
		if errs[i] != nil {
			c.c.remoteMisses.Add(1)
			done(i, errs[i])
			continue
		}
		w := &want{i: i, cached: cached[i]}
		for _, h := range as[i].holders {
			if h.ID != c.self {
				w.cands = append(w.cands, h)
			}
		}
		if len(w.cands) == 0 {
			c.c.remoteMisses.Add(1)
			done(i, fmt.Errorf("%w: no daemon holds it", store.ErrNotFound))
			continue
		}
		ws = append(ws, w)
	}
	return ws
}

// readFrom reads the keys of g from holder id (at epoch) into this
// daemon's store; each want's last is nil when its key is stored here
// now, else why not.
func (c *Cluster) readFrom(id string, epoch uint64, keys [][]byte, g []*want, deadline time.Time) {
	fail := func(ws []*want, err error) {
		for _, w := range ws {
			w.last = err
		}
	}
	for len(g) > 0 {
		n := min(len(g), maxMsgKeys)
		part := g[:n]
		g = g[n:]
		ks := make([][]byte, n)
		for j, w := range part {
			ks[j] = keys[w.i]
		}
		ttl := time.Until(deadline)
		if ttl < time.Millisecond {
			fail(part, xfer.ErrTimeout)
			continue
		}
		resp, err := c.peers.ExchangeAt(id, epoch, kindHold, encodeHold(uint32(ttl.Milliseconds())+1, ks), ttl)
		if err != nil {
			fail(part, fmt.Errorf("holder %s: %w", id, err))
			continue
		}
		claim, hs, err := decodeHeld(resp, n)
		if err != nil {
			fail(part, fmt.Errorf("holder %s: %w", id, err))
			continue
		}
		c.land(id, epoch, ks, part, hs, deadline)
		if claim != 0 {
			c.fetchWG.Add(1)
			go func() {
				defer c.fetchWG.Done()
				if _, err := c.peers.ExchangeAt(id, epoch, kindRelease, encodeClaim(claim), c.cfg.Timeout); err != nil {
					c.log.Debug("releasing a claim failed (it expires by itself)", "holder", id, "err", err)
				}
			}()
		}
	}
}

// land moves the values a holder pinned (hs) into blocks reserved here,
// checks them and commits them.
func (c *Cluster) land(id string, epoch uint64, ks [][]byte, ws []*want, hs []held, deadline time.Time) {
	var rkeys [][]byte
	var rw []*want
	var sizes []uint64
	var remote []uint64
	for j, h := range hs {
		w := ws[j]
		want := w.cands[w.next]
		switch {
		case store.Code(h.code) == store.NotFound:
			w.last = fmt.Errorf("%w: holder %s no longer has it", store.ErrNotFound, id)
		case store.Code(h.code) != store.OK:
			w.last = fmt.Errorf("holder %s answered code %d", id, h.code)
		case h.size != want.Size:
			w.last = fmt.Errorf("holder %s has %d bytes, its home said %d", id, h.size, want.Size)
		default:
			rkeys = append(rkeys, ks[j])
			rw = append(rw, w)
			sizes = append(sizes, h.size)
			remote = append(remote, h.offset)
		}
	}
	if len(rkeys) == 0 {
		return
	}
	ss := c.st.NewSession()
	defer ss.Close()
	locs := make([]store.Location, len(rkeys))
	codes := make([]store.Code, len(rkeys))
	rerrs := make([]error, len(rkeys))
	if err := ss.Reserve(rkeys, sizes, locs, codes, rerrs); err != nil {
		for _, w := range rw {
			w.last = err
		}
		return
	}
	var spans []Span
	var mk [][]byte
	var mw []*want
	for j, code := range codes {
		switch {
		case code == store.OK:
			spans = append(spans, Span{Local: locs[j].Offset, Remote: remote[j], Length: sizes[j]})
			mk = append(mk, rkeys[j])
			mw = append(mw, rw[j])
		case errors.Is(rerrs[j], store.ErrExists), errors.Is(rerrs[j], store.ErrBusy):
			rw[j].last = nil // stored here meanwhile (or being put): the local answer stands
		default:
			rw[j].last = rerrs[j]
		}
	}
	if len(spans) == 0 {
		return
	}
	sums, rerrs := c.readChecked(id, epoch, spans, deadline)
	var ck [][]byte
	var cw []*want
	var crcs []uint32
	for j, sp := range spans {
		w := mw[j]
		if rerrs[j] != nil {
			w.last = fmt.Errorf("reading from %s: %w", id, rerrs[j])
			continue // ss.Close gives the reservation back
		}
		if got, want := sums[j], w.cands[w.next].CRC; got != want {
			c.c.crcMismatch.Add(1)
			w.last = fmt.Errorf("%w: value from %s has crc32c %#x, its home said %#x (span %+v, first %x)", ErrHolderFailed, id, got, want, sp, c.cfg.Pool[sp.Local:sp.Local+min(sp.Length, 8)])
			continue
		}
		c.c.remoteBytes.Add(sp.Length)
		c.byPeer.add(id, sp.Length)
		ck = append(ck, mk[j])
		cw = append(cw, w)
		crcs = append(crcs, w.cands[w.next].CRC)
	}
	if len(ck) == 0 {
		return
	}
	ccodes := make([]store.Code, len(ck))
	cerrs := make([]error, len(ck))
	// Checked above: the commit does not read the bytes again.
	if err := ss.CommitChecked(ck, crcs, ccodes, cerrs); err != nil {
		for _, w := range cw {
			w.last = err
		}
		return
	}
	for j, w := range cw {
		w.last = cerrs[j]
		if ccodes[j] == store.OK {
			w.last = nil
		}
	}
}

// readParts bounds the parts a holder's read is split into, and
// readPartMin is the least a part moves.
const (
	readParts   = 4
	readPartMin = 4 << 20
)

// readChecked reads spans from holder id into this daemon's pool and
// takes each value's crc32c: sums[j] is span j's, or errs[j] why it was
// not read. A large read is split in parts moved at once, each checked as
// soon as it has landed, so that the checksums of the first parts are
// taken while the last ones are still on the wire.
func (c *Cluster) readChecked(id string, epoch uint64, spans []Span, deadline time.Time) (sums []uint32, errs []error) {
	sums = make([]uint32, len(spans))
	errs = make([]error, len(spans))
	total := uint64(0)
	for _, sp := range spans {
		total += sp.Length
	}
	parts := int(min(uint64(readParts), max(total/readPartMin, 1)))
	parts = min(parts, len(spans))
	per := (total + uint64(parts) - 1) / uint64(parts)
	var wg sync.WaitGroup
	start := 0
	for start < len(spans) {
		end, size := start, uint64(0)
		for end < len(spans) && (end == start || size+spans[end].Length <= per) {
			size += spans[end].Length
			end++
		}
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			if err := c.mover.Read(id, epoch, spans[lo:hi], deadline); err != nil {
				for j := lo; j < hi; j++ {
					errs[j] = err
				}
				return
			}
			for j := lo; j < hi; j++ {
				sp := spans[j]
				sums[j] = store.CRC(c.cfg.Pool[sp.Local : sp.Local+sp.Length])
			}
		}(start, end)
		start = end
	}
	wg.Wait()
	return sums, errs
}

// logFailed says (at most once a second) that a remote read failed on
// every holder, and why the last one did.
func (c *Cluster) logFailed(key []byte, err error) {
	now := time.Now().UnixNano()
	last := c.lastFailLog.Load()
	if now-last < int64(time.Second) || !c.lastFailLog.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("a remote read failed on every holder", "key", string(key), "err", err,
		"failed_total", c.c.remoteFailed.Load())
}
