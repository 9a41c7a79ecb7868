package store

import (
	"os"
	"testing"

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
	dir := os.Getenv("TENSORCAST_STORE_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	u, err := openUringPool(dir, 256<<20, Config{L1Capacity: 256 << 20}, FileL2{Size: 1 << 30, RegionSize: 64 << 20})
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
	u := benchUring(b)
	ss := u.s.NewSession()
	defer ss.Close()
	const size, nkeys = 256 << 10, 512 // 128 MiB on L2
	keys := keysN("p", nkeys)
	val := make([]byte, size)
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
	b.SetBytes(size * benchBatch)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := keys[(i*benchBatch)%nkeys:][:benchBatch]
		if _, err := ss.Get(k, locs, codes, errs, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0], errs[0])
		}
		b.StopTimer()
		if err := ss.Unpin(k, codes); err != nil {
			b.Fatal(err)
		}
		u.s.evict(1<<62, 1<<20)
		b.StartTimer()
	}
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
