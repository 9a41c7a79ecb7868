package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// newClaimedNet builds daemons ids with shards whose homes follow claims
// in an in-memory etcd (the test runs the claim rounds: no claimer), each
// daemon's view of it passed through wrap when set, and waits until every
// shard is claimed by its rendezvous home, as every daemon knows.
func newClaimedNet(t *testing.T, ids []string, shards int, wrap func(id string, f Fence) Fence) (*fakeNet, *fakeFence) {
	t.Helper()
	fence := newFakeFence()
	f := newNetWith(t, ids, Config{Shards: shards, Timeout: time.Second, ProbeEvery: time.Hour},
		func(id string, c *Config) {
			c.Fence = fence.of(id, 1)
			if wrap != nil {
				c.Fence = wrap(id, c.Fence)
			}
			c.manualClaims = true
		})
	v := newView(ids, shards)
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, id := range ids {
			if err := f.node(id).c.claimRound(); err != nil {
				t.Fatalf("%s's claim round: %v", id, err)
			}
		}
		for _, id := range ids {
			for _, cl := range f.node(id).c.ShardClaims() {
				if cl.Home != v.home(cl.Shard) || cl.Gen == 0 {
					return false
				}
			}
		}
		return true
	}, "every shard claimed by its rendezvous home")
	return f, fence
}

// shardOfHome is a shard n's claims give to home.
func shardOfHome(t *testing.T, n *fakeNode, home string) ShardClaim {
	t.Helper()
	for _, cl := range n.c.ShardClaims() {
		if cl.Home == home {
			return cl
		}
	}
	t.Fatalf("%s knows no shard of %s", n.id, home)
	return ShardClaim{}
}

// fenceHeader is a fenced message's header naming one shard at gen.
func fenceHeader(shard uint32, gen uint64) []byte {
	e := newEnc()
	e.u16(1)
	e.u32(shard)
	e.u64(gen)
	return e.bytes()
}

// noPanic runs fn and fails t if it panics.
func noPanic(t *testing.T, what string, fn func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s panicked: %v", what, r)
		}
	}()
	fn()
}

// TestFenceShardOutOfRange: a message to a home naming a shard past the
// home's shard count (a peer with another store_shards, or a hostile
// one) is refused as malformed, with or without etcd: it does not crash
// the home.
func TestFenceShardOutOfRange(t *testing.T) {
	const shards = 16
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
			var f *fakeNet
			if fenced {
				f, _ = newClaimedNet(t, []string{"a", "b"}, shards, nil)
			} else {
				f = newNet(t, []string{"a", "b"}, Config{Shards: shards, Timeout: time.Second, ProbeEvery: time.Hour})
			}
			b := f.node("b")
			for _, s := range []uint32{shards, 1 << 31, 1<<32 - 1} {
				var err error
				var refusal []byte
				noPanic(t, fmt.Sprintf("a fence naming shard %d", s), func() {
					_, refusal, err = b.c.fenced(append(fenceHeader(s, 7), msgVersion))
				})
				if !errors.Is(err, ErrMessage) || refusal != nil {
					t.Fatalf("a fence naming shard %d of %d: refusal % x, %v; want ErrMessage", s, shards, refusal, err)
				}
			}
		})
	}
}

// TestStaleAnswerNamesOtherShards: a home's stale answer is taken in only
// for the shards the message carried: one naming a shard past this
// daemon's shard count does not crash it, and one naming a shard the
// message did not carry changes nothing of that shard.
func TestStaleAnswerNamesOtherShards(t *testing.T) {
	const shards = 16
	f, _ := newClaimedNet(t, []string{"a", "b"}, shards, nil)
	a := f.node("a")
	sent := shardOfHome(t, a, "b")
	other := shardOfHome(t, a, "a")
	stale := []shardGen{{shards + 3, 1 << 40}, {1<<32 - 1, 1 << 40}, {other.Shard, other.Gen + 1000}}
	var err error
	noPanic(t, "a stale answer naming shards past the count", func() {
		_, err = a.c.refresh("b", stale, []shardGen{{sent.Shard, sent.Gen}}, time.Now().Add(time.Second))
	})
	if !errors.Is(err, ErrStaleGeneration) {
		t.Fatalf("a stale answer naming no shard the message carried: %v, want ErrStaleGeneration", err)
	}
	if got := a.c.ShardClaims()[other.Shard]; got != other {
		t.Fatalf("shard %d, which the message did not carry, is now %+v (was %+v)", other.Shard, got, other)
	}
	if g := a.c.heldGen(other.Shard); g != other.Gen {
		t.Fatalf("a holds its shard %d at %d, want %d", other.Shard, g, other.Gen)
	}
}

// TestPeerGenerationNotKept: a generation a peer states (a home's stale
// answer, a re-announcement request naming the claims it won) is not
// kept as the shard's claim: etcd's claims are. A peer stating a
// generation far past any etcd gave (a hostile or broken one) neither
// takes this daemon's own shard from it nor makes the claims etcd gives
// later look older than its word: they are taken in as they come. Nor
// does it wake the claimer (a round may ask etcd).
func TestPeerGenerationNotKept(t *testing.T) {
	const shards = 16
	const huge = 1 << 62
	f, fence := newClaimedNet(t, []string{"a", "b", "c"}, shards, nil)
	a, c := f.node("a"), f.node("c")

	t.Run("stale answer", func(t *testing.T) {
		sb := shardOfHome(t, a, "b")
		_, err := a.c.refresh("b", []shardGen{{sb.Shard, huge}}, []shardGen{{sb.Shard, sb.Gen}}, time.Now().Add(time.Second))
		if err != nil {
			t.Logf("refresh: %v", err)
		}
		if got := a.c.ShardClaims()[sb.Shard]; got.Gen != sb.Gen || got.Home != "b" {
			t.Fatalf("after b said it holds shard %d at %#x, a knows %+v; want etcd's claim %+v", sb.Shard, uint64(huge), got, sb)
		}
		// etcd hands the shard to c: a follows.
		won, err := fence.of("c", 1).Take(t.Context(), []int{sb.Shard}, []uint64{sb.Gen})
		if err != nil || len(won) != 1 {
			t.Fatalf("c taking shard %d: %v %v", sb.Shard, won, err)
		}
		if got := a.c.ShardClaims()[sb.Shard]; got.Home != "c" || got.Gen != won[0].Gen {
			t.Fatalf("etcd gave shard %d to c at %d; a knows %+v", sb.Shard, won[0].Gen, got)
		}
	})

	t.Run("re-announcement request", func(t *testing.T) {
		sa := shardOfHome(t, a, "a")
		e := newEnc()
		e.u16(1)
		e.u32(uint32(sa.Shard))
		e.u64(1)
		e.u64(huge)
		select {
		case <-a.c.ckick:
		default:
		}
		if _, err := a.c.onReannounce("c", c.Epoch(), e.bytes()); err != nil {
			t.Fatal(err)
		}
		if len(a.c.ckick) != 0 {
			t.Fatal("c's word woke a's claimer: a peer's requests would drive a's claim rounds, and their requests to etcd")
		}
		if got := a.c.ShardClaims()[sa.Shard]; got != sa {
			t.Fatalf("after c said it won a's shard %d at %#x, a knows %+v; want etcd's claim %+v", sa.Shard, uint64(huge), got, sa)
		}
		if !a.c.holdsGen(sa.Shard, sa.Gen) {
			t.Fatalf("a no longer holds its shard %d at %d", sa.Shard, sa.Gen)
		}
		won, err := fence.of("b", 1).Take(t.Context(), []int{sa.Shard}, []uint64{sa.Gen})
		if err != nil || len(won) != 1 {
			t.Fatalf("b taking shard %d: %v %v", sa.Shard, won, err)
		}
		if got := a.c.ShardClaims()[sa.Shard]; got.Home != "b" || got.Gen != won[0].Gen {
			t.Fatalf("etcd gave shard %d to b at %d; a knows %+v", sa.Shard, won[0].Gen, got)
		}
	})
}

// countingFence counts the reads of claims a daemon makes.
type countingFence struct {
	Fence
	refreshes atomic.Int32
}

func (f *countingFence) Refresh(ctx context.Context, shards []int) error {
	f.refreshes.Add(1)
	return f.Fence.Refresh(ctx, shards)
}

// TestNewerClaimReadFromEtcd: a home that refuses a message saying it
// holds the shard at a generation newer than this daemon knows (it took
// the shard, and this daemon's watch has not brought that yet) is right:
// this daemon reads the shard's claim from etcd, once, and knows it then.
func TestNewerClaimReadFromEtcd(t *testing.T) {
	const shards = 16
	counting := map[string]*countingFence{}
	f, fence := newClaimedNet(t, []string{"a", "b", "c"}, shards, func(id string, f Fence) Fence {
		counting[id] = &countingFence{Fence: f}
		return counting[id]
	})
	a := f.node("a")
	sb := shardOfHome(t, a, "b")
	// c takes b's shard while a's watch is behind.
	fence.mu.Lock()
	watch := fence.watchers["a"]
	delete(fence.watchers, "a")
	fence.mu.Unlock()
	won, err := fence.of("c", 1).Take(t.Context(), []int{sb.Shard}, []uint64{sb.Gen})
	if err != nil || len(won) != 1 {
		t.Fatalf("c taking shard %d: %v %v", sb.Shard, won, err)
	}
	fence.mu.Lock()
	fence.watchers["a"] = watch
	fence.mu.Unlock()
	if got := a.c.ShardClaims()[sb.Shard]; got != sb {
		t.Fatalf("a's watch is behind, yet a knows %+v", got)
	}

	// a sent to c (no generation: c is not the home a knows); c says it
	// holds the shard at its claim's generation.
	if _, err := a.c.refresh("c", []shardGen{{sb.Shard, won[0].Gen}}, []shardGen{{sb.Shard, 0}}, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := a.c.ShardClaims()[sb.Shard]; got != won[0] {
		t.Fatalf("after c's answer a knows %+v, want etcd's claim %+v", got, won[0])
	}
	if n := counting["a"].refreshes.Load(); n != 1 {
		t.Fatalf("a read the claims %d times, want once", n)
	}
}

// TestSameClaimDoesNotWakeClaimer: a claim handed over again as this
// daemon knows it already (a read of claims that changed nothing) does
// not wake the claimer. Else a claim round whose read of claims found
// them as they were (a claim that fails the same way each time) would
// wake the next at once: a loop of requests to etcd, without a pause.
func TestSameClaimDoesNotWakeClaimer(t *testing.T) {
	f, _ := newClaimedNet(t, []string{"a", "b"}, 16, nil)
	a := f.node("a")
	select {
	case <-a.c.ckick:
	default:
	}
	same := a.c.ShardClaims()
	a.c.onShardClaims(same)
	if len(a.c.ckick) != 0 {
		t.Fatal("claims handed over as they were woke the claimer")
	}
	if got := a.c.ShardClaims(); !slices.Equal(got, same) {
		t.Fatalf("claims handed over as they were changed them:\n%v\nwas\n%v", got, same)
	}
	// A change does.
	cl := same[0]
	cl.Gen++
	a.c.onShardClaims([]ShardClaim{cl})
	if len(a.c.ckick) != 1 {
		t.Fatal("a newer claim did not wake the claimer")
	}
}
