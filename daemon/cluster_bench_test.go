package daemon

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
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
//	           of d1 exported, in one Transfer;
//	tcp-alone-x4  the same in four Transfers of 32 at once, from four
//	           clients of d2 (the cluster's reader moves four parts at
//	           once).
//
// Each reports cpu-s/GB: the CPU time of the whole process (both daemons
// and the clients are in it) per GB moved, over the timed loop (the
// cluster's untimed removal of d2's copies between rounds included).
//
// go test -run '^$' -bench '^BenchmarkStoreRemoteGet$' -benchtime 50x ./daemon/
func BenchmarkStoreRemoteGet(b *testing.B) {
	d1, d2 := benchPair(b, 192<<20)
	runs := 0
	b.Run("cluster", func(b *testing.B) {
		runs++
		remoteGetCluster(b, d1, d2, runs, nil)
	})

	aloneRows(b, "tcp", func(b *testing.B, parts int) { remoteGetTCPAlone(b, d1, d2, parts) })
}

// aloneRows runs the transport-alone rows of a remote get benchmark:
// transport-alone, one Transfer, and transport-alone-x4, four at once from
// four clients, as the cluster's reader moves a holder's values in four
// parts.
func aloneRows(b *testing.B, transport string, row func(b *testing.B, parts int)) {
	for _, parts := range []int{1, 4} {
		name := transport + "-alone"
		if parts > 1 {
			name = fmt.Sprintf("%s-x%d", name, parts)
		}
		b.Run(name, func(b *testing.B) { row(b, parts) })
	}
}

// remoteGetTCPAlone is BenchmarkStoreRemoteGet's tcp-alone rows: parts
// clients of d2 each READ their share of remoteGetN values into a buffer
// of their own from a buffer a client of d1 exported, all at once.
func remoteGetTCPAlone(b *testing.B, d1, d2 *peerDaemon, parts int) {
	a := d1.dial(b, "exporter")
	abuf, err := a.RegisterBuffer(remoteGetN * remoteGetSize)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := a.ExportSegment("kv", abuf.ID, 0, 0, client.RightRead); err != nil {
		b.Fatal(err)
	}
	fillAlone(abuf.Mem)
	per := remoteGetN / parts
	movers := make([]aloneMover, parts)
	for k := range movers {
		c := d2.dial(b, fmt.Sprintf("bench-%d", k))
		rs, err := c.OpenRemote("d1/kv", client.RightRead)
		if err != nil {
			b.Fatal(err)
		}
		buf, err := c.RegisterBuffer(uint64(per * remoteGetSize))
		if err != nil {
			b.Fatal(err)
		}
		movers[k].c = c
		for i := range per {
			movers[k].reqs = append(movers[k].reqs, xfer.Request{Op: xfer.OpRead, Local: buf.ID,
				LocalOffset: uint64(i * remoteGetSize), Target: rs.ID, TargetOffset: uint64((k*per + i) * remoteGetSize),
				Length: remoteGetSize})
		}
	}
	remoteGetAlone(b, movers, nil)
}

// fillAlone writes values of remoteGetSize bytes, as the cluster row's
// puts do, over mem: a transport-alone row moves bytes of the same kind,
// never memory nobody wrote (which a host may back with one shared zero
// page, and which then costs less to read).
func fillAlone(mem []byte) {
	for at := 0; at+remoteGetSize <= len(mem); at += remoteGetSize {
		copy(mem[at:], clusterValue(fmt.Appendf(nil, "alone/%d", at), remoteGetSize))
	}
}

// BenchmarkStoreRemoteGetRDMA is BenchmarkStoreRemoteGet over rdma: the
// two daemons have rdma = on (make test-rdma runs it in the Soft-RoCE VM,
// RDMA_DAEMON_BENCH), and beside the cluster's remote get the rdma
// transport alone moves the same bytes pool to pool, as the cluster's
// reads do:
//
//	cluster     as BenchmarkStoreRemoteGet's (the holder's claim is a hold
//	            exchange on the peer channel, the bytes one RDMA READ per
//	            value, in up to four batches at once);
//	rdma-alone  a client of d2 READs 128 × 256 KiB into blocks of d2's
//	            pool from 4 MiB blocks of d1's pool a client of d1
//	            exported, in one Transfer, opened with transport rdma;
//	rdma-alone-x4  the same in four Transfers of 32 at once, from four
//	            clients of d2 (the cluster's reader moves four parts at
//	            once).
//
// Before each is timed, the link is brought up and warmed; each fails
// when its timed loop moved more than 1/64 of its bytes over tcp. Besides
// cpu-s/GB (this process's CPU time), each reports machine-cpu-s/GB: the
// busy time of every CPU of the machine (/proc/stat) per GB, which counts
// the Soft-RoCE driver's work in the kernel's own threads too; in the VM
// nothing else runs.
//
//	RDMA_TEST_RUN='^$' RDMA_BENCH=- RDMA_DAEMON_RUN=- RDMA_DAEMON_BENCH=StoreRemoteGetRDMA \
//		RDMA_DAEMON_BENCHTIME=5x RDMA_DAEMON_BENCH_COUNT=5 scripts/rdma-vm-test.sh
func BenchmarkStoreRemoteGetRDMA(b *testing.B) {
	testutil.Require(b, testutil.RDMA)
	d1, d2 := benchPair(b, 192<<20, func(c *Config) {
		c.RDMA = "on"
		c.RDMADevice = os.Getenv("RXE_DEV")
	})
	runs := 0
	b.Run("cluster", func(b *testing.B) {
		runs++
		remoteGetCluster(b, d1, d2, runs, d2)
	})
	aloneRows(b, "rdma", func(b *testing.B, parts int) { remoteGetRDMAAlone(b, d1, d2, parts) })
}

// remoteGetRDMAAlone is BenchmarkStoreRemoteGetRDMA's rdma-alone rows:
// parts clients of d2 each READ their share of remoteGetN values into
// blocks of d2's pool from 4 MiB blocks of d1's pool, opened with
// transport rdma, all at once.
func remoteGetRDMAAlone(b *testing.B, d1, d2 *peerDaemon, parts int) {
	const block = 4 << 20
	per := block / remoteGetSize
	nblocks := remoteGetN / per
	a := d1.dial(b, "exporter")
	pa, ok := a.Pool()
	if !ok {
		b.Fatal("d1's client has no pool mapping")
	}
	src, err := a.AllocBlocks(nil, nblocks, block)
	if err != nil {
		b.Fatal(err)
	}
	for _, off := range src {
		fillAlone(a.PoolBytes()[off : off+block])
	}
	movers := make([]aloneMover, parts)
	for k := range movers {
		c := d2.dial(b, fmt.Sprintf("bench-%d", k))
		pc, ok := c.Pool()
		if !ok {
			b.Fatal("d2's client has no pool mapping")
		}
		mine := src[k*nblocks/parts : (k+1)*nblocks/parts]
		dst, err := c.AllocBlocks(nil, len(mine), block)
		if err != nil {
			b.Fatal(err)
		}
		movers[k].c = c
		for j, off := range mine {
			name := fmt.Sprintf("kv-%d-%d-%d-%d", parts, b.N, k, j)
			if _, err := a.ExportSegment(name, pa.Segment, off, block, client.RightRead); err != nil {
				b.Fatal(err)
			}
			rs, err := c.OpenRemoteVia("d1/"+name, client.RightRead, client.TransportRDMA)
			if err != nil {
				b.Fatal(err)
			}
			for i := range per {
				movers[k].reqs = append(movers[k].reqs, xfer.Request{Op: xfer.OpRead, Local: pc.Segment,
					LocalOffset: dst[j] + uint64(i*remoteGetSize), Target: rs.ID, TargetOffset: uint64(i * remoteGetSize),
					Length: remoteGetSize})
			}
		}
	}
	remoteGetAlone(b, movers, d2)
}

// benchPair starts the benchmarks' two daemons of one cluster, d2 dialing
// d1, with pools of pool bytes, the store in DRAM only (and the config
// changes more), and waits until each sees both.
func benchPair(b *testing.B, pool Size, more ...func(*Config)) (d1, d2 *peerDaemon) {
	key := testutil.KeyFile(b, b.TempDir(), "cluster.key", "bench cluster key")
	cfg := func(c *Config) {
		c.PeerSliceSize = 1 << 20
		c.PoolSize = pool
		c.StoreL2Path = "off"
		c.StoreShards = 64
		for _, m := range more {
			m(c)
		}
	}
	d1 = startPeerWith(b, "d1", key, "", cfg, dialsIn("d2"))
	d2 = startPeerWith(b, "d2", key, "", cfg, d1.peer())
	waitMembers(b, []*peerDaemon{d1, d2}, "d1", "d2")
	return d1, d2
}

// remoteGetN values of remoteGetSize bytes are what a round of the remote
// get benchmarks moves.
const remoteGetN, remoteGetSize = 128, 256 << 10

// remoteGetCluster is the cluster row of the remote get benchmarks: a
// client of d2 gets remoteGetN keys a client of d1 put (keys of round
// run), round after round. Besides cpu-s/GB it reports two shares of it:
// untimed-cpu-s/GB, the unpins and removals between rounds, and
// crc-cpu-s/GB, a crc32c pass over as many bytes, timed after the loop on
// its own. With offTCP (rdma), untimed gets of one more
// key first run until one moves no payload over tcp, and the timed loop
// fails when it moved more than 1/64 of its bytes over tcp.
func remoteGetCluster(b *testing.B, d1, d2 *peerDaemon, run int, offTCP *peerDaemon) {
	const n, size = remoteGetN, remoteGetSize
	put := d1.dial(b, fmt.Sprintf("putter-%d", run))
	keys := make([][]byte, n+1)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "bench/%d/%03d", run, i)
		if err := put.PutBytes(keys[i], clusterValue(keys[i], size), false); err != nil {
			b.Fatal(err)
		}
	}
	all := keys
	b.Cleanup(func() {
		// d1's pool holds the next runs' keys (and the rdma row's
		// blocks) in turn.
		if err := d1.d.stores[0].RemoveHere(all, make([]store.Code, len(all)), nil); err != nil {
			b.Error(err)
		}
	})
	warm := keys[n:]
	keys = keys[:n]
	for _, k := range append(keys, warm...) {
		testutil.Eventually(b, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) > 0
		}, "%s announced", k)
	}
	q, res := queueReader(b, d2, fmt.Sprintf("reader-%d", run), n)
	cqes := make([]client.Completion, 1)
	ud := uint64(0)
	call := func(submit func(ud uint64) (bool, error)) {
		ud++
		if ok, err := submit(ud); !ok || err != nil {
			b.Fatalf("submit: %v %v", ok, err)
		}
		if got, err := q.Reap(cqes, 1, 30*time.Second); got != 1 || err != nil {
			b.Fatalf("reap: %d %v", got, err)
		}
	}
	codes := make([]store.Code, n)
	getUnpin := func(keys [][]byte) {
		call(func(ud uint64) (bool, error) { return q.Get(keys, res, ud) })
		if err := res.Check(cqes[0]); err != nil || cqes[0].N != uint64(len(keys)) {
			b.Fatalf("get: %v, %d of %d", err, cqes[0].N, len(keys))
		}
		call(func(ud uint64) (bool, error) { return q.Unpin(keys, res, ud) })
		if err := d2.d.stores[0].RemoveHere(keys, codes[:len(keys)], nil); err != nil {
			b.Fatal(err)
		}
	}
	if offTCP != nil {
		// The mover's first reads from d1 go over tcp and have the link
		// set up behind them.
		testutil.Eventually(b, 30*time.Second, func() bool {
			before := tcpBytes(offTCP)
			getUnpin(warm)
			return tcpBytes(offTCP)-before < size
		}, "remote gets off tcp:\n%s", offTCP.log)
	}
	b.SetBytes(n * size)
	var tcp0 uint64
	if offTCP != nil {
		tcp0 = tcpBytes(offTCP)
	}
	cpu := startCPU()
	if offTCP != nil {
		cpu.machine = machineCPU()
	}
	st0 := d2.d.cluster.Stats()
	var untimed time.Duration
	b.ResetTimer()
	for range b.N {
		call(func(ud uint64) (bool, error) { return q.Get(keys, res, ud) })
		b.StopTimer()
		pause := testutil.ProcessCPU()
		if err := res.Check(cqes[0]); err != nil || cqes[0].N != n {
			b.Fatalf("get: %v, %d of %d", err, cqes[0].N, n)
		}
		call(func(ud uint64) (bool, error) { return q.Unpin(keys, res, ud) })
		if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil {
			b.Fatal(err)
		}
		untimed += testutil.ProcessCPU() - pause
		b.StartTimer()
	}
	b.StopTimer()
	cpu.report(b, n*size)
	// The share of the values read in one exchange each (quick.go); the
	// others went by a hold and READs.
	b.ReportMetric(float64(d2.d.cluster.Stats().QuickReads-st0.QuickReads)/float64(b.N*n), "quick-share")
	gb := float64(b.N) * n * size / 1e9
	// Where the cluster's CPU beyond the transport's goes: the untimed
	// unpin and removal (in cpu-s/GB), and the crc32c pass over the bytes
	// alone, on one goroutine with nothing else running.
	b.ReportMetric(untimed.Seconds()/gb, "untimed-cpu-s/GB")
	vals := make([]byte, n*size)
	for i := range vals {
		vals[i] = byte(i) // faulted in before the clock starts: the pass times the crc alone
	}
	c0 := testutil.ProcessCPU()
	for range 2 {
		store.CRC(vals)
	}
	b.ReportMetric((testutil.ProcessCPU()-c0).Seconds()/(2*n*size/1e9), "crc-cpu-s/GB")
	if offTCP != nil {
		checkOffTCP(b, offTCP, tcp0, n*size)
	}
}

// queueReader is a client of d named name, its queue (16 deep) and
// results for n keys.
func queueReader(b *testing.B, d *peerDaemon, name string, n int) (*client.Queue, *client.Results) {
	c := d.dial(b, name)
	q, err := c.OpenQueue(16)
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.NewResults(n)
	if err != nil {
		b.Fatal(err)
	}
	return q, res
}

// aloneMover is a client and the requests it moves in one Transfer.
type aloneMover struct {
	c    *client.Client
	reqs []xfer.Request
}

// remoteGetAlone is the transport-alone rows of the remote get
// benchmarks: each mover's Transfer, all at once, round after round; with
// offTCP, as remoteGetCluster's.
func remoteGetAlone(b *testing.B, movers []aloneMover, offTCP *peerDaemon) {
	bytes := 0
	res := make([][]error, len(movers))
	for k, m := range movers {
		res[k] = make([]error, len(m.reqs))
		for _, r := range m.reqs {
			bytes += int(r.Length)
		}
	}
	errs := make([]error, len(movers))
	move := func(k int) {
		m := movers[k]
		sum, err := m.c.Transfer(m.reqs, 30*time.Second, res[k])
		if err == nil && sum.Completed != uint32(len(m.reqs)) {
			err = fmt.Errorf("%+v", sum)
		}
		errs[k] = err
	}
	transfer := func() {
		if len(movers) == 1 {
			move(0)
		} else {
			var wg sync.WaitGroup
			for k := range movers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					move(k)
				}()
			}
			wg.Wait()
		}
		for k, err := range errs {
			if err != nil {
				b.Fatalf("transfer %d of %d: %v", k+1, len(movers), err)
			}
		}
	}
	var tcp0 uint64
	if offTCP != nil {
		transfer() // warm: the link's first use
		tcp0 = tcpBytes(offTCP)
	}
	b.SetBytes(int64(bytes))
	cpu := startCPU()
	if offTCP != nil {
		cpu.machine = machineCPU()
	}
	b.ResetTimer()
	for range b.N {
		transfer()
	}
	b.StopTimer()
	cpu.report(b, bytes)
	if offTCP != nil {
		checkOffTCP(b, offTCP, tcp0, bytes)
	}
}

// checkOffTCP fails b when d's tcp node moved more than 1/64 of b.N
// rounds of bytes since it moved tcp0.
func checkOffTCP(b *testing.B, d *peerDaemon, tcp0 uint64, bytes int) {
	moved := tcpBytes(d) - tcp0
	b.ReportMetric(float64(moved)/float64(b.N), "tcp-B/op")
	if moved > uint64(b.N)*uint64(bytes)/64 {
		b.Fatalf("%d rounds of %d bytes moved %d bytes over tcp, not rdma:\n%s", b.N, bytes, moved, d.log)
	}
}

// cpuMark is the process's CPU time (user and system) at a point, and
// where asked for (the rdma benchmarks, in the VM) the machine's busy CPU
// time (every CPU, /proc/stat; 0: not asked for or not readable).
type cpuMark struct{ at, machine time.Duration }

func startCPU() cpuMark { return cpuMark{at: testutil.ProcessCPU()} }

// machineCPU is the busy time of every CPU of the machine since boot:
// /proc/stat's first line, all but idle and iowait (guest time is in
// user already); 0 when it cannot be read.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks uint64
	for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// report adds cpu-s/GB: the CPU time since m per GB of b.N rounds of
// bytes each; and with m.machine, machine-cpu-s/GB, the machine's busy
// time per GB (which counts other processes too: meaningful where nothing
// else runs, as in the Soft-RoCE VM).
func (m cpuMark) report(b *testing.B, bytes int) {
	used := testutil.ProcessCPU() - m.at
	gb := float64(b.N) * float64(bytes) / 1e9
	b.ReportMetric(used.Seconds()/gb, "cpu-s/GB")
	if m.machine > 0 {
		b.ReportMetric((machineCPU()-m.machine).Seconds()/gb, "machine-cpu-s/GB")
	}
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
		q, res := queueReader(b, d, "reader", n)
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
		pause := testutil.ProcessCPU()
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
		untimed += testutil.ProcessCPU() - pause
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
				if err != nil || int(sum.Completed) != n {
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
// one key (4 KiB and 256 KiB) and of eight in one call (8 × 4 KiB, 8 × 64
// KiB) whose home's answers d2 has cached, beside the tcp transport's own
// round trip reading the same bytes:
//
//	cluster    a client of d2 gets keys d1 holds, whose home is d1,
//	           through its queue; d2's cache of home answers names d1 (a
//	           first get filled it), so the get asks no home: it asks d1
//	           for each value in one exchange (the holder's claim and the
//	           bytes in one round trip, store/cluster/quick.go), whose
//	           answer lands in d2's pool; d2 checks its crc32c and commits
//	           it; then,
//	           untimed, the client unpins them and d2's copies are removed
//	           (RemoveHere: the cache of home answers keeps d1);
//	tcp-alone  the same client READs the same number of bytes from a
//	           buffer a client of d1 exported, in one Transfer (a READ
//	           per value).
//
// Two more figures split the cluster's latency, timed after each round
// from inside d2 (no client): exchange-us, the median of a bare peer
// exchange from d2 to d1 (a cluster hello, served on a goroutine of
// d1's); fetch-us, the median of the cluster's own fetch of the key
// (cached answer, one-round-trip read, crc32c, commit; no queue, store
// call or completion). quick-share is the share of those gets and
// fetches that took the one round trip (1: all).
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
	remoteGetLatency(b, d1, d2, "tcp")
}

// BenchmarkStoreRemoteGetLatencyRDMA is BenchmarkStoreRemoteGetLatency
// with rdma between the daemons (the Soft-RoCE VM: make test-rdma with
// RDMA_DAEMON_BENCH=StoreRemoteGetLatencyRDMA): the cluster get of one
// key whose value is up to rdma_inline_read (32 KiB by default: the
// 4 KiB row) is the one-round-trip read over the peer channel; a larger
// one, and the keys of the gets of eight, read over rdma (a hold, the
// READs, the release); the reference is one Transfer of a segment opened
// with transport rdma. rdma-us and rdma-cpu-us stand where the tcp rows
// say tcp.
func BenchmarkStoreRemoteGetLatencyRDMA(b *testing.B) {
	testutil.Require(b, testutil.RDMA)
	d1, d2 := benchPair(b, 64<<20, func(c *Config) {
		c.RDMA = "on"
		c.RDMADevice = os.Getenv("RXE_DEV")
	})
	remoteGetLatency(b, d1, d2, "rdma")
}

// remoteGetLatency is the latency benchmarks' body: via is the transport
// between d1 and d2 ("tcp" or "rdma"), which the reference Transfer is
// opened with and whose name its metrics carry. Over rdma, a get whose
// payload went over tcp fails it, unless the value is small enough to be
// read inline (rdma_inline_read).
func remoteGetLatency(b *testing.B, d1, d2 *peerDaemon, via string) {
	put := d1.dial(b, "putter")
	exp := d1.dial(b, "exporter")
	c := d2.dial(b, "reader")
	q, err := c.OpenQueue(16)
	if err != nil {
		b.Fatal(err)
	}
	most := 0
	for _, cs := range latencyCases {
		most = max(most, cs.keys)
	}
	res, err := c.NewResults(most)
	if err != nil {
		b.Fatal(err)
	}
	for _, cs := range latencyCases {
		n, size := cs.keys, cs.size
		name := fmt.Sprintf("%dKiB", size>>10)
		if n > 1 {
			name = fmt.Sprintf("%dx%s", n, name)
		}
		runs := 0
		b.Run(name, func(b *testing.B) {
			runs++
			// Keys whose home is d1: without the cache, d2 would ask d1.
			var keys [][]byte
			for i := 0; len(keys) < n; i++ {
				k := fmt.Appendf(nil, "lat/%d/%d/%d/%d", n, size, runs, i)
				if w, err := d2.d.cluster.Where(k); err == nil && w.Home == "d1" {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				if err := put.PutBytes(k, clusterValue(k, size), false); err != nil {
					b.Fatal(err)
				}
				testutil.Eventually(b, 10*time.Second, func() bool {
					_, hs, err := d2.d.cluster.Locate(k)
					return err == nil && len(hs) > 0
				}, "%s announced", k)
			}
			abuf, err := exp.RegisterBuffer(uint64(n * size))
			if err != nil {
				b.Fatal(err)
			}
			seg := fmt.Sprintf("lat-%d-%d-%d", n, size, runs)
			if _, err := exp.ExportSegment(seg, abuf.ID, 0, 0, client.RightRead); err != nil {
				b.Fatal(err)
			}
			open := c.OpenRemote
			if via == "rdma" {
				open = func(name string, r uint8, _ ...client.CallOption) (client.RemoteSegment, error) {
					return c.OpenRemoteVia(name, r, client.TransportRDMA)
				}
			}
			rs, err := open("d1/"+seg, client.RightRead)
			if err != nil {
				b.Fatal(err)
			}
			buf, err := c.RegisterBuffer(uint64(n * size))
			if err != nil {
				b.Fatal(err)
			}
			var reqs []xfer.Request
			for i := range n {
				off := uint64(i * size)
				reqs = append(reqs, xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: off, Target: rs.ID,
					TargetOffset: off, Length: uint64(size)})
			}
			terrs := make([]error, n)
			cqes := make([]client.Completion, 1)
			codes := make([]store.Code, n)
			ud := uint64(0)
			call := func(submit func() (bool, error)) {
				if ok, err := submit(); !ok || err != nil {
					b.Fatalf("submit: %v %v", ok, err)
				}
				if got, err := q.Reap(cqes, 1, 30*time.Second); got != 1 || err != nil {
					b.Fatalf("reap: %d %v", got, err)
				}
			}
			removeHere := func() {
				if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil {
					b.Fatalf("remove here: %v", err)
				}
				for i, code := range codes {
					if code != store.OK {
						b.Fatalf("remove here: %s: %v", keys[i], code)
					}
				}
			}
			get := func() time.Duration {
				ud++
				t0 := time.Now()
				call(func() (bool, error) { return q.Get(keys, res, ud) })
				d := time.Since(t0)
				if err := res.Check(cqes[0]); err != nil || cqes[0].N != uint64(n) {
					b.Fatalf("get: %v, %d of %d", err, cqes[0].N, n)
				}
				ud++
				call(func() (bool, error) { return q.Unpin(keys, res, ud) })
				removeHere()
				return d
			}
			// transfer is the reference: one Transfer over via.
			transfer := func() time.Duration {
				t0 := time.Now()
				sum, err := c.Transfer(reqs, 30*time.Second, terrs)
				d := time.Since(t0)
				if err != nil || int(sum.Completed) != n {
					b.Fatalf("transfer: %v %+v", err, sum)
				}
				return d
			}
			// A bare peer exchange d2 → d1, the round trip the holder's
			// claim costs a get on top of the read.
			exch := bareExchange(b, d2, "d1")
			// The same remote get from inside d2, no client: the
			// cluster's fetch alone (cached answer, hold, read, crc32c,
			// commit), then d2's copy removed.
			fetch := func() time.Duration {
				ch := make(chan error, n)
				t0 := time.Now()
				d2.d.cluster.Fetch(keys, func(_ int, err error) { ch <- err })
				for range n {
					if err := <-ch; err != nil {
						b.Fatalf("fetch: %v", err)
					}
				}
				d := time.Since(t0)
				removeHere()
				return d
			}
			// Warm: the first get fills d2's cache of home answers.
			get()
			transfer()
			exch()
			// With rdma between the daemons, a get of one value up to
			// rdma_inline_read is read over tcp (the bytes in the
			// holder's answer); any other get, and every transfer,
			// moves its payload by rdma. The checks below let the gets
			// of values that small use tcp whatever their number (the
			// gets of eight 4 KiB values included).
			inline := size <= int(d2.cfg.RDMAInlineRead)
			// offTCP reports whether what f did moved less than half a
			// payload over tcp.
			offTCP := func(f func() time.Duration) bool {
				before := tcpBytes(d2)
				f()
				return tcpBytes(d2)-before < uint64(n*size)/2
			}
			if via == "rdma" {
				// The mover's first reads from d1 go over tcp and have
				// the link set up behind them.
				testutil.Eventually(b, 30*time.Second, func() bool {
					g, t := offTCP(get), offTCP(transfer)
					return (g || inline) && t
				}, "remote gets and transfers off tcp:\n%s", d2.log)
			}
			var cl, tc, ex, fe []time.Duration
			var clCPU, tcCPU time.Duration
			var clTCP, tcTCP uint64 // bytes over tcp in the gets, in the transfers
			st0 := d2.d.cluster.Stats()
			lookups := st0.Lookups
			b.ResetTimer()
			for range b.N {
				m, n := testutil.ProcessCPU(), tcpBytes(d2)
				for range latencyBlock {
					cl = append(cl, get())
				}
				m2, n2 := testutil.ProcessCPU(), tcpBytes(d2)
				for range latencyBlock {
					tc = append(tc, transfer())
				}
				clCPU += m2 - m
				tcCPU += testutil.ProcessCPU() - m2
				clTCP += n2 - n
				tcTCP += tcpBytes(d2) - n2
				for range latencyBlock {
					ex = append(ex, exch())
					fe = append(fe, fetch())
				}
			}
			b.StopTimer()
			ops := float64(b.N * latencyBlock)
			// The control messages (home lookups, holds, releases) go
			// over tcp: a few hundred bytes a get. The payload of the
			// transfers, or of the gets read by rdma, would be ops ×
			// size at least.
			if half := ops * float64(n*size) / 2; via == "rdma" && (float64(tcTCP) >= half || !inline && float64(clTCP) >= half) {
				b.Fatalf("%d bytes over tcp in %v transfers and %d in %v gets of %d bytes over rdma (read inline: %v)", tcTCP, ops, clTCP, ops, size, inline)
			}
			mc, mt := median(cl), median(tc)
			b.ReportMetric(float64(mc.Nanoseconds())/1e3, "cluster-us")
			b.ReportMetric(float64(mt.Nanoseconds())/1e3, via+"-us")
			b.ReportMetric(float64(median(ex).Nanoseconds())/1e3, "exchange-us")
			b.ReportMetric(float64(median(fe).Nanoseconds())/1e3, "fetch-us")
			b.ReportMetric(float64(mc)/float64(mt), "ratio")
			b.ReportMetric(float64(clCPU.Nanoseconds())/1e3/ops, "cluster-cpu-us")
			b.ReportMetric(float64(tcCPU.Nanoseconds())/1e3/ops, via+"-cpu-us")
			st1 := d2.d.cluster.Stats()
			b.ReportMetric(float64(st1.Lookups-lookups), "home-lookups")
			b.ReportMetric(float64(st1.QuickReads-st0.QuickReads)/(2*ops*float64(n)), "quick-share")
		})
	}
}

// latencyCases are BenchmarkStoreRemoteGetLatency's gets: keys values of
// size bytes in one call, beside one Transfer of as many READs.
var latencyCases = []struct{ keys, size int }{{1, 4 << 10}, {1, 256 << 10}, {8, 4 << 10}, {8, 64 << 10}}

// latencyBlock is how many requests of one side a round of
// BenchmarkStoreRemoteGetLatency times before the other side's.
const latencyBlock = 50

// bareExchange returns a timer of one bare peer exchange from d to peer
// (a cluster hello, served on a goroutine of the peer's): the reference
// round trip of the latency benchmarks.
func bareExchange(b *testing.B, d *peerDaemon, peer string) func() time.Duration {
	hello := binary.LittleEndian.AppendUint32([]byte{2}, uint32(d.cfg.StoreShards))
	node := d.d.peers.Node()
	return func() time.Duration {
		t0 := time.Now()
		if _, err := node.ExchangeAt(peer, 0, "tc.store.hello", hello, 10*time.Second); err != nil {
			b.Fatalf("hello: %v", err)
		}
		return time.Since(t0)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
