package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// etcdCluster is daemons sharing one etcd, the cluster key and a clock.
type etcdCluster struct {
	t   *testing.T
	srv *etcdtest.Server
	key string
	clk *testutil.Clock // the daemons' staleness budget reads it
}

func newEtcdCluster(t *testing.T) *etcdCluster {
	srv := etcdtest.Start(t)
	return &etcdCluster{t: t, srv: srv, key: testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast directory test key"),
		clk: testutil.NewClock(time.Unix(1_700_000_000, 0))}
}

func (e *etcdCluster) withEtcd(listen string, mut func(*Config)) func(*Config) {
	return func(c *Config) {
		c.Directory = "etcd"
		c.EtcdEndpoints = e.srv.Endpoints()
		c.EtcdPrefix = "/t/"
		c.EtcdLeaseTTL = Duration(time.Second)
		c.StalenessBudget = Duration(2 * time.Second)
		c.Clock = e.clk.Now
		if listen != "" {
			c.PeerListen = listen
		}
		if mut != nil {
			mut(c)
		}
	}
}

// keys counts the keys under prefix in etcd, read directly.
func (e *etcdCluster) keys(prefix string) int64 {
	e.t.Helper()
	// Generous bounds: the whole suite runs beside this under -race.
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.srv.Endpoints(), DialTimeout: 15 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.Count
}

// start runs a daemon with the etcd directory and no configured peers.
func (e *etcdCluster) start(id string, mut func(*Config)) *peerDaemon {
	e.t.Helper()
	return startPeerWith(e.t, id, e.key, "", e.withEtcd("", mut))
}

// agedPast advances e's clock past the staleness budget of d's directory
// entry of id, and again while a confirmation that was on its way when the
// test stopped etcd (a progress notification read late, on a loaded host)
// dates the entry afresh on the advanced clock.
func (e *etcdCluster) agedPast(d *peerDaemon, id string) {
	e.t.Helper()
	c := d.d.dir.Cache()
	age := func() time.Duration {
		for _, m := range c.Members() {
			if m.Member.ID == id {
				return m.Age
			}
		}
		return directory.Never
	}
	e.clk.Advance(c.Budget() + time.Second)
	testutil.Eventually(e.t, 10*time.Second, func() bool {
		if age() <= c.Budget() {
			e.clk.Advance(c.Budget() + time.Second)
		}
		return age() > c.Budget()
	}, "%s's entry of %s past the budget", d.cfg.DaemonID, id)
}

// sees waits until d's directory holds id at epoch (0: does not hold id).
func sees(t *testing.T, d *peerDaemon, id string, epoch uint64) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		m, found := d.d.dir.Cache().Peek(id)
		if epoch == 0 {
			return !found
		}
		return found && m.Epoch == epoch
	}, "%s's directory showing %s at epoch %#x: %+v", d.cfg.DaemonID, id, epoch,
		testutil.Lazy(func() any { return d.d.dir.Cache().Members() }))
}

func epochOf(d *peerDaemon) uint64 { return d.d.peers.Node().Epoch() }

// pair starts d1 and d2 on e's directory and waits until each lists the
// other (a daemon accepts only the peers its directory knows); exporter,
// a client of d1, exports a 1 MiB buffer as "kv", and opener is a client of
// d2.
func (e *etcdCluster) pair() (d1, d2 *peerDaemon, exporter, opener *client.Client) {
	e.t.Helper()
	d1 = e.start("d1", nil)
	d2 = e.start("d2", nil)
	sees(e.t, d2, "d1", epochOf(d1))
	sees(e.t, d1, "d2", epochOf(d2))
	// Each has dialed the other: its store's prober has had a hello
	// answered there (a session's connections are all dialed when it is
	// up). A handshake confirms the directory entry of the daemon it
	// shows, as of the daemons' clock; one that came later, after a test
	// aged the entry on that clock, would make it fresh again.
	for _, d := range []*peerDaemon{d1, d2} {
		testutil.Eventually(e.t, 10*time.Second, func() bool { return d.d.cluster.Served()["tc.store.hello"] > 0 },
			"%s answering the other's hello", d.cfg.DaemonID)
	}
	exporter = d1.dial(e.t, "exporter")
	exportBuffer(e.t, exporter, 1<<20, client.RightRead|client.RightWrite, "kv")
	return d1, d2, exporter, d2.dial(e.t, "opener")
}

// openRW opens remote name read-write from c, with a 256 KiB buffer of c's
// to move its bytes through (roundTrip).
func openRW(t *testing.T, c *client.Client, name string) (client.RemoteSegment, *client.Buffer) {
	t.Helper()
	return openRemote(t, c, name, client.RightRead|client.RightWrite), newBuffer(t, c, 256<<10)
}

// roundTrip writes 64 KiB of pattern into the remote segment and reads it
// back through buf.
func roundTrip(c *client.Client, buf *client.Buffer, remote xfer.SegmentID, pattern byte) error {
	for i := range 64 << 10 {
		buf.Mem[i] = pattern + byte(i)
	}
	res := make([]error, 1)
	w := xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: remote, Length: 64 << 10}
	if _, err := c.Transfer([]xfer.Request{w}, 10*time.Second, res); err != nil || res[0] != nil {
		return errors.Join(err, res[0])
	}
	r := xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: 64 << 10, Target: remote, Length: 64 << 10}
	if _, err := c.Transfer([]xfer.Request{r}, 10*time.Second, res); err != nil || res[0] != nil {
		return errors.Join(err, res[0])
	}
	if !bytes.Equal(buf.Mem[:64<<10], buf.Mem[64<<10:128<<10]) {
		return errors.New("the bytes read back differ from those written")
	}
	return nil
}

// TestDirectoryOpenUnlisted: with the etcd directory, a daemon opens an
// export of a daemon its config does not name: the member and its export
// are found through etcd, the owner issues the token, the bytes move.
// The member and its export show in the other's directory with their
// epochs, and the stats carry the directory's counters.
func TestDirectoryOpenUnlisted(t *testing.T) {
	d1, d2, _, b := newEtcdCluster(t).pair()
	testutil.Eventually(t, 10*time.Second, func() bool {
		v, err := d2.d.dir.ResolveExport(context.Background(), directory.LaneCatalogFirst, "d1", "kv")
		return err == nil && v.Export.Size == 1<<20 && v.Export.Epoch == epochOf(d1)
	}, "d2's catalog showing d1/kv: %+v", testutil.Lazy(func() any { return d2.d.dir.Cache().Exports() }))
	rs, buf := openRW(t, b, "d1/kv")
	if rs.Epoch != epochOf(d1) {
		t.Fatalf("opened at epoch %#x, d1 runs %#x", rs.Epoch, epochOf(d1))
	}
	if err := roundTrip(b, buf, rs.ID, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.OpenRemote("d9/kv", client.RightRead); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unknown daemon: %v, want NOT_FOUND", err)
	}
	if _, err := b.OpenRemote("d1/kv", client.RightRead, client.WithLane("fast-lane")); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("unknown lane: %v, want INVALID_ARGUMENT", err)
	}
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range st.Transports {
		got[c.Name] = c.Value
	}
	if got["directory_up"] != 1 || got["directory_members"] != 2 || got["directory_hits"] == 0 || got["directory_etcd_requests"] == 0 {
		t.Fatalf("directory counters in stats: %v", got)
	}
	status := d2.d.dir.Status(context.Background())
	if status.State != directory.StateUp || len(status.Members) != 2 || status.Members[0].LeaseLeft < 0 {
		t.Fatalf("status: %+v", status)
	}
	// And the metrics: the same counters, the cache's age within the
	// budget (the daemons' clock stands still).
	exp := scrapeMetrics(t, d2.d.MetricsAddr())
	for series, want := range map[string]float64{
		`tensorcast_directory_up`:                         1,
		`tensorcast_directory_members`:                    2,
		`tensorcast_directory_staleness_budget_seconds`:   2,
		`tensorcast_directory_cache_age_seconds`:          0,
		`tensorcast_directory_unavailable_total`:          0,
		`tensorcast_directory_fallbacks_total{to="peer"}`: 0,
	} {
		if got := sample(t, exp, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if sample(t, exp, `tensorcast_directory_hits_total`) == 0 || sample(t, exp, `tensorcast_directory_lookups_total`) == 0 ||
		sample(t, exp, `tensorcast_directory_etcd_requests_total`) == 0 || sample(t, exp, `tensorcast_directory_exports`) == 0 {
		t.Errorf("directory metrics without lookups, hits, etcd requests or exports:\n%s", exp)
	}
	sample(t, exp, `tensorcast_directory_fallbacks_total{to="store"}`)
}

// TestDirectoryIDCollision: a second daemon with the id of a live one
// does not start, and says who holds the id. It is refused before its
// peer plane listens: its peer_listen is a port the test holds, and the
// refusal is the id's, not the port's.
func TestDirectoryIDCollision(t *testing.T) {
	e := newEtcdCluster(t)
	d1 := e.start("d1", nil)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.DaemonID, cfg.PeerListen, cfg.ClusterKeyFile = "d1", held.Addr().String(), e.key
	e.withEtcd("", nil)(&cfg)
	var logs lockedBuffer
	_, err = New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), env(nil))
	if !errors.Is(err, directory.ErrIDInUse) {
		t.Fatalf("second d1 (peer_listen on a held port): %v, want the id refused before the port is tried", err)
	}
	if strings.Contains(logs.String(), "peer plane up") {
		t.Fatalf("the refused daemon brought its peer plane up:\n%s", logs.String())
	}
	if !strings.Contains(err.Error(), d1.d.PeerAddr()) || !strings.Contains(err.Error(), "daemon_id") {
		t.Fatalf("refusal does not say who holds the id and which key to change: %v", err)
	}
	// The holder is untouched.
	d2 := e.start("d2", nil)
	sees(t, d2, "d1", epochOf(d1))
}

// TestDirectoryRestartEpoch: a daemon that restarts registers a new epoch;
// a segment opened at the old epoch is refused by the owner (its token
// names the old epoch), and opening it again works at the new one.
func TestDirectoryRestartEpoch(t *testing.T) {
	e := newEtcdCluster(t)
	d1, d2, _, b := e.pair()
	rs, buf := openRW(t, b, "d1/kv")
	if err := roundTrip(b, buf, rs.ID, 1); err != nil {
		t.Fatal(err)
	}
	old := epochOf(d1)
	if err := d1.stop(); err != nil {
		t.Fatal(err)
	}
	// A clean stop leaves: the lease is revoked before Run returns, not
	// left to lapse a TTL later.
	if n := e.keys("/t/members/d1"); n != 0 {
		t.Fatal("d1's registration outlived its clean stop: the lease was not revoked")
	}
	sees(t, d2, "d1", 0)
	d1b := e.start("d1", nil)
	sees(t, d2, "d1", epochOf(d1b))
	if epochOf(d1b) == old {
		t.Fatal("the restarted daemon kept its epoch")
	}
	exportBuffer(t, d1b.dial(t, "exporter"), 1<<20, client.RightRead|client.RightWrite, "kv")
	err := roundTrip(b, buf, rs.ID, 2)
	if !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("a segment opened at the old epoch: %v, want PERMISSION_DENIED", err)
	}
	rs2, err := b.OpenRemote("d1/kv", client.RightRead|client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	if rs2.Epoch != epochOf(d1b) {
		t.Fatalf("reopened at %#x, want %#x", rs2.Epoch, epochOf(d1b))
	}
	if err := roundTrip(b, buf, rs2.ID, 3); err != nil {
		t.Fatal(err)
	}
}

// TestDirectoryEtcdDown: with etcd stopped, an open segment keeps moving
// bytes; within the budget opens are served from the cache; past it a
// catalog-first open fails UNAVAILABLE, a stream-first one goes to the
// peer (whose handshake and token answer), and one for a daemon the
// cache does not know fails UNAVAILABLE. etcd back, the directory
// recovers by itself and catalog-first opens work again.
func TestDirectoryEtcdDown(t *testing.T) {
	e := newEtcdCluster(t)
	_, d2, a, b := e.pair()
	exportBuffer(t, a, 1<<20, client.RightRead|client.RightWrite, "kv2")
	rs, buf := openRW(t, b, "d1/kv")

	e.srv.Stop()
	if err := roundTrip(b, buf, rs.ID, 1); err != nil {
		t.Fatalf("open segment with etcd down: %v", err)
	}
	e.clk.Advance(time.Second)
	r2, err := b.OpenRemote("d1/kv2", client.RightRead)
	if err != nil {
		t.Fatalf("catalog-first open within the budget, etcd down: %v", err)
	}
	_ = b.CloseRemote(r2.ID)
	// That open confirmed d1's entry at the peer (its epoch as the cache
	// has it), so the entry is as old as that open.
	e.clk.Advance(2500 * time.Millisecond)
	if _, err := b.OpenRemote("d1/kv2", client.RightRead); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("catalog-first open past the budget, etcd down: %v, want UNAVAILABLE", err)
	}
	r3, err := b.OpenRemote("d1/kv2", client.RightRead, client.WithLane("stream-first"))
	if err != nil {
		t.Fatalf("stream-first open past the budget (the peer answers): %v", err)
	}
	if _, err := b.OpenRemote("d7/kv", client.RightRead, client.WithLane("stream-first")); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("stream-first open of an unknown daemon past the budget: %v, want UNAVAILABLE", err)
	}
	if err := roundTrip(b, buf, rs.ID, 2); err != nil {
		t.Fatalf("open segment, etcd down past the budget: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return d2.d.dir.State() == directory.StateDown }, "d2 noticing the outage")
	_ = b.CloseRemote(r3.ID)

	e.srv.Restart()
	testutil.Eventually(t, 10*time.Second, func() bool { return d2.d.dir.State() == directory.StateUp }, "d2 recovering")
	if _, err := b.OpenRemote("d1/kv2", client.RightRead); err != nil {
		t.Fatalf("catalog-first open after recovery: %v", err)
	}
	if n := strings.Count(d2.log.String(), "etcd unreachable: lookups"); n != 1 {
		t.Fatalf("outage logged %d times", n)
	}
}

// TestDirectoryStaleEntryFenced: the cache's entry for d1 is out of date
// (etcd is down, so it cannot hear otherwise) and the peer's fencing
// decides. First d1 restarts on the same address with a new epoch: the
// handshake shows the new epoch, the open works there, the old epoch's
// segment is refused, and the entry is corrected. Then another daemon
// takes the address: it does not answer as d1, the open fails
// UNAVAILABLE saying so, and the entry is marked stale.
func TestDirectoryStaleEntryFenced(t *testing.T) {
	e := newEtcdCluster(t)
	d1, d2, _, b := e.pair()
	rs, buf := openRW(t, b, "d1/kv")
	addr, old := d1.d.PeerAddr(), epochOf(d1)
	// Counted from here: d2 marks its entry for d1 suspect once, whichever
	// sees first that d1 changed (d2's prober finding d1 gone, d1's new
	// run's handshake, or the open below).
	corrections := d2.d.dir.Cache().Stats().Corrections

	// etcd down: nothing d1 does now reaches d2's cache.
	e.srv.Stop()
	if err := d1.stop(); err != nil {
		t.Fatal(err)
	}
	// d1 again, on its address, with a new epoch; it cannot register (etcd
	// is down), so it runs on the embedded directory, listing d2 (a daemon
	// accepts only the peer ids it knows).
	d1b := startPeerWith(t, "d1", e.key, addr, nil, dialsIn("d2"))
	exportBuffer(t, d1b.dial(t, "exporter"), 1<<20, client.RightRead|client.RightWrite, "kv")
	if m, ok := d2.d.dir.Cache().Peek("d1"); !ok || m.Epoch != old {
		t.Fatalf("d2's entry for d1 = %+v %v, want the old epoch", m, ok)
	}
	e.clk.Advance(3 * time.Second) // past the budget: stream-first goes to the peer
	rs2, err := b.OpenRemote("d1/kv", client.RightRead|client.RightWrite, client.WithLane("stream-first"))
	if err != nil {
		t.Fatalf("stream-first open at the stale address: %v", err)
	}
	if rs2.Epoch != epochOf(d1b) {
		t.Fatalf("opened at %#x, the peer runs %#x", rs2.Epoch, epochOf(d1b))
	}
	if err := roundTrip(b, buf, rs2.ID, 1); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(b, buf, rs.ID, 2); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("segment of the old epoch: %v, want PERMISSION_DENIED", err)
	}
	if got := d2.d.dir.Cache().Stats().Corrections; got != corrections+1 {
		t.Fatalf("corrections %d → %d, want one more (the entry marked suspect once)", corrections, got)
	}

	// Now another daemon on d1's address.
	if err := d1b.stop(); err != nil {
		t.Fatal(err)
	}
	startPeerWith(t, "d3", e.key, addr, nil, dialsIn("d2"))
	// A catalog-first lookup of the suspect entry would go to etcd (down):
	// it fails closed without dialing.
	if _, err := b.OpenRemote("d1/kv", client.RightRead); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("catalog-first open of a suspect entry with etcd down: %v, want UNAVAILABLE", err)
	}
	_, err = b.OpenRemote("d1/kv", client.RightRead, client.WithLane("stream-first"))
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("stream-first open where another daemon answers: %v, want UNAVAILABLE", err)
	}
	if !strings.Contains(d2.log.String(), `answered as daemon \"d3\"`) {
		t.Fatalf("d2 did not log why:\n%s", d2.log)
	}
	// etcd back: d1's registration lapses (its lease was never revoked),
	// and the cache learns it from the store.
	e.srv.Restart()
	sees(t, d2, "d1", 0)
	if _, err := b.OpenRemote("d1/kv", client.RightRead); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("open of a daemon that left, cache corrected: %v, want NOT_FOUND", err)
	}
}

// TestDirectoryHybridCacheFirst: past the staleness budget (etcd down, so
// nothing refreshes the cache) a hybrid-cache-first open of a daemon the
// cache knows goes to that peer, whose handshake and token answer, and
// never to the store; one of a daemon the cache does not know goes to the
// store instead (and fails closed, the store being down), where a
// stream-first one does not wait on the store at all. Within the budget
// all three lanes are served from the cache.
func TestDirectoryHybridCacheFirst(t *testing.T) {
	e := newEtcdCluster(t)
	d1, d2, _, b := e.pair()
	hybrid := client.WithLane("hybrid-cache-first")
	st := func() directory.CacheStats { return d2.d.dir.Cache().Stats() }

	before := st()
	r, err := b.OpenRemote("d1/kv", client.RightRead, hybrid)
	if err != nil {
		t.Fatalf("hybrid-cache-first open within the budget: %v", err)
	}
	_ = b.CloseRemote(r.ID)
	if s := st(); s.Hits != before.Hits+1 || s.FallbackPeer != before.FallbackPeer || s.StoreReads != before.StoreReads {
		t.Fatalf("within the budget: hits %d→%d, peer fallbacks %d→%d, store reads %d→%d; want one hit",
			before.Hits, s.Hits, before.FallbackPeer, s.FallbackPeer, before.StoreReads, s.StoreReads)
	}

	e.srv.Stop()
	e.agedPast(d2, "d1") // etcd cannot refresh it now
	before = st()
	r, err = b.OpenRemote("d1/kv", client.RightRead|client.RightWrite, hybrid)
	if err != nil {
		t.Fatalf("hybrid-cache-first open of a cached daemon past the budget (the peer answers): %v", err)
	}
	if r.Epoch != epochOf(d1) {
		t.Fatalf("opened at epoch %#x, d1 runs %#x", r.Epoch, epochOf(d1))
	}
	buf, err := b.RegisterBuffer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(b, buf, r.ID, 1); err != nil {
		t.Fatalf("segment opened through the peer: %v", err)
	}
	if s := st(); s.FallbackPeer != before.FallbackPeer+1 || s.StoreReads != before.StoreReads || s.Hits != before.Hits {
		t.Fatalf("hybrid, cached, past the budget: peer fallbacks %d→%d, store reads %d→%d, hits %d→%d; want one peer fallback",
			before.FallbackPeer, s.FallbackPeer, before.StoreReads, s.StoreReads, before.Hits, s.Hits)
	}

	// The peer confirmed d1 just now; age the entry past the budget again.
	e.clk.Advance(3 * time.Second)
	before = st()
	if _, err := b.OpenRemote("d1/kv", client.RightRead); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("catalog-first open past the budget, etcd down: %v, want UNAVAILABLE", err)
	}
	if s := st(); s.FallbackStore != before.FallbackStore+1 || s.StoreReads != before.StoreReads+1 {
		t.Fatalf("catalog-first past the budget did not go to the store: store fallbacks %d→%d, reads %d→%d",
			before.FallbackStore, s.FallbackStore, before.StoreReads, s.StoreReads)
	}

	before = st()
	if _, err := b.OpenRemote("d7/kv", client.RightRead, hybrid); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("hybrid-cache-first open of an unknown daemon, etcd down: %v, want UNAVAILABLE", err)
	}
	if s := st(); s.FallbackStore != before.FallbackStore+1 || s.StoreReads != before.StoreReads+1 || s.FallbackPeer != before.FallbackPeer {
		t.Fatalf("hybrid, not cached: store fallbacks %d→%d, reads %d→%d, peer fallbacks %d→%d; want it sent to the store",
			before.FallbackStore, s.FallbackStore, before.StoreReads, s.StoreReads, before.FallbackPeer, s.FallbackPeer)
	}
	before = st()
	if _, err := b.OpenRemote("d7/kv", client.RightRead, client.WithLane("stream-first")); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("stream-first open of an unknown daemon: %v, want UNAVAILABLE", err)
	}
	if s := st(); s.StoreReads != before.StoreReads || s.FallbackPeer != before.FallbackPeer+1 {
		t.Fatalf("stream-first, not cached: store reads %d→%d, peer fallbacks %d→%d; it must not wait on the store",
			before.StoreReads, s.StoreReads, before.FallbackPeer, s.FallbackPeer)
	}
	if err := roundTrip(b, buf, r.ID, 2); err != nil {
		t.Fatalf("open segment after the refusals: %v", err)
	}
}
