package etcd

import (
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestNeedProgress: a progress request only once the proof is within the
// lead of the budget, and at most one per lead.
func TestNeedProgress(t *testing.T) {
	const budget, lead = 2 * time.Second, 500 * time.Millisecond
	for _, c := range []struct {
		age, since  time.Duration
		asked, want bool
	}{
		{age: 0, want: false},
		{age: 1499 * time.Millisecond, want: false},
		{age: 1500 * time.Millisecond, want: true},
		{age: directory.Never, want: true},
		{age: 1600 * time.Millisecond, since: 100 * time.Millisecond, asked: true, want: false},
		{age: 1600 * time.Millisecond, since: 500 * time.Millisecond, asked: true, want: true},
		{age: 1600 * time.Millisecond, since: -time.Second, asked: true, want: true}, // the clock went back
	} {
		if got := needProgress(c.age, budget, lead, c.since, c.asked); got != c.want {
			t.Errorf("needProgress(age %v, since %v, asked %v) = %v, want %v", c.age, c.since, c.asked, got, c.want)
		}
	}
}

// TestProgressOnlyWhenNeeded: an idle directory asks etcd to prove its
// cache current only when nothing else did for Budget - ProgressLead:
// with etcd's default (no notifications of its own for 10 minutes) about
// once every Budget - ProgressLead, never more often; with etcd sending
// progress notifications more often than that, never. The cache stays
// within its budget throughout (no outage), and the lease is renewed
// once every half TTL.
func TestProgressOnlyWhenNeeded(t *testing.T) {
	const budget, lead = time.Second, 250 * time.Millisecond
	cfg := func(c *Config) { c.Budget, c.ProgressLead = budget, lead }

	t.Run("etcd sends none", func(t *testing.T) {
		srv := etcdtest.Start(t)
		a := open(t, srv, "a", cfg)
		joined := time.Now()
		join(t, a, 1)
		from, start := a.ProgressRequests(), time.Now()
		const n = 4
		testutil.Eventually(t, 20*time.Second, func() bool { return a.ProgressRequests()-from >= n }, "%d progress requests", n)
		took := time.Since(start)
		// n requests, each once the proof is budget-lead old: the first
		// within that, the others one such period apart at least.
		if least := (n - 1) * (budget - lead); took < least {
			t.Fatalf("%d progress requests in %v, want them %v apart at least (the cache's need), not faster", n, took, budget-lead)
		}
		if st := a.State(); st != directory.StateUp {
			t.Fatalf("state %s: the cache passed its budget", st)
		}
		since := time.Since(joined)
		// One at the start, then one every half TTL (a margin of one).
		if r := a.Renewals(); r == 0 || time.Duration(r-2)*renewEvery(a.cfg.LeaseTTL) > since {
			t.Fatalf("%d lease renewals in %v, want one every %v", r, since, renewEvery(a.cfg.LeaseTTL))
		}
	})

	t.Run("etcd notifies", func(t *testing.T) {
		srv := etcdtest.StartWith(t, etcdtest.Options{ProgressNotify: 100 * time.Millisecond})
		a := open(t, srv, "a", cfg)
		join(t, a, 1)
		from := a.ProgressRequests()
		n0 := a.notified.Load()
		// 15 notifications from etcd: 1.5 s, twice the period after which
		// the prober would ask.
		testutil.Eventually(t, 20*time.Second, func() bool { return a.notified.Load()-n0 >= 15 }, "etcd's progress notifications")
		if got := a.ProgressRequests() - from; got != 0 {
			t.Fatalf("%d progress requests while etcd notified the watch every 100ms, want none", got)
		}
		if st := a.State(); st != directory.StateUp || a.Cache().Age() > budget {
			t.Fatalf("state %s, cache age %v: the notifications did not keep it current", st, a.Cache().Age())
		}
	})
}
