// Package crc32c is the crc32c (Castagnoli) checksum of the store's values,
// fast enough to check every value read back from L2 or from another host.
//
// It computes exactly what hash/crc32 computes with the Castagnoli table
// (same values, so nothing on L2 or on the wire changes); only the speed
// differs. hash/crc32 uses the SSE 4.2 CRC32 instruction, three streams at
// once: about 27 GB/s over bytes in cache on the machines measured, but
// under 9 GB/s over bytes that are not (a 256 KiB value just read from the
// device by DMA), because its loads do not keep enough cache misses in
// flight. Where the CPU has AVX-512 and VPCLMULQDQ, Update folds 256 bytes
// per step with carry-less multiplications instead: memory-bound over cold
// bytes and several times faster over cached ones. Where it has VPCLMULQDQ
// on 256-bit registers only (AMD Zen 3), it folds part of each block on
// those while three CRC32 streams take the rest, in one loop
// (hybrid_amd64.go): on a Zen 3, 29 GB/s against hash/crc32's 21 over a
// cached 256 KiB value and 17 against 8 over a cold one (BENCHMARKS.md).
// Elsewhere it is hash/crc32 itself.
//
// How the fold works (crc32c_amd64.s does it, fold in crc32c_test.go is the
// same in plain Go): the value is a polynomial over GF(2), the first bit
// (the low bit of byte 0) of highest degree, and the crc32c is what is
// left of (value · x³²) mod P. A 16-byte piece X at some position can be
// moved d bytes further along (multiplied by x^(8d)) and added into the
// piece there without changing that remainder, as long as it is replaced
// by something congruent mod P: X's first 8 bytes times (x^(63+8d) mod P)
// plus its last 8 bytes times (x^(8d-1) mod P), each product 96 bits at
// most (the -1 is the carry-less multiply's one-bit shift of reflected
// operands). Folding every piece onto the last 16 bytes leaves a 16-byte
// message with the same crc, which the CRC32 instruction finishes. The
// checksum's starting state is xored into the first four bytes.
package crc32c

import (
	"hash/crc32"
	"math/bits"
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the crc32c of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Update is the crc32c of what crc was the crc32c of, followed by p (as
// crc32.Update with the Castagnoli table).
func Update(crc uint32, p []byte) uint32 {
	if n := len(p) &^ (foldBlock - 1); haveFold && n >= minFold {
		crc = ^foldUpdate(^crc, p[:n])
		p = p[n:]
	}
	if haveHybrid && len(p) >= minHybrid {
		var s uint32
		s, p = hybridUpdate(^crc, p)
		crc = ^s
	}
	return crc32.Update(crc, table, p)
}

// Impl names the implementation Update uses on this CPU, for the daemon's
// log of what it found.
func Impl() string {
	switch {
	case haveFold:
		return implFold
	case haveHybrid:
		return implHybrid
	}
	return "sse4.2 or table (hash/crc32)"
}

const (
	foldBlock = 256 // the fold's step; it takes whole steps only
	// minFold: below this, the fold's set-up and final reduction cost more
	// than hash/crc32 saves.
	minFold = 512
)

// poly is the Castagnoli polynomial without its x³² term, bit i the
// coefficient of x^i.
const poly = 0x1EDC6F41

// xPow is x^e mod P, bit i the coefficient of x^i.
func xPow(e int) uint32 {
	r := uint64(1)
	for range e {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= 1<<32 | poly
		}
	}
	return uint32(r)
}

// foldPair is the pair of multipliers that moves a 16-byte piece d bytes
// on: x^(63+8d) and x^(8d-1) mod P, bit-reflected into the 64-bit operand
// the carry-less multiplication takes.
func foldPair(d int) (first, last uint64) {
	return bits.Reverse64(uint64(xPow(63 + 8*d))), bits.Reverse64(uint64(xPow(8*d - 1)))
}

// hybridStep is what one iteration of the loop takes: 128 bytes folded,
// 40 from each stream.
const (
	hybridFold   = 128
	hybridStream = 40
	hybridStep   = hybridFold + 3*hybridStream
)

// hybridIters are the block sizes, in iterations, largest first: each
// block ends with a reduction and a join of a few dozen instructions, so
// blocks are long (31 KiB); the smaller one (7.75 KiB) takes most of what a
// 64 KiB read leaves of the larger.
var hybridIters = [...]int{128, 32}

// minHybrid is the hybrid's smallest block.
var minHybrid = hybridIters[len(hybridIters)-1] * hybridStep

// hybridK are hybridAVX2's multipliers for each block size: fold pairs
// moving a 16-byte piece 128 bytes on (the loop), 96, 64, 32 (three
// registers onto the fourth) and 16 (a lane onto the next), then the
// multipliers that move a state past three streams, two and one. Made
// only where the CPU runs the hybrid.
var hybridK = func() (k [len(hybridIters)][13]uint64) {
	if !canHybrid {
		return k
	}
	for b, n := range hybridIters {
		for i, d := range [...]int{128, 96, 64, 32, 16} {
			k[b][2*i], k[b][2*i+1] = foldPair(d)
		}
		for i, streams := range [...]int{3, 2, 1} {
			k[b][10+i] = shiftBy(streams * n * hybridStream)
		}
	}
	return k
}()

// shiftBy is the multiplier that moves a raw state past l ≥ 16 bytes
// (hybrid_amd64.go, joining): x^(63+8(l-16)) mod P, bit-reflected.
func shiftBy(l int) uint64 {
	first, _ := foldPair(l - 16)
	return first
}
