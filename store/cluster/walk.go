package cluster

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// A new home's rebuild, ended by the members' word. A daemon that gains a
// shard (at start, on a view change, on a claim won) knows only the copies
// announced to it since; the members re-announce theirs at a bounded
// rate. Until every member has, a removal there asks each member the
// index may lack a copy of to drop the key (removeHere), and tombstones
// the members away, so that a copy re-announced after the removal is not
// indexed and served again.
//
// When that ends is the members' word, not a time: each pull (the home
// asking a member to re-announce its keys of the home's shards) carries a
// sequence number of the home's, and a member that completes a walk of its
// store begun after such a pull tells the home which shards that walk
// announced to it, every announcement answered, with the pull's number
// (kindWalked). The home takes a member's copies of shard s as indexed
// once the member said so for a pull sent after s was gained (gainSeq):
// copies put since are announced by their commits. A member that restarts
// (another run) says it again; one that serves no pull (an older release)
// is taken as walked Config.TombstoneTTL after the gain, as before the
// word existed. The home's own copies count the same way: it marks a pull
// of itself when it gains, and its own walk reports to it. A walk can say
// nothing of a shard whose home it did not see as the asker (the
// member's view of the shard's claim still lagged): a member whose word
// stays missing is pulled again, after a back-off that doubles
// (pullUnwalked).

// walked is, for one member at one run, the newest pull number each shard
// was walked for.
type walked struct {
	epoch uint64
	seq   []uint64
}

// pullMark is the newest pull this daemon had from one home, at its run;
// as a home's record of a pull it sent (walks.asked), also when, and how
// many pulls in a row its word has not followed.
type pullMark struct {
	epoch, seq uint64
	at         time.Time
	tries      int
}

// Pulls of a member whose word is still missing for a shard this daemon
// is home of are sent again, first five probe rounds after the last,
// each wait doubling up to rePullMost: a walk that could not tell (the
// member's view of the shard's claim lagged, or its walk failed) is asked
// for again, and a member that takes long is not walked over and over.
const (
	rePullRounds = 5
	rePullMost   = 5 * time.Minute
)

// maxPullMarks bounds the homes a daemon remembers pulls of: a peer that
// is not a member adds nothing past it.
const maxPullMarks = 4096

// walks is the state of rebuilds on both sides: as a home, the pulls sent
// and the members' walks reported; as a member, the pulls taken.
type walks struct {
	mu sync.Mutex
	// seq numbers the pulls this daemon sent (at its run).
	seq uint64
	// gainSeq is, per shard, the first pull number sent after this
	// daemon last gained it (0: never gained); lastGain the highest.
	gainSeq  []uint64
	lastGain uint64
	// done are the members' reported walks; asked the pull each member
	// was last sent (pullUnwalked). (The run at which a member answered
	// that it serves no pull is its older mark, members.go.)
	done  map[string]*walked
	asked map[string]pullMark
	// marks are the pulls this daemon took as a member, by home.
	marks map[string]pullMark
}

func newWalks(shards int) *walks {
	return &walks{gainSeq: make([]uint64, shards), done: map[string]*walked{}, asked: map[string]pullMark{},
		marks: map[string]pullMark{}}
}

// gain records that this daemon became home, now, of the shards mine
// reports (gainShards).
func (c *Cluster) gain(mine func(s int) bool) {
	var shards []int
	for s := range c.cfg.Shards {
		if mine(s) {
			shards = append(shards, s)
		}
	}
	c.gainShards(shards...)
}

// gainShards records that this daemon became home, now, of shards, and
// marks a pull of its own copies, which the walk it queues next reports.
// A claim won gains its one shard here, with no scan of every shard.
func (c *Cluster) gainShards(shards ...int) {
	if len(shards) == 0 {
		return
	}
	now := time.Now().UnixNano()
	w := c.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	next := w.seq + 1
	for _, s := range shards {
		w.gainSeq[s] = next
		c.gainedAt[s].Store(now)
	}
	w.seq = next
	w.lastGain = next
	w.marks[c.self] = pullMark{epoch: c.peers.Epoch(), seq: next}
}

// nextPull numbers a pull about to be sent to member id at run epoch;
// again: one sent again for a word still missing (pullUnwalked).
func (c *Cluster) nextPull(id string, epoch uint64, again bool) uint64 {
	w := c.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	tries := 0
	if a, ok := w.asked[id]; ok && again && a.epoch == epoch {
		tries = a.tries + 1
	}
	w.asked[id] = pullMark{epoch: epoch, seq: w.seq, at: time.Now(), tries: tries}
	return w.seq
}

// pull asks member id to re-announce the keys it holds of the shards this
// daemon is home of (or of those the claims in req name: a kindReannounce
// request), numbered so that its walk can say when it is done. A member
// that serves no pull is sent req as kindReannounce, and its walks are
// taken as done Config.TombstoneTTL after a gain.
func (c *Cluster) pull(id string, req []byte, again bool) {
	epoch := c.epochOf(id)
	seq := c.nextPull(id, epoch, again)
	e := newEnc()
	e.u64(seq)
	e.b = append(e.b, req[1:]...) // the claims, after req's version
	_, _, err := c.exchangeNewer(id, epoch, kindPull, e.bytes(), kindReannounce, func() []byte { return req },
		time.Now().Add(c.cfg.Timeout))
	if err != nil {
		// Asked again after the next probe round, unless it serves no
		// re-announcement at all (its store across hosts is not
		// running): asking it every round would only fill the log.
		if !notServed(err) {
			c.walks.mu.Lock()
			if c.walks.asked[id].seq == seq {
				delete(c.walks.asked, id)
			}
			c.walks.mu.Unlock()
		}
		c.log.Info("a member was not asked to re-announce", "member", id, "err", err)
	}
}

// olderPuller is told that member id, at run epoch, serves no numbered
// pull (an older release; exchangeNewer sends it kindReannounce instead,
// and its older mark makes its walks taken as done Config.TombstoneTTL
// after a gain, for the rest of that run: lacksLocked). Since such a
// release does not pull at start either, it is sent this daemon's copies
// of its shards (a restarted run of it is not sent them on being seen,
// members.go). Called once a run.
func (c *Cluster) olderPuller(id string, epoch uint64, err error) {
	c.log.Warn("a member serves no numbered pull (an older release): a removal at a shard this daemon "+
		"gained asks it to drop the key for a window after the gain, and not after, however long its "+
		"re-announcement takes", "member", id, "epoch", epoch, "window", c.cfg.TombstoneTTL, "err", err)
	c.reannounce(func(_ int, home string) bool { return home == id })
}

// pullUnwalked pulls, in the background, each member of v not yet asked
// for this daemon's last gain at its current run (one up since,
// restarted, or whose pull failed), and again, after a back-off
// (rePullRounds), each whose word is still missing for a shard this daemon
// is home of. The prober calls it after every round.
func (c *Cluster) pullUnwalked(v *view) {
	w := c.walks
	now := time.Now()
	var ids []string
	var again []bool
	first := rePullRounds * c.cfg.ProbeEvery
	w.mu.Lock()
	for _, m := range v.members {
		if m == c.self || w.lastGain == 0 {
			continue
		}
		a, ok := w.asked[m]
		switch {
		case !ok || a.epoch != c.epochOf(m) || a.seq < w.lastGain:
			ids, again = append(ids, m), append(again, false)
		case now.Sub(a.at) >= min(first<<min(a.tries, 16), rePullMost) && c.lacksHomed(v, m):
			ids, again = append(ids, m), append(again, true)
		}
	}
	w.mu.Unlock()
	for i, m := range ids {
		c.pullFromAs(m, again[i])
	}
}

// lacksHomed reports whether member m's word is missing for a shard this
// daemon is home of under v (a member of an older release: within its
// window). The caller holds walks.mu.
func (c *Cluster) lacksHomed(v *view, m string) bool {
	now := time.Now()
	for s := range c.walks.gainSeq {
		if c.homeFor(v, s) == c.self && c.lacksLocked(m, s, now) {
			return true
		}
	}
	return false
}

// onPull is kindReannounce with the home's pull number first: the walk
// that re-announces the keys reports to the home once done (reportWalks).
func (c *Cluster) onPull(from string, epoch uint64, req []byte) ([]byte, error) {
	if len(req) < 9 {
		return nil, fmt.Errorf("%w: pull of %d bytes", ErrMessage, len(req))
	}
	d := newDec(req[:9])
	seq := d.u64()
	if err := d.end(); err != nil {
		return nil, err
	}
	rest := append([]byte{msgVersion}, req[9:]...)
	if _, err := decodeShardClaims(from, rest); err != nil {
		return nil, err
	}
	// Kept from any peer (bounded): one this daemon does not count a
	// member yet (the directory listed it since) is told once it is in
	// the view.
	c.walks.mu.Lock()
	if m, ok := c.walks.marks[from]; len(c.walks.marks) < maxPullMarks || ok {
		if !ok || m.epoch != epoch || seq > m.seq {
			c.walks.marks[from] = pullMark{epoch: epoch, seq: seq}
		}
	}
	c.walks.mu.Unlock()
	return c.onReannounce(from, epoch, rest)
}

// isMember reports whether id is a member this daemon knows.
func (c *Cluster) isMember(id string) bool {
	c.mmu.Lock()
	defer c.mmu.Unlock()
	_, ok := c.members[id]
	return ok
}

// pullMarks is the pulls this daemon has taken, for a walk starting now.
func (c *Cluster) pullMarks() map[string]pullMark {
	c.walks.mu.Lock()
	defer c.walks.mu.Unlock()
	return maps.Clone(c.walks.marks)
}

// reportWalks tells each home with a pull in marks (taken before the walk
// began) which of its shards the walk announced to it under view v (reqs
// asked for them, and it is their home still, its home unchanged since
// moves, the counts of homeMoves when the walk began), unless an
// announcement to it failed: then its keys are walked again (while it is
// a member), so that its word comes later rather than never.
func (c *Cluster) reportWalks(v *view, moves []uint64, reqs []func(int, string) bool, marks map[string]pullMark, failed map[string]bool) {
	for home, m := range marks {
		if failed[home] {
			// After a probe round's pause: a home that fails announcements
			// for long goes down (out of the view), one busy a while is
			// not walked for over and over.
			time.AfterFunc(c.cfg.ProbeEvery, func() {
				if c.view.Load().has(home) {
					c.reannounce(func(_ int, h string) bool { return h == home })
				}
			})
			continue
		}
		if home != c.self && !v.has(home) {
			continue
		}
		bits := make([]byte, (c.cfg.Shards+7)/8)
		n := 0
		// A shard whose home changed while the walk ran, even if it is
		// back, may have had keys announced to another: it is not
		// reported (the change queued a walk of it, which is).
		now := c.view.Load()
		for s := 0; s < c.cfg.Shards; s++ {
			if c.homeFor(v, s) != home || c.homeFor(now, s) != home || c.homeMoves[s].Load() != moves[s] {
				continue
			}
			for _, r := range reqs {
				if r(s, home) {
					bits[s/8] |= 1 << (s % 8)
					n++
					break
				}
			}
		}
		if n == 0 {
			continue
		}
		if home == c.self {
			c.tookWalk(c.self, c.peers.Epoch(), m.seq, bits)
			continue
		}
		e := newEnc()
		e.u64(m.seq)
		e.u32(uint32(c.cfg.Shards))
		e.b = append(e.b, bits...)
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		c.fetchWG.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.fetchWG.Done()
			if _, err := c.exchange(home, m.epoch, kindWalked, e.bytes()); err != nil {
				c.log.Info("a home was not told this daemon's walk of its shards is done: it keeps asking this "+
					"daemon to drop each key removed there", "home", home, "err", err)
			}
		}()
	}
}

// onWalked takes a member's word that a walk begun after pull seq
// announced here every copy it holds of the shards named.
func (c *Cluster) onWalked(from string, epoch uint64, req []byte) ([]byte, error) {
	d := newDec(req)
	seq := d.u64()
	if n := int(d.u32()); d.err == nil && n != c.cfg.Shards {
		d.fail("walk of %d shards (this daemon splits keys in %d)", n, c.cfg.Shards)
	}
	bits := d.take((c.cfg.Shards + 7) / 8)
	if err := d.end(); err != nil {
		return nil, err
	}
	c.walks.mu.Lock()
	sent := c.walks.seq
	c.walks.mu.Unlock()
	if seq == 0 || seq > sent {
		return nil, fmt.Errorf("%w: walk reported for pull %d (the newest sent is %d)", ErrMessage, seq, sent)
	}
	if c.isMember(from) {
		c.tookWalk(from, epoch, seq, bits)
	}
	return []byte{msgVersion}, nil
}

// tookWalk records member id's walk (at run epoch) of the shards in bits
// for pull seq.
func (c *Cluster) tookWalk(id string, epoch, seq uint64, bits []byte) {
	w := c.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.done[id]
	if d == nil || d.epoch != epoch {
		d = &walked{epoch: epoch, seq: make([]uint64, len(w.gainSeq))}
		w.done[id] = d
	}
	for s := range d.seq {
		if bits[s/8]&(1<<(s%8)) != 0 && seq > d.seq[s] {
			d.seq[s] = seq
		}
	}
	c.c.walksTaken.Add(1)
}

// forgetWalks drops what is known of the walks of members no longer listed.
func (c *Cluster) forgetWalks(ids []string) {
	w := c.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.done, id)
		delete(w.asked, id)
		delete(w.marks, id)
	}
}

// unwalked is, for a removal of a key of shard s now, the members of v
// (this daemon included) whose copies of s the index may lack, and
// whether any member away may hold one it lacks. Each call of a removal
// asks it once per shard (unwalkedOf).
func (c *Cluster) unwalked(s int, v *view, away []string, now time.Time) (ask []string, awayToo bool) {
	w := c.walks
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gainSeq[s] == 0 {
		return nil, false
	}
	for _, m := range v.members {
		if c.lacksLocked(m, s, now) {
			ask = append(ask, m)
		}
	}
	for _, m := range away {
		if c.lacksLocked(m, s, now) {
			return ask, true
		}
	}
	return ask, false
}

// lacksLocked reports whether the index of shard s may lack member m's
// copies: its word for a pull sent after the gain is missing (a member
// of an older release: within the window after the gain). The caller
// holds walks.mu.
func (c *Cluster) lacksLocked(m string, s int, now time.Time) bool {
	w := c.walks
	gs := w.gainSeq[s]
	if gs == 0 {
		return false
	}
	ep, olderRun := c.runOf(m)
	if olderRun == ep && ep != 0 {
		return now.UnixNano()-c.gainedAt[s].Load() < int64(c.cfg.TombstoneTTL)
	}
	d := w.done[m]
	return d == nil || d.epoch != ep || d.seq[s] < gs
}

// rebuildingShards counts the shards this daemon is home of whose index
// may still lack copies of a member up (Stats): one away cannot say it
// re-announced, and is told of each removal when it is back (tombAway).
func (c *Cluster) rebuildingShards() int {
	v, now := c.view.Load(), time.Now()
	w := c.walks
	w.mu.Lock() // once for the scan, not once per shard
	defer w.mu.Unlock()
	n := 0
	for s := 0; s < c.cfg.Shards; s++ {
		if w.gainSeq[s] == 0 || c.homeFor(v, s) != c.self {
			continue
		}
		if slices.ContainsFunc(v.members, func(m string) bool { return c.lacksLocked(m, s, now) }) {
			n++
		}
	}
	return n
}
