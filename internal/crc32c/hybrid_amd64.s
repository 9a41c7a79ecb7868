#include "textflag.h"

// STREAMS sums the 8 bytes at off of each of the three streams.
#define STREAMS(off) \
	CRC32Q off(R8), AX; \
	CRC32Q off(R9), BX; \
	CRC32Q off(R10), R11

// FOLD moves register r 128 bytes on (Y4) with temporary t and adds the
// 32 bytes at off(SI), with a step of the streams beside it.
#define FOLD(r, t, off, soff) \
	VPCLMULQDQ $0x00, Y4, r, t; \
	VPCLMULQDQ $0x11, Y4, r, r; \
	STREAMS(soff); \
	VPXOR      off(SI), t, t; \
	VPXOR      t, r, r

// ONTO moves register r onto Y3 by the multipliers at koff(DI).
#define ONTO(r, koff) \
	VBROADCASTI128 koff(DI), Y4; \
	VPCLMULQDQ     $0x00, Y4, r, Y5; \
	VPCLMULQDQ     $0x11, Y4, r, r; \
	VPXOR          Y5, r, r; \
	VPXOR          r, Y3, Y3

// JOIN moves the state in register s on past the streams after it (the
// multiplier at koff(DI)) and adds it to R11.
#define JOIN(s, koff) \
	VMOVQ      s, X5; \
	VMOVQ      koff(DI), X4; \
	VPCLMULQDQ $0x00, X4, X5, X5; \
	VMOVQ      X5, R12; \
	VPEXTRQ    $1, X5, R13; \
	XORL       DX, DX; \
	CRC32Q     R12, DX; \
	CRC32Q     R13, DX; \
	XORL       DX, R11

// func hybridAVX2(s uint32, p []byte, n int, k *[13]uint64) uint32
//
// One block of the hybrid that hybrid_amd64.go describes: p is n·248 bytes,
// n ≥ 1. Its first n·128 bytes are folded on four 32-byte registers while
// the CRC32 instruction sums the rest as three streams of n·40 bytes, in
// the same loop; then the registers are reduced to the state after the
// first part, and the four states are joined. s is the raw state before
// the block; the raw state after it is returned.
TEXT ·hybridAVX2(SB), NOSPLIT, $0-52
	MOVL s+0(FP), R12
	MOVQ p_base+8(FP), SI
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), DI

	// The streams: R8, R9, R10, from n·128 bytes on, n·40 bytes apart.
	MOVQ   CX, R13
	SHLQ   $7, R13
	LEAQ   (SI)(R13*1), R8
	IMUL3Q $40, CX, R14
	LEAQ   (R8)(R14*1), R9
	LEAQ   (R9)(R14*1), R10
	XORL   AX, AX
	XORL   BX, BX
	XORL   R11, R11

	// The first 128 bytes, the state in their first four; the streams'
	// first 40 bytes.
	VMOVDQU        0(SI), Y0
	VMOVDQU        32(SI), Y1
	VMOVDQU        64(SI), Y2
	VMOVDQU        96(SI), Y3
	VMOVD          R12, X5
	VPXOR          Y5, Y0, Y0
	VBROADCASTI128 0(DI), Y4 // move 128 bytes on
	ADDQ           $128, SI
	STREAMS(0)
	STREAMS(8)
	STREAMS(16)
	STREAMS(24)
	STREAMS(32)
	ADDQ $40, R8
	ADDQ $40, R9
	ADDQ $40, R10
	DECQ CX
	JZ   reduce

loop:
	FOLD(Y0, Y5, 0, 0)
	FOLD(Y1, Y6, 32, 8)
	FOLD(Y2, Y7, 64, 16)
	FOLD(Y3, Y5, 96, 24)
	STREAMS(32)
	ADDQ $128, SI
	ADDQ $40, R8
	ADDQ $40, R9
	ADDQ $40, R10
	DECQ CX
	JNZ  loop

reduce:
	// Y0, Y1, Y2 onto Y3: 96, 64 and 32 bytes on.
	ONTO(Y0, 16)
	ONTO(Y1, 32)
	ONTO(Y2, 48)

	// Y3's first lane onto its second: 16 bytes on.
	VEXTRACTI128 $1, Y3, X7
	VMOVDQU      64(DI), X4
	VPCLMULQDQ   $0x00, X4, X3, X5
	VPCLMULQDQ   $0x11, X4, X3, X6
	VPXOR        X5, X6, X6
	VPXOR        X7, X6, X6

	// The state after the folded part: the crc of the 16 bytes left.
	VMOVQ   X6, R12
	VPEXTRQ $1, X6, R13
	XORL    R14, R14
	CRC32Q  R12, R14
	CRC32Q  R13, R14

	// Join: each state but the last moved on past the streams after it
	// (as if those bytes were zeros, which adds nothing), then added up.
	JOIN(R14, 80)
	JOIN(AX, 88)
	JOIN(BX, 96)
	VZEROUPPER
	MOVL R11, ret+48(FP)
	RET

// func cpuid7ECX() uint32
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL  $7, AX
	XORL  CX, CX
	CPUID
	MOVL  CX, ret+0(FP)
	RET
