package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// claim claims shards for d (unclaimed before) and fails the test unless
// it wins them all.
func claim(t *testing.T, d testDir, shards ...int) []ShardClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	won, err := d.ClaimShards(ctx, 1, shards, make([]uint64, len(shards)))
	if err != nil || len(won) != len(shards) {
		t.Fatalf("claiming shards %v: won %+v, %v\n%s", shards, won, err, d.log)
	}
	return won
}

// TestShardsCurrentEndsWithTheLease: a home trusts its claims only while
// its lease is held for certain. With a staleness budget longer than the
// lease's TTL, a daemon cut off from etcd stops trusting them once a TTL
// has run since its last renewal (when etcd may let the lease lapse and
// give its shards to another home), not only when its cache passes the
// budget; and trusts them again once etcd, back, renews the lease.
func TestShardsCurrentEndsWithTheLease(t *testing.T) {
	srv := etcdtest.Start(t)
	clock := testutil.NewClock(time.Now())
	a := open(t, srv, "a", func(c *Config) { c.Budget = time.Minute; c.Clock = clock.Now })
	join(t, a, 1)
	claim(t, a, 3)
	testutil.Eventually(t, 5*time.Second, a.ShardsCurrent, "a's claims current after Join")

	// Cut off: no renewal gets through from now on. The clock moves one
	// TTL on: the cache is a second old (well within the budget), but etcd
	// may have let the lease lapse.
	srv.Stop()
	clock.Advance(a.cfg.LeaseTTL)
	if age := a.Cache().Age(); age > a.cfg.Budget {
		t.Fatalf("cache age %v past the budget %v: the test would prove nothing", age, a.cfg.Budget)
	}
	if a.ShardsCurrent() {
		t.Fatalf("a trusts its claims a lease TTL (%v) after its last renewal, cut off from etcd", a.cfg.LeaseTTL)
	}

	// etcd back: it renews every lease it had, the keeper finds its own
	// still held, and the claims are trusted again.
	srv.Restart()
	testutil.Eventually(t, 10*time.Second, a.ShardsCurrent, "a's claims current once etcd renewed its lease")
}
