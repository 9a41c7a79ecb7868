package cluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestRendezvousMovesOnlyWhatMust: every daemon computes the same homes
// from the same members, whatever their order; a member that leaves moves
// only its own shards, and one that joins takes shards only from the
// others, about a fair share.
func TestRendezvousMovesOnlyWhatMust(t *testing.T) {
	const shards = 1024
	a := newView([]string{"d1", "d2", "d3", "d4"}, shards)
	b := newView([]string{"d4", "d3", "d1", "d2", "d2"}, shards)
	for s := range shards {
		if a.home(s) != b.home(s) {
			t.Fatalf("shard %d: home %s or %s depending on the order of the members", s, a.home(s), b.home(s))
		}
	}
	count := map[string]int{}
	for s := range shards {
		count[a.home(s)]++
	}
	for id, n := range count {
		if n < shards/4/2 || n > shards/4*2 {
			t.Errorf("%s is home of %d shards of %d over 4 members", id, n, shards)
		}
	}
	left := newView([]string{"d1", "d2", "d4"}, shards)
	joined := newView([]string{"d1", "d2", "d3", "d4", "d5"}, shards)
	moved := 0
	for s := range shards {
		if a.home(s) != "d3" && left.home(s) != a.home(s) {
			t.Fatalf("shard %d moved from %s to %s when d3 left", s, a.home(s), left.home(s))
		}
		if joined.home(s) != a.home(s) {
			if joined.home(s) != "d5" {
				t.Fatalf("shard %d moved from %s to %s when d5 joined", s, a.home(s), joined.home(s))
			}
			moved++
		}
	}
	if moved < shards/5/2 || moved > shards/5*2 {
		t.Errorf("d5 joining moved %d shards of %d", moved, shards)
	}
	if lone := newView([]string{"solo"}, shards); lone.home(0) != "solo" || lone.home(shards-1) != "solo" {
		t.Fatal("a lone member is not home of every shard")
	}
}

func TestShardOfIsStable(t *testing.T) {
	// The shard of a key is part of the protocol between daemons: it
	// must not change with the build or the run.
	for _, c := range []struct {
		key  string
		want int
	}{{"a", 140}, {"chain/00", 147}, {"kv/layer0/block7", 625}} {
		if got := ShardOf([]byte(c.key), 1024); got != c.want {
			t.Errorf("ShardOf(%q) = %d, want %d", c.key, got, c.want)
		}
	}
}

// TestIndexLimits: a full index refuses new keys (counted) and takes
// holders of known ones; a key keeps at most maxHolders holders, the
// newest; a holder announcing again replaces its entry.
func TestIndexLimits(t *testing.T) {
	x := newIndex(4, 2, 2)
	k := func(i int) []byte { return fmt.Appendf(nil, "k%d", i) }
	if !x.add(0, k(0), Holder{ID: "a", Epoch: 1}) || !x.add(1, k(1), Holder{ID: "a", Epoch: 1}) {
		t.Fatal("adding under the limit failed")
	}
	if x.add(2, k(2), Holder{ID: "a", Epoch: 1}) || x.refused.Load() != 1 {
		t.Fatalf("a third key in an index of two: refused %d", x.refused.Load())
	}
	x.add(0, k(0), Holder{ID: "b", Epoch: 1})
	x.add(0, k(0), Holder{ID: "c", Epoch: 1})
	hs := x.get(0, k(0), nil)
	if len(hs) != 2 || hs[0].ID != "b" || hs[1].ID != "c" {
		t.Fatalf("holders %+v, want b and c (the oldest, a, made room)", hs)
	}
	x.add(0, k(0), Holder{ID: "b", Epoch: 2, Size: 9})
	hs = x.get(0, k(0), nil)
	if len(hs) != 2 || hs[1].ID != "b" || hs[1].Epoch != 2 || hs[0].ID != "c" {
		t.Fatalf("holders %+v after b's new run announced", hs)
	}
	x.dropHolder(0, k(0), "c", 0)
	x.dropHolder(0, k(0), "b", 1) // another run's: stays
	if hs := x.get(0, k(0), nil); len(hs) != 1 || hs[0].Epoch != 2 {
		t.Fatalf("holders %+v", hs)
	}
	if got := x.drop(0, k(0), nil); len(got) != 1 || x.keys.Load() != 1 || x.shardKeys(0) != 0 {
		t.Fatalf("drop: %+v, %d keys", got, x.keys.Load())
	}
	if !x.add(2, k(2), Holder{ID: "a"}) {
		t.Fatal("a key did not fit once another was dropped")
	}
}

// TestIndexCheckAndMarkUnderTheShardLock: an announcement's check
// (addUnless) and a removal's mark (drop) run with the key's shard locked,
// so that neither comes between the other's two steps; a copy the check
// finds removed is not added.
func TestIndexCheckAndMarkUnderTheShardLock(t *testing.T) {
	x := newIndex(4, 8, 2)
	k := []byte("k")
	locked := func(what string) {
		if x.shards[1].mu.TryLock() {
			x.shards[1].mu.Unlock()
			t.Errorf("%s ran with the shard unlocked", what)
		}
	}
	added, gone := x.addUnless(1, k, Holder{ID: "a"}, func() bool { locked("the check"); return false })
	if !added || gone {
		t.Fatalf("addUnless of a copy not removed: added %v, gone %v", added, gone)
	}
	if hs := x.drop(1, k, func() { locked("the mark") }); len(hs) != 1 {
		t.Fatalf("drop: holders %+v, want a", hs)
	}
	added, gone = x.addUnless(1, k, Holder{ID: "b"}, func() bool { return true })
	if added || !gone || x.keys.Load() != 0 || len(x.get(1, k, nil)) != 0 {
		t.Fatalf("addUnless of a removed copy: added %v, gone %v, %d keys", added, gone, x.keys.Load())
	}
}

// TestShardsDescribed: Shards says, for each shard, the home every member
// computes, at the home's run epoch, with the keys indexed there counted
// on the home only; past the last shard it stops.
func TestShardsDescribed(t *testing.T) {
	ids := []string{"a", "b", "c"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	const key = "shards/key"
	a.put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a"}) }, "announced")
	ks := ShardOf([]byte(key), 16)
	for _, id := range ids {
		n := f.node(id)
		got := n.c.Shards(0, 100)
		if len(got) != 16 {
			t.Fatalf("%s: %d shards, want 16", id, len(got))
		}
		for s, in := range got {
			home := f.node(in.Home)
			if in.Shard != s || home == nil || in.Rendezvous != in.Home || in.Gen != home.Epoch() {
				t.Fatalf("%s: shard %d: %+v (home epoch %v)", id, s, in, home)
			}
			want := 0
			if s == ks && in.Home == id {
				want = 1
			}
			if in.Keys != want {
				t.Fatalf("%s: shard %d: %d keys indexed here, want %d", id, s, in.Keys, want)
			}
		}
		if tail := n.c.Shards(14, 10); len(tail) != 2 || tail[0].Shard != 14 {
			t.Fatalf("%s: shards from 14: %+v", id, tail)
		}
	}
}

// TestRankedIsSuccession: a shard's ranked members are its home first,
// then the member that becomes home when the ones before it go.
func TestRankedIsSuccession(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	v := newView(ids, 256)
	for s := range 256 {
		r := v.ranked(s, len(ids))
		if len(r) != len(ids) || r[0] != v.home(s) {
			t.Fatalf("shard %d: ranked %v, home %s", s, r, v.home(s))
		}
		for i := 1; i < len(r); i++ {
			rest := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(r[:i], id) })
			if h := newView(rest, 256).home(s); h != r[i] {
				t.Fatalf("shard %d: %v gone, home %s; ranked says %s", s, r[:i], h, r[i])
			}
		}
		if got := v.ranked(s, 2, r[0]); !slices.Equal(got, r[1:3]) {
			t.Fatalf("shard %d: ranked without %s is %v, want %v", s, r[0], got, r[1:3])
		}
	}
}
