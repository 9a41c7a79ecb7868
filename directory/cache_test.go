package directory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeStore answers from a map and counts its reads; with fail set it
// fails every read, with block set it waits for the context.
type fakeStore struct {
	mu      sync.Mutex // guards members, exports, rev
	members map[string]Member
	exports map[string]Export
	rev     int64
	reads   atomic.Int64
	fail    atomic.Bool
	block   atomic.Bool
}

func (s *fakeStore) GetMember(ctx context.Context, id string) (Member, int64, int64, bool, error) {
	s.reads.Add(1)
	if s.block.Load() {
		<-ctx.Done()
		return Member{}, 0, 0, false, ctx.Err()
	}
	if s.fail.Load() {
		return Member{}, 0, 0, false, errors.New("store down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.members[id]
	return m, 7, s.rev, ok, nil
}

func (s *fakeStore) GetExport(ctx context.Context, owner, name string) (Export, int64, bool, error) {
	s.reads.Add(1)
	if s.block.Load() {
		<-ctx.Done()
		return Export{}, 0, false, ctx.Err()
	}
	if s.fail.Load() {
		return Export{}, 0, false, errors.New("store down")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.exports[owner+"/"+name]
	return e, s.rev, ok, nil
}

func member(id string, epoch uint64) Member {
	return Member{ID: id, Epoch: epoch, Addr: "127.0.0.1:1", Caps: []string{"tcp"}}
}

func newTestCache(t *testing.T, st *fakeStore, clk *fakeClock) *Cache {
	t.Helper()
	c, err := NewCache(CacheConfig{Budget: 2 * time.Second, Store: st, Clock: clk.Now, RefreshTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCacheAge: before a listing everything is older than any budget; a
// listing and each feed event make the cache current; time passing with
// no word from the feed ages every entry alike.
func TestCacheAge(t *testing.T) {
	clk := newFakeClock()
	st := &fakeStore{}
	st.fail.Store(true)
	c := newTestCache(t, st, clk)
	if s := c.Stats(); s.Age != Never {
		t.Fatalf("age before listing = %v", s.Age)
	}
	if _, err := c.ResolveMember(context.Background(), LaneCatalogFirst, "a"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("lookup before any listing with the store down: %v", err)
	}
	a := member("a", 1)
	c.Load([]Event{{Member: &a, Lease: 5, Rev: 10}}, 10)
	clk.Advance(time.Second)
	v, err := c.ResolveMember(context.Background(), LaneCatalogFirst, "a")
	if err != nil || v.Source != SourceCache || v.Age != time.Second || v.Member.Epoch != 1 || v.Lease != 5 {
		t.Fatalf("hit = %+v, %v", v, err)
	}
	clk.Advance(1500 * time.Millisecond)
	c.Synced(11) // a progress report
	if v, _ := c.ResolveMember(context.Background(), LaneCatalogFirst, "a"); v.Age != 0 || v.Source != SourceCache {
		t.Fatalf("after sync: %+v", v)
	}
	if s := c.Stats(); s.Lookups != 3 || s.Hits != 2 || s.FallbackStore != 1 || s.Unavailable != 1 || s.Members != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestCacheLanes: within the budget every lane is served by the cache
// and nothing reads the store; past it, catalog-first reads the store,
// stream-first never does (it hands the stale entry to the peer, or fails
// closed when there is none), hybrid-cache-first goes to the peer when it
// has an entry and to the store when not.
func TestCacheLanes(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	a2 := member("a", 2)
	st := &fakeStore{members: map[string]Member{"a": a2, "n": member("n", 9)}, rev: 20}
	c := newTestCache(t, st, clk)
	a := member("a", 1)
	c.Load([]Event{{Member: &a, Rev: 10}}, 10)

	for _, lane := range []Lane{LaneCatalogFirst, LaneStreamFirst, LaneHybridCacheFirst} {
		if v, err := c.ResolveMember(ctx, lane, "a"); err != nil || v.Source != SourceCache {
			t.Fatalf("%v within budget: %+v %v", lane, v, err)
		}
		if _, err := c.ResolveMember(ctx, lane, "zz"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%v unknown within budget: %v", lane, err)
		}
	}
	if st.reads.Load() != 0 {
		t.Fatalf("store read %d times within the budget", st.reads.Load())
	}

	clk.Advance(3 * time.Second)
	// stream-first: the store would hang; it must not be asked.
	st.block.Store(true)
	v, err := c.ResolveMember(ctx, LaneStreamFirst, "a")
	if err != nil || v.Source != SourcePeer || v.Member.Epoch != 1 || v.Age != 3*time.Second {
		t.Fatalf("stream-first past budget: %+v %v", v, err)
	}
	if _, err := c.ResolveMember(ctx, LaneStreamFirst, "n"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("stream-first, nothing cached, past budget: %v", err)
	}
	if v, err := c.ResolveMember(ctx, LaneHybridCacheFirst, "a"); err != nil || v.Source != SourcePeer {
		t.Fatalf("hybrid with an entry: %+v %v", v, err)
	}
	if st.reads.Load() != 0 {
		t.Fatalf("stream-first or hybrid with an entry read the store (%d)", st.reads.Load())
	}
	// catalog-first with the store hanging: fails closed within the
	// refresh timeout.
	start := time.Now()
	if _, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("catalog-first with the store hanging: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("catalog-first waited %v on a hanging store", d)
	}
	st.block.Store(false)
	// hybrid without an entry goes to the store.
	if v, err := c.ResolveMember(ctx, LaneHybridCacheFirst, "n"); err != nil || v.Source != SourceStore || v.Member.Epoch != 9 {
		t.Fatalf("hybrid without an entry: %+v %v", v, err)
	}
	// catalog-first refreshes the entry: the store's epoch, and the entry
	// is current again for every lane.
	if v, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); err != nil || v.Source != SourceStore || v.Member.Epoch != 2 {
		t.Fatalf("catalog-first refresh: %+v %v", v, err)
	}
	if v, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); err != nil || v.Source != SourceCache || v.Member.Epoch != 2 {
		t.Fatalf("after refresh: %+v %v", v, err)
	}
	// a refresh that finds nothing is an answer too (not found, within the
	// budget, until the feed passes it).
	st.mu.Lock()
	delete(st.members, "a")
	st.rev = 30
	st.mu.Unlock()
	clk.Advance(3 * time.Second)
	if _, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("refresh of a deleted member: %v", err)
	}
	if _, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("tombstone within budget: %v", err)
	}
	// a feed event older than the refresh does not bring it back.
	c.Apply(Event{Member: &a, Rev: 25})
	if _, ok := c.Peek("a"); ok {
		t.Fatal("an event older than a refresh overwrote it")
	}
	s := c.Stats()
	if s.FallbackPeer != 3 || s.FallbackStore != 4 || s.Unavailable != 2 || s.StoreReads != 4 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestCacheCorrections: a peer showing another epoch, an address that did
// not answer and an export its owner refused each mark the entry stale
// (counted once), so that the next lookup falls back; the feed's rewrite
// clears it.
func TestCacheCorrections(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	st := &fakeStore{members: map[string]Member{}, exports: map[string]Export{}, rev: 1}
	st.fail.Store(true)
	c := newTestCache(t, st, clk)
	a := member("a", 1)
	b := member("b", 4)
	x := Export{Owner: "a", Name: "w", Size: 4096, Rights: RightRead, Epoch: 1, Generation: 1}
	c.Load([]Event{{Member: &a, Rev: 2}, {Member: &b, Rev: 3}, {Export: &x, Rev: 4}}, 4)

	if c.Observe("a", 1) {
		t.Fatal("same epoch counted as a correction")
	}
	if !c.Observe("a", 2) || c.Observe("a", 2) {
		t.Fatal("another epoch: want one correction")
	}
	if _, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("stale entry with the store down: %v", err)
	}
	if v, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); err != nil || v.Source != SourcePeer {
		t.Fatalf("stale entry, stream-first: %+v %v", v, err)
	}
	a2 := member("a", 2)
	c.Apply(Event{Member: &a2, Rev: 5})
	c.Synced(5)
	if v, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); err != nil || v.Source != SourceCache || v.Member.Epoch != 2 {
		t.Fatalf("after the feed's rewrite: %+v %v", v, err)
	}

	if !c.Unreachable("b") || c.Unreachable("b") {
		t.Fatal("unreachable: want one correction")
	}
	if v, _ := c.ResolveMember(ctx, LaneStreamFirst, "b"); v.Source != SourcePeer {
		t.Fatalf("unreachable entry: %+v", v)
	}
	if !c.ExportGone("a", "w") {
		t.Fatal("export gone: no correction")
	}
	if _, err := c.ResolveExport(ctx, LaneCatalogFirst, "a", "w"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("stale export, store down: %v", err)
	}
	c.Apply(Event{Delete: true, Export: &Export{Owner: "a", Name: "w"}, Rev: 6})
	c.Synced(6)
	if _, err := c.ResolveExport(ctx, LaneCatalogFirst, "a", "w"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the feed's delete: %v", err)
	}
	if s := c.Stats(); s.Corrections != 3 {
		t.Fatalf("corrections = %d, want 3", s.Corrections)
	}
}

func TestParseLane(t *testing.T) {
	for in, want := range map[string]Lane{"": LaneCatalogFirst, "catalog-first": LaneCatalogFirst,
		"stream-first": LaneStreamFirst, "hybrid-cache-first": LaneHybridCacheFirst} {
		if got, err := ParseLane(in); err != nil || got != want {
			t.Errorf("ParseLane(%q) = %v, %v", in, got, err)
		}
		if want.String() == "" {
			t.Errorf("%d has no name", want)
		}
	}
	for _, in := range []string{"Stream-First", "fast", "catalog-first "} {
		if _, err := ParseLane(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseLane(%q): %v", in, err)
		}
	}
}

// TestCacheHitAllocs: a hit allocates nothing (lookups run per open, many
// per second on a busy host).
func TestCacheHitAllocs(t *testing.T) {
	clk := newFakeClock()
	c := newTestCache(t, &fakeStore{}, clk)
	a := member("a", 1)
	x := Export{Owner: "a", Name: "w", Size: 4096, Rights: RightRead, Epoch: 1, Generation: 1}
	c.Load([]Event{{Member: &a, Rev: 1}, {Export: &x, Rev: 2}}, 2)
	ctx := context.Background()
	n := testing.AllocsPerRun(1000, func() {
		if _, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ResolveExport(ctx, LaneCatalogFirst, "a", "w"); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("a cache hit allocates %v times", n)
	}
}

// TestCacheBounded: the store is outside input; the cache keeps at most
// MaxMembers members and counts what it drops.
func TestCacheBounded(t *testing.T) {
	c := newTestCache(t, &fakeStore{}, newFakeClock())
	evs := make([]Event, MaxMembers+10)
	ms := make([]Member, len(evs))
	for i := range evs {
		ms[i] = member(fmt.Sprint("m", i), 1)
		evs[i] = Event{Member: &ms[i], Rev: int64(i + 1)}
	}
	c.Load(evs, int64(len(evs)))
	extra := member("late", 1)
	c.Apply(Event{Member: &extra, Rev: int64(len(evs) + 1)})
	if s := c.Stats(); s.Members != MaxMembers || s.Dropped != 11 {
		t.Fatalf("members %d, dropped %d", s.Members, s.Dropped)
	}
}
