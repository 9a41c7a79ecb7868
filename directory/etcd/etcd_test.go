package etcd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// logBuf collects a directory's log lines.
type logBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type testDir struct {
	*Dir
	log *logBuf
}

// open opens a directory for id on srv with a one-second lease.
func open(t *testing.T, srv *etcdtest.Server, id string, mut func(*Config)) testDir {
	t.Helper()
	lb := &logBuf{}
	cfg := Config{Endpoints: srv.Endpoints(), Prefix: "/test/", Self: id, LeaseTTL: time.Second,
		DialTimeout: 2 * time.Second, RetryEvery: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mut != nil {
		mut(&cfg)
	}
	d, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return testDir{d, lb}
}

func join(t *testing.T, d testDir, epoch uint64) {
	t.Helper()
	if err := d.Join(context.Background(), directory.Member{ID: d.cfg.Self, Epoch: epoch, Addr: "127.0.0.1:7000",
		Caps: []string{"tcp"}}); err != nil {
		t.Fatalf("join %s: %v\n%s", d.cfg.Self, err, d.log)
	}
}

// epochOf is the epoch d's cache holds for id, 0 when it holds none.
func epochOf(d testDir, id string) uint64 {
	m, ok := d.Cache().Peek(id)
	if !ok {
		return 0
	}
	return m.Epoch
}

// TestJoinLeaveCrash: a member that joins is seen by the others through
// the watch; one that leaves (Close revokes its lease) is gone at once;
// one that crashes (stops renewing) is gone within its lease TTL.
func TestJoinLeaveCrash(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	b := open(t, srv, "b", nil)
	join(t, b, 2)
	c := open(t, srv, "c", nil)
	join(t, c, 3)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(a, "b") == 2 && epochOf(a, "c") == 3 }, "a sees b and c")
	if epochOf(b, "a") != 1 {
		t.Fatalf("b's first listing has no a: %+v", b.Cache().Members())
	}
	if p, ok := a.Lookup("b"); !ok || p.Addr != "127.0.0.1:7000" || p.Epoch != 2 {
		t.Fatalf("a.Lookup(b) = %+v %v", p, ok)
	}
	if ids := a.List(); len(ids) != 3 || !ids[0].Self || ids[1].ID != "b" {
		t.Fatalf("a.List() = %+v", ids)
	}

	b.Close()
	start := time.Now()
	testutil.Eventually(t, 2*time.Second, func() bool { return epochOf(a, "b") == 0 }, "a sees b leave")
	t.Logf("leave seen after %v", time.Since(start))

	start = time.Now()
	c.Abandon()
	testutil.Eventually(t, 3*time.Second, func() bool { return epochOf(a, "c") == 0 }, "a sees c's lease lapse")
	if took := time.Since(start); took > c.cfg.LeaseTTL+time.Second {
		t.Fatalf("crashed member gone after %v, more than lease TTL %v + 1s", took, c.cfg.LeaseTTL)
	} else {
		t.Logf("crash seen after %v (lease TTL %v)", took, c.cfg.LeaseTTL)
	}
	if a.State() != directory.StateUp {
		t.Fatalf("a state = %s", a.State())
	}
}

// TestRestartNewEpoch: a daemon that crashed and restarts waits for its
// old lease to lapse, then registers its new epoch, which the others see.
func TestRestartNewEpoch(t *testing.T) {
	srv := etcdtest.Start(t)
	obs := open(t, srv, "obs", nil)
	join(t, obs, 9)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(obs, "a") == 1 }, "obs sees a")
	a.Abandon()
	start := time.Now()
	a2 := open(t, srv, "a", nil)
	join(t, a2, 2) // waits for epoch 1's lease
	testutil.Eventually(t, 3*time.Second, func() bool { return epochOf(obs, "a") == 2 }, "obs sees epoch 2")
	if took := time.Since(start); took > a2.cfg.LeaseTTL+time.Second {
		t.Fatalf("restarted member appeared after %v, more than lease TTL + 1s", took)
	}
}

// TestIDCollision: a second live daemon with the same id is refused, and
// the error says who holds it; the first stays registered.
func TestIDCollision(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	dup := open(t, srv, "a", nil)
	err := dup.Join(context.Background(), directory.Member{ID: "a", Epoch: 2, Addr: "127.0.0.1:7001"})
	if !errors.Is(err, directory.ErrIDInUse) {
		t.Fatalf("second daemon with id a: %v", err)
	}
	for _, want := range []string{"127.0.0.1:7000", "0x1", "left"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	obs := open(t, srv, "obs", nil)
	join(t, obs, 5)
	if epochOf(obs, "a") != 1 {
		t.Fatalf("after the refused join, a is %+v", obs.Cache().Members())
	}
	// The refused daemon holds no lease: closing it changes nothing.
	dup.Close()
	if a.State() != directory.StateUp || epochOf(obs, "a") != 1 {
		t.Fatal("the refused daemon displaced the holder")
	}
}

// TestExportCatalog: exports are published beside the registration, seen
// by the others through the watch, and withdrawn; a member's exports go
// with its lease.
func TestExportCatalog(t *testing.T) {
	ctx := context.Background()
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	b := open(t, srv, "b", nil)
	join(t, b, 2)
	a.Exported("kv", 1<<20, directory.RightRead|directory.RightWrite)
	a.Exported("w", 4096, directory.RightRead)
	testutil.Eventually(t, 5*time.Second, func() bool { return len(b.Cache().Exports()) == 2 }, "b sees a's exports")
	v, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "kv")
	if err != nil || v.Source != directory.SourceCache || v.Export.Size != 1<<20 || v.Export.Epoch != 1 || v.Export.Generation == 0 {
		t.Fatalf("b resolves a/kv: %+v %v", v, err)
	}
	gen := v.Export.Generation
	a.Unexported("kv")
	a.Exported("kv", 8192, directory.RightRead)
	testutil.Eventually(t, 5*time.Second, func() bool {
		v, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "kv")
		return err == nil && v.Export.Generation != gen && v.Export.Size == 8192
	}, "b sees a/kv exported again")
	a.Unexported("w")
	testutil.Eventually(t, 5*time.Second, func() bool {
		_, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "w")
		return errors.Is(err, directory.ErrNotFound)
	}, "b sees a/w withdrawn")
	if st := a.Status(ctx); st.Published != 1 || st.Pending != 0 {
		t.Fatalf("a status: published %d pending %d", st.Published, st.Pending)
	}
	a.Abandon()
	testutil.Eventually(t, 3*time.Second, func() bool { return len(b.Cache().Exports()) == 0 }, "a's exports lapse with its lease")
}

// TestEtcdDown: with etcd stopped, lookups within the budget are answered
// from the cache; past it catalog-first fails UNAVAILABLE (the store does
// not answer) and stream-first answers only what it has cached, for the
// peer to confirm; the outage is logged once and shown in the state.
// With etcd back, the directory recovers by itself: the registration
// (lapsed in the client's eyes) is made again with the same epoch, the
// exports with it, and the cache is current.
func TestEtcdDown(t *testing.T) {
	ctx := context.Background()
	srv := etcdtest.Start(t)
	clk := testutil.NewClock(time.Unix(1_700_000_000, 0))
	withClock := func(c *Config) { c.Clock = clk.Now; c.ProgressLead = 20 * time.Millisecond }
	a := open(t, srv, "a", withClock)
	join(t, a, 1)
	a.Exported("kv", 4096, directory.RightRead)
	b := open(t, srv, "b", withClock)
	join(t, b, 2)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(b, "a") == 1 && len(b.Cache().Exports()) == 1 }, "b sees a and a/kv")

	srv.Stop()
	clk.Advance(time.Second) // within the 2s budget
	if v, err := b.ResolveMember(ctx, directory.LaneCatalogFirst, "a"); err != nil || v.Source != directory.SourceCache {
		t.Fatalf("within budget, etcd down: %+v %v", v, err)
	}
	clk.Advance(1500 * time.Millisecond) // past it
	if _, err := b.ResolveMember(ctx, directory.LaneCatalogFirst, "a"); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("catalog-first past budget, etcd down: %v", err)
	}
	if _, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "kv"); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("catalog-first export past budget, etcd down: %v", err)
	}
	if v, err := b.ResolveMember(ctx, directory.LaneStreamFirst, "a"); err != nil || v.Source != directory.SourcePeer {
		t.Fatalf("stream-first past budget: %+v %v", v, err)
	}
	if _, err := b.ResolveMember(ctx, directory.LaneStreamFirst, "nobody"); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("stream-first for an unknown id past budget: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return b.State() == directory.StateDown }, "b notices the outage")
	// Let the prober run a few more rounds: the outage is said once.
	clk.Advance(time.Second)
	testutil.Eventually(t, 5*time.Second, func() bool { return a.log.count("directory keep-alives ended") == 1 }, "a's keep-alives lapse")
	if n := b.log.count("etcd unreachable: lookups"); n != 1 {
		t.Fatalf("outage logged %d times:\n%s", n, b.log)
	}
	if st := b.Status(ctx); st.State != directory.StateDown || st.Outages != 1 || st.Cache.Unavailable < 3 {
		t.Fatalf("status while down: %+v", st)
	}

	srv.Restart()
	testutil.Eventually(t, 10*time.Second, func() bool { return b.State() == directory.StateUp }, "b recovers")
	// etcd's restart renewed a's lease: a keeps it, and writes nothing.
	testutil.Eventually(t, 10*time.Second, func() bool { return a.log.count("the registration stands") == 1 }, "a finds its lease kept")
	if n := a.log.count("registration lost"); n != 0 {
		t.Fatalf("a registered again though etcd kept its lease:\n%s", a.log)
	}
	if v, err := b.ResolveMember(ctx, directory.LaneCatalogFirst, "a"); err != nil || v.Source != directory.SourceCache || v.Member.Epoch != 1 {
		t.Fatalf("after recovery: %+v %v", v, err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		v, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "kv")
		return err == nil && v.Source == directory.SourceCache
	}, "a/kv is in b's cache")
	if n := b.log.count("etcd reachable again"); n != 1 {
		t.Fatalf("recovery logged %d times:\n%s", n, b.log)
	}
	// a is there once, and stays after its lease's TTL: its keep-alives
	// resumed.
	clk.Advance(100 * time.Millisecond)
	c := open(t, srv, "c", nil)
	join(t, c, 3)
	if epochOf(c, "a") != 1 || len(c.Cache().Exports()) != 1 {
		t.Fatalf("a fresh member's view after the recovery: %+v %+v", c.Cache().Members(), c.Cache().Exports())
	}
}

// TestCrashAfterOutage: after etcd came back and a resumed its kept
// lease, a crash is seen within the TTL (the keep-alives that ended in
// the outage hold nothing up).
func TestCrashAfterOutage(t *testing.T) {
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	b := open(t, srv, "b", nil)
	join(t, b, 2)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(b, "a") == 1 }, "b sees a")
	srv.Stop()
	testutil.Eventually(t, 5*time.Second, func() bool { return a.log.count("directory keep-alives ended") == 1 }, "a's keep-alives lapse")
	srv.Restart()
	testutil.Eventually(t, 10*time.Second, func() bool { return a.log.count("the registration stands") == 1 }, "a finds its lease kept")
	testutil.Eventually(t, 10*time.Second, func() bool { return b.State() == directory.StateUp }, "b current")
	start := time.Now()
	a.Abandon()
	testutil.Eventually(t, 10*time.Second, func() bool { return epochOf(b, "a") == 0 }, "b sees a's lease lapse")
	if took := time.Since(start); took > a.cfg.LeaseTTL+time.Second {
		t.Fatalf("crash after an outage seen after %v", took)
	}
}

// TestEtcdNotReachedAtStart: a directory opened while etcd does not
// answer says so once its staleness budget has passed since it opened,
// not at its first look (its cache's age is "never" until the first
// listing), and says once that etcd answers when it does.
func TestEtcdNotReachedAtStart(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.Stop()
	clk := testutil.NewClock(time.Unix(1_700_000_000, 0))
	b := open(t, srv, "b", func(c *Config) { c.Clock = clk.Now; c.ProgressLead = 20 * time.Millisecond })
	// Three listings tried and failed: the prober, which looks every
	// 10 ms, has looked several times meanwhile.
	testutil.Eventually(t, 10*time.Second, func() bool { return b.Requests() >= 3 }, "b tries to list")
	if st, n := b.State(), b.log.count("etcd not reached yet"); st != "connecting" || n != 0 {
		t.Fatalf("within the budget of its opening: state %q, %d outages logged:\n%s", st, n, b.log)
	}
	clk.Advance(2*time.Second + time.Millisecond)
	testutil.Eventually(t, 5*time.Second, func() bool { return b.State() == directory.StateDown }, "b says etcd is not reached")
	srv.Restart()
	testutil.Eventually(t, 10*time.Second, func() bool { return b.State() == directory.StateUp }, "b reaches etcd")
	if n, m := b.log.count("etcd not reached yet"), b.log.count("etcd reachable again"); n != 1 || m != 1 {
		t.Fatalf("not reached logged %d times, reachable again %d times, want once each:\n%s", n, m, b.log)
	}
}

// TestTLS: with etcd serving https and asking for client certificates, a
// directory with the CA, certificate and key files joins and sees the
// others; without the client certificate it cannot register; files that
// are missing or hold no certificate are refused at Open.
func TestTLS(t *testing.T) {
	srv := etcdtest.StartTLS(t)
	f := srv.TLS()
	withTLS := func(c *Config) { c.CAFile, c.CertFile, c.KeyFile = f.CA, f.ClientCert, f.ClientKey }
	a := open(t, srv, "a", withTLS)
	join(t, a, 1)
	b := open(t, srv, "b", withTLS)
	join(t, b, 2)
	if epochOf(b, "a") != 1 {
		t.Fatalf("b over TLS: %+v", b.Cache().Members())
	}
	noCert := open(t, srv, "c", func(c *Config) { c.CAFile = f.CA; c.DialTimeout = 500 * time.Millisecond })
	if err := noCert.Join(context.Background(), directory.Member{ID: "c", Epoch: 3, Addr: "127.0.0.1:1"}); !errors.Is(err, directory.ErrUnavailable) {
		t.Fatalf("join without a client certificate: %v", err)
	}
	for _, c := range []Config{
		{CAFile: "/nonexistent/ca.pem"},
		{CAFile: f.ClientKey}, // a key, not a certificate
		{CAFile: f.CA, CertFile: f.ClientCert, KeyFile: "/nonexistent/key.pem"},
		{CAFile: f.CA, CertFile: f.ClientCert},
	} {
		c.Endpoints, c.Self = srv.Endpoints(), "x"
		if _, err := Open(c); !errors.Is(err, directory.ErrConfig) {
			t.Errorf("Open with %+v: %v, want ErrConfig", c, err)
		}
	}
}

// TestLeaseRevokedRegistersAgain: a lease etcd no longer holds (revoked
// here, as a lapse while this daemon was cut off would leave it) ends the
// keep-alives, the check finds it gone, and the daemon registers again
// under a new lease, with its catalog.
func TestLeaseRevokedRegistersAgain(t *testing.T) {
	ctx := context.Background()
	srv := etcdtest.Start(t)
	a := open(t, srv, "a", nil)
	join(t, a, 1)
	a.Exported("kv", 4096, directory.RightRead)
	b := open(t, srv, "b", nil)
	join(t, b, 2)
	testutil.Eventually(t, 5*time.Second, func() bool { return epochOf(b, "a") == 1 && len(b.Cache().Exports()) == 1 }, "b sees a and a/kv")
	a.smu.Lock()
	old := a.lease
	a.smu.Unlock()
	if _, err := b.cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return a.log.count("registered in the directory again") == 1 }, "a registers again")
	if n := a.log.count("registration lost"); n != 1 {
		t.Fatalf("registration lost logged %d times:\n%s", n, a.log)
	}
	if n := a.log.count("the registration stands"); n != 0 {
		t.Fatalf("a kept a revoked lease:\n%s", a.log)
	}
	a.smu.Lock()
	cur := a.lease
	a.smu.Unlock()
	if cur == old || cur == 0 {
		t.Fatalf("lease after registering again %x (before %x)", cur, old)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		v, err := b.ResolveExport(ctx, directory.LaneCatalogFirst, "a", "kv")
		return epochOf(b, "a") == 1 && err == nil && v.Source == directory.SourceCache
	}, "b sees a and a/kv again")
}
