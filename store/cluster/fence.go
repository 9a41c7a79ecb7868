package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Fencing. Every message to a home (announce, lookup, remove) carries,
// for each shard of its keys, the generation of the shard's home it was
// sent for; a home that does not hold that generation refuses the whole
// message (fenceStale, with the generations it knows) and obeys none of
// it. The sender refreshes what it knows of those shards and sends their
// keys once more, to the homes they have now; a second refusal is
// ErrStaleGeneration.
//
// With directory = etcd (Config.Fence) a generation is a claim in etcd: a
// home claims its shards (the claimer) by a transaction that succeeds only
// for the generation it expects, under its member lease, and holds a
// shard from the claim's revision until the directory's watch shows
// another claim, or until its view of etcd is older than the staleness
// budget (then it refuses everything: fail closed). Homes then follow the
// claims, not the rendezvous: rendezvous only says who should claim. A
// daemon takes a shard whose holder left its view; when etcd still lists
// that holder (a partition: both sides reach etcd, each view makes itself
// home), only with a majority of etcd's members in its view, and never
// back from the member that took it from this daemon, so the claim does
// not change hands every round until the partition heals. In
// steady state no request goes to etcd: the claims come with the watch
// the directory keeps anyway.
//
// Without etcd a generation is the home's run epoch, as the configured
// peers' handshakes say (a lone daemon is home of every shard, at its own
// epoch).

// Fence is the shard claims of directory = etcd.
type Fence interface {
	// Watch registers fn, called with every change of the claims (and
	// once with those known now); fn is quick and does not call into the
	// Fence.
	Watch(fn func([]ShardClaim))
	// Take claims shards for this daemon, each expected at expect[i] (0:
	// unclaimed), and returns those won. Take, Release and Refresh end
	// when ctx does (the cluster closing, or for Refresh the deadline of
	// the call it serves), and by the directory's own request timeout.
	Take(ctx context.Context, shards []int, expect []uint64) ([]ShardClaim, error)
	// Release gives up this daemon's claims of shards, each while still
	// at gens[i].
	Release(ctx context.Context, shards []int, gens []uint64) error
	// Refresh reads the claims of shards from the directory (handing
	// them to the watcher).
	Refresh(ctx context.Context, shards []int) error
	// Current reports whether this daemon's own claims hold now.
	Current() bool
}

// ShardClaim is a shard's home and generation (Home empty: unclaimed as of
// Gen).
type ShardClaim struct {
	Shard int
	Home  string
	Epoch uint64
	Gen   uint64
	// told marks a claim a peer stated (decodeShardClaims): its word, not
	// etcd's, which onShardClaims does not keep.
	told bool
}

// Fence statuses of a home's answer.
const (
	fenceOK    = 0
	fenceStale = 1
)

// homeFor is the home of shard s under v: with a fence the daemon holding
// its claim (when it is up in v), else the one rendezvous names (who is
// to claim it).
func (c *Cluster) homeFor(v *view, s int) string {
	if c.shardClaims != nil {
		if cl := c.shardClaims[s].Load(); cl != nil && cl.Home != "" && (cl.Home == c.self || v.has(cl.Home)) {
			return cl.Home
		}
	}
	return v.home(s)
}

// genFor is the generation a message to home about shard s carries.
func (c *Cluster) genFor(s int, home string) uint64 {
	if c.shardClaims == nil {
		return c.epochOf(home)
	}
	if cl := c.shardClaims[s].Load(); cl != nil && cl.Home == home {
		return cl.Gen
	}
	return 0
}

// holdsGen reports whether this daemon is home of shard s at gen now.
func (c *Cluster) holdsGen(s int, gen uint64) bool {
	if s < 0 || s >= c.cfg.Shards {
		return false
	}
	if c.shardClaims == nil {
		// The transport refuses another epoch already; 0 is a sender that
		// does not know this run's yet.
		return gen == 0 || gen == c.peers.Epoch()
	}
	cl := c.shardClaims[s].Load()
	return gen != 0 && cl != nil && cl.Home == c.self && cl.Gen == gen && c.cfg.Fence.Current()
}

// heldGen is the generation this daemon holds shard s at (0: none).
func (c *Cluster) heldGen(s int) uint64 {
	if c.shardClaims == nil {
		if c.view.Load().home(s) == c.self {
			return c.peers.Epoch()
		}
		return 0
	}
	if cl := c.shardClaims[s].Load(); cl != nil && cl.Home == c.self && c.cfg.Fence.Current() {
		return cl.Gen
	}
	return 0
}

// shardGen is one shard and a generation, as a fence header carries it.
type shardGen struct {
	shard int
	gen   uint64
}

// fenceBytes bounds a fence header: one entry per key at most.
const fenceBytes = 2 + maxMsgKeys*12

// encodeFenced wraps body (a message) for home with the generations of
// its keys' shards.
func (c *Cluster) encodeFenced(home string, keys [][]byte, pos []int, body []byte) ([]byte, []shardGen) {
	var sgs []shardGen
	for _, p := range pos {
		s := c.shardOf(keys[p])
		if !slices.ContainsFunc(sgs, func(x shardGen) bool { return x.shard == s }) {
			sgs = append(sgs, shardGen{s, c.genFor(s, home)})
		}
	}
	e := newEnc()
	e.u16(uint16(len(sgs)))
	for _, x := range sgs {
		e.u32(uint32(x.shard))
		e.u64(x.gen)
	}
	e.b = append(e.b, body...)
	return e.bytes(), sgs
}

// fenced is a home's check of a fenced message: the body to obey, or the
// answer refusing it (the generations this daemon holds of the shards it
// does not hold at the generation asked).
func (c *Cluster) fenced(req []byte) (body, refusal []byte, err error) {
	d := newDec(req)
	n := int(d.u16())
	if d.err == nil && n > maxMsgKeys {
		d.fail("%d shards in a fence (at most %d)", n, maxMsgKeys)
	}
	var stale []shardGen
	for i := 0; i < n && d.err == nil; i++ {
		s, gen := d.u32(), d.u64()
		// A shard past this daemon's count is a sender with another
		// store_shards (or a broken one): nothing it asks of the home
		// can be right.
		if d.err == nil && int64(s) >= int64(c.cfg.Shards) {
			d.fail("shard %d in a fence (%d shards here)", s, c.cfg.Shards)
		}
		if d.err == nil && !c.holdsGen(int(s), gen) {
			stale = append(stale, shardGen{int(s), c.heldGen(int(s))})
		}
	}
	if d.err != nil {
		return nil, nil, d.err
	}
	if len(stale) > 0 {
		c.c.staleRefused.Add(1)
		e := newEnc()
		e.u8(fenceStale)
		e.u16(uint16(len(stale)))
		for _, x := range stale {
			e.u32(uint32(x.shard))
			e.u64(x.gen)
		}
		return nil, e.bytes(), nil
	}
	return d.b, nil, nil
}

// answerFenced wraps a home's answer to an obeyed message.
func answerFenced(body []byte) []byte {
	return append([]byte{msgVersion, fenceOK}, body...)
}

// onFenced makes h a home's handler of fenced messages.
func (c *Cluster) onFenced(h func(from string, epoch uint64, body []byte) ([]byte, error)) func(string, uint64, []byte) ([]byte, error) {
	return func(from string, epoch uint64, req []byte) ([]byte, error) {
		body, refusal, err := c.fenced(req)
		switch {
		case err != nil:
			return nil, err
		case refusal != nil:
			return refusal, nil
		}
		resp, err := h(from, epoch, body)
		if err != nil {
			return nil, err
		}
		return answerFenced(resp), nil
	}
}

// unwrapAnswer is the body of a home's answer, or the shards it refused
// (stale: the generations it holds of them).
func unwrapAnswer(resp []byte) (body []byte, stale []shardGen, err error) {
	d := newDec(resp)
	switch st := d.u8(); {
	case d.err != nil:
		return nil, nil, d.err
	case st == fenceOK:
		return d.b, nil, nil
	case st != fenceStale:
		return nil, nil, fmt.Errorf("%w: fence status %d", ErrMessage, st)
	}
	n := int(d.u16())
	if d.err == nil && n > maxMsgKeys {
		d.fail("%d stale shards", n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		stale = append(stale, shardGen{int(d.u32()), d.u64()})
	}
	if err := d.end(); err != nil {
		return nil, nil, err
	}
	if len(stale) == 0 {
		return nil, nil, fmt.Errorf("%w: a stale answer naming no shard", ErrMessage)
	}
	return nil, stale, nil
}

// homeMsg is one kind of message to homes: how it is built from the
// positions of keys it carries, answered here when this daemon is the
// home, and taken in once a home answered (or failed: err).
type homeMsg struct {
	kind string
	// older, when set, is the kind an older release knows in kind's
	// place: a home that serves no kind is sent that one (members.go).
	older string
	// per is what one key costs in the message beyond its bytes.
	per   int
	build func(pos []int) []byte
	local func(pos []int)
	got   func(pos []int, home string, body []byte, err error)
}

// toHomes sends the keys at pos to their homes, every home in parallel
// (each in messages of at most maxMsgKeys keys), fenced; a message a home
// refused for a stale generation is sent once more, after a refresh of
// what this daemon knows of the shards, to the homes they have then. It
// returns when every key is answered.
func (c *Cluster) toHomes(keys [][]byte, pos []int, m homeMsg, deadline time.Time) {
	c.toHomesOnce(keys, pos, m, deadline, true)
}

func (c *Cluster) toHomesOnce(keys [][]byte, pos []int, m homeMsg, deadline time.Time, retry bool) {
	v := c.view.Load()
	by := map[string][]int{}
	for _, p := range pos {
		h := c.homeFor(v, c.shardOf(keys[p]))
		by[h] = append(by[h], p)
	}
	lookup := m.kind == kindLookup || m.kind == kindClaim
	if lookup && retry {
		c.route.keys.Add(uint64(len(pos)))
	}
	var wg sync.WaitGroup
	for home, ps := range by {
		if home == c.self {
			continue // after the others are on their way: it may take a while itself
		}
		for _, ch := range chunks(keys, ps, m.per) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, sent := c.encodeFenced(home, keys, ch, m.build(ch))
				resp, err := c.homeExchange(home, m, req, deadline)
				var body []byte
				var stale []shardGen
				if err == nil {
					body, stale, err = unwrapAnswer(resp)
				}
				if err != nil {
					if lookup && c.peers.Unreachable(err) {
						c.route.unreachable.Add(uint64(len(ch)))
					}
					m.got(ch, home, nil, err)
					return
				}
				if stale == nil {
					m.got(ch, home, body, nil)
					return
				}
				c.c.staleAnswers.Add(1)
				if lookup {
					c.route.refused.Add(uint64(len(ch)))
				}
				if !retry {
					m.got(ch, home, nil, fmt.Errorf("%w: %s, shards %v, after a refresh", ErrStaleGeneration, home, stale))
					return
				}
				// The keys of the shards refused go again once what is
				// known of them is refreshed (or fail when nothing newer
				// can be known); those of the others in the message go
				// again as they are.
				bad := map[int]bool{}
				for _, x := range stale {
					bad[x.shard] = true
				}
				read, rerr := c.refresh(home, stale, sent, deadline)
				if lookup && read > 0 {
					// Only a lookup's: the route counters are of the
					// keys looked up, not of announcements and holds.
					c.route.storeReads.Add(uint64(read))
					c.route.storeRequests.Add(1)
				}
				var again, failed []int
				for _, p := range ch {
					if rerr != nil && bad[c.shardOf(keys[p])] {
						failed = append(failed, p)
					} else {
						again = append(again, p)
					}
				}
				if len(failed) > 0 {
					m.got(failed, home, nil, rerr)
				}
				if len(again) > 0 {
					c.toHomesOnce(keys, again, m, deadline, false)
				}
			}()
		}
	}
	for _, ch := range chunks(keys, by[c.self], m.per) {
		m.local(ch)
	}
	wg.Wait()
}

// homeExchange sends req (m's message) to home; to a home of an older
// release (members.go, exchangeNewer) as the kind it knows.
func (c *Cluster) homeExchange(home string, m homeMsg, req []byte, deadline time.Time) ([]byte, error) {
	epoch := c.epochOf(home)
	if m.older == "" {
		return c.exchangeBy(home, epoch, m.kind, req, deadline)
	}
	resp, _, err := c.exchangeNewer(home, epoch, m.kind, req, m.older, func() []byte { return req }, deadline)
	return resp, err
}

// refresh brings up to date what this daemon knows of shards a home
// refused as stale. Without a fence there is nothing to read: the view is
// what the members say. With one, the claims of the shards whose home
// answered other than this daemon knows are read from etcd (one request):
// a home that says it holds a newer generation (it took the shard, and the
// watch has not brought that here yet), or one this daemon believed home
// that now holds none. A home's word is never kept as a claim: a
// generation is what etcd says, and one etcd never gave (a broken or
// hostile home's) would make every claim etcd gives later look older, and
// keep the shard where the word says until this daemon restarts. An
// unclaimed shard is left to its claim. The read ends by deadline, the
// call's: an etcd that answers slowly makes the keys of those shards fail
// in time, not the call late. It returns how many shards it read.
func (c *Cluster) refresh(home string, stale, sent []shardGen, deadline time.Time) (int, error) {
	c.log.Debug("a home refused a stale generation", "home", home, "stale", stale, "sent", sent)
	if c.cfg.Fence == nil {
		return 0, nil
	}
	var read []int
	for _, x := range stale {
		// Only the shards the message carried: what the home says of
		// others (of a shard past this daemon's count, too) answers
		// nothing this daemon asked.
		if !slices.ContainsFunc(sent, func(y shardGen) bool { return y.shard == x.shard }) || slices.Contains(read, x.shard) {
			continue
		}
		known := c.shardClaims[x.shard].Load()
		if x.gen != 0 && (known == nil || x.gen > known.Gen) || x.gen == 0 && known != nil && known.Home == home {
			read = append(read, x.shard)
		}
	}
	if len(read) == 0 {
		return 0, fmt.Errorf("%w: %s is not home of shards %v, and no other home has claimed them yet", ErrStaleGeneration, home, stale)
	}
	ctx, cancel := context.WithDeadline(c.life, deadline)
	defer cancel()
	if err := c.cfg.Fence.Refresh(ctx, read); err != nil {
		return len(read), fmt.Errorf("%w: %s refused a stale generation and the claims could not be read again: %w", ErrStaleGeneration, home, err)
	}
	return len(read), nil
}

// onShardClaims takes in changes of the claims (the Fence's watcher): a
// shard this daemon lost is forgotten, the keys held here of a shard that
// moved go to its new home, and the claimer looks again when a claim
// changed. A claim a peer told of is not taken: the watch brings etcd's
// (see refresh), and a peer's word neither wakes the claimer nor changes
// anything here.
func (c *Cluster) onShardClaims(cs []ShardClaim) {
	var lost []int
	lostTo := map[int]string{}
	moved := map[int]bool{}
	changed := false
	for _, n := range cs {
		if n.told || n.Shard < 0 || n.Shard >= c.cfg.Shards {
			continue
		}
		p := &c.shardClaims[n.Shard]
		cl := n
		var old *ShardClaim
		stored := false
		for {
			// The watch, this daemon's own claims and the claims peers
			// tell of come on different goroutines: a generation never
			// goes back.
			old = p.Load()
			if old != nil && old.Gen > n.Gen {
				break
			}
			if n.Home == c.self && (old == nil || old.Home != c.self) {
				// Gained: what the index has of the shard is from a time
				// this daemon was home without a claim (its own copies,
				// announced here while the claim's home was out of its
				// view), stale now; its holders re-announce it (moved).
				// Before the claim is stored, so that no announcement
				// fenced at the new generation is lost.
				c.idx.clearShard(n.Shard)
				c.gainShards(n.Shard)
			}
			if old == nil || old.Home != n.Home {
				c.homeMoves[n.Shard].Add(1) // before the claim is seen (walk.go)
			}
			if p.CompareAndSwap(old, &cl) {
				stored = true
				break
			}
		}
		if !stored {
			continue
		}
		// The same claim again (a read of claims that found them as they
		// were) is no change: waking the claimer for it would have a
		// round whose read found nothing new wake the next at once.
		changed = changed || old == nil || *old != n
		oldHome := ""
		if old != nil {
			oldHome = old.Home
		}
		if oldHome == c.self && n.Home != c.self {
			lost = append(lost, n.Shard)
			c.idx.clearShard(n.Shard)
		}
		c.takenMu.Lock()
		if oldHome == c.self && n.Home != c.self && n.Home != "" {
			c.takenBy[n.Shard] = n
		} else if n.Home == c.self {
			delete(c.takenBy, n.Shard)
		}
		c.takenMu.Unlock()
		if n.Home != "" && n.Home != c.self {
			// Its tombstones here (if it was home of the shard before,
			// perhaps through an unclaimed generation) go to its home.
			lostTo[n.Shard] = n.Home
		}
		if n.Home != "" && (n.Home != oldHome || old.Gen != n.Gen) {
			moved[n.Shard] = true
		}
	}
	if len(lost) > 0 {
		c.log.Info("shards claimed by another home: this daemon is no longer their home", "shards", len(lost))
	}
	if len(lostTo) > 0 {
		c.handTombs(func(s int) (string, bool) { h, ok := lostTo[s]; return h, ok })
	}
	if len(moved) > 0 {
		c.reannounce(func(s int, _ string) bool { return moved[s] })
	}
	if !changed {
		return
	}
	select {
	case c.ckick <- struct{}{}:
	default:
	}
}

// claimer is the Cluster's goroutine (with a fence) that claims the
// shards rendezvous makes this daemon home of (unclaimed, or claimed by a
// member down in its view) and releases those it holds that another
// member up is to be home of; it looks when the claims or the view change
// and every ProbeEvery. Close stops it.
func (c *Cluster) claimer() {
	defer close(c.cdone)
	t := time.NewTicker(c.cfg.ProbeEvery)
	defer t.Stop()
	// soon wakes the claimer early while its claims cannot be trusted yet
	// (not registered in etcd, or its view of etcd too old): it claims as
	// soon as they can.
	soon := time.NewTimer(0)
	defer soon.Stop()
	var lastErr string
	for {
		select {
		case <-c.stop:
			return
		case <-c.ckick:
		case <-t.C:
		case <-soon.C:
		}
		if !c.cfg.Fence.Current() {
			soon.Reset(min(c.cfg.ProbeEvery, 50*time.Millisecond))
			continue
		}
		if err := c.claimRound(); err != nil {
			if err.Error() != lastErr {
				c.log.Warn("claiming shards in etcd failed: keys of the shards not held are misses meanwhile", "err", err)
			}
			lastErr = err.Error()
		} else {
			lastErr = ""
		}
	}
}

// claimRound claims and releases what the claims and the view call for.
func (c *Cluster) claimRound() error {
	f := c.cfg.Fence
	if !f.Current() {
		return nil
	}
	v := c.view.Load()
	// listed are the members etcd lists (their leases live); majority is
	// whether this daemon sees more than half of them.
	var listed map[string]bool
	majority := true
	if c.cfg.Directory != nil {
		listed = map[string]bool{c.self: true}
		for _, id := range c.cfg.Directory() {
			listed[id] = true
		}
		seen := 0
		for _, id := range v.members {
			if listed[id] {
				seen++
			}
		}
		majority = 2*seen > len(listed)
	}
	// Without a majority, this daemon cannot tell a partition around it
	// from the others' deaths: it holds only the shards etcd's list makes
	// its own, and lets go of those it took from others while it saw a
	// majority (a partition reaches the members one at a time, so its view
	// passes through one), for the majority's side to take.
	home := v.home
	if !majority {
		home = newView(slices.Collect(maps.Keys(listed)), c.cfg.Shards).home
	}
	var take, rel []int
	var exp, relGen []uint64
	left := 0
	for s := range c.shardClaims {
		cl := c.shardClaims[s].Load()
		mine := home(s) == c.self
		switch {
		case mine && (cl == nil || cl.Home == ""):
			take, exp = append(take, s), append(exp, 0)
		case mine && cl.Home != c.self && !v.has(cl.Home):
			if listed[cl.Home] && (!majority || c.tookFromHere(s, cl)) {
				// Its holder is out of this daemon's view but alive in
				// etcd: on the other side of a partition, whose view
				// may make it the shard's home just as this one's makes
				// this daemon. Taken only from a side that sees a
				// majority of etcd's members (an isolated daemon takes
				// nobody's shards), and never back from a member that
				// took it from here: else the claim would change hands
				// every round while the partition lasts. It comes back
				// when the views agree again, or when etcd drops the
				// member (its claim goes with its lease).
				left++
				continue
			}
			take, exp = append(take, s), append(exp, cl.Gen)
		case !mine && cl != nil && cl.Home == c.self:
			rel, relGen = append(rel, s), append(relGen, cl.Gen)
		}
	}
	if prev := c.leftTaken.Swap(int64(left)); prev != int64(left) && left > 0 {
		c.log.Warn("shards members out of this daemon's view took from it are left with them while etcd lists them (a partition)",
			"shards", left)
	}
	var err error
	if len(rel) > 0 {
		switch err = f.Release(c.life, rel, relGen); {
		case err != nil:
		case majority:
			c.log.Info("shards released to their new homes", "shards", len(rel))
		default:
			c.log.Warn("this daemon sees no majority of the members etcd lists: shards it took from them released",
				"shards", len(rel), "sees", len(v.members), "listed", len(listed))
		}
	}
	if len(take) == 0 {
		return err
	}
	won, terr := f.Take(c.life, take, exp)
	if len(won) > 0 {
		c.c.claimsWon.Add(uint64(len(won)))
		c.onShardClaims(won)
		c.log.Info("shards claimed", "shards", len(won), "asked", len(take), "generation", won[0].Gen)
		c.pullShardClaims(v, won)
	}
	if terr != nil {
		return terr
	}
	return err
}

// tookFromHere reports whether claim cl of shard s is the one that took s
// from this daemon.
func (c *Cluster) tookFromHere(s int, cl *ShardClaim) bool {
	c.takenMu.Lock()
	defer c.takenMu.Unlock()
	t, ok := c.takenBy[s]
	return ok && t.Home == cl.Home && t.Gen == cl.Gen
}

// pullShardClaims asks every member of v to take in the claims this daemon
// won and re-announce the keys it holds of those shards, in the
// background.
func (c *Cluster) pullShardClaims(v *view, won []ShardClaim) {
	for len(won) > 0 {
		n := min(len(won), maxMsgKeys)
		e := newEnc()
		e.u16(uint16(n))
		for _, cl := range won[:n] {
			e.u32(uint32(cl.Shard))
			e.u64(cl.Epoch)
			e.u64(cl.Gen)
		}
		c.pullWith(v, e.bytes())
		won = won[n:]
	}
}

// decodeShardClaims decodes a re-announcement request's claims (those its
// sender won), as claims of from that it told of: which shards to
// re-announce to it, not claims to keep (onShardClaims).
func decodeShardClaims(from string, b []byte) ([]ShardClaim, error) {
	if len(b) == 1 {
		return nil, nil // no claims: a pull of the view's shards
	}
	d := newDec(b)
	n := int(d.u16())
	if d.err == nil && n > maxMsgKeys {
		d.fail("%d claims", n)
	}
	cs := make([]ShardClaim, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		cs = append(cs, ShardClaim{Shard: int(d.u32()), Home: from, Epoch: d.u64(), Gen: d.u64(), told: true})
	}
	return cs, d.end()
}

// Claims is the claim of every shard as this daemon knows it (with a
// fence; nil without one).
func (c *Cluster) ShardClaims() []ShardClaim {
	if c.shardClaims == nil {
		return nil
	}
	out := make([]ShardClaim, len(c.shardClaims))
	for s := range c.shardClaims {
		out[s].Shard = s
		if cl := c.shardClaims[s].Load(); cl != nil {
			out[s] = *cl
		}
	}
	return out
}

// ShardInfo is one shard as this daemon knows it (tcctl cluster shards).
type ShardInfo struct {
	Shard int
	// Home is the shard's home ("" with a fence and no claim); Gen the
	// generation a message to it carries (its claim in etcd, else its run
	// epoch; this daemon's own when it is the home).
	Home string
	Gen  uint64
	// Rendezvous is the member rendezvous hashing names (with a fence,
	// the one to claim it).
	Rendezvous string
	// Keys are the keys indexed here (this daemon being the home).
	Keys int
}

// Shards describes count shards from first (fewer past the last).
func (c *Cluster) Shards(first, count int) []ShardInfo {
	v := c.view.Load()
	first = min(max(first, 0), c.cfg.Shards)
	end := min(first+max(count, 0), c.cfg.Shards)
	out := make([]ShardInfo, 0, end-first)
	for s := first; s < end; s++ {
		home := c.homeFor(v, s)
		if c.shardClaims != nil {
			if cl := c.shardClaims[s].Load(); cl == nil || cl.Home == "" || (cl.Home != c.self && !v.has(cl.Home)) {
				home = "" // unclaimed, or claimed by a member down: no home now
			}
		}
		in := ShardInfo{Shard: s, Home: home, Rendezvous: v.home(s)}
		switch {
		case home == c.self:
			in.Gen = c.heldGen(s)
			in.Keys = c.idx.shardKeys(s)
		case home != "":
			in.Gen = c.genFor(s, home)
		}
		out = append(out, in)
	}
	return out
}

// ShardCount is how many shards the key space is split into.
func (c *Cluster) ShardCount() int { return c.cfg.Shards }

// Fenced reports whether homes follow shard claims in etcd.
func (c *Cluster) Fenced() bool { return c.shardClaims != nil }

// ClaimsByHolder is how many read claims this daemon, as a home, has
// outstanding at each holder.
func (c *Cluster) ClaimsByHolder() map[string]int { return c.claims.ByHolder() }
