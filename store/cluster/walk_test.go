package cluster

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestWalkMessagesRefused: a walk's word or a pull that is malformed, or
// names a pull never sent, is refused as a bad message and records
// nothing.
func TestWalkMessagesRefused(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	a, b := f.node("a"), f.node("b")
	testutil.Eventually(t, 10*time.Second, func() bool { return len(a.c.Members()) == 2 }, "a seeing b")
	a.c.walks.mu.Lock()
	sent := a.c.walks.seq
	a.c.walks.mu.Unlock()
	walkedMsg := func(seq uint64, shards uint32, bits []byte) []byte {
		e := newEnc()
		e.u64(seq)
		e.u32(shards)
		e.b = append(e.b, bits...)
		return e.bytes()
	}
	taken := a.c.c.walksTaken.Load()
	for name, req := range map[string][]byte{
		"a pull never sent":      walkedMsg(sent+1, 16, []byte{0xff, 0xff}),
		"pull 0":                 walkedMsg(0, 16, []byte{0xff, 0xff}),
		"another shard count":    walkedMsg(sent, 32, []byte{0xff, 0xff, 0xff, 0xff}),
		"bits cut short":         walkedMsg(sent, 16, []byte{0xff}),
		"trailing bytes":         walkedMsg(sent, 16, []byte{0xff, 0xff, 0}),
		"another message format": append([]byte{msgVersion + 1}, walkedMsg(sent, 16, []byte{0xff, 0xff})[1:]...),
		"empty":                  nil,
	} {
		if _, err := a.c.onWalked("b", b.Epoch(), req); !errors.Is(err, ErrMessage) {
			t.Errorf("walk's word with %s: %v; want ErrMessage", name, err)
		}
	}
	if n := a.c.c.walksTaken.Load() - taken; n != 0 {
		t.Fatalf("%d refused walks taken", n)
	}
	for name, req := range map[string][]byte{
		"no pull number":  {msgVersion, 1, 2},
		"claims cut":      append(append([]byte{msgVersion}, make([]byte, 8)...), 0, 1),
		"another version": append([]byte{msgVersion + 1}, make([]byte, 8)...),
	} {
		if _, err := b.c.onPull("a", a.Epoch(), req); !errors.Is(err, ErrMessage) {
			t.Errorf("pull with %s: %v; want ErrMessage", name, err)
		}
	}
}

// TestEveryRebuildEnds: daemons started together, with homes by
// rendezvous and by claims in etcd, each hold keys of the others' shards;
// then one goes and comes back. Every home's rebuild of the shards it
// gained ends by the members' word (none waits on a member up).
func TestEveryRebuildEnds(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(map[bool]string{false: "embedded", true: "fenced"}[fenced], func(t *testing.T) {
			ids := []string{"a", "b", "c"}
			f := newTombNet(t, ids, 32, fenced)
			settled := func() bool {
				for _, id := range ids {
					if f.node(id).c.Stats().Rebuilding != 0 {
						return false
					}
				}
				return true
			}
			rebuilding := func() []int {
				var n []int
				for _, id := range ids {
					n = append(n, f.node(id).c.Stats().Rebuilding)
				}
				return n
			}
			for i, id := range ids {
				k := fmt.Sprintf("rebuild/%s/%d", id, i)
				f.node(id).put(t, k, value(k, 4096))
			}
			testutil.Eventually(t, 10*time.Second, settled, "every rebuild ended after the start (shards waiting: %v)",
				testutil.Lazy(rebuilding))
			c := f.node("c")
			c.down.Store(true)
			for _, id := range []string{"a", "b"} {
				testutil.Eventually(t, 10*time.Second, seesKey(f.node(id), "rebuild", fenced, "a", "b"), "%s seeing c gone", id)
			}
			c.down.Store(false)
			for _, id := range ids {
				testutil.Eventually(t, 10*time.Second, seesKey(f.node(id), "rebuild", fenced, ids...), "%s seeing c back", id)
			}
			testutil.Eventually(t, 10*time.Second, settled, "every rebuild ended after c came back (shards waiting: %v)",
				testutil.Lazy(rebuilding))
			if st := f.node("a").c.Stats(); st.WalksTaken == 0 {
				t.Fatal("a took no member's word")
			}
		})
	}
}

// TestAWalkDoesNotReportAShardWhoseHomeMovedMeanwhile: a shard whose home
// changed while a walk ran, even one whose home is the same again by the
// walk's end, is not reported by that walk (its keys may have gone to
// another home meanwhile, which the home's index then lacks); the shards
// whose home stayed are.
func TestAWalkDoesNotReportAShardWhoseHomeMovedMeanwhile(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	testutil.Eventually(t, 10*time.Second, func() bool { return len(a.c.Members()) == 2 }, "a seeing b")
	v := a.c.view.Load()
	var mine []int
	for s := range 16 {
		if a.c.homeFor(v, s) == "a" {
			mine = append(mine, s)
		}
	}
	if len(mine) < 2 {
		t.Fatalf("a is home of shards %v of 16; the test needs two", mine)
	}
	moved, still := mine[0], mine[1]
	lacksOwn := func(s int) bool {
		ask, _ := a.c.unwalked(s, a.c.view.Load(), nil, time.Now())
		return slices.Contains(ask, "a")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return !lacksOwn(moved) && !lacksOwn(still) },
		"a's first walk of its own copies taken")
	a.c.gainShards(moved, still) // gained again: a's word for both is missing
	if !lacksOwn(moved) || !lacksOwn(still) {
		t.Fatal("a's own word not missing after a gain")
	}
	moves := make([]uint64, 16)
	for s := range moves {
		moves[s] = a.c.homeMoves[s].Load()
	}
	a.c.homeMoves[moved].Add(2) // while the walk ran, its home went elsewhere and came back
	a.c.reportWalks(v, moves, []func(int, string) bool{everyKey}, a.c.pullMarks(), nil)
	if lacksOwn(still) {
		t.Errorf("shard %d, whose home stayed, not reported by the walk", still)
	}
	if !lacksOwn(moved) {
		t.Errorf("shard %d, whose home moved and came back while the walk ran, reported by it", moved)
	}
}

// TestAViewChangeCountsTheShardsItMoves: a member going and coming back
// counts a move of each shard whose home it took each way (by rendezvous,
// and by claims in etcd, whose directory lists every member), and, by
// rendezvous, none of a shard whose home stayed.
func TestAViewChangeCountsTheShardsItMoves(t *testing.T) {
	const shards = 64
	ids := []string{"a", "b", "x"}
	moving := keyWithHomes(t, "moves/away", shards, []string{"x", "a", "b", "x"}, []string{"a", "a", "b"})
	staying := keyWithHomes(t, "moves/stay", shards, []string{"a", "a", "b", "x"}, []string{"a", "a", "b"})
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			// As with etcd: the members' leases live, so one cut off sees
			// no majority and claims nothing.
			f := newTombNetWith(t, ids, shards, fenced, func(c *Config) { c.Directory = func() []string { return ids } })
			a, x := f.node("a"), f.node("x")
			sees := func(want ...string) {
				for _, k := range []string{moving, staying} {
					testutil.Eventually(t, 10*time.Second, seesKey(a, k, fenced, want...), "a seeing %v", want)
				}
			}
			sees(ids...)
			sm, ss := a.c.shardOf([]byte(moving)), a.c.shardOf([]byte(staying))
			m0, s0 := a.c.homeMoves[sm].Load(), a.c.homeMoves[ss].Load()
			x.down.Store(true)
			sees("a", "b")
			if d := a.c.homeMoves[sm].Load() - m0; d < 1 {
				t.Fatalf("shard %d, x's, moved to a: %d moves counted", sm, d)
			}
			m1 := a.c.homeMoves[sm].Load()
			x.down.Store(false)
			sees(ids...)
			if d := a.c.homeMoves[sm].Load() - m1; d < 1 {
				t.Errorf("shard %d, back to x: %d moves counted", sm, d)
			}
			// With claims, one taken while the members still came up may
			// reach a late and move a's shard too: only by rendezvous is
			// a's shard a's throughout.
			if d := a.c.homeMoves[ss].Load() - s0; d != 0 && !fenced {
				t.Errorf("shard %d, a's throughout: %d moves counted", ss, d)
			}
		})
	}
}
