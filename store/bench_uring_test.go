package store

import (
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// The L2 benchmarks run on a real file through io_uring. The file lives in
// $TENSORCAST_STORE_BENCH_DIR when set (scripts/bench-store.sh points it at
// the disk to measure and runs fio on the same file), else in a temporary
// directory. Queue depth is the batch: every batch's reads or writes go to
// the ring in one submission.

const benchBatch = 32

func benchUring(b *testing.B) *uringEnv {
	b.Helper()
	return benchUringL2(b, FileL2{Size: 1 << 30, RegionSize: 64 << 20}, false)
}

// benchUringL2 is benchUring with f's L2; fresh puts it in a new directory
// (under $TENSORCAST_STORE_BENCH_DIR when set) removed after the benchmark,
// so that runs in one process do not recover each other's values.
func benchUringL2(b *testing.B, f FileL2, fresh bool) *uringEnv {
	b.Helper()
	dir := os.Getenv("TENSORCAST_STORE_BENCH_DIR")
	switch {
	case dir == "":
		dir = b.TempDir()
	case fresh:
		d, err := os.MkdirTemp(dir, "promote-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	u, err := openUringPool(dir, 256<<20, Config{L1Capacity: 256 << 20}, f)
	testutil.RequireSupported(b, testutil.IOUring, err)
	b.Cleanup(func() {
		if err := u.close(); err != nil {
			b.Error(err)
		}
	})
	return u
}

// BenchmarkPromote256K: Gets of L2-only 256 KiB values, benchBatch at a
// time: each reserves pool blocks and reads the values into them
// (READ_FIXED, O_DIRECT), checks their crc32c and pins them; then Unpin and
// eviction make them L2-only again (not timed).
func BenchmarkPromote256K(b *testing.B) {
	promote256K(b, benchUring(b))
}

// BenchmarkPromoteCRC256K is BenchmarkPromote256K with the crc32c check of
// each value read back (crc32c=on, the default) and without it
// (crc32c=off: FileL2.NoVerifyReads), one after the other in one run: what
// the check costs a get of a value on L2 only. cpu-ns/get is the process's
// CPU time (user and system, the ring's kernel work included) per value,
// over the timed Gets only.
func BenchmarkPromoteCRC256K(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "crc32c=off"
		if on {
			name = "crc32c=on"
		}
		b.Run(name, func(b *testing.B) {
			promote256K(b, benchUringL2(b, FileL2{Size: 1 << 30, RegionSize: 64 << 20, NoVerifyReads: !on}, true))
		})
	}
}

// BenchmarkCRC32C256K: the checksum alone over a 256 KiB value in memory.
func BenchmarkCRC32C256K(b *testing.B) {
	v := make([]byte, 256<<10)
	for i := range v {
		v[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(v)))
	var sum uint32
	for b.Loop() {
		sum ^= crc32c(v)
	}
	if sum == 1 {
		b.Log(sum) // keeps the loop's work
	}
}

func promote256K(b *testing.B, u *uringEnv) {
	ss := u.s.NewSession()
	defer ss.Close()
	const size, nkeys = 256 << 10, 512 // 128 MiB on L2
	keys := keysN("p", nkeys)
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i * 13)
	}
	codes, errs := make([]Code, benchBatch), make([]error, benchBatch)
	for i := 0; i < nkeys; i += benchBatch {
		vals := make([][]byte, benchBatch)
		for j := range vals {
			vals[j] = val
		}
		if _, err := ss.Put(keys[i:i+benchBatch], vals, true, codes, errs, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0], errs[0])
		}
	}
	u.s.evict(1<<62, 1<<20)
	locs := make([]Location, benchBatch)
	var cpu time.Duration
	gets := 0
	b.SetBytes(size * benchBatch)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := keys[(i*benchBatch)%nkeys:][:benchBatch]
		t0 := cpuTime(b)
		if _, err := ss.Get(k, locs, codes, errs, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0], errs[0])
		}
		cpu += cpuTime(b) - t0
		gets += benchBatch
		b.StopTimer()
		if err := ss.Unpin(k, codes); err != nil {
			b.Fatal(err)
		}
		u.s.evict(1<<62, 1<<20)
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(gets), "cpu-ns/get")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDurablePut256K: durable copying puts of 256 KiB values,
// benchBatch at a time (value writes in one submission, then each header
// after its value), and the Remove that zeroes their headers (not timed).
func BenchmarkDurablePut256K(b *testing.B) {
	u := benchUring(b)
	ss := u.s.NewSession()
	defer ss.Close()
	const size = 256 << 10
	keys := keysN("d", benchBatch)
	vals := make([][]byte, benchBatch)
	for i := range vals {
		vals[i] = make([]byte, size)
	}
	codes, errs := make([]Code, benchBatch), make([]error, benchBatch)
	b.SetBytes(size * benchBatch)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ss.Put(keys, vals, true, codes, errs, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0], errs[0])
		}
		b.StopTimer()
		if _, err := u.s.Remove(keys, codes, errs, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0], errs[0])
		}
		b.StartTimer()
	}
}

// BenchmarkCRCCheck256K: what the crc32c check costs a get of 256 KiB
// values on L2 only, side by side in one store: each loop iteration gets the
// same keys twice, once checking each value read back (on, the default) and
// once not (off, as FileL2.NoVerifyReads), in alternating order, evicting
// them from L1 after each get (untimed), so that both sides read the same
// blocks of the same file at the same moments of the disk and the machine.
// batch=1 is one get at a time (the check's share of one value's latency),
// batch=32 a call of 32 values read together. Reported: each side's median
// time and process CPU time per value over the iterations, and the check's
// share of both, (on - off) / on. The disk's time varies more from call to
// call than the check costs, so the check's exposed time is also taken
// apart from it: span is the time from the first read's completion to the
// call's return (the device completes a call's reads within microseconds
// of each other here), exposed-% is (span on - span off) / time on, and
// exposed-ns/get the same difference per value.
func BenchmarkCRCCheck256K(b *testing.B) {
	for _, batch := range []int{1, benchBatch} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			c := newCRCBench(b, benchUringL2(b, FileL2{Size: 1 << 30, RegionSize: 64 << 20}, true), batch)
			b.SetBytes(int64(2 * batch * crcBenchSize))
			var on, off crcTimes
			for i := 0; b.Loop(); i++ {
				k := c.keys[i*batch%len(c.keys):][:batch]
				if i&1 == 0 {
					c.get(b, k, true, &on)
					c.get(b, k, false, &off)
				} else {
					c.get(b, k, false, &off)
					c.get(b, k, true, &on)
				}
			}
			ons, offs := median(on.wall), median(off.wall)
			exp := median(on.span) - median(off.span)
			b.ReportMetric(100*exp/ons, "exposed-%")
			b.ReportMetric(exp/float64(batch), "exposed-ns/get")
			onc, offc := median(on.cpu), median(off.cpu)
			per := float64(batch)
			b.ReportMetric(ons/per, "on-ns/get")
			b.ReportMetric(offs/per, "off-ns/get")
			b.ReportMetric(100*(ons-offs)/ons, "time-%")
			b.ReportMetric(onc/per, "on-cpu-ns/get")
			b.ReportMetric(offc/per, "off-cpu-ns/get")
			b.ReportMetric(100*(onc-offc)/onc, "cpu-%")
		})
	}
}

const crcBenchSize = 256 << 10

// crcBench is BenchmarkCRCCheck256K's store, with its values on L2 only.
type crcBench struct {
	u     *uringEnv
	ss    *Session
	keys  [][]byte
	locs  []Location
	codes []Code
	errs  []error
	first atomic.Int64 // when the call's first read completed, in unix ns
}

// crcTimes are one side's times per call, in ns.
type crcTimes struct{ wall, cpu, span []float64 }

func newCRCBench(b *testing.B, u *uringEnv, batch int) *crcBench {
	const nkeys = 512 // 128 MiB on L2
	c := &crcBench{u: u, ss: u.s.NewSession(), keys: keysN("p", nkeys),
		locs: make([]Location, batch), codes: make([]Code, benchBatch), errs: make([]error, benchBatch)}
	b.Cleanup(func() { c.ss.Close() })
	h := func() { c.first.CompareAndSwap(0, time.Now().UnixNano()) }
	readDoneHook.Store(&h)
	b.Cleanup(func() { readDoneHook.Store(nil) })
	val := make([]byte, crcBenchSize)
	for i := range val {
		val[i] = byte(i * 13)
	}
	vals := make([][]byte, benchBatch)
	for j := range vals {
		vals[j] = val
	}
	for i := 0; i < nkeys; i += benchBatch {
		if _, err := c.ss.Put(c.keys[i:i+benchBatch], vals, true, c.codes, c.errs, nil, 0); err != nil || c.codes[0] != OK {
			b.Fatal(err, c.codes[0], c.errs[0])
		}
	}
	u.s.evict(1<<62, 1<<20)
	return c
}

// get times one Get of keys (L2 only) with the check on or off, then
// unpins them and evicts them from L1 again, untimed.
func (c *crcBench) get(b *testing.B, keys [][]byte, check bool, to *crcTimes) {
	codes, errs := c.codes[:len(keys)], c.errs[:len(keys)]
	b.StopTimer()
	c.u.s.l2.verify = check // nothing is in flight between calls
	c.first.Store(0)
	c0, t0 := cpuTime(b), time.Now()
	b.StartTimer()
	_, err := c.ss.Get(keys, c.locs, codes, errs, nil, 0)
	b.StopTimer()
	t1 := time.Now()
	d, cd := t1.Sub(t0), cpuTime(b)-c0
	c.u.s.l2.verify = true
	if err != nil || codes[0] != OK {
		b.Fatal(err, codes[0], errs[0])
	}
	to.wall = append(to.wall, float64(d.Nanoseconds()))
	to.cpu = append(to.cpu, float64(cd.Nanoseconds()))
	to.span = append(to.span, float64(t1.UnixNano()-c.first.Load()))
	if err := c.ss.Unpin(keys, codes); err != nil {
		b.Fatal(err)
	}
	c.u.s.evict(1<<62, 1<<20)
	b.StartTimer()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
