package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func want(crc uint32, p []byte) uint32 { return crc32.Update(crc, table, p) }

// TestUpdateMatchesHashCRC32: every length up to a few fold steps past the
// threshold, at every alignment in a cache line, from arbitrary states, and
// large values: the same crc as hash/crc32's Castagnoli.
func TestUpdateMatchesHashCRC32(t *testing.T) {
	t.Logf("implementation: %s", Impl())
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4096+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= 4096; n++ {
		off := n % 64
		p := buf[off : off+n]
		s := r.Uint32()
		if got, w := Update(s, p), want(s, p); got != w {
			t.Fatalf("len %d at offset %d from %#x: %#x, hash/crc32 says %#x", n, off, s, got, w)
		}
	}
	for _, n := range []int{256 << 10, 256<<10 + 1, 1<<20 - 17, 4 << 20} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		if got, w := Checksum(p), crc32.Checksum(p, table); got != w {
			t.Fatalf("len %d: %#x, hash/crc32 says %#x", n, got, w)
		}
	}
}

// TestEveryBitCounts: flipping any one bit of a 256 KiB value (in the
// first piece, in the fold's last register, in the unfolded tail) changes
// its crc, as a checksum that guards values must.
func TestEveryBitCounts(t *testing.T) {
	const n = 256<<10 + 100
	p := make([]byte, n)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	base := Checksum(p)
	for _, at := range []int{0, 3, 4, 15, 16, 255, 256, n - 100 - 256, n - 100 - 64, n - 100 - 1, n - 100, n - 1} {
		for bit := range 8 {
			p[at] ^= 1 << bit
			if Checksum(p) == base {
				t.Fatalf("flipping bit %d of byte %d leaves the crc unchanged", bit, at)
			}
			p[at] ^= 1 << bit
		}
	}
}

// fold is the fold of crc32c.go in plain Go, one 16-byte piece at a time:
// it checks the multipliers (foldPair) on any architecture, apart from the
// assembly that uses them.
func fold(crc uint32, p []byte) uint32 {
	le := func(b []byte) (v uint64) {
		for i := 7; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		return v
	}
	clmul := func(a, b uint64) (lo, hi uint64) {
		for i := range 64 {
			if b>>i&1 != 0 {
				lo ^= a << i
				if i > 0 {
					hi ^= a >> (64 - i)
				}
			}
		}
		return lo, hi
	}
	k1, k2 := foldPair(16)
	x0, x1 := le(p)^uint64(^crc), le(p[8:])
	for o := 16; o+16 <= len(p); o += 16 {
		a, b := clmul(x0, k1)
		c, d := clmul(x1, k2)
		x0, x1 = a^c^le(p[o:]), b^d^le(p[o+8:])
	}
	var last [16]byte
	for i := range 8 {
		last[i], last[8+i] = byte(x0>>(8*i)), byte(x1>>(8*i))
	}
	// The crc of the 16 bytes from state zero, that is from crc ^0.
	return crc32.Update(0xffffffff, table, last[:])
}

func TestFoldInPlainGo(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for n := 16; n <= 2048; n += 16 {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		s := r.Uint32()
		if got, w := fold(s, p), want(s, p); got != w {
			t.Fatalf("len %d: %#x, hash/crc32 says %#x", n, got, w)
		}
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 600))
	f.Add(uint32(0xdeadbeef), make([]byte, 1024+7))
	f.Fuzz(func(t *testing.T, s uint32, p []byte) {
		if got, w := Update(s, p), want(s, p); got != w {
			t.Fatalf("len %d from %#x: %#x, hash/crc32 says %#x", len(p), s, got, w)
		}
	})
}

// The benchmarks: a 256 KiB value in cache (hot), and one of many spread
// over 1 GiB (cold: not in any cache, as a value just read by DMA may be
// not), for this package and for hash/crc32 side by side.
func bench(b *testing.B, cold bool, f func([]byte) uint32) {
	const size = 256 << 10
	n := size
	if cold {
		n = 1 << 30
	}
	arena := make([]byte, n)
	for i := range arena {
		arena[i] = byte(i * 7)
	}
	b.SetBytes(size)
	var sum uint32
	i := 0
	for b.Loop() {
		k := 0
		if cold {
			i = (i*7919 + 1) % (n / size)
			k = i
		}
		sum ^= f(arena[k*size : (k+1)*size])
	}
	if sum == 1 {
		b.Log(sum)
	}
}

func BenchmarkChecksum256K(b *testing.B) {
	for _, c := range []struct {
		name string
		f    func([]byte) uint32
	}{
		{"crc32c", Checksum},
		{"hash-crc32", func(p []byte) uint32 { return crc32.Checksum(p, table) }},
	} {
		b.Run(c.name+"/hot", func(b *testing.B) { bench(b, false, c.f) })
		b.Run(c.name+"/cold", func(b *testing.B) { bench(b, true, c.f) })
	}
}
