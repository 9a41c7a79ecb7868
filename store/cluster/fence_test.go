package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// newClaimedNet builds daemons ids with shards whose homes follow claims
// in an in-memory etcd (the test runs the claim rounds: no claimer), and
// waits until every shard is claimed by its rendezvous home, as every
// daemon knows.
func newClaimedNet(t *testing.T, ids []string, shards int) (*fakeNet, *fakeFence) {
	t.Helper()
	fence := newFakeFence()
	f := newNetWith(t, ids, Config{Shards: shards, Timeout: time.Second, ProbeEvery: time.Hour},
		func(id string, c *Config) {
			c.Fence = fence.of(id, 1)
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
				f, _ = newClaimedNet(t, []string{"a", "b"}, shards)
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
	f, _ := newClaimedNet(t, []string{"a", "b"}, shards)
	a := f.node("a")
	sent := shardOfHome(t, a, "b")
	other := shardOfHome(t, a, "a")
	stale := []shardGen{{shards + 3, 1 << 40}, {1<<32 - 1, 1 << 40}, {other.Shard, other.Gen + 1000}}
	var err error
	noPanic(t, "a stale answer naming shards past the count", func() {
		err = a.c.refresh("b", stale, []shardGen{{sent.Shard, sent.Gen}}, time.Now().Add(time.Second))
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
