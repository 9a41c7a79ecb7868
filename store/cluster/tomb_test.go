package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

func TestTombs(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tb := newTombs(3, time.Minute, time.Second)
	h := Holder{ID: "d3", Epoch: 9, Tier: TierL1, Size: 4096, CRC: 0xabc}
	tb.add([]byte("a"), h, t0)
	// Another holder, other bytes (a put after the removal), or a key
	// never removed: not removed.
	if spent(tb.removed([]byte("a"), "d2", 4096, 0xabc, t0)) || spent(tb.removed([]byte("b"), "d3", 4096, 0xabc, t0)) {
		t.Fatal("removed for another holder or key")
	}
	if !spent(tb.removed([]byte("a"), "d3", 4096, 0xabc, t0)) {
		t.Fatal("the removed copy re-announced was not answered removed")
	}
	if spent(tb.removed([]byte("a"), "d3", 4096, 0xabc, t0)) || tb.live() != 0 {
		t.Fatal("a tombstone answered twice")
	}
	tb.add([]byte("a"), h, t0)
	if spent(tb.removed([]byte("a"), "d3", 4096, 0xdef, t0)) || tb.live() != 0 {
		t.Fatal("a copy of other bytes was answered removed, or its tombstone stayed")
	}
	// Bounded: the oldest goes first.
	for i := range 5 {
		tb.add(fmt.Appendf(nil, "k%d", i), h, t0.Add(time.Duration(i)*time.Second))
	}
	if tb.live() != 3 || tb.evicted.Load() != 2 {
		t.Fatalf("%d live, %d evicted; want 3, 2", tb.live(), tb.evicted.Load())
	}
	if spent(tb.removed([]byte("k0"), "d3", 4096, 0xabc, t0)) || !spent(tb.removed([]byte("k2"), "d3", 4096, 0xabc, t0)) {
		t.Fatal("eviction did not take the oldest")
	}
	// By age: past the TTL they go.
	if spent(tb.removed([]byte("k3"), "d3", 4096, 0xabc, t0.Add(2*time.Minute))) || tb.live() != 0 || tb.expired.Load() != 2 {
		t.Fatalf("after the TTL: %d live, %d expired", tb.live(), tb.expired.Load())
	}
	// An eviction announced by the holder spends its tombstone.
	tb.add([]byte("z"), h, t0)
	tb.forget([]byte("z"), "d3")
	if tb.live() != 0 {
		t.Fatal("forget left the tombstone")
	}
}

// TestTombsMoveWithShard: a key is removed while its holder h is away, so
// its home x remembers h's copy (a tombstone). Then y joins and becomes
// the key's home, and x goes away too. When h comes back and re-announces
// its copy, to y, the removal holds: y has x's tombstone, answers
// "removed", h drops its copy, and every daemon's read misses.
func TestTombsMoveWithShard(t *testing.T) {
	t.Run("rendezvous", func(t *testing.T) { tombsMoveWithShard(t, false) })
	t.Run("fenced", func(t *testing.T) { tombsMoveWithShard(t, true) })
}

// tombsMoveWithShard is TestTombsMoveWithShard, the homes following the
// members (rendezvous) or, fenced, the shard claims they take and release
// (directory = etcd).
func tombsMoveWithShard(t *testing.T, fenced bool) {
	ids := []string{"a", "b", "h", "x", "y"}
	const shards = 64
	// A key whose home is x while y is away (with or without h), and y
	// once y is back.
	key := keyWithHomes(t, "tomb/move", shards, []string{"x", "a", "b", "h", "x"}, []string{"x", "a", "b", "x"},
		append([]string{"y"}, ids...))
	f := newTombNet(t, ids, shards, fenced)
	a, b, h, x, y := f.node("a"), f.node("b"), f.node("h"), f.node("x"), f.node("y")
	sees := func(n *fakeNode, want ...string) func() bool { return seesKey(n, key, fenced, want...) }
	y.down.Store(true)
	for _, n := range []*fakeNode{a, b, h, x} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b", "h", "x"), "%s seeing y gone", n.id)
	}
	v := removeWhileAway(t, f, key, fenced)
	// y joins and becomes the key's home: x hands it the tombstone.
	y.down.Store(false)
	for _, n := range []*fakeNode{a, b, x, y} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b", "x", "y"), "%s seeing y back (sees %v)", n.id,
			testutil.Lazy(n.c.Members))
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return y.c.Stats().TombsTaken >= 1 && x.c.Stats().Tombstones == 0 },
		"the tombstone handed to y (x %+v)", testutil.Lazy(x.c.Stats))
	// x goes: only y can tell h its copy was removed.
	x.down.Store(true)
	for _, n := range []*fakeNode{a, b, y} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b", "y"), "%s seeing x gone", n.id)
	}
	h.down.Store(false)
	for _, n := range []*fakeNode{a, b, h, y} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b", "h", "y"), "%s seeing h back (sees %v)", n.id,
			testutil.Lazy(n.c.Members))
	}
	// y asks h to drop the copy, or answers its re-announcement
	// "removed", whichever comes first.
	testutil.Eventually(t, 10*time.Second, func() bool { return h.here(t, key) == store.NotFound },
		"h dropping its removed copy (h %+v, y %+v)", testutil.Lazy(h.c.Stats), testutil.Lazy(y.c.Stats))
	for _, n := range []*fakeNode{a, b, h, y} {
		if got, err := n.read(key, len(v)); err == nil {
			t.Errorf("%s reads the removed key: %d bytes", n.id, len(got))
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { _, hs, err := y.c.Locate([]byte(key)); return err == nil && len(hs) == 0 },
		"its home forgetting every holder")
}

// TestTombsOutliveDeadHome: a key is removed while its holder h is away,
// so its home x remembers h's copy (a tombstone); then x dies before it
// could hand the tombstone to anyone. When h comes back and the key's
// shard has a new home (another daemon, or h itself), the removal still
// holds: x gave copies of its tombstone to keepers when it made it, they
// hand them to the shard's current home and ask h to drop the copy, and
// no daemon reads the removed key.
func TestTombsOutliveDeadHome(t *testing.T) {
	for _, tc := range []struct {
		name, newHome string
		fenced        bool
	}{
		{"other", "a", false},
		{"holder", "h", false},
		{"other/fenced", "a", true},
		{"holder/fenced", "h", true},
	} {
		t.Run(tc.name, func(t *testing.T) { tombsOutliveDeadHome(t, tc.newHome, tc.fenced) })
	}
}

func tombsOutliveDeadHome(t *testing.T, newHome string, fenced bool) {
	ids := []string{"a", "b", "h", "x"}
	const shards = 64
	// A key whose home is x with every member and without h, and
	// newHome once x is gone.
	key := keyWithHomes(t, "tomb/dead", shards, append([]string{"x"}, ids...), []string{"x", "a", "b", "x"},
		[]string{newHome, "a", "b", "h"})
	f := newTombNet(t, ids, shards, fenced)
	a, b, h, x := f.node("a"), f.node("b"), f.node("h"), f.node("x")
	sees := func(n *fakeNode, want ...string) func() bool { return seesKey(n, key, fenced, want...) }
	for _, n := range []*fakeNode{a, b, h, x} {
		testutil.Eventually(t, 10*time.Second, sees(n, ids...), "%s seeing every member", n.id)
	}
	v := removeWhileAway(t, f, key, fenced)
	if st := x.c.Stats(); st.KeepsGiven != 2 || a.c.Stats().TombsKept+b.c.Stats().TombsKept != 2 {
		t.Fatalf("x gave %d copies of its tombstone (%d failed); a keeps %d, b %d: want one each", st.KeepsGiven, st.KeepsFailed,
			a.c.Stats().TombsKept, b.c.Stats().TombsKept)
	}
	// x dies with its tombstone, and h comes back.
	x.down.Store(true)
	for _, n := range []*fakeNode{a, b} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b"), "%s seeing x gone", n.id)
	}
	h.down.Store(false)
	for _, n := range []*fakeNode{a, b, h} {
		testutil.Eventually(t, 10*time.Second, sees(n, "a", "b", "h"), "%s seeing h back (sees %v)", n.id,
			testutil.Lazy(n.c.Members))
	}
	if home := a.c.Home([]byte(key)); home != newHome {
		t.Fatalf("the key's home is %s, want %s", home, newHome)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h.here(t, key) == store.NotFound },
		"h dropping its removed copy (tombstones kept by a %d, b %d; h took %d)",
		testutil.Lazy(func() int { return a.c.Stats().TombsKept }), testutil.Lazy(func() int { return b.c.Stats().TombsKept }),
		testutil.Lazy(func() uint64 { return h.c.Stats().TombsTaken }))
	for _, n := range []*fakeNode{a, b, h} {
		if got, err := n.read(key, len(v)); err == nil {
			t.Errorf("%s reads the removed key: %d bytes", n.id, len(got))
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { _, hs, err := a.c.Locate([]byte(key)); return err == nil && len(hs) == 0 },
		"its new home knowing no holder (%v)", testutil.Lazy(func() string { _, hs, err := a.c.Locate([]byte(key)); return fmt.Sprint(hs, err) }))
}

// keyWithHomes is a key whose home, among shards, is each views[i][0]
// under the members views[i][1:].
func keyWithHomes(t *testing.T, prefix string, shards int, views ...[]string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprintf("%s/%d", prefix, i)
		s := ShardOf([]byte(k), shards)
		ok := true
		for _, v := range views {
			ok = ok && newView(v[1:], shards).home(s) == v[0]
		}
		if ok {
			return k
		}
	}
	t.Fatal("no key with the homes the test needs")
	return ""
}

// newTombNet builds daemons ids with shards and a quick prober, their
// homes following the members (rendezvous) or, fenced, shard claims in
// an in-memory etcd that a daemon down cannot reach.
func newTombNet(t *testing.T, ids []string, shards int, fenced bool) *fakeNet {
	t.Helper()
	return newTombNetWith(t, ids, shards, fenced, nil)
}

// newTombNetWith is newTombNet with a last say on each fenced daemon's
// config (mut).
func newTombNetWith(t *testing.T, ids []string, shards int, fenced bool, mut func(c *Config)) *fakeNet {
	t.Helper()
	fence := newFakeFence()
	var net atomic.Pointer[fakeNet] // set once the daemons are built
	fence.cut = func(id string) bool { n := net.Load(); return n != nil && n.node(id).down.Load() }
	f := newNetWith(t, ids, Config{Shards: shards, Timeout: 2 * time.Second, ProbeEvery: 20 * time.Millisecond},
		func(id string, c *Config) {
			if fenced {
				c.Fence = fence.of(id, uint64(1000+slices.Index(ids, id)))
				if mut != nil {
					mut(c)
				}
			}
		})
	net.Store(f)
	return f
}

// seesKey is a condition: n's view of the members is want and, fenced,
// key's shard is claimed by the home rendezvous names.
func seesKey(n *fakeNode, key string, fenced bool, want ...string) func() bool {
	return func() bool {
		if !slices.Equal(n.c.Members(), want) {
			return false
		}
		w := n.c.Placement([]byte(key))
		return !fenced || w.Home == w.Rendezvous && w.Generation != 0
	}
}

// removeWhileAway puts key on h, takes h away (a, b and x see it gone),
// removes key on a and checks that its home x remembers h's copy (a
// tombstone). It returns the value.
func removeWhileAway(t *testing.T, f *fakeNet, key string, fenced bool) []byte {
	t.Helper()
	a, b, h, x := f.node("a"), f.node("b"), f.node("h"), f.node("x")
	v := value(key, 4096)
	h.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { _, hs, err := a.c.Locate([]byte(key)); return err == nil && len(hs) == 1 },
		"h's copy announced to x")
	h.down.Store(true)
	for _, n := range []*fakeNode{a, b, x} {
		testutil.Eventually(t, 10*time.Second, seesKey(n, key, fenced, "a", "b", "x"), "%s seeing h gone", n.id)
	}
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("remove: %v %v", code, err)
	}
	// h's copy, and, for each member away while the key's own home is one
	// of them, whatever copy that member may have (tombAway).
	if ks, _ := x.c.tombs.of("h", 16); len(ks) != 1 || string(ks[0]) != key {
		t.Fatalf("x remembers %q of h's copies, want %s (x %+v, placement %+v)", ks, key, x.c.Stats(), a.c.Placement([]byte(key)))
	}
	return v
}

// TestTombstoneWithoutTheValue: a tombstone made with no size and crc
// known (a removal while the holder was away, its home knowing no copy)
// covers whatever value of the key the holder announces, once; one made
// with them covers only that value.
func TestTombstoneWithoutTheValue(t *testing.T) {
	now := time.Now()
	ts := newTombs(16, time.Hour, time.Second)
	ts.add([]byte("k"), Holder{ID: "m"}, now)
	ts.add([]byte("j"), Holder{ID: "m", Size: 10, CRC: 7}, now)
	if !spent(ts.removed([]byte("k"), "m", 4096, 99, now)) {
		t.Error("a tombstone without the value did not cover a copy of the key")
	}
	if spent(ts.removed([]byte("k"), "m", 4096, 99, now)) {
		t.Error("a spent tombstone covered a second announcement")
	}
	if spent(ts.removed([]byte("j"), "m", 11, 7, now)) {
		t.Error("a tombstone of a 10-byte value covered an 11-byte one (a put after the removal)")
	}
}

// spent is tombs.removed's answer without its time.
func spent(removed bool, _ time.Time) bool { return removed }

// TestTombsHandedOnceAtATime: a home just back may be owed many
// tombstones (the removals made while it was away, in chunks of
// maxMsgKeys), and every probe round asks for them to be handed over.
// One hand-off per home runs at a time, so calls while one waits on the
// home send nothing more, and each tombstone goes once; a hand-off whose
// message the home does not take (busy) stops there, sending no more
// until the next call, which hands the rest.
func TestTombsHandedOnceAtATime(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	a, b := f.node("a"), f.node("b")
	toB := func(int) (string, bool) { return "b", true }
	const n = 2*maxMsgKeys + 10 // three messages
	now := time.Now()
	for i := range n {
		a.c.tombs.add([]byte(fmt.Sprintf("handed/%d", i)), Holder{ID: "z", Size: 4096, CRC: uint32(i)}, now)
	}
	sent := func() uint64 {
		f.kindMu.Lock()
		defer f.kindMu.Unlock()
		return f.kinds[kindTombs]
	}

	// Busy: the first message is sent busyTries times, and no other.
	f.busyFor("b", -1)
	a.c.handTombs(toB)
	testutil.Eventually(t, 10*time.Second, func() bool { return a.c.Stats().HandStopped == 1 }, "the hand-off stopped at b's busy answers")
	answered := f.busyOf(kindTombs)
	if answered != busyTries {
		t.Fatalf("b answered busy %d times, want %d (one message, then the hand-off stops)", answered, busyTries)
	}
	f.busyFor("b", 0)

	// Calls while a hand-off waits on b start none.
	release := f.holdKind(t, "a", kindTombs)
	a.c.handTombs(toB)
	testutil.Eventually(t, 10*time.Second, func() bool { return f.heldKinds() == 1 }, "the first message held")
	for range 4 {
		a.c.handTombs(toB)
	}
	release()
	testutil.Eventually(t, 10*time.Second, func() bool { return b.c.Stats().TombsTaken >= n && a.c.Stats().Tombstones == 0 },
		"every tombstone handed to b (a %+v, b %+v)", testutil.Lazy(a.c.Stats), testutil.Lazy(b.c.Stats))
	a.c.Close() // every hand-off it started has ended
	if got, want := sent(), uint64(3); got != want {
		t.Errorf("%d messages of tombstones sent, want %d (each tombstone once)", got, want)
	}
	if got := b.c.Stats().TombsTaken; got != n {
		t.Errorf("b took %d tombstones, want %d", got, n)
	}
}

// logTally is a slog.Handler tallying, per message, the lines logged and
// the events they stand for (a rate-limited line's count, else 1).
type logTally struct {
	mu            *sync.Mutex
	lines, events map[string]int
}

func newLogTally() logTally {
	return logTally{mu: &sync.Mutex{}, lines: map[string]int{}, events: map[string]int{}}
}

func (h logTally) Enabled(context.Context, slog.Level) bool { return true }
func (h logTally) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h logTally) WithGroup(string) slog.Handler            { return h }
func (h logTally) Handle(_ context.Context, r slog.Record) error {
	n := 1
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			n = int(a.Value.Int64())
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines[r.Message]++
	h.events[r.Message] += n
	return nil
}

// of is the lines logged of msg and the events they stand for.
func (h logTally) of(msg string) (lines, events int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lines[msg], h.events[msg]
}

// TestRemovalsWhileAwayLogged: with the only other member away, each
// removal of a key that member is home of makes a tombstone for it that
// no member can keep a copy of. A client removing key by key made two log
// lines per remove (27 a second each in a soak, 119 MB of log an hour);
// each kind is now a line an interval with the rest counted, and the
// tombstones no member kept are counted in full (KeepsNone).
func TestRemovalsWhileAwayLogged(t *testing.T) {
	const (
		awayMsg = "keys removed while members are away: their copies there are dropped when they are back"
		noneMsg = "no member to keep tombstones: the removal of copies on holders away holds only while this home lives"
		shards  = 16
		n       = 20
	)
	tally := newLogTally()
	f := newNetWith(t, []string{"a", "h"}, Config{Shards: shards, Timeout: 2 * time.Second, ProbeEvery: 20 * time.Millisecond},
		func(id string, c *Config) {
			if id == "a" {
				c.Log = slog.New(tally)
			}
		})
	a, h := f.node("a"), f.node("h")
	h.down.Store(true)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(a.c.Members(), []string{"a"}) }, "a seeing h gone")
	for i := range n {
		// A key h is home of while both are up.
		key := keyWithHomes(t, fmt.Sprintf("away/%d", i), shards, []string{"h", "a", "h"})
		if code, err := removeOn(t, a, key); code != store.OK {
			t.Fatalf("remove %s: %v %v", key, code, err)
		}
	}
	if got := a.c.Stats().KeepsNone; got != n {
		t.Fatalf("%d tombstones counted with no member to keep them, want %d", got, n)
	}
	a.c.Close() // logs what its rate-limited logs still count
	for _, msg := range []string{awayMsg, noneMsg} {
		lines, events := tally.of(msg)
		if events != n || lines > n/4 {
			t.Errorf("%q: %d lines for %d events, want %d events in a few lines", msg, lines, events, n)
		}
	}
}
