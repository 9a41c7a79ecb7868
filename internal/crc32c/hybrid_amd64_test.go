package crc32c

import (
	"math/rand/v2"
	"testing"
)

// TestHybridBlocks runs the assembly itself, block by block, on a CPU that
// can (with AVX-512 too, where Update uses the fold instead): every block
// size of hybridIters, from arbitrary states, at every alignment in a
// cache line.
func TestHybridBlocks(t *testing.T) {
	if !canHybrid {
		t.Skip("this CPU lacks AVX2 or VPCLMULQDQ, which the hybrid needs (Update uses hash/crc32 here)")
	}
	r := rand.New(rand.NewPCG(9, 10))
	buf := make([]byte, hybridIters[0]*hybridStep+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for b, n := range hybridIters {
		for off := range 64 {
			p := buf[off : off+n*hybridStep]
			s := r.Uint32()
			if got, w := hybridAVX2(s, p, n, &hybridK[b]), ^want(^s, p); got != w {
				t.Fatalf("%d iterations at offset %d from %#x: %#x, hash/crc32 says %#x", n, off, s, got, w)
			}
		}
	}
}
