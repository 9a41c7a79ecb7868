//go:build linux

package shm

import (
	"strconv"
	"sync"
	"testing"
)

func benchPool(b *testing.B) *Pool {
	return newTestPool(b, 64, DefaultMinBlock, DefaultMaxBlock) // 256 MiB
}

// BenchmarkAllocFree is one Alloc plus one Free of a block of each size.
func BenchmarkAllocFree(b *testing.B) {
	for _, size := range []uint64{4 * kib, 64 * kib, 4 * mib} {
		b.Run(sizeName(size), func(b *testing.B) {
			p := benchPool(b)
			b.ReportAllocs()
			for b.Loop() {
				off, err := p.Alloc(size)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(off); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllocFreeHeld keeps half the pool's 64 KiB blocks live, so
// Alloc and Free walk real free lists and slabs change hands.
func BenchmarkAllocFreeHeld(b *testing.B) {
	p := benchPool(b)
	const size = 64 * kib
	n := int(p.Size() / size)
	offs := make([]uint64, n)
	if err := p.AllocN(size, offs); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i += 2 {
		if err := p.Free(offs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		off, err := p.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		j := 1 + 2*(i%(n/2))
		if err := p.Free(offs[j]); err != nil {
			b.Fatal(err)
		}
		offs[j] = off
		i++
	}
}

// BenchmarkAllocFreeParallel runs Alloc+Free on every P, all in one class.
func BenchmarkAllocFreeParallel(b *testing.B) {
	p := benchPool(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			off, err := p.Alloc(16 * kib)
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.Free(off); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkAllocN64Free takes 64 blocks in one call and frees them: the
// per-batch cost of a 64-block put.
func BenchmarkAllocN64Free(b *testing.B) {
	p := benchPool(b)
	offs := make([]uint64, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := p.AllocN(64*kib, offs); err != nil {
			b.Fatal(err)
		}
		for _, off := range offs {
			if err := p.Free(off); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/block")
}

// BenchmarkMutexBaseline is the reference for the figures above: two
// uncontended lock/unlock pairs, the floor of one Alloc plus one Free.
func BenchmarkMutexBaseline(b *testing.B) {
	var mu sync.Mutex
	n := 0
	for b.Loop() {
		mu.Lock()
		n++
		mu.Unlock()
		mu.Lock()
		n--
		mu.Unlock()
	}
	if n != 0 {
		b.Fatal(n)
	}
}

func sizeName(size uint64) string {
	if size >= mib {
		return strconv.FormatUint(size/mib, 10) + "MiB"
	}
	return strconv.FormatUint(size/kib, 10) + "KiB"
}
