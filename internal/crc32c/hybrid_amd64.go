package crc32c

import "golang.org/x/sys/cpu"

// The hybrid: where the CPU has VPCLMULQDQ on 256-bit registers but not
// AVX-512 (AMD Zen 3 among them), neither
// the fold on 32-byte registers nor hash/crc32's three CRC32 streams is
// much faster than the other (23.6 and 21.3 GB/s over cached bytes on a
// Zen 3, BENCHMARKS.md's section on the fold on AVX2 registers), but they
// use different units of the core. hybridAVX2 runs both
// in one loop over one block: the block's first part is folded, the rest
// is three CRC32 streams, and the four states are joined at the end.
//
// Joining: a raw state c followed by L zero bytes is, by the CRC32
// instruction's definition, the crc from state zero of an L-byte message
// whose first 8 bytes are c (zero-extended) and the rest zeros. Moving that
// first 8-byte piece L-16 bytes on (crc32c.go, the fold) leaves the
// 16-byte product clmul(c, x^(63+8(L-16)) mod P) as the message's last 16
// bytes and zeros before them, so the state is the crc of those 16 bytes.
// Bytes of the other streams that follow c's stream add to that state what
// their own stream from state zero gives (the crc is linear), so the
// block's state is the sum of each part's state moved on past the parts
// after it.

// canHybrid: the CPU runs hybridAVX2: AVX2 with the OS saving its
// registers, VPCLMULQDQ (CPUID leaf 7, ECX bit 10: x/sys/cpu reports it
// only beside AVX-512), PCLMULQDQ and SSE 4.2. haveHybrid: Update uses it,
// where there is no AVX-512 fold, which is faster.
var (
	canHybrid  = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42 && cpuid7ECX()&(1<<10) != 0
	haveHybrid = !haveFold && canHybrid
)

const implHybrid = "avx2 vpclmulqdq fold beside three sse4.2 crc32 streams"

// hybridUpdate continues the raw state s over p in whole blocks and
// returns what it did not take (less than the smallest block).
func hybridUpdate(s uint32, p []byte) (uint32, []byte) {
	for b, n := range hybridIters {
		for size := n * hybridStep; len(p) >= size; p = p[size:] {
			s = hybridAVX2(s, p[:size], n, &hybridK[b])
		}
	}
	return s, p
}

// hybridAVX2 and cpuid7ECX are in hybrid_amd64.s.
//
//go:noescape
func hybridAVX2(s uint32, p []byte, n int, k *[13]uint64) uint32

func cpuid7ECX() uint32
