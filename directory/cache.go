package directory

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Never is the age of something the cache has never heard about from its
// store: older than any budget.
const Never = time.Duration(math.MaxInt64)

// Bounds on what the cache holds: the store is shared, and what other
// daemons wrote there is outside input. Records past them are dropped and
// counted (CacheStats.Dropped); their lookups fall back or fail.
const (
	MaxMembers = 1 << 16
	MaxExports = 1 << 20
)

// Clock reads the time. The cache measures ages with it, so tests move the
// staleness budget by moving a clock instead of sleeping.
type Clock func() time.Time

// Store is where the cache goes back to when an entry is past the budget
// and the lane allows waiting on it. Each call is one read of the store.
type Store interface {
	// GetMember reads the registration of daemon id.
	GetMember(ctx context.Context, id string) (MemberRead, error)
	// GetExport reads the catalog entry of owner/name.
	GetExport(ctx context.Context, owner, name string) (ExportRead, error)
}

// MemberRead is what one read of the store found for a daemon.
type MemberRead struct {
	// Found is false when the store holds no (readable) registration.
	Found  bool
	Member Member
	// Lease is the record's lease, Rev its modification revision (both 0
	// when not found).
	Lease, Rev int64
	// At is the store's revision the read saw (etcd's response header
	// revision): the answer, found or not, holds as of At. The cache
	// writes a read back only if no feed event it applied is newer.
	At int64
}

// ExportRead is what one read of the store found for a catalog entry,
// with the revisions of MemberRead.
type ExportRead struct {
	Found   bool
	Export  Export
	Rev, At int64
}

// Event is one change the store's feed reports, in revision order.
type Event struct {
	// Delete is set for a removal; Member or Export says what was removed
	// (only its ids are read).
	Delete bool
	// Exactly one of Member and Export is set.
	Member *Member
	Export *Export
	// Lease is the record's lease (members), Rev its revision.
	Lease, Rev int64
}

// CacheConfig configures a Cache.
type CacheConfig struct {
	// Budget is the staleness budget: an entry older than this is not
	// served from the cache (required, positive).
	Budget time.Duration
	// Store is read on fallbacks; nil means the lookups that would go to
	// the store fail UNAVAILABLE instead.
	Store Store
	// RefreshTimeout bounds one fallback read of the store (default: the
	// budget, at most 2s).
	RefreshTimeout time.Duration
	// Clock defaults to time.Now.
	Clock Clock
}

// Cache is the bounded-stale view of the multi-host directory a daemon
// serves lookups from. A feed of the store (a watch) keeps it current:
// every entry's age is the time since the feed, or a read of that entry,
// last proved it current. A lookup whose answer is older than the budget
// falls back, as the request's lane allows (see Lane), and every fallback
// is counted. What it answers is advice: the owning peer's handshake and
// token checks decide, and what they find corrects the cache (Observe,
// Unreachable, ExportGone).
type Cache struct {
	budget  time.Duration
	store   Store
	timeout time.Duration
	now     Clock

	// mu guards the fields below.
	mu      sync.RWMutex
	members map[string]*memberEntry
	exports map[exportKey]*exportEntry
	// primed is set once a full listing was loaded; before that, absence
	// proves nothing.
	primed bool
	// syncedAt is when the feed last proved the whole cache current (an
	// event or a progress report). rev is the store revision the feed has
	// delivered everything up to: the cache knows every key as of rev (a
	// key without an entry is absent at rev), and the keys a fallback read
	// wrote as of that read's revision (an entry's at).
	syncedAt time.Time
	rev      int64

	st cacheCounters
}

// cacheCounters are the cache's counters, read by Stats.
type cacheCounters struct {
	lookups, hits, notFound, fallbackStore, fallbackPeer, unavailable, corrections, storeReads, dropped atomic.Uint64
}

// CacheStats are the cache's counters and state.
type CacheStats struct {
	Lookups uint64
	// Hits were answered from the cache within the budget (found or not).
	Hits uint64
	// NotFound counts the answers that found nothing (hits or not).
	NotFound uint64
	// FallbackStore and FallbackPeer count the lookups past the budget
	// that went to the store, or were handed to the owning peer to
	// confirm.
	FallbackStore, FallbackPeer uint64
	// Unavailable counts the lookups that failed closed.
	Unavailable uint64
	// Corrections counts entries the peers contradicted.
	Corrections uint64
	// StoreReads counts reads of the store on fallbacks.
	StoreReads uint64
	// Dropped counts records not kept because the cache was full
	// (MaxMembers, MaxExports).
	Dropped uint64
	// Age is the time since the feed last proved the cache current (Never
	// before the first listing); Rev the store revision it reflects.
	Age              time.Duration
	Rev              int64
	Members, Exports int
}

// entryState is what the cache knows of an entry, member or export.
type entryState struct {
	rev int64 // the record's revision (a tombstone's: the read's)
	// at is the store revision a fallback read that wrote the entry saw
	// (0 for the feed's entries, which are known as of the cache's rev).
	at        int64
	confirmed time.Time // a read or the peer itself confirmed it
	suspect   bool      // a peer contradicted it: stale until rewritten
	gone      bool      // a read found no record (tombstone until the feed passes rev)
	goneAt    time.Time // when the read found nothing
}

// state is e's entryState; nil without an entry.
func (e *memberEntry) state() *entryState {
	if e == nil {
		return nil
	}
	return &e.entryState
}

// state is e's entryState; nil without an entry.
func (e *exportEntry) state() *entryState {
	if e == nil {
		return nil
	}
	return &e.entryState
}

type memberEntry struct {
	entryState
	m            Member
	lease        int64
	observed     uint64 // the epoch the peer itself last showed, if any
	observedWhen time.Time
}

// exportKey names an export in the cache (a struct, so that a lookup
// builds no string).
type exportKey struct{ owner, name string }

func keyOf(e *Export) exportKey { return exportKey{e.Owner, e.Name} }

type exportEntry struct {
	entryState
	e Export
}

// NewCache returns an empty cache: every lookup falls back until the feed
// loads a listing.
func NewCache(cfg CacheConfig) (*Cache, error) {
	if cfg.Budget <= 0 {
		return nil, fmt.Errorf("%w: staleness budget %v must be positive", ErrConfig, cfg.Budget)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.RefreshTimeout <= 0 {
		cfg.RefreshTimeout = min(cfg.Budget, 2*time.Second)
	}
	return &Cache{budget: cfg.Budget, store: cfg.Store, timeout: cfg.RefreshTimeout, now: cfg.Clock,
		members: make(map[string]*memberEntry), exports: make(map[exportKey]*exportEntry)}, nil
}

// Budget is the staleness budget.
func (c *Cache) Budget() time.Duration { return c.budget }

// Now reads the cache's clock.
func (c *Cache) Now() time.Time { return c.now() }

func ageSince(now, t time.Time) time.Duration {
	if t.IsZero() {
		return Never
	}
	if d := now.Sub(t); d > 0 {
		return d
	}
	return 0
}

// entryAge is the age of an entry confirmed at confirmed, given the feed's
// last sync; suspect entries are older than any budget.
func (c *Cache) entryAgeLocked(now, confirmed time.Time, suspect bool) time.Duration {
	if suspect {
		return Never
	}
	t := confirmed
	if c.primed && c.syncedAt.After(t) {
		t = c.syncedAt
	}
	return ageSince(now, t)
}

// Load replaces the whole cache with a listing of the store at rev. A
// fallback read in flight that saw an older revision is not written back
// over it.
func (c *Cache) Load(members []Event, rev int64) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.members
	c.members = make(map[string]*memberEntry, len(members))
	c.exports = make(map[exportKey]*exportEntry)
	for _, ev := range members {
		switch {
		case ev.Member != nil && len(c.members) >= MaxMembers, ev.Export != nil && len(c.exports) >= MaxExports:
			c.st.dropped.Add(1)
		case ev.Member != nil:
			e := &memberEntry{m: *ev.Member, lease: ev.Lease, entryState: entryState{rev: ev.Rev}}
			if o := old[ev.Member.ID]; o != nil && o.observed != 0 {
				e.observed, e.observedWhen = o.observed, o.observedWhen
			}
			c.members[ev.Member.ID] = e
		case ev.Export != nil:
			c.exports[keyOf(ev.Export)] = &exportEntry{e: *ev.Export, entryState: entryState{rev: ev.Rev}}
		}
	}
	c.primed, c.syncedAt, c.rev = true, now, rev
}

// Apply applies one change from the feed. A change older than what a
// fallback read already put in the cache is ignored.
func (c *Cache) Apply(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The feed has delivered ev, whatever becomes of it here: a fallback
	// read older than ev.Rev no longer says anything new (a delete leaves
	// no entry behind, so the revision is all that remembers it).
	if ev.Rev > c.rev {
		c.rev = ev.Rev
	}
	switch {
	case ev.Member != nil:
		id := ev.Member.ID
		cur := c.members[id]
		if cur != nil && cur.rev > ev.Rev {
			return
		}
		if ev.Delete {
			delete(c.members, id)
			return
		}
		if cur == nil && len(c.members) >= MaxMembers {
			c.st.dropped.Add(1)
			return
		}
		e := &memberEntry{m: *ev.Member, lease: ev.Lease, entryState: entryState{rev: ev.Rev}}
		c.members[id] = e
	case ev.Export != nil:
		k := keyOf(ev.Export)
		cur := c.exports[k]
		if cur != nil && cur.rev > ev.Rev {
			return
		}
		if ev.Delete {
			delete(c.exports, k)
			return
		}
		if cur == nil && len(c.exports) >= MaxExports {
			c.st.dropped.Add(1)
			return
		}
		c.exports[k] = &exportEntry{e: *ev.Export, entryState: entryState{rev: ev.Rev}}
	}
}

// writeBackLocked says whether a store read (of the store at revision at,
// finding a record of revision rec or none) is written over cur, the
// entry the cache holds (nil: none; full: no room for another).
//
// The read ran without the lock, so the feed may have passed it: it is
// outdated if the feed has delivered a later revision (the cache's rev:
// every key as of rev, so a delete or a listing without the key, which
// leave no entry behind, are remembered by it), if a later read wrote the
// entry (its at), or if it found a record older than the entry's.
// Comparing revisions, rather than keeping tombstones of deletes for as
// long as a read may take, is exact whatever made the read late and adds
// nothing to bound or sweep. An outdated read is not written back; but
// finding the very record the cache holds still proves that record
// current now, and a suspect one right (until a peer says otherwise
// again), or it would fall back forever.
func (c *Cache) writeBackLocked(cur *entryState, at, rec int64, found, full bool, now time.Time) bool {
	var curAt, curRev int64
	if cur != nil {
		curAt, curRev = cur.at, cur.rev
	}
	switch {
	case at < c.rev || at < curAt || found && rec < curRev:
		if cur != nil && found && !cur.gone && cur.rev == rec {
			cur.confirmed, cur.suspect = now, false
		}
		return false
	case cur == nil && full:
		c.st.dropped.Add(1)
		return false
	}
	return true
}

// tombstone is the entry of a read, of the store at revision at, that
// found no record.
func tombstone(at int64, now time.Time) entryState {
	return entryState{rev: at, at: at, gone: true, goneAt: now}
}

// Synced records that the feed has delivered everything up to rev: the
// whole cache is current as of now. Tombstones the feed has passed are
// dropped.
func (c *Cache) Synced(rev int64) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev > c.rev {
		c.rev = rev
	}
	c.syncedAt = now
	for id, e := range c.members {
		if e.gone && e.rev <= c.rev {
			delete(c.members, id)
		}
	}
	for k, e := range c.exports {
		if e.gone && e.rev <= c.rev {
			delete(c.exports, k)
		}
	}
}

// MemberView is a member as a lookup answers it.
type MemberView struct {
	Member Member
	// Age is how old the answer is; Source where it came from.
	Age    time.Duration
	Source Source
	// Lease is the registration's lease in the store (0 unknown).
	Lease int64
}

// ExportView is a catalog entry as a lookup answers it.
type ExportView struct {
	Export Export
	Age    time.Duration
	Source Source
}

func (c *Cache) member(id string, now time.Time) (e memberEntry, ok bool, age time.Duration) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p := c.members[id]
	if p == nil {
		if !c.primed {
			return memberEntry{}, false, Never
		}
		return memberEntry{}, false, ageSince(now, c.syncedAt)
	}
	if p.gone {
		return memberEntry{}, false, c.entryAgeLocked(now, p.goneAt, false)
	}
	return *p, true, c.entryAgeLocked(now, p.confirmed, p.suspect)
}

func (c *Cache) export(key exportKey, now time.Time) (e exportEntry, ok bool, age time.Duration) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p := c.exports[key]
	if p == nil {
		if !c.primed {
			return exportEntry{}, false, Never
		}
		return exportEntry{}, false, ageSince(now, c.syncedAt)
	}
	if p.gone {
		return exportEntry{}, false, c.entryAgeLocked(now, p.goneAt, false)
	}
	return *p, true, c.entryAgeLocked(now, p.confirmed, p.suspect)
}

func fmtAge(d time.Duration) string {
	if d == Never {
		return "never synced"
	}
	return d.Round(time.Millisecond).String() + " old"
}

// ResolveMember looks daemon id up for a request in lane. Within the
// budget the cache answers (a hit; ErrNotFound when it knows no such
// daemon). Past it: catalog-first reads the store (and fails
// ErrUnavailable when the store does not answer in time), stream-first
// answers SourcePeer with the cache's last entry for the caller to confirm
// at the peer (ErrUnavailable when there is none), hybrid-cache-first does
// the latter when it has an entry and the former otherwise. What a store
// read found is written back unless the feed delivered a newer revision
// while it was in flight (writeBackLocked).
func (c *Cache) ResolveMember(ctx context.Context, lane Lane, id string) (MemberView, error) {
	c.st.lookups.Add(1)
	e, ok, age := c.member(id, c.now())
	if age <= c.budget {
		c.st.hits.Add(1)
		if !ok {
			c.st.notFound.Add(1)
			return MemberView{Age: age, Source: SourceCache}, fmt.Errorf("%w: no daemon %q in the directory (%s)", ErrNotFound, id, fmtAge(age))
		}
		return MemberView{Member: e.m, Age: age, Source: SourceCache, Lease: e.lease}, nil
	}
	if lane == LaneStreamFirst || (lane == LaneHybridCacheFirst && ok) {
		c.st.fallbackPeer.Add(1)
		if !ok {
			c.st.unavailable.Add(1)
			return MemberView{Age: age, Source: SourcePeer}, fmt.Errorf("%w: daemon %q is not in the directory cache, which is %s (budget %v), and a %s lookup does not wait on the store",
				ErrUnavailable, id, fmtAge(age), c.budget, lane)
		}
		return MemberView{Member: e.m, Age: age, Source: SourcePeer, Lease: e.lease}, nil
	}
	c.st.fallbackStore.Add(1)
	if c.store == nil {
		c.st.unavailable.Add(1)
		return MemberView{Age: age, Source: SourceStore}, fmt.Errorf("%w: the directory entry for %q is %s (budget %v) and there is no store to refresh from", ErrUnavailable, id, fmtAge(age), c.budget)
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	c.st.storeReads.Add(1)
	r, err := c.store.GetMember(rctx, id)
	if err != nil {
		c.st.unavailable.Add(1)
		return MemberView{Age: age, Source: SourceStore}, fmt.Errorf("%w: the directory entry for %q is %s (budget %v) and the store did not answer: %v", ErrUnavailable, id, fmtAge(age), c.budget, err)
	}
	at := max(r.At, r.Rev) // the record is at least as new as itself
	now := c.now()
	c.mu.Lock()
	cur := c.members[id]
	switch {
	case !c.writeBackLocked(cur.state(), at, r.Rev, r.Found, len(c.members) >= MaxMembers, now):
	case r.Found:
		ne := &memberEntry{m: r.Member, lease: r.Lease, entryState: entryState{rev: r.Rev, at: at, confirmed: now}}
		if cur != nil {
			ne.observed, ne.observedWhen = cur.observed, cur.observedWhen
		}
		c.members[id] = ne
	default:
		c.members[id] = &memberEntry{m: Member{ID: id}, entryState: tombstone(at, now)}
	}
	c.mu.Unlock()
	if !r.Found {
		c.st.notFound.Add(1)
		return MemberView{Source: SourceStore}, fmt.Errorf("%w: no daemon %q registered", ErrNotFound, id)
	}
	return MemberView{Member: r.Member, Source: SourceStore, Lease: r.Lease}, nil
}

// ResolveExport looks the export owner/name up for a request in lane, with
// the posture of ResolveMember.
func (c *Cache) ResolveExport(ctx context.Context, lane Lane, owner, name string) (ExportView, error) {
	c.st.lookups.Add(1)
	k := exportKey{owner, name}
	e, ok, age := c.export(k, c.now())
	if age <= c.budget {
		c.st.hits.Add(1)
		if !ok {
			c.st.notFound.Add(1)
			return ExportView{Age: age, Source: SourceCache}, fmt.Errorf("%w: no export %q in the directory (%s)", ErrNotFound, owner+"/"+name, fmtAge(age))
		}
		return ExportView{Export: e.e, Age: age, Source: SourceCache}, nil
	}
	if lane == LaneStreamFirst || (lane == LaneHybridCacheFirst && ok) {
		c.st.fallbackPeer.Add(1)
		if !ok {
			c.st.unavailable.Add(1)
			return ExportView{Age: age, Source: SourcePeer}, fmt.Errorf("%w: export %q is not in the directory cache, which is %s (budget %v), and a %s lookup does not wait on the store",
				ErrUnavailable, owner+"/"+name, fmtAge(age), c.budget, lane)
		}
		return ExportView{Export: e.e, Age: age, Source: SourcePeer}, nil
	}
	c.st.fallbackStore.Add(1)
	if c.store == nil {
		c.st.unavailable.Add(1)
		return ExportView{Age: age, Source: SourceStore}, fmt.Errorf("%w: the directory entry for %q is %s (budget %v) and there is no store to refresh from", ErrUnavailable, owner+"/"+name, fmtAge(age), c.budget)
	}
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	c.st.storeReads.Add(1)
	r, err := c.store.GetExport(rctx, owner, name)
	if err != nil {
		c.st.unavailable.Add(1)
		return ExportView{Age: age, Source: SourceStore}, fmt.Errorf("%w: the directory entry for %q is %s (budget %v) and the store did not answer: %v", ErrUnavailable, owner+"/"+name, fmtAge(age), c.budget, err)
	}
	at := max(r.At, r.Rev)
	now := c.now()
	c.mu.Lock()
	cur := c.exports[k]
	switch {
	case !c.writeBackLocked(cur.state(), at, r.Rev, r.Found, len(c.exports) >= MaxExports, now):
	case r.Found:
		c.exports[k] = &exportEntry{e: r.Export, entryState: entryState{rev: r.Rev, at: at, confirmed: now}}
	default:
		c.exports[k] = &exportEntry{e: Export{Owner: owner, Name: name}, entryState: tombstone(at, now)}
	}
	c.mu.Unlock()
	if !r.Found {
		c.st.notFound.Add(1)
		return ExportView{Source: SourceStore}, fmt.Errorf("%w: no export %q registered", ErrNotFound, owner+"/"+name)
	}
	return ExportView{Export: r.Export, Source: SourceStore}, nil
}

// Observe records what daemon id itself showed (its handshake, or the
// epoch of a token it issued). The same epoch as the entry confirms the
// entry as of now; another epoch means the entry is out of date: it is
// marked suspect, so that the next lookup past it falls back, and the
// correction is counted. It reports whether the entry was corrected.
func (c *Cache) Observe(id string, epoch uint64) bool {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.members[id]
	if e == nil || e.gone {
		return false
	}
	e.observed, e.observedWhen = epoch, now
	if e.m.Epoch == epoch {
		e.confirmed, e.suspect = now, false
		return false
	}
	if !e.suspect {
		e.suspect = true
		c.st.corrections.Add(1)
		return true
	}
	return false
}

// Unreachable records that the address the cache gave for id did not
// answer as id: the entry is marked suspect until the store rewrites it.
func (c *Cache) Unreachable(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.members[id]
	if e == nil || e.gone || e.suspect {
		return false
	}
	e.suspect = true
	c.st.corrections.Add(1)
	return true
}

// ExportGone records that the owner refused owner/name as not exported
// (revoked, or never there): the catalog entry is marked suspect.
func (c *Cache) ExportGone(owner, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.exports[exportKey{owner, name}]
	if e == nil || e.gone || e.suspect {
		return false
	}
	e.suspect = true
	c.st.corrections.Add(1)
	return true
}

// Members returns every cached member (suspect ones included), sorted by
// id, with each one's age.
func (c *Cache) Members() []MemberView {
	now := c.now()
	c.mu.RLock()
	out := make([]MemberView, 0, len(c.members))
	for _, e := range c.members {
		if e.gone {
			continue
		}
		out = append(out, MemberView{Member: e.m, Age: c.entryAgeLocked(now, e.confirmed, e.suspect), Source: SourceCache, Lease: e.lease})
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b MemberView) int { return strings.Compare(a.Member.ID, b.Member.ID) })
	return out
}

// Exports returns every cached export, sorted by key.
func (c *Cache) Exports() []ExportView {
	now := c.now()
	c.mu.RLock()
	out := make([]ExportView, 0, len(c.exports))
	for _, e := range c.exports {
		if e.gone {
			continue
		}
		out = append(out, ExportView{Export: e.e, Age: c.entryAgeLocked(now, e.confirmed, e.suspect), Source: SourceCache})
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b ExportView) int { return strings.Compare(a.Export.Key(), b.Export.Key()) })
	return out
}

// Peek returns the cached member id whatever its age (the transports'
// address book: they dial what the directory last knew, and the peer's
// handshake decides).
func (c *Cache) Peek(id string) (Member, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e := c.members[id]
	if e == nil || e.gone {
		return Member{}, false
	}
	return e.m, true
}

// Age is how long ago the feed last proved the whole cache current
// (Never before its first listing): Stats' Age, without counting the
// entries, for the callers that ask on every message.
func (c *Cache) Age() time.Duration {
	now := c.now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.primed {
		return Never
	}
	return ageSince(now, c.syncedAt)
}

// Stats returns the counters and the cache's age.
func (c *Cache) Stats() CacheStats {
	now := c.now()
	c.mu.RLock()
	s := CacheStats{Age: Never, Rev: c.rev}
	if c.primed {
		s.Age = ageSince(now, c.syncedAt)
	}
	for _, e := range c.members {
		if !e.gone {
			s.Members++
		}
	}
	for _, e := range c.exports {
		if !e.gone {
			s.Exports++
		}
	}
	c.mu.RUnlock()
	s.Lookups, s.Hits, s.NotFound = c.st.lookups.Load(), c.st.hits.Load(), c.st.notFound.Load()
	s.FallbackStore, s.FallbackPeer = c.st.fallbackStore.Load(), c.st.fallbackPeer.Load()
	s.Unavailable, s.Corrections, s.StoreReads = c.st.unavailable.Load(), c.st.corrections.Load(), c.st.storeReads.Load()
	s.Dropped = c.st.dropped.Load()
	return s
}
