package daemon

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// etcdRequests is what etcd says it received: every request message of
// every gRPC method (grpc_server_msg_received_total: a unary call is one,
// each message on a stream one more: lease keep-alives, watch progress
// requests), from every client, in all and by method.
func etcdRequests(t testing.TB, srv *etcdtest.Server) (float64, map[string]float64) {
	t.Helper()
	resp, err := http.Get(srv.Endpoint() + "/metrics")
	if err != nil {
		t.Fatalf("etcd metrics: %v", err)
	}
	defer resp.Body.Close()
	const name = "grpc_server_msg_received_total{"
	total, by := 0.0, map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("etcd metrics: %q: %v", line, err)
		}
		method := "?"
		if i := strings.Index(line, `grpc_method="`); i >= 0 {
			rest := line[i+len(`grpc_method="`):]
			method = rest[:strings.IndexByte(rest, '"')]
		}
		total += v
		by[method] += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("etcd metrics: %v", err)
	}
	if total == 0 {
		t.Fatal("etcd metrics: no grpc_server_msg_received_total")
	}
	return total, by
}

// TestStoreEtcdRequestsSteadyState counts the requests etcd receives
// while three daemons (directory = etcd, the default lease TTL and
// staleness budget) serve 10,000 store operations after a warm-up: puts
// of 4 KiB values, remote gets (each a key another daemon put, fetched
// across hosts) and removes (each removing every copy), from one client
// on each daemon at once. Hot state stays in the daemons. etcd itself
// counts (every message it received), and the test logs the requests per
// 1,000 operations in all. It fails when the requests other than the
// ones the daemons make on a clock (each one's watch progress request
// every 500 ms and lease keep-alive every 3.3 s) pass 1 per 1,000
// operations, or the clocked ones pass their schedule. The total per
// 1,000 operations depends on how many operations a second the clients
// make (about 7 clocked requests a second for three daemons): it is
// recorded in BENCHMARKS.md, not asserted.
func TestStoreEtcdRequestsSteadyState(t *testing.T) {
	srv := etcdtest.Start(t)
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast steady etcd test key")
	cfg := func(c *Config) {
		clusterConfig(c)
		c.PoolSize = 96 << 20
		c.Directory = "etcd"
		c.EtcdEndpoints = []string{srv.Endpoint()}
		c.EtcdPrefix = "/steady/"
		c.Clock = nil
	}
	ids := []string{"d1", "d2", "d3"}
	ds := make([]*peerDaemon, len(ids))
	for i, id := range ids {
		ds[i] = startPeerWith(t, id, key, "", cfg)
	}
	waitMembers(t, ds, ids...)
	testutil.Eventually(t, 30*time.Second, func() bool {
		first := ds[0].d.cluster.ShardClaims()
		homes := map[string]bool{}
		for _, d := range ds {
			cs := d.d.cluster.ShardClaims()
			for s := range cs {
				if cs[s].Gen == 0 || cs[s] != first[s] {
					return false
				}
				homes[cs[s].Home] = true
			}
		}
		return len(homes) == len(ids)
	}, "every shard claimed, by all three daemons, and all agree")

	const size, rounds = 4 << 10, 1112 // 3 clients × rounds × 3 ops ≥ 10,000
	warm := rounds / 4
	// Keys each daemon puts for the others to read, first.
	src := func(i, j int) []byte { return fmt.Appendf(nil, "steady/src/%d/%04d", i, j) }
	for i, d := range ds {
		c := d.dial(t, "seeder")
		for j := range warm + rounds {
			if err := c.PutBytes(src(i, j), clusterValue(src(i, j), size), false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range ds {
		last := src(i, warm+rounds-1)
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := ds[(i+1)%len(ds)].d.cluster.Locate(last)
			return err == nil && len(hs) > 0
		}, "%s announced", last)
	}

	// run has one client on each daemon do rounds [from, to): put a key,
	// get a key the next daemon put (a remote get), remove the key put
	// the round before; it returns the operations done.
	var mu sync.Mutex
	var failed []string
	run := func(from, to int) int {
		var wg sync.WaitGroup
		ops := make([]int, len(ds))
		for i, d := range ds {
			c := d.dial(t, fmt.Sprintf("steady-%d-%d", i, from))
			wg.Add(1)
			go func() {
				defer wg.Done()
				fail := func(format string, a ...any) {
					mu.Lock()
					failed = append(failed, fmt.Sprintf(format, a...))
					mu.Unlock()
				}
				own := func(j int) []byte { return fmt.Appendf(nil, "steady/own/%d/%04d", i, j) }
				for j := from; j < to; j++ {
					if err := c.PutBytes(own(j), clusterValue(own(j), size), false); err != nil {
						fail("d%d put %s: %v", i+1, own(j), err)
						return
					}
					k := src((i+1)%len(ds), j)
					v, err := c.GetBytes(k)
					if err != nil || !bytes.Equal(v, clusterValue(k, size)) {
						fail("d%d get %s: %v (%d bytes)", i+1, k, err, len(v))
						return
					}
					ops[i] += 2
					if j > from {
						if err := c.StoreRemove([][]byte{own(j - 1)}, make([]error, 1)); err != nil {
							fail("d%d remove %s: %v", i+1, own(j-1), err)
							return
						}
						ops[i]++
					}
				}
			}()
		}
		wg.Wait()
		if len(failed) > 0 {
			t.Fatalf("%d failures, first: %s", len(failed), failed[0])
		}
		n := 0
		for _, o := range ops {
			n += o
		}
		return n
	}
	run(0, warm)

	before, byBefore := etcdRequests(t, srv)
	start := time.Now()
	ops := run(warm, warm+rounds)
	took := time.Since(start)
	after, byAfter := etcdRequests(t, srv)
	reqs := after - before
	// The requests the daemons make on a clock, whatever the store does:
	// each daemon's watch progress request every ProgressEvery (the
	// staleness budget / 4: 500 ms) and its lease keep-alive every TTL/3
	// (10 s / 3). The others (reads, transactions, puts, lease grants)
	// are the ones store operations could cause.
	var methods []string
	clocked := 0.0
	for m, v := range byAfter {
		d := v - byBefore[m]
		if d <= 0 {
			continue
		}
		methods = append(methods, fmt.Sprintf("%s %.0f", m, d))
		if m == "Watch" || m == "LeaseKeepAlive" {
			clocked += d
		}
	}
	slices.Sort(methods)
	per := reqs / float64(ops) * 1000
	perOp := (reqs - clocked) / float64(ops) * 1000
	t.Logf("%d store operations in %v (%.0f/s): %.0f etcd requests (%s): %.2f per 1,000 operations in all, %.2f per second; "+
		"%.2f per 1,000 operations besides the watch progress requests and lease keep-alives",
		ops, took.Round(time.Millisecond), float64(ops)/took.Seconds(), reqs, strings.Join(methods, ", "), per, reqs/took.Seconds(), perOp)
	if ops < 10000 {
		t.Fatalf("%d store operations, want at least 10,000", ops)
	}
	if perOp > 1 {
		t.Errorf("%.2f etcd requests per 1,000 store operations besides the clocked ones, want at most 1", perOp)
	}
	// The clocked requests follow their clocks (a margin of a tick per
	// daemon and kind), not the operations.
	ticks := took.Seconds() * float64(len(ds)) * (1/0.5 + 3/10.0)
	if bound := ticks + float64(2*len(ds)); clocked > bound {
		t.Errorf("%.0f watch progress requests and lease keep-alives in %v, want at most %.0f (their schedule)", clocked, took, bound)
	}
}
