package directory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func newFakeClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_700_000_000, 0)) }

// fakeStore answers from a map and counts its reads; with fail set it
// fails every read, with block set it waits for the context. A gate set
// by hold holds the next read after it took its answer, so that a test
// changes the cache while the read is in flight.
type fakeStore struct {
	mu      sync.Mutex // guards members, exports, rev, recRev, gate
	members map[string]Member
	exports map[string]Export
	// rev is the store's revision; recRev a record's modification
	// revision ("id" or "owner/name"), rev when not set.
	rev    int64
	recRev map[string]int64
	gate   *readGate
	reads  atomic.Int64
	fail   atomic.Bool
	block  atomic.Bool
}

// readGate holds one read of a fakeStore: the read reports on taken that
// it has its answer, and returns it once release is closed (whatever its
// context says, so that a slow test machine cannot turn the held read
// into a timeout).
type readGate struct {
	taken   chan struct{}
	release chan struct{}
}

// hold gates the next read.
func (s *fakeStore) hold() *readGate {
	g := &readGate{taken: make(chan struct{}, 1), release: make(chan struct{})}
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
	return g
}

// answer takes what a read of key finds: the record's revision and the
// store's, and the gate the read must pass (nil for none).
func (s *fakeStore) answer(key string) (rec, at int64, g *readGate) {
	rec, ok := s.recRev[key]
	if !ok {
		rec = s.rev
	}
	g, s.gate = s.gate, nil
	return rec, s.rev, g
}

func (g *readGate) pass() {
	if g != nil {
		g.taken <- struct{}{}
		<-g.release
	}
}

func (s *fakeStore) GetMember(ctx context.Context, id string) (MemberRead, error) {
	s.reads.Add(1)
	if s.block.Load() {
		<-ctx.Done()
		return MemberRead{}, ctx.Err()
	}
	if s.fail.Load() {
		return MemberRead{}, errors.New("store down")
	}
	s.mu.Lock()
	m, ok := s.members[id]
	rec, at, g := s.answer(id)
	s.mu.Unlock()
	g.pass()
	if !ok {
		return MemberRead{At: at}, nil
	}
	return MemberRead{Found: true, Member: m, Lease: 7, Rev: rec, At: at}, nil
}

func (s *fakeStore) GetExport(ctx context.Context, owner, name string) (ExportRead, error) {
	s.reads.Add(1)
	if s.block.Load() {
		<-ctx.Done()
		return ExportRead{}, ctx.Err()
	}
	if s.fail.Load() {
		return ExportRead{}, errors.New("store down")
	}
	s.mu.Lock()
	e, ok := s.exports[owner+"/"+name]
	rec, at, g := s.answer(owner + "/" + name)
	s.mu.Unlock()
	g.pass()
	if !ok {
		return ExportRead{At: at}, nil
	}
	return ExportRead{Found: true, Export: e, Rev: rec, At: at}, nil
}

func member(id string, epoch uint64) Member {
	return Member{ID: id, Epoch: epoch, Addr: "127.0.0.1:1", Caps: []string{"tcp"}}
}

func newTestCache(t *testing.T, st *fakeStore, clk *testutil.Clock) *Cache {
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

// heldRead starts lookup, which must read st, and returns once the read
// has taken its answer and is held; finish lets the read go and returns
// the lookup's error.
func heldRead(t *testing.T, st *fakeStore, lookup func() error) (finish func() error) {
	t.Helper()
	g := st.hold()
	done := make(chan error, 1)
	go func() { done <- lookup() }()
	select {
	case <-g.taken:
	case err := <-done:
		t.Fatalf("the lookup did not read the store: %v", err)
	}
	return func() error {
		close(g.release)
		return <-done
	}
}

// raceFixture is a cache primed at revision 20 with member a (rev 10)
// and its export a/w (rev 11), the store holding the same, and the clock
// past the budget: lookups read the store.
func raceFixture(t *testing.T) (*Cache, *fakeStore, *testutil.Clock, Member, Export) {
	t.Helper()
	clk := newFakeClock()
	a := member("a", 1)
	x := Export{Owner: "a", Name: "w", Size: 4096, Rights: RightRead, Epoch: 1, Generation: 1}
	st := &fakeStore{members: map[string]Member{"a": a}, exports: map[string]Export{"a/w": x}, rev: 20,
		recRev: map[string]int64{"a": 10, "a/w": 11}}
	c := newTestCache(t, st, clk)
	c.Load([]Event{{Member: &a, Lease: 7, Rev: 10}, {Export: &x, Rev: 11}}, 20)
	clk.Advance(3 * time.Second)
	return c, st, clk, a, x
}

func resolveA(c *Cache) func() error {
	return func() error { _, err := c.ResolveMember(context.Background(), LaneCatalogFirst, "a"); return err }
}

func resolveAW(c *Cache) func() error {
	return func() error { _, err := c.ResolveExport(context.Background(), LaneCatalogFirst, "a", "w"); return err }
}

// TestCacheReadRacesDelete: a fallback read that found a record, still in
// flight when the feed deletes the key, does not put the record back:
// the feed's delete is newer than what the read saw, whether or not the
// feed's progress report follows the delete before the read returns.
// With the report the cache answers "not found" as a hit; without it, the
// key is simply not cached (a stream-first lookup past the budget fails
// closed instead of serving a ghost).
func TestCacheReadRacesDelete(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(fmt.Sprintf("synced=%v", synced), func(t *testing.T) {
			ctx := context.Background()
			c, st, clk, _, _ := raceFixture(t)
			finish := heldRead(t, st, resolveA(c))
			st.mu.Lock()
			delete(st.members, "a")
			st.mu.Unlock()
			c.Apply(Event{Delete: true, Member: &Member{ID: "a"}, Rev: 21})
			if synced {
				c.Synced(21)
			}
			if err := finish(); err != nil {
				t.Fatalf("the lookup in flight: %v", err)
			}
			clk.Advance(3 * time.Second) // past the budget again after the sync
			finish = heldRead(t, st, resolveAW(c))
			st.mu.Lock()
			delete(st.exports, "a/w")
			st.mu.Unlock()
			c.Apply(Event{Delete: true, Export: &Export{Owner: "a", Name: "w"}, Rev: 22})
			if synced {
				c.Synced(22)
			}
			if err := finish(); err != nil {
				t.Fatalf("the export lookup in flight: %v", err)
			}
			if m, ok := c.Peek("a"); ok {
				t.Errorf("the deleted member is back: %+v", m)
			}
			if xs := c.Exports(); len(xs) != 0 {
				t.Fatalf("the deleted export is back: %+v", xs)
			}
			if s := c.Stats(); s.Members != 0 || s.Exports != 0 || s.Rev != 22 {
				t.Fatalf("after the deletes: %d members, %d exports, rev %d", s.Members, s.Exports, s.Rev)
			}
			want := ErrUnavailable
			if synced {
				want = ErrNotFound
			}
			if v, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); !errors.Is(err, want) {
				t.Fatalf("member a after its delete: %+v %v, want %v", v, err, want)
			}
			if v, err := c.ResolveExport(ctx, LaneStreamFirst, "a", "w"); !errors.Is(err, want) {
				t.Fatalf("export a/w after its delete: %+v %v, want %v", v, err, want)
			}
		})
	}
}

// TestCacheReadRacesLoad: a fresh listing that no longer holds a key
// wins over a fallback read of it begun before the listing.
func TestCacheReadRacesLoad(t *testing.T) {
	ctx := context.Background()
	c, st, _, _, _ := raceFixture(t)
	finishM := heldRead(t, st, resolveA(c))
	finishX := heldRead(t, st, resolveAW(c))
	b := member("b", 3)
	st.mu.Lock()
	st.members = map[string]Member{"b": b}
	st.exports = map[string]Export{}
	st.rev = 23
	st.mu.Unlock()
	c.Load([]Event{{Member: &b, Rev: 23}}, 23) // a relisting after a broken watch
	if err := finishM(); err != nil {
		t.Fatal(err)
	}
	if err := finishX(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ResolveMember(ctx, LaneCatalogFirst, "a"); !errors.Is(err, ErrNotFound) || v.Source != SourceCache {
		t.Errorf("member a, not in the listing: %+v %v", v, err)
	}
	if v, err := c.ResolveExport(ctx, LaneCatalogFirst, "a", "w"); !errors.Is(err, ErrNotFound) || v.Source != SourceCache {
		t.Fatalf("export a/w, not in the listing: %+v %v", v, err)
	}
	if v, err := c.ResolveMember(ctx, LaneCatalogFirst, "b"); err != nil || v.Source != SourceCache || v.Member.Epoch != 3 {
		t.Fatalf("member b: %+v %v", v, err)
	}
}

// TestCacheReadConfirmsSuspect: a suspect entry (a peer contradicted it)
// that a fallback read finds unchanged in the store is confirmed, and
// served from the cache again, even when the feed moved on (other keys)
// while the read was in flight: otherwise it would fall back forever.
func TestCacheReadConfirmsSuspect(t *testing.T) {
	ctx := context.Background()
	c, st, _, _, x := raceFixture(t)
	c.Synced(20) // current again, then contradicted
	if !c.Observe("a", 2) || !c.ExportGone("a", "w") {
		t.Fatal("no correction")
	}
	finishM := heldRead(t, st, resolveA(c))
	finishX := heldRead(t, st, resolveAW(c))
	b := member("b", 3)
	c.Apply(Event{Member: &b, Rev: 25})
	c.Synced(25)
	if err := finishM(); err != nil {
		t.Fatal(err)
	}
	if err := finishX(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); err != nil || v.Source != SourceCache || v.Member.Epoch != 1 || v.Age != 0 {
		t.Fatalf("member a after the read confirmed it: %+v %v", v, err)
	}
	if v, err := c.ResolveExport(ctx, LaneStreamFirst, "a", "w"); err != nil || v.Source != SourceCache || v.Export != x {
		t.Fatalf("export a/w after the read confirmed it: %+v %v", v, err)
	}
	if n := st.reads.Load(); n != 2 {
		t.Fatalf("store reads = %d, want 2", n)
	}
}

// TestCacheReadNewerThanFeed: a fallback read newer than the feed updates
// the cache (a new registration, a new export, a delete the feed has not
// delivered yet), and the feed's older events, arriving late, do not undo
// it.
func TestCacheReadNewerThanFeed(t *testing.T) {
	ctx := context.Background()
	c, st, clk, a, x := raceFixture(t)
	a2 := member("a", 2)
	x2 := Export{Owner: "a", Name: "w", Size: 8192, Rights: RightRead, Epoch: 2, Generation: 1}
	st.mu.Lock()
	st.members["a"], st.exports["a/w"] = a2, x2
	st.recRev = map[string]int64{"a": 26, "a/w": 27}
	st.rev = 30
	st.mu.Unlock()

	// The feed, behind the store, delivers an older change while the read
	// is in flight.
	finish := heldRead(t, st, resolveA(c))
	c.Apply(Event{Member: &a, Lease: 7, Rev: 24})
	c.Synced(24)
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ResolveMember(ctx, LaneStreamFirst, "a"); err != nil || v.Source != SourceCache || v.Member.Epoch != 2 {
		t.Fatalf("member a after a newer read: %+v %v", v, err)
	}
	c.Apply(Event{Member: &a, Lease: 7, Rev: 25}) // late, older than the read
	if m, _ := c.Peek("a"); m.Epoch != 2 {
		t.Fatalf("an older feed event undid a newer read: %+v", m)
	}

	clk.Advance(3 * time.Second)
	finish = heldRead(t, st, resolveAW(c))
	c.Synced(28)
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ResolveExport(ctx, LaneStreamFirst, "a", "w"); err != nil || v.Source != SourceCache || v.Export != x2 {
		t.Fatalf("export a/w after a newer read: %+v %v", v, err)
	}
	c.Apply(Event{Export: &x, Rev: 11})
	if xs := c.Exports(); len(xs) != 1 || xs[0].Export != x2 {
		t.Fatalf("an older feed event undid a newer read: %+v", xs)
	}

	// A read that finds the key deleted after the feed's revision.
	st.mu.Lock()
	delete(st.exports, "a/w")
	st.rev = 31
	st.mu.Unlock()
	c.ExportGone("a", "w")
	if _, err := c.ResolveExport(ctx, LaneCatalogFirst, "a", "w"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("export a/w deleted in the store: %v", err)
	}
	c.Apply(Event{Export: &x2, Rev: 27}) // late, older than the read
	if v, err := c.ResolveExport(ctx, LaneStreamFirst, "a", "w"); !errors.Is(err, ErrNotFound) || v.Source != SourceCache {
		t.Fatalf("export a/w after a read found it gone: %+v %v", v, err)
	}
}
