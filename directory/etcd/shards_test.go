package etcd

import (
	"context"
	"sync"
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

// claimLog collects what WatchShards hands over.
type claimLog struct {
	mu   sync.Mutex // guards last
	last map[int]ShardClaim
}

func (l *claimLog) watch(cs []ShardClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[int]ShardClaim{}
	}
	for _, c := range cs {
		l.last[c.Shard] = c
	}
}

func (l *claimLog) of(s int) ShardClaim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last[s]
}

// TestShardKeyNotCanonical: a key that names a shard in another spelling
// than the directory writes ("shards/07", "shards/+7": a hand edit, or
// another version) is outside the layout and claims nothing. Taken for
// shard 7, its later revision made it the newer claim, so every daemon
// would follow it to its home (which never claimed the shard: two homes
// when it is a member) and the shard's real home could never take it back
// (its claim transactions compare the real key).
func TestShardKeyNotCanonical(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	var la claimLog
	a.WatchShards(la.watch)
	won := claim(t, a, 7)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, k := range []string{"/test/shards/07", "/test/shards/+7"} {
		if _, err := a.cli.Put(ctx, k, `{"home":"b","epoch":1}`); err != nil {
			t.Fatal(err)
		}
	}
	// A claim of shard 9 after them: once the watch brought it, it has
	// brought them.
	if _, err := a.cli.Put(ctx, "/test/shards/9", `{"home":"c","epoch":1}`); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return la.of(9).Home == "c" }, "a's watch brings shard 9's claim")
	if c := la.of(7); c.Home != "a" || c.Gen != won[0].Gen {
		t.Fatalf("after keys in another spelling, a's watch says shard 7 is %+v, want a's claim %+v", c, won[0])
	}

	// A daemon that lists them.
	b := open(t, srv, "b", nil)
	join(t, b, 2)
	var lb claimLog
	b.WatchShards(lb.watch)
	if c := lb.of(7); c.Home != "a" || c.Gen != won[0].Gen {
		t.Fatalf("b's listing says shard 7 is %+v, want a's claim %+v", c, won[0])
	}
}

// TestClaimOverUnreadableRecord: a shard key holding a record that is no
// claim (it does not decode: another program's write, a hand edit) is an
// unclaimed shard, and its home can claim it: the claim replaces the
// record. Were it expected absent, the claim would fail on every round
// (each read of the record saying "unclaimed" again), and the shard would
// have no home for as long as the record stays.
func TestClaimOverUnreadableRecord(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The watcher first: a record that is no claim is handed to the
	// watcher there is when it comes, not kept for a later one.
	var l claimLog
	a.WatchShards(l.watch)
	put, err := a.cli.Put(ctx, a.shardKey(3), `{"home":`)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return l.of(3).Gen == uint64(put.Header.Revision) },
		"a seeing the record at shard 3")
	if c := l.of(3); c.Home != "" {
		t.Fatalf("a record that does not decode is a claim of %q", c.Home)
	}
	won := claim(t, a, 3)
	if won[0].Home != "a" || won[0].Gen <= uint64(put.Header.Revision) {
		t.Fatalf("claim over the record: %+v", won[0])
	}
	got, err := a.cli.Get(ctx, a.shardKey(3))
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].ModRevision != int64(won[0].Gen) {
		t.Fatalf("shard 3 in etcd after the claim: %v %v", got.Kvs, err)
	}

	// A record written over it since is not replaced by a claim that
	// expected the unreadable one.
	if _, err := a.cli.Put(ctx, a.shardKey(5), `[]`); err != nil {
		t.Fatal(err)
	}
	later, err := a.cli.Put(ctx, a.shardKey(5), `{"home":"b","epoch":2}`)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return l.of(5).Home == "b" }, "a seeing b's claim of shard 5")
	won, err = a.ClaimShards(ctx, 1, []int{5}, []uint64{0})
	if err != nil || len(won) != 0 {
		t.Fatalf("claiming shard 5, unclaimed expected, over b's claim at %d: won %+v, %v", later.Header.Revision, won, err)
	}
}

// TestListingForgetsUnreadableRecord: a record that is no claim, gone
// from a listing (deleted while the watch was down), is forgotten: a
// claim of its shard expects the key absent again, not that record.
func TestListingForgetsUnreadableRecord(t *testing.T) {
	var d Dir
	d.shardEvents([]ShardClaim{{Shard: 3, Gen: 10, unreadable: true}})
	if _, ok := d.shards.unreadable[3]; !ok {
		t.Fatal("the feed did not note the record that is no claim")
	}
	d.listedShards(nil, 20)
	if rev, ok := d.shards.unreadable[3]; ok {
		t.Fatalf("a listing without shard 3's key left its record (revision %d) noted", rev)
	}
}
