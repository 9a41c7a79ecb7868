package client

import (
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// The store's figures through the queue, measured against a daemon that
// runs in a process of its own (scripts/bench-store-queue.sh starts it):
// TENSORCAST_BENCH_SOCKET is its socket, TENSORCAST_BENCH_PID its pid
// (its CPU time is read from /proc/PID/stat before and after the measured
// part), TENSORCAST_BENCH_CLK_TCK the clock ticks per second (default
// 100). Without them the benchmarks skip.

// benchRun makes each benchmark function call's keys its own: the
// framework calls a benchmark more than once, and a store key is written
// once.
var benchRun atomic.Uint64

// benchDaemon connects to the measured daemon.
func benchDaemon(b *testing.B) (*Client, int) {
	b.Helper()
	sock, pidS := os.Getenv("TENSORCAST_BENCH_SOCKET"), os.Getenv("TENSORCAST_BENCH_PID")
	if sock == "" || pidS == "" {
		b.Skip("skipped: set TENSORCAST_BENCH_SOCKET and TENSORCAST_BENCH_PID to a daemon of its own (scripts/bench-store-queue.sh)")
	}
	pid, err := strconv.Atoi(pidS)
	if err != nil {
		b.Fatalf("TENSORCAST_BENCH_PID=%q", pidS)
	}
	c, err := Dial(sock, Options{Name: "bench-store-queue"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c, pid
}

// benchKeys is one slot's keys: n fixed-width keys in one buffer whose
// 16 hex digits of cycle number are rewritten in place, so a new cycle's
// keys cost no allocation.
type benchKeys struct {
	buf  []byte
	keys [][]byte
	at   int // where the cycle digits start in each key
}

func newBenchKeys(prefix string, slot, n int) *benchKeys {
	k := &benchKeys{}
	head := fmt.Sprintf("%s/%04d/", prefix, slot)
	k.at = len(head)
	width := len(head) + 16 + 1 + 4
	k.buf = make([]byte, 0, n*width)
	for i := 0; i < n; i++ {
		start := len(k.buf)
		k.buf = fmt.Appendf(k.buf, "%s%016x.%04d", head, 0, i)
		k.keys = append(k.keys, k.buf[start:len(k.buf):len(k.buf)])
	}
	return k
}

const hexDigits = "0123456789abcdef"

func (k *benchKeys) setCycle(c uint64) {
	for _, key := range k.keys {
		for i := 15; i >= 0; i-- {
			key[k.at+i] = hexDigits[(c>>(4*(15-i)))&15]
		}
	}
}

// pipeline keeps depth calls in flight on q, each slot going through its
// steps in turn; a slot that ends its last step starts a new cycle until
// cycles are done. step(slot, i, ud) stages step i of slot; after(slot, i)
// runs when it completed (its results checked).
type pipeline struct {
	q      *Queue
	depth  int
	nsteps int
	// res[slot] holds the results of the slot's steps that have some
	// (all but a LookupPrefix, whose completion's count is its answer).
	res    []*Results
	step   func(slot, i int, ud uint64) (bool, error)
	after  func(slot, i int)
	cycle  func(slot int, n uint64) // a new cycle begins for slot
	wantOK func(slot, i int) uint64 // keys that must be OK at step i (the count the completion says)
	// lookup says step i of a slot is a LookupPrefix (no results).
	lookup func(i int) bool
}

// run runs cycles cycles; it fails the benchmark on any key that is not OK.
func (p *pipeline) run(b *testing.B, cycles uint64) {
	b.Helper()
	cqes := make([]Completion, 2*p.depth)
	var started, done uint64
	at := make([]int, p.depth)
	submit := func(slot int) {
		for {
			ok, err := p.step(slot, at[slot], uint64(slot)<<8|uint64(at[slot]))
			if err != nil {
				b.Fatal(err)
			}
			if ok {
				return
			}
			// No room in the data area until the daemon takes what is
			// staged (depth is below the ring's size, so never the ring).
			time.Sleep(time.Microsecond)
		}
	}
	begin := func(slot int) {
		p.cycle(slot, started)
		started++
		at[slot] = 0
		submit(slot)
	}
	for s := 0; s < p.depth && started < cycles; s++ {
		begin(s)
	}
	for done < cycles {
		n, err := p.q.Reap(cqes, 1, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cqes[:n] {
			slot, i := int(c.UserData>>8), int(c.UserData&0xff)
			if p.lookup == nil || !p.lookup(i) {
				if err := p.res[slot].Check(c); err != nil {
					b.Fatalf("slot %d step %d: %v", slot, i, err)
				}
			}
			if want := p.wantOK(slot, i); c.Code != tcproto.CodeOK || c.N != want {
				b.Fatalf("slot %d step %d: %+v, want %d keys OK", slot, i, c, want)
			}
			if p.after != nil {
				p.after(slot, i)
			}
			if at[slot]++; at[slot] < p.nsteps {
				submit(slot)
				continue
			}
			done++
			if started < cycles {
				begin(slot)
			}
		}
	}
}

// BenchmarkStoreQueue: the hot store calls through a queue at batch 1 and
// 128, eight calls in flight: keys per second, and the daemon's CPU time
// per key (goal: at most 1 µs at batch 128).
func BenchmarkStoreQueue(b *testing.B) {
	for _, op := range []string{"put", "get-release", "exists", "lookup", "lookup-pin-release"} {
		for _, batch := range []int{1, 128} {
			b.Run(fmt.Sprintf("op=%s/batch=%d", op, batch), func(b *testing.B) { benchStoreOp(b, op, batch) })
		}
	}
}

func benchStoreOp(b *testing.B, op string, batch int) {
	c, pid := benchDaemon(b)
	const depth = 8
	q, err := c.OpenQueue(64, WithDataSize(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	run := benchRun.Add(1)
	keys := make([]*benchKeys, depth)
	res := make([]*Results, depth)
	for s := range keys {
		keys[s] = newBenchKeys(fmt.Sprintf("bq/%d/%d/%s", os.Getpid(), run, op), s, batch)
		if res[s], err = c.NewResults(batch); err != nil {
			b.Fatal(err)
		}
	}
	p := &pipeline{q: q, depth: depth, res: res, wantOK: func(int, int) uint64 { return uint64(batch) },
		cycle: func(int, uint64) {}}
	switch op {
	case "put":
		// Reserve, one byte written in place, Commit: fresh keys each cycle.
		p.nsteps = 2
		p.cycle = func(s int, n uint64) { keys[s].setCycle(n) }
		p.step = func(s, i int, ud uint64) (bool, error) {
			if i == 0 {
				return q.Reserve(keys[s].keys, 4096, res[s], ud)
			}
			return q.Commit(keys[s].keys, false, res[s], ud)
		}
		p.after = func(s, i int) {
			if i == 0 {
				for j := range keys[s].keys {
					res[s].Value(j)[0] = byte(j)
				}
			}
		}
	default:
		// One set of stored keys per slot, read over and over.
		p.nsteps = 1
		for s := range keys {
			r := res[s]
			for _, st := range []func() (bool, error){
				func() (bool, error) { return q.Reserve(keys[s].keys, 4096, r, 1) },
				func() (bool, error) { return q.Commit(keys[s].keys, false, r, 2) },
			} {
				if ok, err := st(); !ok || err != nil {
					b.Fatal(ok, err)
				}
				cq := make([]Completion, 1)
				if _, err := q.Reap(cq, 1, 10*time.Second); err != nil || r.Check(cq[0]) != nil || cq[0].N != uint64(batch) {
					b.Fatalf("preparing the keys: %v %+v", err, cq[0])
				}
			}
		}
		switch op {
		case "get-release":
			p.nsteps = 2
			p.step = func(s, i int, ud uint64) (bool, error) {
				if i == 0 {
					return q.Get(keys[s].keys, res[s], ud)
				}
				return q.Unpin(keys[s].keys, res[s], ud)
			}
		case "exists":
			p.step = func(s, _ int, ud uint64) (bool, error) { return q.Exists(keys[s].keys, res[s], ud) }
		case "lookup":
			p.lookup = func(int) bool { return true }
			p.step = func(s, _ int, ud uint64) (bool, error) { return q.LookupPrefix(keys[s].keys, false, ud) }
		case "lookup-pin-release":
			p.nsteps = 2
			p.step = func(s, i int, ud uint64) (bool, error) {
				if i == 0 {
					return q.LookupPrefix(keys[s].keys, true, ud)
				}
				return q.Unpin(keys[s].keys, res[s], ud)
			}
			p.lookup = func(i int) bool { return i == 0 }
		}
	}
	cycles := uint64(b.N)
	b.ResetTimer()
	cpu0 := testutil.ProcCPU(b, pid)
	p.run(b, cycles)
	cpu := testutil.ProcCPU(b, pid) - cpu0
	b.StopTimer()
	n := float64(cycles) * float64(batch)
	b.ReportMetric(n/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "daemon-ns/key")
}

// BenchmarkStoreQueueZeroCopy256K: zero-copy puts and gets of 256 KiB
// values through the queue, four calls of 16 keys in flight: Reserve,
// Commit, Get, Unpin. With touch=none the client leaves the bytes as they
// are (its own work produces and consumes them in place: a device writes
// into the reserved block, a kernel reads the value where it lies), which
// is the store's own cost per byte; with touch=copy it also writes each
// value in place and reads it out with memcpy. Its MB/s counts each value
// twice (in and out), as the copying form and memcpy below do.
func BenchmarkStoreQueueZeroCopy256K(b *testing.B) {
	for _, touch := range []string{"none", "copy"} {
		b.Run("touch="+touch, func(b *testing.B) { benchZeroCopy(b, touch == "copy") })
	}
}

func benchZeroCopy(b *testing.B, touch bool) {
	const size, batch, depth = 256 << 10, 16, 4
	c, pid := benchDaemon(b)
	q, err := c.OpenQueue(32)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	run := benchRun.Add(1)
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	keys := make([]*benchKeys, depth)
	res := make([]*Results, depth)
	for s := range keys {
		keys[s] = newBenchKeys(fmt.Sprintf("bz/%d/%d", os.Getpid(), run), s, batch)
		if res[s], err = c.NewResults(batch); err != nil {
			b.Fatal(err)
		}
	}
	p := &pipeline{q: q, depth: depth, nsteps: 4, res: res, wantOK: func(int, int) uint64 { return batch },
		cycle: func(s int, n uint64) { keys[s].setCycle(n) },
		step: func(s, i int, ud uint64) (bool, error) {
			k, r := keys[s].keys, res[s]
			switch i {
			case 0:
				return q.Reserve(k, size, r, ud)
			case 1:
				return q.Commit(k, false, r, ud)
			case 2:
				return q.Get(k, r, ud)
			}
			return q.Unpin(k, r, ud)
		},
		after: func(s, i int) {
			if !touch {
				return
			}
			switch i {
			case 0:
				for j := 0; j < batch; j++ {
					copy(res[s].Value(j), src)
				}
			case 2:
				for j := 0; j < batch; j++ {
					copy(dst, res[s].Value(j))
				}
			}
		}}
	b.SetBytes(2 * size * batch)
	b.ResetTimer()
	cpu0 := testutil.ProcCPU(b, pid)
	p.run(b, uint64(b.N))
	cpu := testutil.ProcCPU(b, pid) - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*batch), "daemon-ns/key")
}

// BenchmarkStoreCopying256K: the copying form of the same bytes on the
// socket, what a copying store pays: StorePut from a client buffer and
// StoreRead into one, 16 keys per call.
func BenchmarkStoreCopying256K(b *testing.B) {
	const size, batch = 256 << 10, 16
	c, _ := benchDaemon(b)
	in, err := c.RegisterBuffer(size * batch)
	if err != nil {
		b.Fatal(err)
	}
	out, err := c.RegisterBuffer(size * batch)
	if err != nil {
		b.Fatal(err)
	}
	run := benchRun.Add(1)
	k := newBenchKeys(fmt.Sprintf("bc/%d/%d", os.Getpid(), run), 0, batch)
	vals, dests := make([]Extent, batch), make([]Extent, batch)
	for j := range vals {
		vals[j] = Extent{Segment: in.ID, Offset: uint64(j) * size, Length: size}
		dests[j] = Extent{Segment: out.ID, Offset: uint64(j) * size, Length: size}
	}
	errs, lens := make([]error, batch), make([]uint64, batch)
	b.SetBytes(2 * size * batch)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.setCycle(uint64(i))
		if err := c.StorePut(k.keys, vals, false, errs); err != nil || errs[0] != nil {
			b.Fatal(err, errs[0])
		}
		if err := c.StoreRead(k.keys, dests, lens, errs); err != nil || errs[0] != nil {
			b.Fatalf("read %d of %d: %v %v", i, b.N, err, errs)
		}
	}
}

// BenchmarkMemcpy256K is the reference: one copy of 256 KiB, from and to
// 64 MiB spans gone through in turn, so that the bytes come from memory as
// the store's do, not from a cache.
func BenchmarkMemcpy256K(b *testing.B) {
	const size, span = 256 << 10, 64 << 20
	src, dst := make([]byte, span), make([]byte, span)
	for i := range src {
		src[i] = byte(i)
	}
	b.SetBytes(size)
	off := 0
	for b.Loop() {
		copy(dst[off:off+size], src[off:off+size])
		if off += size; off == span {
			off = 0
		}
	}
}

// BenchmarkStoreQueuePromote256K: Gets of 256 KiB values that are only on
// L2 (promotion: READ_FIXED into pool blocks, crc32c checked) through the
// queue, 32 single-key Gets (each with its Unpin) in flight. It first puts
// durably b.N values plus as many again as L1 holds, so that the first
// b.N are on L2 only, then reads those, oldest first (run it as
// -benchtime=Nx). Compare with fio reading 256 KiB blocks of the same file
// at iodepth 32.
func BenchmarkStoreQueuePromote256K(b *testing.B) {
	const size, depth = 256 << 10, 32
	c, pid := benchDaemon(b)
	st, err := c.Stats()
	if err != nil {
		b.Fatal(err)
	}
	var l1 uint64
	for _, k := range st.Store {
		if k.Name == "l1_capacity" {
			l1 = k.Value
		}
	}
	q, err := c.OpenQueue(64)
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	run := benchRun.Add(1)
	total := uint64(b.N) + l1/size + 64
	// Put every value durably, 16 at a time.
	pk := newBenchKeys(fmt.Sprintf("bp/%d/%d", os.Getpid(), run), 0, 16)
	pr, err := c.NewResults(16)
	if err != nil {
		b.Fatal(err)
	}
	cq := make([]Completion, 1)
	call := func(submit func() (bool, error)) {
		if ok, err := submit(); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if _, err := q.Reap(cq, 1, 30*time.Second); err != nil || pr.Check(cq[0]) != nil || cq[0].N != uint64(pr.Len()) {
			b.Fatalf("durable put: %v %+v", err, cq[0])
		}
	}
	for g := uint64(0); g*16 < total; g++ {
		pk.setCycle(g)
		call(func() (bool, error) { return q.Reserve(pk.keys, size, pr, 1) })
		for j := range pk.keys {
			pr.Value(j)[0] = byte(j)
		}
		call(func() (bool, error) { return q.Commit(pk.keys, true, pr, 2) })
	}
	last := uint64(b.N - 1)
	pk.setCycle(last / 16)
	if in, err := c.StoreStat(pk.keys[last%16]); err != nil || in.InL1 || !in.InL2 {
		b.Fatalf("value %d, the last to be read, is not on L2 only: %+v %v", last, in, err)
	}
	// Read the first b.N, one key per call, in put order.
	keys := make([]*benchKeys, depth)
	res := make([]*Results, depth)
	for s := range keys {
		keys[s] = newBenchKeys(fmt.Sprintf("bp/%d/%d", os.Getpid(), run), 0, 16)
		if res[s], err = c.NewResults(1); err != nil {
			b.Fatal(err)
		}
	}
	which := make([]uint64, depth)
	p := &pipeline{q: q, depth: depth, nsteps: 2, res: res, wantOK: func(int, int) uint64 { return 1 },
		cycle: func(s int, n uint64) { which[s] = n; keys[s].setCycle(n / 16) },
		step: func(s, i int, ud uint64) (bool, error) {
			k := keys[s].keys[which[s]%16 : which[s]%16+1]
			if i == 0 {
				return q.Get(k, res[s], ud)
			}
			return q.Unpin(k, res[s], ud)
		}}
	before := storePromotions(b, c)
	b.SetBytes(size)
	b.ResetTimer()
	cpu0 := testutil.ProcCPU(b, pid)
	p.run(b, uint64(b.N))
	cpu := testutil.ProcCPU(b, pid) - cpu0
	b.StopTimer()
	if got := storePromotions(b, c) - before; got < uint64(b.N) {
		b.Fatalf("%d promotions for %d Gets of L2-only values", got, b.N)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "daemon-ns/key")
}

func storePromotions(b *testing.B, c *Client) uint64 {
	b.Helper()
	st, err := c.Stats()
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range st.Store {
		if k.Name == "promotions" {
			return k.Value
		}
	}
	return 0
}
