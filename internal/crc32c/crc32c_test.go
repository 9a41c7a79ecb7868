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
// first piece, in the fold's last register, in each part of the hybrid's
// block, in the unfolded tail) changes
// its crc, as a checksum that guards values must.
func TestEveryBitCounts(t *testing.T) {
	const n = 256<<10 + 100
	p := make([]byte, n)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	base := Checksum(p)
	// The hybrid's first block: the folded part's first and last bytes,
	// each stream's first and last.
	v, l := hybridIters[0]*hybridFold, hybridIters[0]*hybridStream
	for _, at := range []int{0, 3, 4, 15, 16, 255, 256, v - 1, v, v + l - 1, v + l, v + 2*l, v + 3*l - 1,
		n - 100 - 256, n - 100 - 64, n - 100 - 1, n - 100, n - 1} {
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

// clmul is the carry-less product of a and b, low and high 64 bits.
func clmul(a, b uint64) (lo, hi uint64) {
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

// hybrid is hybridAVX2's block in plain Go, part by part: the first n·128
// bytes from state s, three streams of n·40 bytes each from state zero,
// joined by the multipliers of shiftBy. It checks the joining on any
// architecture, apart from the assembly that uses it.
func hybrid(s uint32, p []byte, n int) uint32 {
	raw := func(s uint32, p []byte) uint32 { return ^crc32.Update(^s, table, p) }
	shift := func(c uint32, l int) uint32 {
		lo, hi := clmul(uint64(c), shiftBy(l))
		var b [16]byte
		for i := range 8 {
			b[i], b[8+i] = byte(lo>>(8*i)), byte(hi>>(8*i))
		}
		return raw(0, b[:])
	}
	v, l := n*hybridFold, n*hybridStream
	st := raw(s, p[:v])
	for i := range 3 {
		st = shift(st, l) ^ raw(0, p[v+i*l:v+(i+1)*l])
	}
	return st
}

func TestHybridJoinInPlainGo(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{1, 2, 3, 32, 128} {
		p := make([]byte, n*hybridStep)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		s := r.Uint32()
		if got, w := hybrid(s, p, n), ^want(^s, p); got != w {
			t.Fatalf("%d iterations: %#x, hash/crc32 says %#x", n, got, w)
		}
	}
}

// TestUpdateInPieces: a value summed in pieces of any size (as the tcp
// transport sums a READ's bytes as each socket read lands), lengths around
// the hybrid's and the fold's block sizes, the same crc as in one call.
func TestUpdateInPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	p := make([]byte, 1<<20+333)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	w := crc32.Checksum(p, table)
	for range 50 {
		var crc uint32
		for rest := p; len(rest) > 0; {
			k := min(len(rest), 1+r.IntN(3*minHybrid))
			if r.IntN(4) == 0 {
				k = min(len(rest), hybridIters[0]*hybridStep+r.IntN(3)-1)
			}
			crc, rest = Update(crc, rest[:k]), rest[k:]
		}
		if crc != w {
			t.Fatalf("in pieces: %#x, in one call %#x", crc, w)
		}
	}
	for _, n := range []int{minHybrid - 1, minHybrid, minHybrid + 1, 2*minHybrid + 255,
		hybridIters[0] * hybridStep, hybridIters[0]*hybridStep + minHybrid, 64 << 10} {
		for off := range 8 {
			q, s := p[off:off+n], r.Uint32()
			if got, w := Update(s, q), want(s, q); got != w {
				t.Fatalf("len %d at offset %d from %#x: %#x, hash/crc32 says %#x", n, off, s, got, w)
			}
		}
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), make([]byte, 600))
	f.Add(uint32(0xdeadbeef), make([]byte, 1024+7))
	f.Add(uint32(0x12345678), make([]byte, 40<<10+9)) // whole hybrid blocks and a tail
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
