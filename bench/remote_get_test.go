package bench

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// Sizes of BenchmarkStoreRemoteGetDaemons: a get is remoteN values of
// remoteSize bytes; A holds remoteRounds gets' keys (192 MiB), and B's L1
// holds under three of them, so that keys read in turn are never held by
// B when asked again.
const (
	remoteN      = 128
	remoteSize   = 256 << 10
	remoteRounds = 6
	remoteSlots  = 3 // tcp-alone: B's destination cycles over as many gets' bytes as its L1 holds
)

// BenchmarkStoreRemoteGetDaemons measures a remote get of 128 values of
// 256 KiB between two tensorcastd processes on loopback, beside the tcp
// transport alone moving the same bytes between the same two daemons:
//
//	cluster    a client of B gets the 128 keys of one of six gets' worth a
//	           client of A put, through its queue, and unpins them; the
//	           gets go round the six in turn, and B's L1 (128 MiB) holds
//	           under three, so each get is remote (home lookups, a hold,
//	           reads into B's pool, crc32c, commit; B's least recently
//	           used copies evicted as it goes);
//	tcp-alone  a client of B READs 128 × 256 KiB from A's 192 MiB export
//	           in one Transfer, the six regions in turn, into three 32 MiB
//	           regions of its own buffer in turn, so that both rows touch
//	           as much memory.
//
// Each reports cpu-s/GB of the three processes (A, B and this one, the
// clients) and of each, from /proc. The daemons are the tensorcastd the
// tree builds (once per test binary), each in its own process with its
// own Go scheduler, as on two hosts; both run on this machine's CPUs.
//
//	go test -run '^$' -bench '^BenchmarkStoreRemoteGetDaemons$' -benchtime 50x -count 5 ./bench/
func BenchmarkStoreRemoteGetDaemons(b *testing.B) {
	bin := buildDaemon(b)
	key := testutil.KeyFile(b, b.TempDir(), "cluster.key", "bench cluster key")
	common := []string{"--peer-listen", "127.0.0.1:0", "--cluster-key-file", key, "--rdma", "off", "--store-l2-path", "off"}
	a, err := spawnDaemon(bin, 1<<30, nil, append([]string{"--daemon-id", "A", "--peer", "B="}, common...), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Stop() })
	ca := dialBench(b, a, "putter")
	buf, err := ca.RegisterBuffer(remoteRounds * remoteN * remoteSize)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := ca.ExportSegment("kv", buf.ID, 0, 0, client.RightRead); err != nil {
		b.Fatal(err)
	}
	// The same bytes in A's pool, where the store keeps its values
	// (taken before the puts, while the pool is whole).
	poolMem, err := exportPool(ca, "kv-pool", remoteRounds*remoteN*remoteSize, client.RightRead)
	if err != nil {
		b.Fatal(err)
	}
	d, err := spawnDaemon(bin, 512<<20, nil, append([]string{"--daemon-id", "B", "--store-l1-capacity", "128MiB",
		"--store-max-session-reserved", "64MiB", "--peer", "A=" + ca.Hello().PeerAddr}, common...), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Stop() })
	keys := make([][][]byte, remoteRounds)
	for r := range keys {
		for i := range remoteN {
			k := fmt.Appendf(nil, "remote/%d/%03d", r, i)
			v := remoteValue(k)
			if err := ca.PutBytes(k, v, false); err != nil {
				b.Fatal(err)
			}
			keys[r] = append(keys[r], k)
			// The transport-alone rows move the same bytes.
			at := (r*remoteN + i) * remoteSize
			copy(buf.Mem[at:], v)
			copy(poolMem[at:], v)
		}
	}
	cb := dialBench(b, d, "reader")
	g := newRemoteGetter(b, cb, remoteN)
	// B learns A's keys from their homes' announcements: every get whole
	// and byte-exact once before anything is timed.
	for r := range remoteRounds {
		testutil.Eventually(b, 30*time.Second, func() bool { return g.get(keys[r], false) == nil }, "get %d whole on B", r)
		for i, k := range keys[r] {
			if !bytes.Equal(g.res.Value(i), remoteValue(k)) {
				b.Fatalf("%s: B read other bytes than A holds", k)
			}
		}
		g.unpin(keys[r])
	}
	procs := []int{a.cmd.Process.Pid, d.cmd.Process.Pid, os.Getpid()}
	// B's L1 holds under three gets' keys: the first get's are gone
	// from it (its home says A alone holds them), so every get is remote.
	testutil.Eventually(b, 30*time.Second, func() bool {
		loc, err := cb.ClusterLocate(keys[0][0])
		return err == nil && slices.Equal(loc.Holders, []string{"A"})
	}, "B's copy of %s evicted", keys[0][0])

	b.Run("cluster", func(b *testing.B) {
		g.b = b
		next := 0
		runRemote(b, procs, func() {
			r := next % remoteRounds
			next++
			if err := g.get(keys[r], true); err != nil {
				b.Fatal(err)
			}
			g.unpin(keys[r])
		})
	})
	// alone runs a transport-alone row: READs from A's export into
	// local (a segment of B's client), get r's value i landing at
	// dst(r, i) there, whose bytes mem gives.
	alone := func(b *testing.B, export string, local xfer.SegmentID, dst func(r, i int) uint64, mem func(off uint64) []byte) {
		rs, err := cb.OpenRemote("A/"+export, client.RightRead)
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([][]xfer.Request, remoteRounds)
		for r := range reqs {
			for i := range remoteN {
				reqs[r] = append(reqs[r], xfer.Request{Op: xfer.OpRead, Local: local, LocalOffset: dst(r, i),
					Target: rs.ID, TargetOffset: uint64((r*remoteN + i) * remoteSize), Length: remoteSize})
			}
		}
		results := make([]error, remoteN)
		next := 0
		runRemote(b, procs, func() {
			r := next % remoteRounds
			next++
			sum, err := cb.Transfer(reqs[r], 30*time.Second, results)
			if err != nil || sum.Completed != remoteN {
				b.Fatalf("transfer: %v %+v", err, sum)
			}
			if next == 1 {
				for i, k := range keys[0] {
					if !bytes.Equal(mem(dst(0, i)), remoteValue(k)) {
						b.Fatalf("%s: READ other bytes than A holds", k)
					}
				}
			}
		})
	}
	b.Run("tcp-alone", func(b *testing.B) {
		buf, err := cb.RegisterBuffer(remoteSlots * remoteN * remoteSize)
		if err != nil {
			b.Fatal(err)
		}
		alone(b, "kv", buf.ID, func(r, i int) uint64 { return uint64(((r%remoteSlots)*remoteN + i) * remoteSize) },
			func(off uint64) []byte { return buf.Mem[off : off+remoteSize] })
	})
	b.Run("tcp-alone-pool", func(b *testing.B) {
		pi, ok := cb.Pool()
		if !ok {
			b.Fatal("B's pool is not mapped")
		}
		offs, err := cb.AllocBlocks(nil, remoteSlots*remoteN, remoteSize)
		if err != nil {
			b.Fatal(err)
		}
		pool := cb.PoolBytes()
		alone(b, "kv-pool", pi.Segment, func(r, i int) uint64 { return offs[(r%remoteSlots)*remoteN+i] },
			func(off uint64) []byte { return pool[off : off+remoteSize] })
	})
}

// remoteValue is key's value in BenchmarkStoreRemoteGetDaemons: bytes of
// its own, so that a value read from the wrong place shows.
func remoteValue(key []byte) []byte {
	v := make([]byte, remoteSize)
	seed := uint64(len(key))
	for _, c := range key {
		seed = seed*31 + uint64(c)
	}
	for j := 0; j < len(v); j += 8 {
		binary.LittleEndian.PutUint64(v[j:], seed*0x9e3779b97f4a7c15+uint64(j))
	}
	return v
}

func dialBench(b *testing.B, d *Daemon, name string) *client.Client {
	c, err := client.Dial(d.Socket, client.Options{Name: name})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// remoteGetter runs store calls through one queue, one at a time.
type remoteGetter struct {
	b    *testing.B
	q    *client.Queue
	res  *client.Results
	cqes []client.Completion
	ud   uint64
}

// newRemoteGetter opens a queue of c and results for up to n keys.
func newRemoteGetter(b *testing.B, c *client.Client, n int) *remoteGetter {
	q, err := c.OpenQueue(16)
	if err != nil {
		b.Fatal(err)
	}
	res, err := c.NewResults(n)
	if err != nil {
		b.Fatal(err)
	}
	return &remoteGetter{b: b, q: q, res: res, cqes: make([]client.Completion, 1)}
}

func (g *remoteGetter) call(submit func(ud uint64) (bool, error)) {
	g.ud++
	if ok, err := submit(g.ud); !ok || err != nil {
		g.b.Fatalf("submit: %v %v", ok, err)
	}
	if got, err := g.q.Reap(g.cqes, 1, 30*time.Second); got != 1 || err != nil {
		g.b.Fatalf("reap: %d %v", got, err)
	}
}

// get gets keys; with whole, anything but every key found is an error.
// Without it, a get that found some is unpinned and its error returned.
func (g *remoteGetter) get(keys [][]byte, whole bool) error {
	g.call(func(ud uint64) (bool, error) { return g.q.Get(keys, g.res, ud) })
	err := g.res.Check(g.cqes[0])
	if err == nil && g.cqes[0].N != uint64(len(keys)) {
		err = fmt.Errorf("get found %d of %d keys", g.cqes[0].N, len(keys))
	}
	if err != nil && !whole && g.cqes[0].N > 0 {
		g.unpin(keys)
	}
	return err
}

func (g *remoteGetter) unpin(keys [][]byte) {
	g.call(func(ud uint64) (bool, error) { return g.q.Unpin(keys, g.res, ud) })
}

// runRemote times b.N rounds of one get's bytes and reports cpu-s/GB of
// procs (A, B, this process) together and each.
func runRemote(b *testing.B, procs []int, round func()) {
	round() // the row's first use (a remote segment opened, a queue warmed)
	b.SetBytes(remoteN * remoteSize)
	before := make([]time.Duration, len(procs))
	for i, p := range procs {
		before[i] = testutil.ProcCPU(b, p)
	}
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	gb := float64(b.N) * remoteN * remoteSize / 1e9
	total := 0.0
	for i, p := range procs {
		s := (testutil.ProcCPU(b, p) - before[i]).Seconds() / gb
		total += s
		b.ReportMetric(s, []string{"A-cpu-s/GB", "B-cpu-s/GB", "clients-cpu-s/GB"}[i])
	}
	b.ReportMetric(total, "cpu-s/GB")
}
