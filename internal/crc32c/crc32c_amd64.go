package crc32c

import "golang.org/x/sys/cpu"

// haveFold: the CPU (and the kernel, which must save the registers) has
// what foldAVX512 uses: AVX-512F, VPCLMULQDQ on 512-bit registers, and
// SSE 4.2's CRC32 for the last 16 bytes.
var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

const implFold = "avx512 vpclmulqdq fold"

// foldConsts are foldAVX512's multipliers, in pairs (for a 16-byte piece's
// first 8 bytes, for its last 8) moving a piece d bytes on: d = 256 (the
// loop), 192, 128, 64 (four registers onto the last), then 48, 32, 16 and
// a pair of zeros (the four 16-byte lanes of the last register onto its
// last lane, in one multiplication).
var foldConsts = func() (k [16]uint64) {
	for i, d := range [...]int{256, 192, 128, 64, 48, 32, 16} {
		k[2*i], k[2*i+1] = foldPair(d)
	}
	return k
}()

// foldUpdate continues the raw crc state s (not inverted) over p, whose
// length is a multiple of foldBlock and at least minFold.
func foldUpdate(s uint32, p []byte) uint32 { return foldAVX512(s, p, &foldConsts) }

// foldAVX512 is in crc32c_amd64.s.
//
//go:noescape
func foldAVX512(s uint32, p []byte, k *[16]uint64) uint32
