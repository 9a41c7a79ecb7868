package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// get reads key from etcd directly: its value and lease, found or not.
func get(t *testing.T, d testDir, key string) (val string, lease int64, found bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].Lease, true
}

// TestClaimThenJoin: a claim reserves the id (a claims key, under a lease
// of its own); Join registers under that lease and deletes the claim in
// the same step.
func TestClaimThenJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	if err := a.Claim(context.Background()); err != nil {
		t.Fatal(err)
	}
	val, claimLease, found := get(t, a, "/test/claims/a")
	if !found || !strings.Contains(val, `"id":"a"`) || claimLease == 0 {
		t.Fatalf("claim key %q lease %x found %v", val, claimLease, found)
	}
	if _, _, found := get(t, a, "/test/members/a"); found {
		t.Fatal("a member key before Join")
	}
	join(t, a, 1)
	if _, _, found := get(t, a, "/test/claims/a"); found {
		t.Fatal("the claim outlived the registration")
	}
	if _, lease, found := get(t, a, "/test/members/a"); !found || lease != claimLease {
		t.Fatalf("member key under lease %x (found %v), want the claim's %x", lease, found, claimLease)
	}
	if err := a.Claim(context.Background()); !errors.Is(err, directory.ErrInvalid) {
		t.Fatalf("a second claim: %v", err)
	}
}

// TestClaimRefused: an id that a live daemon holds, or that another
// daemon starting claimed, cannot be claimed; the refusal says who; a
// claim whose daemon died while starting lapses within its TTL and the id
// can be claimed again.
func TestClaimRefused(t *testing.T) {
	srv := etcdtest.Start(t)
	short := func(c *Config) { c.JoinWait = 300 * time.Millisecond }
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	dup := open(t, srv, "a", short)
	err := dup.Claim(context.Background())
	if !errors.Is(err, directory.ErrIDInUse) || !strings.Contains(err.Error(), "127.0.0.1:7000") {
		t.Fatalf("claim of a held id: %v", err)
	}

	b := open(t, srv, "b", nil)
	if err := b.Claim(context.Background()); err != nil {
		t.Fatal(err)
	}
	dupb := open(t, srv, "b", short)
	err = dupb.Claim(context.Background())
	if !errors.Is(err, directory.ErrIDInUse) || !strings.Contains(err.Error(), "starting with it") {
		t.Fatalf("claim of an id another daemon is starting with: %v", err)
	}
	// b dies while starting: its claim lapses with its lease (1s), and a
	// new daemon's claim, waiting for it, gets through.
	b.Abandon()
	again := open(t, srv, "b", nil)
	start := time.Now()
	if err := again.Claim(context.Background()); err != nil {
		t.Fatalf("claim after the starting daemon died: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the dead claim took %v to lapse, TTL 1s", took)
	}
	join(t, again, 7)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(again, "b") == 7 }, "b registered at epoch 7")
}

// TestClaimLapsedBeforeJoin: a claim lost before Join (its lease gone: a
// start-up that outlasted the TTL) is noticed; Join registers as without
// one, and says so.
func TestClaimLapsedBeforeJoin(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	if err := a.Claim(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, lease, _ := get(t, a, "/test/claims/a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		t.Fatal(err)
	}
	join(t, a, 1)
	if _, l, found := get(t, a, "/test/members/a"); !found || l == lease || l == 0 {
		t.Fatalf("member key found %v under lease %x; want a new lease (the claim's was %x)", found, l, lease)
	}
	if a.log.count("did not last until registration") != 1 {
		t.Fatalf("the lost claim was not logged:\n%s", a.log)
	}
}
