package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/internal/keyblock"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// The reader's side: lookups at the homes, fetches from the holders,
// Present and Removed.

// cacheUse is how lookupAll uses the cache of the homes' answers.
type cacheUse uint8

const (
	// cacheNone: the homes are asked and their answers not kept (Locate:
	// it shows what the home says, and leaves the reads as they were: a
	// read whose holders come from the cache takes no claim at a home).
	cacheNone cacheUse = iota
	// cacheFill: the homes are asked and their answers kept.
	cacheFill
	// cacheRead: a fresh cached answer stands for the home's; the homes'
	// answers are kept.
	cacheRead
)

// lookupAll asks the homes of the keys not skipped about them, every home
// at once, by deadline; as[i] or errs[i] is key i's answer. With
// cacheRead, a fresh cached answer stands for the home's (cached[i] says
// so). With claim, the homes are asked for claims (claim.go) on reads
// ending by deadline; homes[i] is the home that answered key i.
func (c *Cluster) lookupAll(keys [][]byte, skip []bool, deadline time.Time, cache cacheUse, claim bool) (as []lookupAnswer, errs []error, cached []bool, homes []string) {
	as = make([]lookupAnswer, len(keys))
	errs = make([]error, len(keys))
	cached = make([]bool, len(keys))
	homes = make([]string, len(keys))
	now := time.Now()
	var pos []int
	for i, k := range keys {
		if skip != nil && skip[i] {
			continue
		}
		if cache == cacheRead {
			if hs, ok := c.answers.get(k, now); ok {
				as[i].holders, cached[i] = hs, true
				c.c.cacheHits.Add(1)
				continue
			}
		}
		pos = append(pos, i)
	}
	if len(pos) == 0 {
		return as, errs, cached, homes
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
			homes[p] = home
			if got[j].code == codeNotHome {
				errs[p] = fmt.Errorf("%w: %s", ErrNotHome, home)
				continue
			}
			as[p] = got[j]
			if cache != cacheNone && home != c.self && got[j].code == codeOK {
				c.answers.put(keys[p], got[j].holders, now)
			}
		}
	}
	m := homeMsg{
		kind:  kindLookup,
		per:   claimAnswerBytes,
		build: func(ps []int) []byte { return encodeKeys(part(ps)) },
		local: func(ps []int) { take(ps, c.self, c.lookupHere(part(ps))) },
		got: func(ps []int, home string, body []byte, err error) {
			c.c.lookups.Add(uint64(len(ps)))
			var got []lookupAnswer
			if err == nil {
				if claim {
					got, err = decodeClaimAnswer(body, len(ps))
				} else {
					got, err = decodeLookupAnswer(body, len(ps))
				}
			}
			if err != nil {
				c.c.lookupFailed.Add(uint64(len(ps)))
				if !errors.Is(err, ErrStaleGeneration) {
					err = fmt.Errorf("%w: %s: %w", ErrHomeUnreachable, home, err)
				}
				for _, p := range ps {
					homes[p] = home
					errs[p] = err
				}
				return
			}
			take(ps, home, got)
		},
	}
	if claim {
		// A lookup that takes claims on reads ending by deadline
		// (claim.go).
		m.kind = kindClaim
		m.build = func(ps []int) []byte {
			ttl := max(time.Until(deadline), time.Millisecond)
			return encodeHold(uint32(ttl.Milliseconds())+1, part(ps))
		}
		m.local = func(ps []int) { take(ps, c.self, c.claimHere(c.self, c.peers.Epoch(), part(ps), deadline)) }
	}
	local := m.local
	m.local = func(ps []int) {
		c.c.lookupsOwn.Add(uint64(len(ps)))
		local(ps)
	}
	c.toHomes(keys, pos, m, deadline)
	return as, errs, cached, homes
}

// Present sets found[i] for each key not found yet that another daemon
// holds, as its home says (store.Remote).
func (c *Cluster) Present(keys [][]byte, found []bool) {
	as, _, _, _ := c.lookupAll(keys, found, time.Now().Add(c.cfg.Timeout), cacheRead, false)
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

// track counts one more goroutine that Close waits for (fetchWG), unless
// Close has begun: false then, and nothing is counted.
func (c *Cluster) track() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.fetchWG.Add(1)
	return true
}

// PresentAsync is Present on a goroutine of its own (store.RemotePresence),
// ending by Config.Timeout; when closing, done runs at once with nothing
// found.
func (c *Cluster) PresentAsync(keys [][]byte, found []bool, done func()) {
	if !c.track() {
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
	as, errs, _, _ := c.lookupAll([][]byte{key}, nil, time.Now().Add(c.cfg.Timeout), cacheRead, false)
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
// key whose home did not take the removal gets errs[i] (its other copies
// may remain: the caller must not take it for removed everywhere).
func (c *Cluster) Removed(keys [][]byte, errs []error) {
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
		local: func(ps []int) {
			notHome, kept := c.removeHere(c.self, part(ps))
			for _, j := range notHome {
				errs[ps[j]] = fmt.Errorf("%w: %s (this daemon's view of the members is changing; copies on other hosts may remain)",
					ErrNotHome, c.self)
			}
			for _, j := range kept {
				errs[ps[j]] = keptErr(c.self)
			}
		},
		got: func(ps []int, home string, body []byte, err error) {
			var refused, kept []int
			if err == nil {
				// The positions of the keys it is not home of, and of
				// those a holder kept.
				refused, kept, err = decodeRemoveAnswer(body, len(ps))
			}
			if err == nil {
				for _, j := range refused {
					errs[ps[j]] = fmt.Errorf("%w: %s did not take the removal (copies on other hosts may remain)", ErrNotHome, home)
				}
				for _, j := range kept {
					errs[ps[j]] = keptErr(home)
				}
				return
			}
			c.log.Info("a home did not take a removal: the remove answers it, other copies may stay",
				"home", home, "keys", len(ps), "err", err)
			if !errors.Is(err, ErrStaleGeneration) {
				err = fmt.Errorf("%w: %s did not take the removal (copies on other hosts may remain): %w", ErrHomeUnreachable, home, err)
			}
			for _, p := range ps {
				errs[p] = err
			}
		},
	}, time.Now().Add(c.cfg.Timeout))
}

// keptErr is the error of a key whose home took its removal while a
// member kept the copy it holds, or may hold (ErrCopyKept): a holder the
// home's index names is asked again in rounds; a member asked only
// because the index, being rebuilt, may lack its copy is not (no
// tombstone: its value is unknown), and the remove sent again asks it.
func keptErr(home string) error {
	return fmt.Errorf("%w: a member, busy or slow, did not drop the copy it holds or may hold; home %s asks a holder "+
		"it knows of again until it drops it, and the same remove sent again asks every one (OK once none is left)",
		ErrCopyKept, home)
}

// Fetch brings keys from their holders into this daemon's store
// (store.Remote): the keys it can read in one round trip are asked from
// the caller's goroutine (quick.go), the others on a goroutine of its own;
// at most MaxFetches calls at once (past that each key gets ErrBusy), each
// ending by Config.Timeout. A key another fetch is bringing already joins
// that one and gets its answer, so that readers of one hot key fetch it
// once.
func (c *Cluster) Fetch(keys [][]byte, done func(i int, err error)) {
	var own [][]byte
	var pos []int
	// The keys' names in flying, made at once; a name stays there until
	// its key's fetch finishes, which is within this call's life.
	names := keyblock.Strings(keys)
	c.flyMu.Lock()
	for i, k := range keys {
		if ws, ok := c.flying[names[i]]; ok {
			c.flying[names[i]] = append(ws, func(err error) { done(i, err) })
			continue
		}
		c.flying[names[i]] = nil
		own, pos = append(own, k), append(pos, i)
	}
	c.flyMu.Unlock()
	if len(own) == 0 {
		return
	}
	// admitted[j]: own key j holds a place of the mode's remote gets in
	// flight, given back when it finishes.
	var admitted []bool
	finish := func(j int, err error) {
		if admitted != nil && admitted[j] {
			admitted[j] = false
			c.cfg.Admission.EndRemoteGets(1)
		}
		k := names[pos[j]]
		c.flyMu.Lock()
		joined := c.flying[k]
		delete(c.flying, k)
		c.flyMu.Unlock()
		done(pos[j], err)
		for _, w := range joined {
			w(err)
		}
		// The announcement of the copy fetched here goes after the
		// answer, not before it (Stored queued it without a kick).
		c.kickAnnouncer()
	}
	if a := c.cfg.Admission; a != nil {
		// Each key is one remote get of the mode's budget; the keys over
		// it are refused (RESOURCE_EXHAUSTED), the others go on.
		n, why := a.BeginRemoteGets(len(own))
		admitted = make([]bool, len(own))
		for j := range n {
			admitted[j] = true
		}
		for j := n; j < len(own); j++ {
			c.c.overBudget.Add(1)
			finish(j, fmt.Errorf("cluster: remote get refused: %w", why))
		}
		if n == 0 {
			return
		}
		own = own[:n]
	}
	select {
	case c.fetchSem <- struct{}{}:
	default:
		for j := range own {
			finish(j, ErrBusy)
		}
		return
	}
	if !c.track() {
		<-c.fetchSem
		for j := range own {
			finish(j, ErrClosed)
		}
		return
	}
	// The keys whose home answers are cached here: one round trip each,
	// asked from this very goroutine, when the holder can be asked so
	// (quick.go).
	end := func() {
		<-c.fetchSem
		c.fetchWG.Done()
	}
	if c.quickFetch(own, finish, end) {
		return
	}
	go func() {
		defer c.fetchWG.Done()
		defer func() { <-c.fetchSem }()
		c.fetch(own, time.Now().Add(c.cfg.Timeout), finish)
	}()
}

// noteFailure records the current holder's failure (w.last).
func (w *want) noteFailure() {
	if !errors.Is(w.last, store.ErrNotFound) {
		w.failed = true
	}
}

// want is one key of a fetch: the holders to try, in order.
type want struct {
	i      int
	cands  []Holder
	next   int
	last   error
	cached bool // cands came from the cache of home answers
	// claim is the home's claim on cands[0] (0: none), released once the
	// read there is over; home is the home that gave it.
	claim uint64
	home  string
	// busy is set once a holder answered it is at its reader limit for
	// the key: when no holder gives it, the home is asked again after a
	// pause, as for a busy home answer.
	busy bool
	// failed is set once a holder failed otherwise than by no longer
	// having the value: only when none did is the key a miss.
	failed bool
	// tier is the tier a replica's copy stored here is announced at, set
	// by land: TierL2 once a durable copy was committed on L2, or a copy
	// found on L2; else 0, for TierL1.
	tier uint8
}

// errBacklogged: a fetch does not bring a copy of the value here, since the
// announcements waiting to be sent have reached Config.MaxPending (its
// own would go past the bound, and a copy its home does not know of would
// outlive the key's removal).
var errBacklogged = fmt.Errorf("%w: the announcements of this daemon's copies to their homes are backlogged", ErrBusy)

// errHolderAtLimit: a holder has as many readers of the key as it admits
// (Config.ClaimsPerKey).
var errHolderAtLimit = fmt.Errorf("%w: the holder is at its reader limit for the key", ErrBusy)

// Pauses of a reader whose key's replicas are all at their reader limit,
// before it asks the home again.
const (
	busyPauseFirst = time.Millisecond
	busyPauseMost  = 50 * time.Millisecond
)

// fetch reads keys the two-step way (a home's answer, a hold, READs), by
// deadline.
func (c *Cluster) fetch(keys [][]byte, deadline time.Time, done func(int, error)) {
	ws, busy := c.wants(keys, nil, deadline, true, done)
	pause := busyPauseFirst
	for len(ws) > 0 || len(busy) > 0 {
		if !time.Now().Before(deadline) {
			c.releaseClaims(ws)
			for _, w := range ws {
				c.c.remoteFailed.Add(1)
				done(w.i, fmt.Errorf("%w: remote read not done within %v (last: %v)", xfer.ErrTimeout, c.cfg.Timeout, w.last))
			}
			for _, i := range busy {
				c.c.remoteFailed.Add(1)
				done(i, fmt.Errorf("%w: every replica was at its reader limit until the read's deadline (%v)", ErrBusy, c.cfg.Timeout))
			}
			return
		}
		if len(ws) == 0 {
			// Only keys whose every replica is busy: ask again after a
			// pause that grows, within the deadline.
			if !c.pause(min(pause, time.Until(deadline))) {
				for _, i := range busy {
					done(i, ErrClosed)
				}
				return
			}
			pause = min(2*pause, busyPauseMost)
			ws, busy = c.wants(keys, only(len(keys), busy), deadline, false, done)
			continue
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
				c.readFrom(s.id, s.epoch, keys, g, deadline, false, true)
			}()
		}
		wg.Wait()
		// The reads at the claimed holders are over, whatever they gave.
		c.releaseClaims(ws)
		rest := ws[:0]
		var again []bool // keys whose cached holders all failed: asked of the home now
		var later []int  // keys whose holders were at their reader limit: asked again after a pause
		for _, w := range ws {
			switch {
			case w.last == nil:
				c.c.remoteHits.Add(1)
				done(w.i, nil)
			case errors.Is(w.last, errBacklogged):
				c.c.remoteFailed.Add(1)
				done(w.i, w.last)
			case w.next+1 < len(w.cands):
				w.noteFailure()
				w.next++
				rest = append(rest, w)
			case w.busy:
				// Some holder was at its reader limit: ask the home
				// again (for a claim) after a pause.
				later = append(later, w.i)
				if w.cached {
					c.answers.drop(keys[w.i : w.i+1])
				}
			case w.cached:
				if again == nil {
					again = only(len(keys), nil)
				}
				again[w.i] = false
				c.answers.drop(keys[w.i : w.i+1])
			default:
				if w.noteFailure(); !w.failed {
					// Every holder the home named no longer has it (the
					// home had not heard of their evictions yet): a miss.
					done(w.i, w.last)
					continue
				}
				c.c.remoteFailed.Add(1)
				c.logFailed(keys[w.i], w.last)
				done(w.i, fmt.Errorf("%w: %w", ErrHolderFailed, w.last))
			}
		}
		ws = rest
		if len(busy) > 0 {
			if again == nil {
				again = only(len(keys), nil)
			}
			for _, i := range busy {
				again[i] = false
			}
		}
		if again != nil {
			var more []*want
			more, busy = c.wants(keys, again, deadline, false, done)
			ws = append(ws, more...)
		}
		busy = append(busy, later...)
	}
}

// only is a skip list of n keys that skips all but those at pos.
func only(n int, pos []int) []bool {
	skip := make([]bool, n)
	for i := range skip {
		skip[i] = true
	}
	for _, i := range pos {
		skip[i] = false
	}
	return skip
}

// pause waits d, or until Close; false when Close came.
func (c *Cluster) pause(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.stop:
		return false
	case <-t.C:
		return true
	}
}

// wants looks the keys not skipped up (with cache: a fresh cached answer
// stands for the home's; else the homes hand claims) and returns what to
// read of each from whom, and the keys whose every replica is at its
// reader limit (busy: to be asked again); a key no other daemon holds, or
// whose home failed, is answered at once.
func (c *Cluster) wants(keys [][]byte, skip []bool, deadline time.Time, cache bool, done func(int, error)) (ws []*want, busy []int) {
	use := cacheFill
	if cache {
		use = cacheRead
	}
	as, errs, cached, homes := c.lookupAll(keys, skip, deadline, use, true)
	// The wants and their holders are made in one block each, not one per
	// key: the blocks are sized first, so that the pointers into them
	// stay put.
	nw, nh := 0, 0
	for i := range keys {
		if (skip == nil || !skip[i]) && errs[i] == nil && as[i].code != codeBusy {
			nw, nh = nw+1, nh+len(as[i].holders)
		}
	}
	block := make([]want, 0, nw)
	cands := make([]Holder, 0, nh)
	ws = make([]*want, 0, nw)
	for i := range keys {
		if skip != nil && skip[i] {
			continue
		}
		if errs[i] != nil {
			c.c.remoteMisses.Add(1)
			done(i, errs[i])
			continue
		}
		if as[i].code == codeBusy {
			busy = append(busy, i)
			continue
		}
		from := len(cands)
		for _, h := range as[i].holders {
			if h.ID != c.self {
				cands = append(cands, h)
			}
		}
		block = append(block, want{i: i, cached: cached[i], claim: as[i].claim, home: homes[i],
			cands: cands[from:len(cands):len(cands)]})
		w := &block[len(block)-1]
		if len(w.cands) == 0 {
			c.c.remoteMisses.Add(1)
			done(i, fmt.Errorf("%w: no daemon holds it", store.ErrNotFound))
			continue
		}
		ws = append(ws, w)
	}
	return ws, busy
}

// readFrom reads the keys of g from holder id (at epoch) into this
// daemon's store; each want's last is nil when its key is stored here
// now, else why not. fetched says the values are a reader's copies of
// remote hits (announced as such), not replicas a putter asked for.
func (c *Cluster) readFrom(id string, epoch uint64, keys [][]byte, g []*want, deadline time.Time, durable, fetched bool) {
	fail := func(ws []*want, err error) {
		for _, w := range ws {
			w.last = err
		}
	}
	for len(g) > 0 {
		// A part is what one session here reserves at once (land): at
		// most a message's keys, and no more bytes than a session may
		// hold reserved, or the values past that bound would fail.
		n, resv := 0, uint64(0)
		for n < min(len(g), maxMsgKeys) {
			b, limit := c.st.ReserveBytes(g[n].cands[g[n].next].Size)
			if n > 0 && resv+b > limit {
				break
			}
			resv += b
			n++
		}
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
			// An answer whose claim decoded but not the rest: the hold
			// is released all the same, not left pinning until its ttl.
			c.releaseHold(id, epoch, claim)
			continue
		}
		c.land(id, epoch, ks, part, hs, deadline, durable, fetched)
		c.releaseHold(id, epoch, claim)
	}
}

// releaseHold releases hold claim (0: none) at holder id, on a goroutine
// of its own that Close waits for; once closing it is left to expire.
func (c *Cluster) releaseHold(id string, epoch uint64, claim uint64) {
	if claim == 0 || !c.track() {
		return // closing: the hold ends at its deadline
	}
	go func() {
		defer c.fetchWG.Done()
		if _, err := c.peers.ExchangeAt(id, epoch, kindRelease, encodeClaim(claim), c.cfg.Timeout); err != nil {
			c.log.Debug("releasing a claim failed (it expires by itself)", "holder", id, "err", err)
		}
	}()
}

// land moves the values a holder pinned (hs) into blocks reserved here,
// checks them and commits them (with durable, to L2 before they count).
// They are copies of another daemon's values: committing them makes no
// further copies.
func (c *Cluster) land(id string, epoch uint64, ks [][]byte, ws []*want, hs []held, deadline time.Time, durable, fetched bool) {
	// Each list is made at its most at once (one allocation, not one per
	// doubling).
	rkeys := make([][]byte, 0, len(hs))
	rw := make([]*want, 0, len(hs))
	sizes := make([]uint64, 0, len(hs))
	remote := make([]uint64, 0, len(hs))
	for j, h := range hs {
		w := ws[j]
		want := w.cands[w.next]
		switch {
		case store.Code(h.code) == store.NotFound:
			w.last = fmt.Errorf("%w: holder %s no longer has it", store.ErrNotFound, id)
		case store.Code(h.code) == store.Busy:
			w.last = fmt.Errorf("%w: holder %s", errHolderAtLimit, id)
			w.busy = true
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
	if fetched && c.backlogged() {
		// Its announcement would find the queue full: not kept here.
		for _, w := range rw {
			w.last = errBacklogged
		}
		return
	}
	ss := c.st.NewSession()
	var unsettled []<-chan struct{}
	defer func() {
		if len(unsettled) > 0 {
			c.closeWhenSettled(ss, unsettled, id)
			return
		}
		ss.Close()
	}()
	_ = ss.SetReplicas(1) // 1 is in range
	locs := make([]store.Location, len(rkeys))
	codes := make([]store.Code, len(rkeys))
	rerrs := make([]error, len(rkeys))
	if err := c.inCalls(len(rkeys), func(lo, hi int) error {
		return ss.Reserve(rkeys[lo:hi], sizes[lo:hi], locs[lo:hi], codes[lo:hi], rerrs[lo:hi])
	}); err != nil {
		// The reservations made go back with the session.
		for _, w := range rw {
			w.last = err
		}
		return
	}
	spans := make([]Span, 0, len(codes))
	mk := make([][]byte, 0, len(codes))
	mw := make([]*want, 0, len(codes))
	for j, code := range codes {
		switch {
		case code == store.OK:
			spans = append(spans, Span{Local: locs[j].Offset, Remote: remote[j], Length: sizes[j]})
			mk = append(mk, rkeys[j])
			mw = append(mw, rw[j])
		case fetched && (errors.Is(rerrs[j], store.ErrExists) || errors.Is(rerrs[j], store.ErrBusy)):
			rw[j].last = nil // stored here meanwhile (or being put): the local answer stands
		case errors.Is(rerrs[j], store.ErrExists):
			rw[j].last = c.sameHere(rkeys[j], rw[j], durable)
		case errors.Is(rerrs[j], store.ErrBusy):
			// A replica's put that may yet abort: nothing here to vouch for.
			rw[j].last = fmt.Errorf("a put of the key is in flight here: %w", rerrs[j])
		default:
			rw[j].last = rerrs[j]
		}
	}
	if len(spans) == 0 {
		return
	}
	var sums []uint32
	sums, rerrs, unsettled = c.readChecked(id, epoch, spans, deadline)
	ck := make([][]byte, 0, len(spans))
	cw := make([]*want, 0, len(spans))
	crcs := make([]uint32, 0, len(spans))
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
	// Checked above: the commit does not read the bytes again. A fetched
	// copy is unseen here until its home takes its announcement (confirm).
	_ = c.inCalls(len(ck), func(lo, hi int) error {
		var err error
		if fetched {
			err = ss.CommitFetched(ck[lo:hi], crcs[lo:hi], ccodes[lo:hi], cerrs[lo:hi])
		} else {
			err = ss.CommitChecked(ck[lo:hi], durable, crcs[lo:hi], ccodes[lo:hi], cerrs[lo:hi])
		}
		for j := lo; err != nil && j < hi; j++ {
			ccodes[j], cerrs[j] = store.Internal, err
		}
		return nil // each part's keys have their own outcome
	})
	for j, w := range cw {
		w.last = cerrs[j]
		if ccodes[j] == store.OK {
			w.last = nil
			if durable {
				w.tier = TierL2
			}
		}
	}
}

// inCalls has do make a store call for each part [lo, hi) of n keys, in
// order, each part at most the keys one store call takes
// (Store.MaxKeysPerCall, which may be fewer than a peer's message
// carries); the first error ends it.
func (c *Cluster) inCalls(n int, do func(lo, hi int) error) error {
	per := max(c.st.MaxKeysPerCall(), 1)
	for lo := 0; lo < n; lo += per {
		if err := do(lo, min(lo+per, n)); err != nil {
			return err
		}
	}
	return nil
}

// errNotOnL2: a durable replicate found the key already stored here, but
// only in memory, and a durable copy counts only on L2.
var errNotOnL2 = xfer.Categorized(xfer.ErrPrecondition, "cluster: the key is stored here, but not on L2")

// sameHere says whether the value a replicate asked for (w's holder) and
// found already stored here (key's Reserve answered it exists) stands for
// the copy asked: only when it is the same value (size and crc32c) and,
// for a durable replicate, on L2. Else it says why not. A copy that stands
// has w.tier set to the tier it is announced at: L2 when it is there,
// durable asked or not, as this daemon's own announcement of it said.
func (c *Cluster) sameHere(key []byte, w *want, durable bool) error {
	size, crc, onL2, err := c.st.CopyHere(key)
	asked := w.cands[w.next]
	switch {
	case err != nil:
		return fmt.Errorf("the key was stored here, and is not now: %w", err)
	case size != asked.Size || crc != asked.CRC:
		return fmt.Errorf("%w: another value of it is here (%d bytes, crc32c %#x; %d bytes, %#x asked)", store.ErrExists, size, crc, asked.Size, asked.CRC)
	case durable && !onL2:
		return errNotOnL2
	}
	if onL2 {
		w.tier = TierL2
	}
	return nil
}

// readParts bounds the parts a holder's read is split into, and
// readPartMin is the least a part moves.
const (
	readParts   = 4
	readPartMin = 4 << 20
)

// readChecked reads spans from holder id into this daemon's pool and
// takes each value's crc32c: sums[j] is span j's, or errs[j] why it was
// not read. A span the transport summed as its bytes landed (tcp) is not
// read again; the others are. A large read is split in parts moved at
// once, each checked as soon as it has landed, so that the checksums of the first parts are
// taken while the last ones are still on the wire. unsettled are the
// failed parts' Mover.Read channels: until each closes, a transfer may
// still write into the blocks its spans name.
func (c *Cluster) readChecked(id string, epoch uint64, spans []Span, deadline time.Time) (sums []uint32, errs []error, unsettled []<-chan struct{}) {
	sums = make([]uint32, len(spans))
	errs = make([]error, len(spans))
	var mu sync.Mutex // unsettled, with parts at once
	total := uint64(0)
	for _, sp := range spans {
		total += sp.Length
	}
	parts := int(min(uint64(readParts), max(total/readPartMin, 1)))
	parts = min(parts, len(spans))
	part := func(lo, hi int) {
		settled, err := c.mover.Read(id, epoch, spans[lo:hi], deadline)
		if err != nil {
			for j := lo; j < hi; j++ {
				errs[j] = err
			}
			if settled != nil {
				mu.Lock()
				unsettled = append(unsettled, settled)
				mu.Unlock()
			}
			return
		}
		for j := lo; j < hi; j++ {
			sp := spans[j]
			if sp.Sum.Taken {
				sums[j] = sp.Sum.CRC // taken as the bytes landed
				c.c.crcLanded.Add(1)
				continue
			}
			sums[j] = store.CRC(c.cfg.Pool[sp.Local : sp.Local+sp.Length])
		}
	}
	if parts == 1 {
		// A small read: on this goroutine, not handed to another one and
		// waited for (each hand-off is a wake-up on a read's critical path).
		part(0, len(spans))
		return sums, errs, unsettled
	}
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
			part(lo, hi)
		}(start, end)
		start = end
	}
	wg.Wait()
	return sums, errs, unsettled
}

// settleWarn is how long a failed read's blocks wait for its transfers
// before the log says so (they go on waiting).
const settleWarn = 5 * time.Second

// closeWhenSettled closes ss (giving back the blocks it reserved and did
// not commit) once every channel of unsettled has closed: no transfer of
// a failed read from holder can land in them any more. The reader's
// answer does not wait for it. When the cluster closes first, the blocks
// go back then: the daemon is stopping (Close waits for this too).
func (c *Cluster) closeWhenSettled(ss *store.Session, unsettled []<-chan struct{}, holder string) {
	// A replica's read runs in an exchange handler, which no fetch count
	// covers: once Close has begun, the blocks go back now.
	if !c.track() {
		ss.Close()
		return
	}
	c.c.unsettled.Add(1)
	go func() {
		defer c.fetchWG.Done()
		defer c.c.unsettled.Add(-1)
		defer ss.Close() // first: the count falls once the blocks are back
		warn := time.NewTimer(settleWarn)
		defer warn.Stop()
		for _, ch := range unsettled {
			for waiting := true; waiting; {
				select {
				case <-ch:
					waiting = false
				case <-c.stop:
					return
				case <-warn.C:
					c.log.Warn("a failed read still has transfers in flight; the blocks they land in stay reserved until they end",
						"holder", holder, "waited", settleWarn)
				}
			}
		}
	}()
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
