package grant

import (
	"fmt"
	"hash/maphash"
	"maps"
	"sync"
	"time"
)

// Claims are the home's reservations of its holders' read capacity: a
// reader that the home sends to a holder takes a claim there first, and
// no holder is sent more concurrent readers of one key (MaxPerKey) or in
// all (MaxPerHolder) than it admits. A claim ends when the reader
// releases it (its read is over) or at the read's deadline, whichever
// comes first, so a reader that dies leaks nothing. Only the reader that
// took a claim ends it: a release naming another reader's claim is
// refused and changes nothing (ErrNotClaimHolder). This is the
// reservation the global store's replica counters made, kept in the home's
// memory instead.
type Claims struct {
	cfg ClaimsConfig

	// mu guards the fields below.
	mu      sync.Mutex
	closed  bool
	next    uint64
	live    map[uint64]claim
	perKey  map[holderKey]int // readers per (holder, key)
	perHold map[string]int    // readers per holder
	sched   sched
	scratch []deadline
	stats   ClaimStats
}

// ClaimsConfig configures Claims.
type ClaimsConfig struct {
	// MaxPerKey is how many readers of one key one holder admits at once
	// (default 8).
	MaxPerKey int
	// MaxPerHolder is how many readers one holder admits at once over all
	// its keys; 0 is no bound beyond MaxPerKey.
	MaxPerHolder int
	// MaxOutstanding bounds the claims outstanding in all (default 65536):
	// memory taken on behalf of readers is bounded.
	MaxOutstanding int
	// MaxTTL is the latest deadline a claim may have, from now (default
	// 5 minutes): a claim is for one read.
	MaxTTL time.Duration
	// Clock is the time source (default the wall clock).
	Clock Clock
}

func (c *ClaimsConfig) setDefaults() {
	if c.MaxPerKey <= 0 {
		c.MaxPerKey = 8
	}
	if c.MaxOutstanding <= 0 {
		c.MaxOutstanding = 65536
	}
	if c.MaxTTL <= 0 {
		c.MaxTTL = 5 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
}

// Claim is one reader's reservation at one holder: Release it by ID when
// the read ends.
type Claim struct {
	ID       uint64
	Holder   string
	Deadline time.Time
}

// Reader is who takes a claim: the reading daemon's id and run (epoch).
// A claim is released only by the reader that took it, in that run.
type Reader struct {
	ID    string
	Epoch uint64
}

// ClaimStats are the claims' counters.
type ClaimStats struct {
	Outstanding uint64 // claims held now
	Granted     uint64 // claims ever granted
	Refused     uint64 // acquisitions refused with ErrBusy
	Expired     uint64 // claims that reached their deadline unreleased
	Foreign     uint64 // releases refused: the claim was another reader's
}

type holderKey struct {
	holder string
	key    string
}

type claim struct {
	hk     holderKey
	reader Reader
}

// NewClaims makes an empty claims table.
func NewClaims(cfg ClaimsConfig) *Claims {
	cfg.setDefaults()
	c := &Claims{cfg: cfg, live: map[uint64]claim{}, perKey: map[holderKey]int{}, perHold: map[string]int{}}
	c.sched = sched{clock: cfg.Clock, fire: c.expire}
	return c
}

var claimSeed = maphash.MakeSeed()

// score is the rendezvous weight of holder for key: among equally loaded
// holders, each key prefers its own, so readers of different keys spread
// and readers of one key agree.
func score(key []byte, holder string) uint64 {
	var h maphash.Hash
	h.SetSeed(claimSeed)
	h.Write(key)
	h.WriteByte(0)
	h.WriteString(holder)
	return h.Sum64()
}

// Acquire reserves reader's read of key at one of holders, until
// deadline: the least loaded holder with room for another reader of key
// (ties broken by rendezvous over the key), or ErrBusy when every holder is
// at its limit. holders are daemon ids; a holder named twice counts once.
func (c *Claims) Acquire(reader Reader, key []byte, holders []string, deadline time.Time) (Claim, error) {
	if len(key) == 0 || len(holders) == 0 {
		return Claim{}, fmt.Errorf("%w: a claim needs a key and at least one holder (%d bytes, %d holders)", ErrInvalid, len(key), len(holders))
	}
	now := c.cfg.Clock.Now()
	if !deadline.After(now) || deadline.Sub(now) > c.cfg.MaxTTL {
		return Claim{}, fmt.Errorf("%w: claim deadline %v from now (want (0, %v])", ErrInvalid, deadline.Sub(now), c.cfg.MaxTTL)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return Claim{}, ErrClosed
	}
	if len(c.live) >= c.cfg.MaxOutstanding {
		c.stats.Refused++
		return Claim{}, fmt.Errorf("%w: %d claims outstanding in all", ErrBusy, len(c.live))
	}
	best, bestLoad, bestScore := -1, 0, uint64(0)
	for i, h := range holders {
		hk := holderKey{h, string(key)}
		n := c.perKey[hk]
		if n >= c.cfg.MaxPerKey || (c.cfg.MaxPerHolder > 0 && c.perHold[h] >= c.cfg.MaxPerHolder) {
			continue
		}
		sc := score(key, h)
		if best < 0 || n < bestLoad || (n == bestLoad && sc > bestScore) {
			best, bestLoad, bestScore = i, n, sc
		}
	}
	if best < 0 {
		c.stats.Refused++
		return Claim{}, fmt.Errorf("%w: %d holders, %d readers of the key each at most", ErrBusy, len(holders), c.cfg.MaxPerKey)
	}
	h := holders[best]
	hk := holderKey{h, string(key)}
	c.next++
	id := c.next
	c.live[id] = claim{hk: hk, reader: reader}
	c.perKey[hk]++
	c.perHold[h]++
	c.stats.Granted++
	c.sched.add(deadline, id, 0)
	return Claim{ID: id, Holder: h, Deadline: deadline}, nil
}

// Release ends reader's claims ids: their reads are over. A claim that is
// not outstanding (released, expired, never granted) is skipped, and the
// error is ErrClaimNotFound once the others are released. A claim that
// another reader (or another run of the same daemon) took makes the whole
// release ErrNotClaimHolder, and none of ids is released: a release is
// obeyed only from the reader that holds the claims.
func (c *Claims) Release(reader Reader, ids ...uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		if cl, ok := c.live[id]; ok && cl.reader != reader {
			c.stats.Foreign++
			return fmt.Errorf("%w: claim %d is %s's (epoch %d), released by %s (epoch %d)", ErrNotClaimHolder, id,
				cl.reader.ID, cl.reader.Epoch, reader.ID, reader.Epoch)
		}
	}
	missing := 0
	for _, id := range ids {
		cl, ok := c.live[id]
		if !ok {
			missing++
			continue
		}
		c.drop(id, cl)
	}
	c.sched.tidy(len(c.live), func(d deadline) bool { _, ok := c.live[d.id]; return ok })
	if missing > 0 {
		return fmt.Errorf("%w: %d of %d claims", ErrClaimNotFound, missing, len(ids))
	}
	return nil
}

// drop forgets claim id. c.mu is held.
func (c *Claims) drop(id uint64, cl claim) {
	delete(c.live, id)
	if c.perKey[cl.hk]--; c.perKey[cl.hk] == 0 {
		delete(c.perKey, cl.hk)
	}
	if c.perHold[cl.hk.holder]--; c.perHold[cl.hk.holder] == 0 {
		delete(c.perHold, cl.hk.holder)
	}
}

// expire ends the claims whose deadline has come (the timer calls it).
func (c *Claims) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.sched.fired()
	c.scratch = c.sched.due(c.cfg.Clock.Now(), c.scratch[:0])
	for _, d := range c.scratch {
		if cl, ok := c.live[d.id]; ok {
			c.drop(d.id, cl)
			c.stats.Expired++
		}
	}
	c.sched.arm()
}

// Readers is how many claims are outstanding on key at holder.
func (c *Claims) Readers(holder string, key []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.perKey[holderKey{holder, string(key)}]
}

// ByHolder is how many claims are outstanding at each holder now.
func (c *Claims) ByHolder() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.perHold)
}

// Stats reports the counters.
func (c *Claims) Stats() ClaimStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Outstanding = uint64(len(c.live))
	return s
}

// Close ends every claim and refuses new ones.
func (c *Claims) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.sched.stop()
	clear(c.live)
	clear(c.perKey)
	clear(c.perHold)
}
