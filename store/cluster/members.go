package cluster

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// Membership. The members are this daemon and its configured peers; the
// live ones (up) make the view the homes are computed over. A member is
// up from the start (so that daemons started together agree at once), goes
// down when an exchange with it fails as unreachable (Peers.Unreachable)
// or the prober cannot reach it, and comes up again when it speaks to this
// daemon or answers the prober. Each change is a cache event: the view is
// recomputed (rendezvous moves only the shards that must move), a home
// forgets the shards it lost, and the holders re-announce the keys of the
// moved shards to their new homes at a bounded rate; until then a new home
// answers what it knows, and its misses are misses.

// member is what this daemon knows of another member.
type member struct {
	up    bool
	epoch uint64 // the run last seen; 0 before any
	// split is set while the member splits keys otherwise (another
	// store_shards): it stays down whatever it says until a hello agrees.
	split bool
	// upAt is when this daemon last saw the member come up; reached the
	// latest time at which an exchange of this daemon's that the member
	// answered was sent. A failed exchange sent before either says
	// nothing of the member now (lost).
	upAt, reached time.Time
	// older is, per family of newer kinds, when the member last answered
	// that it serves none of them (an older release; older).
	older [newerFamilies]olderMark
}

// newerFamily is a set of message kinds that one release added, which an
// older release answers it does not serve: a member is marked older per
// family, since a release may have one and not the other.
type newerFamily int

const (
	famAges       newerFamily = iota // with removal ages: kindAnnounceAges, kindDropAges
	famPull                          // the numbered pull: kindPull
	newerFamilies                    // how many
)

// familyOf is the family of newer kind.
func familyOf(kind string) newerFamily {
	if kind == kindPull {
		return famPull
	}
	return famAges
}

// olderMark is when a member, at run epoch, last answered at at that it
// serves no kind of a family.
type olderMark struct {
	epoch uint64
	at    time.Time
}

// olderRecheck is how long a member that answered it serves no kind of a
// family is sent the older kinds before a newer one is tried again, in
// case it was upgraded without a restart of its run (its epoch).
const olderRecheck = time.Minute

// runOf is member id's run (its epoch; 0 before any) and the run at
// which it last answered that it serves no numbered pull (0: never), in
// one look.
func (c *Cluster) runOf(id string) (epoch, olderPull uint64) {
	if id == c.self {
		return c.peers.Epoch(), 0
	}
	c.mmu.Lock()
	defer c.mmu.Unlock()
	if m, ok := c.members[id]; ok {
		return m.epoch, m.older[famPull].epoch
	}
	return 0, 0
}

// older reports whether member id, at run epoch, is to be sent the kind
// an older release knows instead of newer kind (kindAnnounce for
// kindAnnounceAges, kindDrop for kindDropAges, kindReannounce for
// kindPull).
func (c *Cluster) older(id string, epoch uint64, kind string) bool {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	m, ok := c.members[id]
	if !ok {
		return false
	}
	o := m.older[familyOf(kind)]
	return o.epoch == epoch && time.Since(o.at) < olderRecheck
}

// exchangeNewer sends req as kind to member id (at run epoch), a kind an
// older release does not serve; to a member that answers it serves no
// such kind but serves olderKind, or answered so within olderRecheck, it
// sends olderReq() as olderKind instead (asOlder), counted. The messages
// with removal ages and the numbered pull go through it.
func (c *Cluster) exchangeNewer(id string, epoch uint64, kind string, req []byte, olderKind string, olderReq func() []byte,
	deadline time.Time) (resp []byte, asOlder bool, err error) {
	if !c.older(id, epoch, kind) {
		resp, err := c.exchangeBy(id, epoch, kind, req, deadline)
		if err == nil || !notServed(err) {
			return resp, false, err
		}
		c.c.olderKinds.Add(1)
		resp, oerr := c.exchangeBy(id, epoch, olderKind, olderReq(), deadline)
		if oerr == nil {
			c.olderRelease(id, epoch, kind, err) // it serves the older kind only
		}
		return resp, true, oerr
	}
	c.c.olderKinds.Add(1)
	resp, err = c.exchangeBy(id, epoch, olderKind, olderReq(), deadline)
	return resp, true, err
}

// notServed reports whether err is a member's answer that it serves no
// handler for the kind asked (an older release, or a store across hosts
// not running there).
func notServed(err error) bool { return errors.Is(err, xfer.ErrNotSupported) }

// olderRelease records that member id, at run epoch, answered it serves no
// kind (err) but served the older kind in its place; the first time in
// that run what follows is done and said in the log, since what the
// member cannot be told then matters. (A member whose store across hosts
// is not running serves neither, and is not marked: the Cluster registers
// the newer kinds before the others, and removes them after.)
func (c *Cluster) olderRelease(id string, epoch uint64, kind string, err error) {
	fam := familyOf(kind)
	c.mmu.Lock()
	m, ok := c.members[id]
	first := ok && (m.older[fam].epoch != epoch || m.older[fam].at.IsZero())
	if ok {
		m.older[fam] = olderMark{epoch: epoch, at: time.Now()}
	}
	c.mmu.Unlock()
	if !first {
		return
	}
	switch fam {
	case famAges:
		c.log.Warn("a member serves no message with removal ages (an older release, or its store across hosts not "+
			"running): it is sent the older kinds, and a removal it missed while away takes whatever copy it has, a "+
			"value put there after the removal included, until it is upgraded",
			"member", id, "epoch", epoch, "kind", kind, "err", err)
	case famPull:
		c.olderPuller(id, epoch, err)
	}
}

// seen records that member id spoke at epoch (a handler ran for it, or
// the prober reached it).
func (c *Cluster) seen(id string, epoch uint64) {
	c.mmu.Lock()
	m, ok := c.members[id]
	if !ok || m.split {
		c.mmu.Unlock()
		return
	}
	restarted := m.epoch != 0 && epoch != 0 && m.epoch != epoch
	changed := !m.up || restarted
	wasDown := !m.up
	// Back after a while unreachable, in a run this daemon knew (or one
	// it never knew the run of): its index of this daemon's copies is as
	// it was, less the announcements that failed meanwhile, and its side
	// may not ask for them.
	sendAgain := wasDown && !restarted
	if wasDown {
		m.upAt = time.Now()
	}
	m.up = true
	if epoch != 0 {
		m.epoch = epoch
	}
	c.mmu.Unlock()
	if !changed {
		return
	}
	c.log.Info("member up", "member", id, "epoch", epoch, "restarted", restarted)
	if sd, ok := c.peers.(StallDropper); ok {
		// Its connections a cut stalled would hold up the exchanges
		// below until TCP retransmits: new ones go now.
		if n := sd.DropStalled(id, "the store across hosts heard from the member again; this connection's bytes are still unacknowledged"); n > 0 {
			c.log.Info("connections to a member back that the network had stalled dropped: the next exchanges dial afresh",
				"member", id, "connections", n)
		}
		if wasDown {
			// An exchange sent meanwhile may have gone on a connection
			// just dropped: its failure is a late one (lost), as of an
			// exchange sent into the cut.
			c.mmu.Lock()
			if m, ok := c.members[id]; ok && m.up {
				m.upAt = time.Now()
			}
			c.mmu.Unlock()
		}
	}
	c.recompute()
	if sendAgain {
		// The keys this daemon holds of the shards it is home of go to it
		// again. A member that restarted is not sent them: its new run
		// pulls every member once its start-up greeting ends (announcer),
		// and sending them now too would walk this store twice for it. A
		// release that pulls nothing at start serves no numbered pull
		// either, and is sent them when that is found (walk.go,
		// olderPuller); one that pulls on its probe rounds only gets them
		// a round later.
		c.reannounce(func(_ int, home string) bool { return home == id })
	}
	// And what it holds of this daemon's shards comes here again: the
	// index lost it when it went down, and a removal it missed meanwhile
	// is answered "removed" (tomb.go).
	c.pullFrom(id)
	c.retryDrops(id)
}

// pullFrom asks member id to re-announce the keys it holds of the shards
// this daemon is home of, in the background.
func (c *Cluster) pullFrom(id string) { c.pullFromAs(id, false) }

// pullFromAs is pullFrom; again: sent again for a word still missing
// (walk.go, pullUnwalked).
func (c *Cluster) pullFromAs(id string, again bool) {
	c.pullAll([]string{id}, []byte{msgVersion}, again)
}

// pullAll pulls (walk.go, pull) each of ids but this daemon with req, in
// the background, unless the Cluster is closed.
func (c *Cluster) pullAll(ids []string, req []byte, again bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, id := range ids {
		if id == c.self {
			continue
		}
		c.fetchWG.Add(1)
		go func() {
			defer c.fetchWG.Done()
			c.pull(id, req, again)
		}()
	}
}

// lost records that member id did not answer an exchange sent at sent
// (err says why); it goes down. Unless the member came up after sent, or
// answered an exchange sent after it: then the failure is a late one of a
// path that works again (an exchange sent into a cut, on a connection the
// cut stalled, timing out once the members met again), counted and
// logged, and the member stays up instead of going down and up again,
// moving its shards twice.
func (c *Cluster) lost(id string, err error, sent time.Time) {
	if id == c.self || !c.peers.Unreachable(err) {
		return
	}
	c.mmu.Lock()
	m, ok := c.members[id]
	if ok && m.up && (m.upAt.After(sent) || m.reached.After(sent)) {
		c.mmu.Unlock()
		c.c.lateLosses.Add(1)
		c.log.Info("a member up again failed an exchange sent before it answered: not taken for down", "member", id,
			"sent", sent, "err", err)
		return
	}
	changed := ok && m.up
	if changed {
		m.up = false
	}
	c.mmu.Unlock()
	if changed {
		c.log.Warn("member down: its shards move to the others", "member", id, "err", err)
	}
	if ok {
		// Also when another goroutine took it down first: that one may
		// not have made the view current yet, and this caller's next step
		// must not see the member in it.
		c.recompute()
	}
}

// reachedAt records that member id answered an exchange of this daemon's
// sent at sent.
func (c *Cluster) reachedAt(id string, sent time.Time) {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	if m, ok := c.members[id]; ok && sent.After(m.reached) {
		m.reached = sent
	}
}

// live is the members up, this daemon included.
func (c *Cluster) live() []string {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	ids := []string{c.self}
	for id, m := range c.members {
		if m.up {
			ids = append(ids, id)
		}
	}
	return ids
}

// away is the members this daemon knows that are not up (down, or
// cut off from it), sorted.
func (c *Cluster) away() []string {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	var ids []string
	for id, m := range c.members {
		if !m.up {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// recompute makes the view of the members up current, and starts the
// moves it implies.
func (c *Cluster) recompute() {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	old := c.view.Load()
	ids := c.live()
	slices.Sort(ids)
	c.apart.setApart(len(c.away()) > 0, time.Now())
	if slices.Equal(old.members, ids) {
		return
	}
	v := newView(ids, c.cfg.Shards)
	for s := range c.cfg.Shards {
		if c.homeFor(old, s) != c.homeFor(v, s) {
			c.homeMoves[s].Add(1)
		}
	}
	c.view.Store(v)
	c.c.viewChanges.Add(1)
	if c.shardClaims != nil {
		// Homes follow the claims: the claimer claims and releases what
		// the new view calls for, and the claims' changes move the keys.
		c.log.Info("members changed", "members", v.members)
		select {
		case c.ckick <- struct{}{}:
		default:
		}
		return
	}
	moved := make([]bool, c.cfg.Shards)
	n, gained := 0, 0
	for s := range moved {
		if old.home(s) != v.home(s) {
			moved[s] = true
			n++
			if old.home(s) == c.self {
				c.idx.clearShard(s)
			}
			if v.home(s) == c.self {
				gained++
			}
		}
	}
	if gained > 0 {
		c.gain(func(s int) bool { return moved[s] && v.home(s) == c.self })
	}
	c.log.Info("members changed: shards move", "members", v.members, "moved", n, "gained", gained, "home_of", c.homeOf(v))
	// The removals this daemon remembers for holders it did not reach go
	// with the shards it lost.
	c.handTombs(func(s int) (string, bool) { return v.home(s), moved[s] && old.home(s) == c.self })
	// This daemon's keys of the moved shards go to their new homes; and
	// a member whose view changed before this one's sent this daemon's
	// new shards to where they were: it is asked for them again.
	c.reannounce(func(s int, _ string) bool { return moved[s] })
	if gained > 0 {
		c.pullWith(v, []byte{msgVersion})
	}
}

// pullWith asks every member of v to re-announce the keys it holds of the
// shards this daemon is home of (in its own view, or those of the claims
// req names), in the background.
func (c *Cluster) pullWith(v *view, req []byte) { c.pullAll(v.members, req, false) }

// onReannounce re-announces the keys held here whose home is the asker.
func (c *Cluster) onReannounce(from string, epoch uint64, req []byte) ([]byte, error) {
	cs, err := decodeShardClaims(from, req)
	if err != nil {
		return nil, err
	}
	if len(cs) > 0 {
		// The claims the asker says it won only choose the keys sent: the
		// keys of those shards go to it, even when the watch brought its
		// claims first, since what was sent then may have reached the
		// asker before it knew it had won. The claims themselves are
		// taken from etcd's watch, never from a peer's word.
		won := map[int]bool{}
		for _, cl := range cs {
			won[cl.Shard] = true
		}
		c.reannounce(func(s int, home string) bool { return won[s] && home == from })
		return []byte{msgVersion}, nil
	}
	c.reannounce(func(_ int, home string) bool { return home == from })
	return []byte{msgVersion}, nil
}

// Members is the view: the members up, sorted (tcctl cluster).
func (c *Cluster) Members() []string { return slices.Clone(c.view.Load().members) }

// maxReannounceReqs bounds the re-announcements queued between two walks
// of the store. Past it they are merged into one of every key held here,
// which covers each of them (a key re-announced to its home once more
// costs only its share of a message, at the walk's bounded rate): a
// member that asks over and over, one peer message each, grows neither
// the queue nor the walk's work per key.
const maxReannounceReqs = 64

// everyKey is a re-announcement of every key held here.
func everyKey(int, string) bool { return true }

// reannounce queues a re-announcement of the keys held here whose shard
// and home (under the view when it runs) pass keep.
func (c *Cluster) reannounce(keep func(shard int, home string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	switch {
	case c.reqsAll:
		// Every key is asked for already.
	case len(c.reqs) >= maxReannounceReqs:
		c.reqs = append(c.reqs[:0], everyKey)
		c.reqsAll = true
		c.log.Info("re-announcements merged into one of every key held here", "queued", maxReannounceReqs)
	default:
		c.reqs = append(c.reqs, keep)
	}
	select {
	case c.rekick <- struct{}{}:
	default:
	}
}

// reannouncer is the Cluster's goroutine that walks this daemon's store
// for the keys a re-announcement asks for and sends them to their homes,
// at most Config.ReannounceRate keys a second; and the prober, which
// every Config.ProbeEvery asks each member (an empty lookup) whether it
// is there, and pulls those whose re-announcement it lacks. Close stops
// it.
func (c *Cluster) reannouncer() {
	defer close(c.redone)
	probe := time.NewTicker(c.cfg.ProbeEvery)
	defer probe.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-probe.C:
			c.probe()
			// A member not yet asked to re-announce since this daemon's
			// last gain (up or restarted since, or its pull failed) is
			// asked now: its word that it has ends the rebuild of the
			// shards gained (walk.go).
			c.pullUnwalked(c.view.Load())
			continue
		case <-c.rekick:
		}
		c.mu.Lock()
		reqs := c.reqs
		c.reqs, c.reqsAll = nil, false
		c.mu.Unlock()
		// The pulls taken before the walk begins are those it answers.
		marks := c.pullMarks()
		if len(reqs) > 0 && !c.walk(reqs, marks) {
			return
		}
	}
}

// probeParallel bounds the hellos of one probe round in flight at once.
const probeParallel = 16

// probe asks every member whether it is there, after taking in the
// members the directory lists now (when there is one). The members are
// asked at once (up to probeParallel): one that does not answer (stopped,
// or cut off by a link that drops its packets) holds the round for the
// timeout, not the others' hellos behind it, so a member back is seen
// within a round however many others are away.
func (c *Cluster) probe() {
	if c.cfg.Directory != nil {
		c.follow(c.cfg.Directory())
	}
	c.mmu.Lock()
	ids := make([]string, 0, len(c.members))
	for id := range c.members {
		ids = append(ids, id)
	}
	c.mmu.Unlock()
	sem := make(chan struct{}, probeParallel)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := c.hello(id); err == nil {
				c.seen(id, c.peers.EpochOf(id))
			}
		}()
	}
	wg.Wait()
	// The view says what the hellos found when probe returns, whatever
	// goroutine changed a member's state first.
	c.recompute()
	// Tombstones of shards another daemon is home of go to it: those a
	// home whose view moved first handed here, and those a new home did
	// not take when the shard moved. A shard's home changing is not the
	// only time they must move, or they would stay where nobody asks.
	v := c.view.Load()
	c.handTombs(func(s int) (string, bool) { return c.homeFor(v, s), true })
}

// walk re-announces what reqs ask for, and tells the homes whose pulls
// marks has which of their shards it re-announced (reportWalks); false
// when Close stopped it.
func (c *Cluster) walk(reqs []func(int, string) bool, marks map[string]pullMark) bool {
	moves := make([]uint64, c.cfg.Shards) // before the view: a change between is one seen
	for s := range moves {
		moves[s] = c.homeMoves[s].Load()
	}
	v := c.view.Load()
	failed := map[string]bool{}
	failedAt := func(home string) { failed[home] = true }
	keep := func(key []byte) bool {
		if c.isGone(key) {
			return false // removed, here until its I/O ends
		}
		s := c.shardOf(key)
		h := c.homeFor(v, s)
		for _, r := range reqs {
			if r(s, h) {
				return true
			}
		}
		return false
	}
	batch := c.cfg.ReannounceRate / 10
	batch = max(batch, 1)
	start := time.Now()
	sent := 0
	var held []store.Held
	for i := range c.st.IndexShards() {
		held = c.st.Holdings(i, keep, held[:0])
		for len(held) > 0 {
			n := min(len(held), batch)
			es := make([]entry, n)
			for j, h := range held[:n] {
				tier := TierL1
				if h.OnL2 {
					tier = TierL2
				}
				es[j] = entry{key: h.Key, tier: tier, size: h.Size, crc: h.CRC}
			}
			c.announceNoting(es, failedAt)
			// A key removed, evicted or put again since Holdings read
			// it has its state now queued after this announcement.
			c.st.Recheck(held[:n])
			c.c.reannounced.Add(uint64(n))
			held = held[n:]
			sent += n
			// Bounded rate: wait until sent keys are due.
			due := start.Add(time.Duration(float64(sent) / float64(c.cfg.ReannounceRate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-c.stop:
					t.Stop()
					return false
				case <-t.C:
				}
			}
		}
	}
	if sent > 0 {
		c.log.Info("keys re-announced to their homes", "keys", sent, "took", time.Since(start).Round(time.Millisecond))
	}
	c.reportWalks(v, moves, reqs, marks, failed)
	return true
}

// follow makes the members those the directory lists (ids): a new one is
// added (down until it answers), one the directory no longer lists (its
// lease expired, or it left) is taken out, a change of members.
func (c *Cluster) follow(ids []string) {
	listed := map[string]bool{}
	for _, id := range ids {
		if id != c.self && id != "" && len(id) <= maxIDLen {
			listed[id] = true
		}
	}
	c.mmu.Lock()
	var gone []string
	for id := range c.members {
		if !listed[id] {
			gone = append(gone, id)
			delete(c.members, id)
		}
	}
	for id := range listed {
		if _, ok := c.members[id]; !ok {
			c.members[id] = &member{}
		}
	}
	c.mmu.Unlock()
	if len(gone) > 0 {
		c.log.Info("members the directory no longer lists: their shards move", "members", gone)
		c.forgetWalks(gone)
		c.recompute()
	}
}

// hello asks member id whether it is there and splits the key space as
// this daemon does (the same store_shards): a member that does not is
// down (it would be asked about shards it does not have), said in the log.
func (c *Cluster) hello(id string) error {
	e := newEnc()
	e.u32(uint32(c.cfg.Shards))
	sent := time.Now()
	resp, err := c.peers.ExchangeAt(id, 0, kindHello, e.bytes(), c.cfg.Timeout)
	switch {
	case err != nil && c.peers.Unreachable(err):
		c.lost(id, err, sent)
		return err
	case err != nil && c.peers.Busy(err):
		// There, with every exchange handler taken (a daemon back from a
		// restart that its members all tell at once): neither down nor
		// out; the next hello asks again.
		c.reachedAt(id, sent)
		c.c.busyHellos.Add(1)
		return err
	case err != nil:
		// Its answer refused this daemon (another store_shards, or no
		// store across hosts there): out until a hello agrees.
		c.down(id, err)
		return err
	}
	d := newDec(resp)
	theirs := d.u32()
	if err := d.end(); err != nil || int(theirs) != c.cfg.Shards {
		err = fmt.Errorf("%w: %s splits keys into %d shards, this daemon into %d (store_shards must be the same on every daemon)",
			ErrMessage, id, theirs, c.cfg.Shards)
		c.down(id, err)
		return err
	}
	c.reachedAt(id, sent)
	c.agree(id)
	return nil
}

// agree clears member id's split: a hello found it splitting keys as this
// daemon does.
func (c *Cluster) agree(id string) {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	if m, ok := c.members[id]; ok {
		m.split = false
	}
}

// onHello answers how many shards this daemon splits keys into; it
// refuses a member that splits them otherwise.
func (c *Cluster) onHello(from string, epoch uint64, req []byte) ([]byte, error) {
	d := newDec(req)
	theirs := d.u32()
	if err := d.end(); err != nil {
		return nil, err
	}
	if int(theirs) != c.cfg.Shards {
		err := fmt.Errorf("%w: %s splits keys into %d shards, this daemon into %d (store_shards must be the same on every daemon)",
			ErrMessage, from, theirs, c.cfg.Shards)
		c.down(from, err)
		return nil, err
	}
	c.agree(from)
	c.seen(from, epoch)
	e := newEnc()
	e.u32(uint32(c.cfg.Shards))
	return e.bytes(), nil
}

// down takes member id out of the view for err, whatever kind of error
// it is.
func (c *Cluster) down(id string, err error) {
	c.mmu.Lock()
	m, ok := c.members[id]
	changed := ok && m.up
	if ok {
		m.up, m.split = false, true
	}
	c.mmu.Unlock()
	if changed {
		c.log.Error("member out of the store across hosts", "member", id, "err", err)
	}
	if ok {
		c.recompute() // as in lost
	}
}
