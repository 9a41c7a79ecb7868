package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// The churn harness: many daemons in this process on one etcd, a Zipf
// lookup and OpenRemote workload, daemons killed, restarted and added, and
// etcd down for a while in the middle. scripts/bench-directory.sh runs it
// at scale; `make test` runs it once, small.
var (
	dbDaemons  = flag.Int("dirbench.daemons", 6, "daemons in the churn harness")
	dbDuration = flag.Duration("dirbench.duration", 6*time.Second, "length of the workload")
	dbOutage   = flag.Duration("dirbench.outage", 2*time.Second, "how long etcd is down, mid-run (0: never)")
	dbTTL      = flag.Duration("dirbench.ttl", time.Second, "the daemons' etcd lease TTL")
	dbBudget   = flag.Duration("dirbench.budget", 500*time.Millisecond, "the staleness budget")
	dbExports  = flag.Int("dirbench.exports", 4, "exports per daemon")
	dbWorkers  = flag.Int("dirbench.workers", 4, "workload goroutines")
	dbOpenPct  = flag.Int("dirbench.open-pct", 10, "share of operations that are OpenRemote (the rest are lookups), percent")
	dbStream   = flag.Int("dirbench.stream-pct", 20, "share of operations in the stream-first lane, percent")
	dbChurn    = flag.Duration("dirbench.churn", 0, "pause between churn events (0: duration/15)")
	dbZipf     = flag.Float64("dirbench.zipf", 1.1, "Zipf exponent over (daemon, export)")
	dbReport   = flag.Bool("dirbench.report", false, "print the report on stdout")
)

// benchDaemon is one daemon of the harness.
type benchDaemon struct {
	id     string
	d      *Daemon
	cancel context.CancelFunc
	done   chan error
	cli    *client.Client
	dead   atomic.Bool
}

type benchCluster struct {
	b   *testing.B
	srv *etcdtest.Server
	key string
	// mu guards daemons and nextID.
	mu      sync.Mutex
	daemons []*benchDaemon
	nextID  int
	// gone adds up the etcd requests of the daemons stopped so far.
	gone atomic.Uint64
}

func (c *benchCluster) start(id string) (*benchDaemon, error) {
	dir, err := os.MkdirTemp("", "tcdir")
	if err != nil {
		return nil, err
	}
	cfg := testConfig(dir)
	cfg.PoolSize = 4 << 20
	cfg.DaemonID, cfg.PeerListen, cfg.ClusterKeyFile = id, "127.0.0.1:0", c.key
	cfg.PeerConns = 1
	cfg.RDMA = "off"
	cfg.Directory, cfg.EtcdEndpoints, cfg.EtcdPrefix = "etcd", c.srv.Endpoints(), "/bench/"
	cfg.EtcdLeaseTTL, cfg.StalenessBudget = Duration(*dbTTL), Duration(*dbBudget)
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), env(nil))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	bd := &benchDaemon{id: id, d: d, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	bd.cancel = cancel
	go func() {
		bd.done <- d.Run(ctx)
		os.RemoveAll(dir)
	}()
	bd.cli, err = client.Dial(cfg.Socket, client.Options{Name: "bench", CallTimeout: 10 * time.Second})
	if err != nil {
		bd.stop(false)
		return nil, err
	}
	buf, err := bd.cli.RegisterBuffer(64 << 10)
	if err != nil {
		bd.stop(false)
		return nil, err
	}
	for i := range *dbExports {
		if _, err := bd.cli.ExportSegment(fmt.Sprint("e", i), buf.ID, 0, 0, client.RightRead); err != nil {
			bd.stop(false)
			return nil, err
		}
	}
	return bd, nil
}

// stop ends the daemon; crash stops its directory first without revoking
// the lease, as a killed process would leave it.
func (bd *benchDaemon) stop(crash bool) {
	if !bd.dead.CompareAndSwap(false, true) {
		return
	}
	if crash {
		bd.d.dir.Abandon()
	}
	if bd.cli != nil {
		bd.cli.Close()
	}
	bd.cancel()
	<-bd.done
}

// latencies collects durations of one kind.
type latencies struct {
	mu sync.Mutex // guards d
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) pct(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func (l *latencies) n() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// benchCounts are the workload's own counts.
type benchCounts struct {
	lookups, hits, fallbacks, unavailable, notFound atomic.Uint64
	// steady*: the same with etcd up and the source's directory current
	// (the outage and the recovery from it are reported on their own).
	steadyLookups, steadyHits, steadyFallbacks atomic.Uint64
	// falseSuccess counts answers that claim the cache within the budget
	// while older, or the store while etcd was down.
	falseSuccess atomic.Uint64
	// outage*: lookups while etcd was down and the cache past the budget.
	outageLookups, outageClosed                            atomic.Uint64
	opens, openOK, openNotFound, openUnavailable, openFail atomic.Uint64
}

// BenchmarkDirectoryChurn runs the churn harness once per iteration and
// reports the seed's gates: cache hit rate, fallback rate, etcd requests
// per 1,000 lookups, lookup latency from the cache and on fallback, how
// fast a dead daemon disappears and a restarted one appears, and that
// with etcd down nothing succeeds falsely and lookups beyond the budget
// fail closed.
func BenchmarkDirectoryChurn(b *testing.B) {
	for range b.N {
		runChurn(b)
	}
}

func runChurn(b *testing.B) {
	srv := etcdtest.Start(b)
	c := &benchCluster{b: b, srv: srv, key: testutil.KeyFile(b, b.TempDir(), "cluster.key", "tensorcast churn key")}
	defer func() {
		c.mu.Lock()
		ds := slices.Clone(c.daemons)
		c.mu.Unlock()
		for _, d := range ds {
			d.stop(false)
		}
	}()
	startAll := time.Now()
	for i := range *dbDaemons {
		d, err := c.start(fmt.Sprint("d", i))
		if err != nil {
			b.Fatalf("daemon %d: %v", i, err)
		}
		c.daemons = append(c.daemons, d)
	}
	c.nextID = *dbDaemons
	obs := c.daemons[0] // never churned: measures appear and disappear
	testutil.Eventually(b, 30*time.Second, func() bool {
		return obs.d.dir.Cache().Stats().Members == *dbDaemons && obs.d.dir.Cache().Stats().Exports == *dbDaemons**dbExports
	}, "the observer seeing every daemon and export: %+v", testutil.Lazy(obs.d.dir.Cache().Stats))
	startup := time.Since(startAll)
	// The process's descriptors, sampled each second: 100 daemons in one
	// process share its limit, and a daemon that cannot get one fails to
	// start (its listener, say) for a reason that is not the directory's.
	var fdPeak atomic.Int64
	var fdLimit unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &fdLimit)
	fdStop := make(chan struct{})
	fdDone := make(chan struct{})
	go func() {
		defer close(fdDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			if ents, err := os.ReadDir("/proc/self/fd"); err == nil && int64(len(ents)) > fdPeak.Load() {
				fdPeak.Store(int64(len(ents)))
			}
			select {
			case <-fdStop:
				return
			case <-t.C:
			}
		}
	}()
	stopFDs := sync.OnceFunc(func() { close(fdStop); <-fdDone })
	defer stopFDs()

	var cnt benchCounts
	var outageGone atomic.Int64
	var hitLat, storeLat, peerLat, openLat, goneLat, appearLat latencies
	var etcdDown atomic.Bool
	var downSince, upAgain atomic.Int64 // unix ns
	budget := *dbBudget
	reqBase := uint64(0)
	for _, d := range c.daemons {
		reqBase += d.d.dir.Requests()
	}

	ctx, stopWork := context.WithTimeout(context.Background(), *dbDuration)
	defer stopWork()
	var wg, workers sync.WaitGroup
	pick := func(r *rand.Rand, z *rand.Zipf) (*benchDaemon, string, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		src := c.daemons[r.Intn(len(c.daemons))]
		k := int(z.Uint64())
		return src, fmt.Sprint("d", k / *dbExports), fmt.Sprint("e", k%*dbExports)
	}
	for w := range *dbWorkers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r := rand.New(rand.NewSource(int64(w) + 1))
			z := rand.NewZipf(r, *dbZipf, 1, uint64(*dbDaemons**dbExports-1))
			for ctx.Err() == nil {
				src, owner, name := pick(r, z)
				if src.dead.Load() {
					continue
				}
				lane := directory.LaneCatalogFirst
				if r.Intn(100) < *dbStream {
					lane = directory.LaneStreamFirst
				}
				if r.Intn(100) < *dbOpenPct {
					if owner == src.id {
						continue
					}
					cnt.opens.Add(1)
					t0 := time.Now()
					rs, err := src.cli.OpenRemote(owner+"/"+name, client.RightRead, client.WithLane(lane.String()))
					openLat.add(time.Since(t0))
					switch {
					case errors.Is(err, client.ErrNotFound):
						cnt.openNotFound.Add(1)
						continue
					case errors.Is(err, client.ErrUnavailable):
						cnt.openUnavailable.Add(1)
						continue
					case err != nil:
						cnt.openFail.Add(1)
						continue
					}
					cnt.openOK.Add(1)
					_ = src.cli.CloseRemote(rs.ID)
					continue
				}
				cnt.lookups.Add(1)
				down := etcdDown.Load()
				steady := !down && src.d.dir.State() == directory.StateUp
				t0 := time.Now()
				v, err := src.d.dir.ResolveExport(ctx, lane, owner, name)
				lat := time.Since(t0)
				if errors.Is(err, directory.ErrClosed) {
					continue
				}
				pastBudget := down && time.Since(time.Unix(0, downSince.Load())) > budget+budget/4
				if pastBudget {
					cnt.outageLookups.Add(1)
				}
				if steady {
					cnt.steadyLookups.Add(1)
					switch v.Source {
					case directory.SourceCache:
						cnt.steadyHits.Add(1)
					case directory.SourceStore, directory.SourcePeer:
						cnt.steadyFallbacks.Add(1)
					}
				}
				switch {
				case v.Source == directory.SourceCache:
					cnt.hits.Add(1)
					hitLat.add(lat)
					if v.Age > budget {
						cnt.falseSuccess.Add(1)
					}
				case v.Source == directory.SourceStore:
					cnt.fallbacks.Add(1)
					storeLat.add(lat)
					if err == nil && pastBudget {
						cnt.falseSuccess.Add(1)
					}
				case v.Source == directory.SourcePeer:
					cnt.fallbacks.Add(1)
					peerLat.add(lat)
				}
				switch {
				case errors.Is(err, directory.ErrUnavailable):
					cnt.unavailable.Add(1)
					if pastBudget {
						cnt.outageClosed.Add(1)
					}
				case errors.Is(err, directory.ErrNotFound):
					cnt.notFound.Add(1)
				case err == nil && pastBudget && lane == directory.LaneCatalogFirst:
					cnt.falseSuccess.Add(1)
				case err == nil && pastBudget && v.Source != directory.SourcePeer:
					cnt.falseSuccess.Add(1)
				}
				if pastBudget && err == nil && v.Source == directory.SourcePeer {
					// Handed to the peer to confirm: not an answer of the
					// directory's own; counted as closed for the gate.
					cnt.outageClosed.Add(1)
				}
			}
		}()
	}

	// Churn and the outage, on this goroutine.
	churn := *dbChurn
	if churn <= 0 {
		churn = *dbDuration / 15
	}
	var killed []string
	var events []string
	outageAt := time.Now().Add(*dbDuration * 3 / 5)
	outageDone := *dbOutage == 0
	rng := rand.New(rand.NewSource(99))
	tick := time.NewTicker(churn)
	defer tick.Stop()
	// Each kill's time to leave etcd (its member key deleted, seen by a
	// watch of the harness's own) and the observer's cache, so that a
	// slow one says which of the two was slow.
	// It reconnects as fast as the daemons do (gRPC's default backoff
	// would find etcd back seconds late, and blame etcd for it).
	watcher, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 15 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: *dbTTL / 3}})}})
	if err != nil {
		b.Fatal(err)
	}
	defer watcher.Close()
	var goneMu sync.Mutex
	var goneSaid []string
	watchGone := func(id string, since time.Time) {
		wg.Add(2)
		etcdGone := make(chan time.Duration, 1)
		leftAt := make(chan time.Duration, 1)
		go func() {
			defer wg.Done()
			wctx, cancel := context.WithTimeout(context.Background(), *dbTTL+*dbOutage+10*time.Second)
			defer cancel()
			key := "/bench/members/" + id
			r, err := watcher.Get(wctx, key)
			if err == nil && len(r.Kvs) == 1 {
				if ttl, err := watcher.TimeToLive(wctx, clientv3.LeaseID(r.Kvs[0].Lease)); err == nil {
					leftAt <- time.Duration(ttl.TTL) * time.Second
				}
			}
			close(leftAt)
			if err == nil && len(r.Kvs) == 0 {
				etcdGone <- time.Since(since)
				return
			} else if err == nil {
				for resp := range watcher.Watch(wctx, key, clientv3.WithRev(r.Header.Revision+1), clientv3.WithFilterPut()) {
					if len(resp.Events) > 0 {
						etcdGone <- time.Since(since)
						return
					}
				}
			}
			etcdGone <- -1
		}()
		go func() {
			defer wg.Done()
			if etcdtest.WaitFor(context.Background(), *dbTTL+*dbOutage+10*time.Second, func() bool {
				_, ok := obs.d.dir.Cache().Peek(id)
				return !ok
			}) {
				took := time.Since(since)
				// A lease still alive when etcd went down is renewed by its
				// restart (as after any leader change): such a kill is not
				// a measure of the TTL.
				ds, up := downSince.Load(), upAgain.Load()
				if ds == 0 || since.Add(*dbTTL+time.Second).UnixNano() < ds || (up != 0 && since.UnixNano() > up) {
					goneLat.add(took)
				} else {
					outageGone.Add(1)
				}
				e := <-etcdGone
				left, ok := <-leftAt
				if !ok {
					left = -1
				}
				goneMu.Lock()
				goneSaid = append(goneSaid, fmt.Sprintf("%s (lease TTL left at the kill %v) gone from etcd %v, from the observer %v", id, left, e.Round(time.Millisecond), took.Round(time.Millisecond)))
				goneMu.Unlock()
			}
		}()
	}
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		if !outageDone && time.Now().After(outageAt) {
			outageDone = true
			srv.Stop()
			downSince.Store(time.Now().UnixNano())
			etcdDown.Store(true)
			events = append(events, "etcd down")
			t := time.NewTimer(*dbOutage)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			etcdDown.Store(false)
			srv.Restart()
			upAgain.Store(time.Now().UnixNano())
			events = append(events, "etcd up")
			continue
		}
		// No kill whose lease would still run when etcd goes down (its
		// restart renews every lease): those measure the outage, not the
		// TTL.
		canKill := outageDone || time.Until(outageAt) > *dbTTL+time.Second
		switch a := rng.Intn(3); {
		case !canKill && (a == 0 || len(killed) == 0):
			continue
		case a == 0 || len(killed) == 0 && a == 1: // kill one (not the observer)
			c.mu.Lock()
			if len(c.daemons) < 3 {
				c.mu.Unlock()
				continue
			}
			i := 1 + rng.Intn(len(c.daemons)-1)
			d := c.daemons[i]
			c.daemons = slices.Delete(c.daemons, i, i+1)
			c.mu.Unlock()
			t0 := time.Now()
			d.stop(true)
			c.gone.Add(d.d.dir.Requests())
			watchGone(d.id, t0)
			killed = append(killed, d.id)
			events = append(events, "kill "+d.id)
		case a == 1: // restart a killed one: same id, new epoch
			id := killed[0]
			killed = killed[1:]
			t0 := time.Now()
			d, err := c.start(id)
			if err != nil {
				events = append(events, "restart "+id+" failed: "+err.Error())
				continue
			}
			ep := d.d.peers.Node().Epoch()
			if etcdtest.WaitFor(context.Background(), *dbTTL+10*time.Second, func() bool {
				m, ok := obs.d.dir.Cache().Peek(id)
				return ok && m.Epoch == ep
			}) {
				appearLat.add(time.Since(t0))
			}
			c.mu.Lock()
			c.daemons = append(c.daemons, d)
			c.mu.Unlock()
			events = append(events, "restart "+id)
		default: // add a new one (its exports are beyond the Zipf range: its lookups are misses)
			c.mu.Lock()
			id := fmt.Sprint("d", c.nextID)
			c.nextID++
			c.mu.Unlock()
			t0 := time.Now()
			d, err := c.start(id)
			if err != nil {
				events = append(events, "add "+id+" failed: "+err.Error())
				continue
			}
			ep := d.d.peers.Node().Epoch()
			if etcdtest.WaitFor(context.Background(), 10*time.Second, func() bool {
				m, ok := obs.d.dir.Cache().Peek(id)
				return ok && m.Epoch == ep
			}) {
				appearLat.add(time.Since(t0))
			}
			c.mu.Lock()
			c.daemons = append(c.daemons, d)
			c.mu.Unlock()
			events = append(events, "add "+id)
		}
	}
	workEnd := time.Now()
	workers.Wait()
	drain := time.Since(workEnd)
	wg.Wait()
	settle := time.Since(workEnd)

	reqs := uint64(0)
	c.mu.Lock()
	for _, d := range c.daemons {
		reqs += d.d.dir.Requests()
	}
	c.mu.Unlock()
	reqs += c.gone.Load()
	reqs -= min(reqs, reqBase)
	lk := float64(cnt.lookups.Load())
	slk := float64(cnt.steadyLookups.Load())
	if lk == 0 || slk == 0 {
		b.Fatal("no lookups ran")
	}
	// The gates are for a directory whose store answers; the outage has
	// its own line.
	hitRate := float64(cnt.steadyHits.Load()) / slk
	fbRate := float64(cnt.steadyFallbacks.Load()) / slk
	b.ReportMetric(100*hitRate, "hit%")
	b.ReportMetric(100*fbRate, "fallback%")
	b.ReportMetric(float64(reqs)/lk*1000, "etcd-req/1k-lookups")
	b.ReportMetric(float64(hitLat.pct(0.5).Nanoseconds()), "hit-p50-ns")
	b.ReportMetric(float64(hitLat.pct(0.99).Nanoseconds()), "hit-p99-ns")
	b.ReportMetric(float64(cnt.falseSuccess.Load()), "false-successes")
	if cnt.falseSuccess.Load() != 0 {
		b.Errorf("%d lookups succeeded falsely", cnt.falseSuccess.Load())
	}
	if n := cnt.outageLookups.Load(); n != cnt.outageClosed.Load() {
		b.Errorf("%d lookups ran with etcd down past the budget, %d failed closed", n, cnt.outageClosed.Load())
	}
	ttlPlus := *dbTTL + time.Second
	if g := goneLat.pct(1); g > ttlPlus {
		b.Errorf("a dead daemon disappeared after %v, more than lease TTL + 1s (%v)", g, ttlPlus)
	}

	if !*dbReport {
		return
	}
	w := os.Stdout
	fmt.Fprintf(w, "directory churn: %d daemons (+%d added), %d exports each, %v workload, etcd down %v mid-run, lease TTL %v, budget %v, Zipf s=%.2f, %d workers\n",
		*dbDaemons, c.nextID-*dbDaemons, *dbExports, *dbDuration, *dbOutage, *dbTTL, budget, *dbZipf, *dbWorkers)
	fmt.Fprintf(w, "  start-up of %d daemons:            %v; after the workload, %v for the last operations to end and %v to see the last churn through\n",
		*dbDaemons, startup.Round(time.Millisecond), drain.Round(time.Millisecond), settle.Round(time.Millisecond))
	fmt.Fprintf(w, "  lookups:                           %d (%d not found, %d unavailable)\n", cnt.lookups.Load(), cnt.notFound.Load(), cnt.unavailable.Load())
	fmt.Fprintf(w, "  cache hit rate, directory up:      %.2f %%   (goal > 95 %%; whole run, outage included: %.2f %%)\n", 100*hitRate, 100*float64(cnt.hits.Load())/lk)
	fmt.Fprintf(w, "  fallback rate, directory up:       %.2f %%   (goal < 5 %%; whole run: %.2f %%)\n", 100*fbRate, 100*float64(cnt.fallbacks.Load())/lk)
	fmt.Fprintf(w, "  etcd requests per 1,000 lookups:   %.1f    (all directory requests of the surviving daemons, keep-alives and progress requests included)\n", float64(reqs)/lk*1000)
	fmt.Fprintf(w, "  lookup from the cache  p50 / p99:  %v / %v   (%d)\n", hitLat.pct(0.5), hitLat.pct(0.99), hitLat.n())
	fmt.Fprintf(w, "  fallback to etcd       p50 / p99:  %v / %v   (%d)\n", storeLat.pct(0.5), storeLat.pct(0.99), storeLat.n())
	fmt.Fprintf(w, "  fallback to the peer   p50 / p99:  %v / %v   (%d)\n", peerLat.pct(0.5), peerLat.pct(0.99), peerLat.n())
	fmt.Fprintf(w, "  OpenRemote             p50 / p99:  %v / %v   (%d: %d ok, %d not found, %d unavailable, %d other errors)\n", openLat.pct(0.5), openLat.pct(0.99),
		cnt.opens.Load(), cnt.openOK.Load(), cnt.openNotFound.Load(), cnt.openUnavailable.Load(), cnt.openFail.Load())
	fmt.Fprintf(w, "  dead daemon gone       p50 / max:  %v / %v   (%d, and %d whose lease the etcd restart renewed; goal within lease TTL + 1s = %v)\n",
		goneLat.pct(0.5), goneLat.pct(1), goneLat.n(), outageGone.Load(), ttlPlus)
	fmt.Fprintf(w, "  (re)started one seen   p50 / max:  %v / %v   (%d; a restart waits for its old lease)\n", appearLat.pct(0.5), appearLat.pct(1), appearLat.n())
	if up := upAgain.Load(); up != 0 {
		fmt.Fprintf(w, "  etcd was down %v\n", time.Duration(up-downSince.Load()).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "  etcd down past budget: %d lookups, %d failed closed or went to the peer; false successes: %d\n",
		cnt.outageLookups.Load(), cnt.outageClosed.Load(), cnt.falseSuccess.Load())
	stopFDs()
	fmt.Fprintf(w, "  descriptors of the process:        peak %d (limit %d)\n", fdPeak.Load(), fdLimit.Cur)
	if fdLimit.Cur > 0 && uint64(fdPeak.Load()) >= fdLimit.Cur*95/100 {
		fmt.Fprintf(w, "  (the process neared its descriptor limit: a daemon that failed to start or register in this run may have\n"+
			"   lacked one; all the daemons share this one process, where each would have its own)\n")
	}
	fmt.Fprintf(w, "  churn: %s\n", strings.Join(events, ", "))
	goneMu.Lock()
	for _, g := range goneSaid {
		fmt.Fprintf(w, "  killed %s\n", g)
	}
	goneMu.Unlock()
}
