package daemon

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// BenchmarkStoreRemoteGet measures a remote get of 128 values of 256 KiB
// between two daemons over tcp on loopback, beside the tcp transport
// alone moving the same bytes:
//
//	cluster    a client of d2 gets the 128 keys d1 holds through its queue
//	           (home lookups, claims, reads into d2's pool, crc32c, commit,
//	           pins); d2's copies are removed, untimed, between rounds;
//	tcp-alone  a client of d2 READs 128 × 256 KiB from a buffer a client
//	           of d1 exported, in one Transfer.
//
// Both report cpu-s/GB: the CPU time of the whole process (both daemons
// and the clients are in it) per GB moved, over the timed loop (the
// cluster's untimed removal of d2's copies between rounds included).
//
// go test -run '^$' -bench BenchmarkStoreRemoteGet -benchtime 20x ./daemon/
// benchPair starts the benchmarks' two daemons of one cluster, d2 dialing
// d1, with pools of pool bytes, the store in DRAM only, and waits until
// each sees both.
func benchPair(b *testing.B, pool Size) (d1, d2 *peerDaemon) {
	key := testutil.KeyFile(b, b.TempDir(), "cluster.key", "bench cluster key")
	cfg := func(c *Config) {
		c.PeerSliceSize = 1 << 20
		c.PoolSize = pool
		c.StoreL2Path = "off"
		c.StoreShards = 64
	}
	d1 = startPeerWith(b, "d1", key, "", cfg, dialsIn("d2"))
	d2 = startPeerWith(b, "d2", key, "", cfg, d1.peer())
	waitMembers(b, []*peerDaemon{d1, d2}, "d1", "d2")
	return d1, d2
}

func BenchmarkStoreRemoteGet(b *testing.B) {
	const n, size = 128, 256 << 10
	d1, d2 := benchPair(b, 192<<20)

	// The testing package runs a sub-benchmark more than once (b.N = 1,
	// then the count asked for): each run puts its own keys.
	runs := 0
	b.Run("cluster", func(b *testing.B) {
		runs++
		put := d1.dial(b, fmt.Sprintf("putter-%d", runs))
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "bench/%d/%03d", runs, i)
			if err := put.PutBytes(keys[i], clusterValue(keys[i], size), false); err != nil {
				b.Fatal(err)
			}
		}
		for _, k := range keys {
			testutil.Eventually(b, 10*time.Second, func() bool {
				_, hs, err := d2.d.cluster.Locate(k)
				return err == nil && len(hs) > 0
			}, "%s announced", k)
		}
		c := d2.dial(b, fmt.Sprintf("reader-%d", runs))
		q, err := c.OpenQueue(16)
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.NewResults(n)
		if err != nil {
			b.Fatal(err)
		}
		cqes := make([]client.Completion, 1)
		call := func(ud uint64, submit func() (bool, error)) {
			if ok, err := submit(); !ok || err != nil {
				b.Fatalf("submit: %v %v", ok, err)
			}
			if got, err := q.Reap(cqes, 1, 30*time.Second); got != 1 || err != nil {
				b.Fatalf("reap: %d %v", got, err)
			}
		}
		codes := make([]store.Code, n)
		b.SetBytes(n * size)
		cpu := startCPU()
		b.ResetTimer()
		for i := range b.N {
			call(uint64(2*i), func() (bool, error) { return q.Get(keys, res, uint64(2*i)) })
			b.StopTimer()
			if err := res.Check(cqes[0]); err != nil || cqes[0].N != n {
				b.Fatalf("get: %v, %d of %d", err, cqes[0].N, n)
			}
			call(uint64(2*i+1), func() (bool, error) { return q.Unpin(keys, res, uint64(2*i+1)) })
			if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		cpu.report(b, n*size)
	})

	b.Run("tcp-alone", func(b *testing.B) {
		a := d1.dial(b, "exporter")
		abuf, err := a.RegisterBuffer(n * size)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.ExportSegment("kv", abuf.ID, 0, 0, client.RightRead); err != nil {
			b.Fatal(err)
		}
		c := d2.dial(b, "bench")
		rs, err := c.OpenRemote("d1/kv", client.RightRead)
		if err != nil {
			b.Fatal(err)
		}
		buf, err := c.RegisterBuffer(n * size)
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([]xfer.Request, n)
		for i := range reqs {
			reqs[i] = xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: uint64(i) * size, Target: rs.ID,
				TargetOffset: uint64(i) * size, Length: size}
		}
		res := make([]error, n)
		b.SetBytes(n * size)
		cpu := startCPU()
		b.ResetTimer()
		for range b.N {
			sum, err := c.Transfer(reqs, 30*time.Second, res)
			if err != nil || sum.Completed != n {
				b.Fatalf("transfer: %v %+v", err, sum)
			}
		}
		cpu.report(b, n*size)
	})
}

// cpuMark is the process's CPU time (user and system) at a point.
type cpuMark struct{ at time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuMark { return cpuMark{processCPU()} }

// report adds cpu-s/GB: the CPU time since m per GB of b.N rounds of
// bytes each.
func (m cpuMark) report(b *testing.B, bytes int) {
	used := processCPU() - m.at
	gb := float64(b.N) * float64(bytes) / 1e9
	b.ReportMetric(used.Seconds()/gb, "cpu-s/GB")
}

// BenchmarkStoreRemoteGetAggregate measures the store across hosts with
// 2, 4 and 8 daemons on this machine (loopback tcp, every daemon in this
// process): each daemon holds 128 values of 256 KiB it put, and one
// client of each gets 128 values the others hold (an equal share from
// each other daemon), all at once; a round ends when every client has its
// values. It reports the aggregate MB/s of the round and cpu-s/GB: the
// CPU time of the whole process (every daemon and client) per GB moved,
// over the timed gets only (the untimed unpins and removals of the
// readers' copies between rounds are taken out). Beside it, on the same
// daemons, tcp-alone: the tcp transport alone moving the same bytes (a
// client of each daemon READs 128 × 256 KiB from the other daemons'
// exports, an equal share from each, in one Transfer, all at once).
//
// go test -run '^$' -bench BenchmarkStoreRemoteGetAggregate -benchtime 10x -count 3 ./daemon/
func BenchmarkStoreRemoteGetAggregate(b *testing.B) {
	for _, nd := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("daemons-%d", nd), func(b *testing.B) { benchAggregate(b, nd) })
	}
}

// aggProfile, when set, is where aggregateCluster writes a CPU profile
// of its timed loop (path.daemons-N), for runs of more than one round.
var aggProfile = flag.String("aggbench.cpuprofile", "", "write a CPU profile of BenchmarkStoreRemoteGetAggregate's timed loop to this path + .daemons-N")

func benchAggregate(b *testing.B, nd int) {
	const n, size = 128, 256 << 10
	key := testutil.KeyFile(b, b.TempDir(), "cluster.key", "bench cluster key")
	cfg := func(c *Config) {
		c.PeerSliceSize = 1 << 20
		c.PoolSize = 192 << 20 // its own 32 MiB and the 32 MiB it reads, with room (as BenchmarkStoreRemoteGet)
		c.StoreL2Path = "off"
		c.StoreShards = 64
	}
	ids := make([]string, nd)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%d", i+1)
	}
	ds := make([]*peerDaemon, nd)
	for i := range ds {
		var peers []PeerConfig
		for j := range nd {
			switch {
			case j < i:
				peers = append(peers, ds[j].peer())
			case j > i:
				peers = append(peers, dialsIn(ids[j]))
			}
		}
		ds[i] = startPeerWith(b, ids[i], key, "", cfg, peers...)
	}
	waitMembers(b, ds, ids...)
	// Daemon i holds own[i]; its client reads want[i]: value j of daemon
	// (i + 1 + j mod (nd-1)) mod nd, so each other daemon gives an equal
	// share.
	own := make([][][]byte, nd)
	for i, d := range ds {
		put := d.dial(b, "putter")
		own[i] = make([][]byte, n)
		for j := range own[i] {
			own[i][j] = fmt.Appendf(nil, "agg/%s/%03d", ids[i], j)
			if err := put.PutBytes(own[i][j], clusterValue(own[i][j], size), false); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := make([][][]byte, nd)
	for i := range want {
		want[i] = make([][]byte, n)
		for j := range want[i] {
			want[i][j] = own[(i+1+j%(nd-1))%nd][j]
		}
		for _, k := range want[i] {
			testutil.Eventually(b, 10*time.Second, func() bool {
				_, hs, err := ds[i].d.cluster.Locate(k)
				return err == nil && len(hs) > 0
			}, "%s announced", k)
		}
	}
	b.Run("cluster", func(b *testing.B) { aggregateCluster(b, ds, ids, want) })
	b.Run("tcp-alone", func(b *testing.B) { aggregateTCP(b, ds, ids) })
}

// aggregateCluster is one client of each daemon of ds getting want[i]
// at once, round after round.
func aggregateCluster(b *testing.B, ds []*peerDaemon, ids []string, want [][][]byte) {
	const n, size = 128, 256 << 10
	nd := len(ds)
	type reader struct {
		q    *client.Queue
		res  *client.Results
		cqes []client.Completion
	}
	rs := make([]reader, nd)
	for i, d := range ds {
		c := d.dial(b, "reader")
		q, err := c.OpenQueue(16)
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.NewResults(n)
		if err != nil {
			b.Fatal(err)
		}
		rs[i] = reader{q: q, res: res, cqes: make([]client.Completion, 1)}
	}
	call := func(r *reader, submit func() (bool, error)) error {
		if ok, err := submit(); !ok || err != nil {
			return fmt.Errorf("submit: %v %v", ok, err)
		}
		if got, err := r.q.Reap(r.cqes, 1, 30*time.Second); got != 1 || err != nil {
			return fmt.Errorf("reap: %d %v", got, err)
		}
		return nil
	}
	codes := make([]store.Code, n)
	errs := make([]error, nd)
	b.SetBytes(int64(nd) * n * size)
	var untimed time.Duration
	if *aggProfile != "" && b.N > 1 {
		f, err := os.Create(fmt.Sprintf("%s.daemons-%d", *aggProfile, nd))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	cpu := startCPU()
	b.ResetTimer()
	for round := range b.N {
		var wg sync.WaitGroup
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := &rs[i]
				ud := uint64(2 * round)
				if err := call(r, func() (bool, error) { return r.q.Get(want[i], r.res, ud) }); err != nil {
					errs[i] = err
					return
				}
				if err := r.res.Check(r.cqes[0]); err != nil || r.cqes[0].N != n {
					errs[i] = fmt.Errorf("get on %s: %v, %d of %d", ids[i], err, r.cqes[0].N, n)
					for j := range n {
						if r.res.Code(j) != 0 {
							errs[i] = fmt.Errorf("%w; first failed: %s: %v", errs[i], want[i][j], r.res.Err(j))
							break
						}
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		pause := processCPU()
		for i := range rs {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			r := &rs[i]
			if err := call(r, func() (bool, error) { return r.q.Unpin(want[i], r.res, uint64(2*round+1)) }); err != nil {
				b.Fatal(err)
			}
			if err := ds[i].d.stores[0].RemoveHere(want[i], codes, nil); err != nil {
				b.Fatal(err)
			}
		}
		untimed += processCPU() - pause
		b.StartTimer()
	}
	b.StopTimer()
	cpu.at += untimed
	cpu.report(b, nd*n*size)
}

// aggregateTCP is the tcp transport alone moving the same bytes: a client
// of each daemon exports 128 × 256 KiB, and a client of each reads 128 ×
// 256 KiB from the others' exports (an equal share from each, as the
// cluster rows), all at once, one Transfer each.
func aggregateTCP(b *testing.B, ds []*peerDaemon, ids []string) {
	const n, size = 128, 256 << 10
	nd := len(ds)
	for i, d := range ds {
		a := d.dial(b, "exporter")
		abuf, err := a.RegisterBuffer(n * size)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.ExportSegment("kv-"+ids[i], abuf.ID, 0, 0, client.RightRead); err != nil {
			b.Fatal(err)
		}
	}
	type reader struct {
		c    *client.Client
		reqs []xfer.Request
		res  []error
	}
	rs := make([]reader, nd)
	for i, d := range ds {
		c := d.dial(b, "bench")
		buf, err := c.RegisterBuffer(n * size)
		if err != nil {
			b.Fatal(err)
		}
		targets := map[int]xfer.SegmentID{}
		reqs := make([]xfer.Request, n)
		for j := range reqs {
			from := (i + 1 + j%(nd-1)) % nd
			t, ok := targets[from]
			if !ok {
				r, err := c.OpenRemote(ids[from]+"/kv-"+ids[from], client.RightRead)
				if err != nil {
					b.Fatal(err)
				}
				t = r.ID
				targets[from] = t
			}
			reqs[j] = xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: uint64(j) * size, Target: t,
				TargetOffset: uint64(j) * size, Length: size}
		}
		rs[i] = reader{c: c, reqs: reqs, res: make([]error, n)}
	}
	errs := make([]error, nd)
	b.SetBytes(int64(nd) * n * size)
	cpu := startCPU()
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for i := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sum, err := rs[i].c.Transfer(rs[i].reqs, 30*time.Second, rs[i].res)
				if err != nil || sum.Completed != n {
					errs[i] = fmt.Errorf("transfer on %s: %v %+v", ids[i], err, sum)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	cpu.report(b, nd*n*size)
}

// BenchmarkStoreRemoteGetLatency measures the latency of a remote get of
// one key (4 KiB and 256 KiB) whose home's answer d2 has cached, beside
// the tcp transport's own round trip reading the same bytes:
//
//	cluster    a client of d2 gets one key d1 holds, whose home is d1,
//	           through its queue; d2's cache of home answers names d1 (a
//	           first get filled it), so the get asks no home: it takes the
//	           holder's claim (a hold exchange with d1), reads the value
//	           into d2's pool, checks its crc32c and commits it; then,
//	           untimed, the client unpins it and d2's copy is removed
//	           (RemoveHere: the cache of home answers keeps d1);
//	tcp-alone  the same client READs the same number of bytes from a
//	           buffer a client of d1 exported, in one Transfer.
//
// Two more figures split the cluster's latency, timed after each round
// from inside d2 (no client): exchange-us, the median of a bare peer
// exchange from d2 to d1 (a cluster hello: the round trip a holder's
// claim costs); fetch-us, the median of the cluster's own fetch of the
// key (cached answer, hold, read, crc32c, commit; no queue, store call
// or completion).
//
// Each b.N round is a block of latencyBlock gets then latencyBlock
// transfers (the two alternate). Reported: the median latency of each
// (cluster-us, tcp-us), their ratio, and the CPU time of the whole
// process per request of each (cluster-cpu-us, tcp-cpu-us; the cluster's
// includes the untimed unpin and removal). home-lookups counts the timed
// gets that asked the home after all (the cache keeps an answer for 2 s).
//
// go test -run '^$' -bench BenchmarkStoreRemoteGetLatency -benchtime 20x -count 3 ./daemon/
func BenchmarkStoreRemoteGetLatency(b *testing.B) {
	d1, d2 := benchPair(b, 64<<20)
	put := d1.dial(b, "putter")
	exp := d1.dial(b, "exporter")
	c := d2.dial(b, "reader")
	q, err := c.OpenQueue(16)
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.NewResults(1)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{4 << 10, 256 << 10} {
		runs := 0
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			runs++
			// A key whose home is d1: without the cache, d2 would ask d1.
			var k []byte
			for i := 0; ; i++ {
				k = fmt.Appendf(nil, "lat/%d/%d/%d", size, runs, i)
				if w, err := d2.d.cluster.Where(k); err == nil && w.Home == "d1" {
					break
				}
			}
			keys := [][]byte{k}
			if err := put.PutBytes(k, clusterValue(k, size), false); err != nil {
				b.Fatal(err)
			}
			testutil.Eventually(b, 10*time.Second, func() bool {
				_, hs, err := d2.d.cluster.Locate(k)
				return err == nil && len(hs) > 0
			}, "%s announced", k)
			abuf, err := exp.RegisterBuffer(uint64(size))
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprintf("lat-%d-%d", size, runs)
			if _, err := exp.ExportSegment(name, abuf.ID, 0, 0, client.RightRead); err != nil {
				b.Fatal(err)
			}
			rs, err := c.OpenRemote("d1/"+name, client.RightRead)
			if err != nil {
				b.Fatal(err)
			}
			buf, err := c.RegisterBuffer(uint64(size))
			if err != nil {
				b.Fatal(err)
			}
			reqs := []xfer.Request{{Op: xfer.OpRead, Local: buf.ID, Target: rs.ID, Length: uint64(size)}}
			terrs := make([]error, 1)
			cqes := make([]client.Completion, 1)
			codes := make([]store.Code, 1)
			ud := uint64(0)
			call := func(submit func() (bool, error)) {
				if ok, err := submit(); !ok || err != nil {
					b.Fatalf("submit: %v %v", ok, err)
				}
				if got, err := q.Reap(cqes, 1, 30*time.Second); got != 1 || err != nil {
					b.Fatalf("reap: %d %v", got, err)
				}
			}
			get := func() time.Duration {
				ud++
				t0 := time.Now()
				call(func() (bool, error) { return q.Get(keys, res, ud) })
				d := time.Since(t0)
				if err := res.Check(cqes[0]); err != nil || cqes[0].N != 1 {
					b.Fatalf("get: %v, %d", err, cqes[0].N)
				}
				ud++
				call(func() (bool, error) { return q.Unpin(keys, res, ud) })
				if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil || codes[0] != store.OK {
					b.Fatalf("remove here: %v %v", err, codes[0])
				}
				return d
			}
			tcp := func() time.Duration {
				t0 := time.Now()
				sum, err := c.Transfer(reqs, 30*time.Second, terrs)
				d := time.Since(t0)
				if err != nil || sum.Completed != 1 {
					b.Fatalf("transfer: %v %+v", err, sum)
				}
				return d
			}
			// A bare peer exchange d2 → d1 (a cluster hello), the round
			// trip the holder's claim costs a get on top of the read.
			hello := binary.LittleEndian.AppendUint32([]byte{2}, uint32(d2.cfg.StoreShards))
			node := d2.d.peers.Node()
			exch := func() time.Duration {
				t0 := time.Now()
				if _, err := node.ExchangeAt("d1", 0, "tc.store.hello", hello, 10*time.Second); err != nil {
					b.Fatalf("hello: %v", err)
				}
				return time.Since(t0)
			}
			// The same remote get from inside d2, no client: the
			// cluster's fetch alone (cached answer, hold, read, crc32c,
			// commit), then d2's copy removed.
			fetch := func() time.Duration {
				ch := make(chan error, 1)
				t0 := time.Now()
				d2.d.cluster.Fetch(keys, func(_ int, err error) { ch <- err })
				err := <-ch
				d := time.Since(t0)
				if err != nil {
					b.Fatalf("fetch: %v", err)
				}
				if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil || codes[0] != store.OK {
					b.Fatalf("remove here: %v %v", err, codes[0])
				}
				return d
			}
			// Warm: the first get fills d2's cache of home answers.
			get()
			tcp()
			exch()
			var cl, tc, ex, fe []time.Duration
			var clCPU, tcCPU time.Duration
			lookups := d2.d.cluster.Stats().Lookups
			b.ResetTimer()
			for range b.N {
				m := processCPU()
				for range latencyBlock {
					cl = append(cl, get())
				}
				m2 := processCPU()
				for range latencyBlock {
					tc = append(tc, tcp())
				}
				clCPU += m2 - m
				tcCPU += processCPU() - m2
				for range latencyBlock {
					ex = append(ex, exch())
					fe = append(fe, fetch())
				}
			}
			b.StopTimer()
			ops := float64(b.N * latencyBlock)
			mc, mt := median(cl), median(tc)
			b.ReportMetric(float64(mc.Nanoseconds())/1e3, "cluster-us")
			b.ReportMetric(float64(mt.Nanoseconds())/1e3, "tcp-us")
			b.ReportMetric(float64(median(ex).Nanoseconds())/1e3, "exchange-us")
			b.ReportMetric(float64(median(fe).Nanoseconds())/1e3, "fetch-us")
			b.ReportMetric(float64(mc)/float64(mt), "ratio")
			b.ReportMetric(float64(clCPU.Nanoseconds())/1e3/ops, "cluster-cpu-us")
			b.ReportMetric(float64(tcCPU.Nanoseconds())/1e3/ops, "tcp-cpu-us")
			b.ReportMetric(float64(d2.d.cluster.Stats().Lookups-lookups), "home-lookups")
		})
	}
}

// latencyBlock is how many requests of one side a round of
// BenchmarkStoreRemoteGetLatency times before the other side's.
const latencyBlock = 50

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
