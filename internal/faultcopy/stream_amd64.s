#include "textflag.h"

// func streamAVX2(dst, src *byte, n uintptr)
//
// Copies n bytes (a multiple of 128, at least 128) from src to dst with
// non-temporal stores; dst is 32-byte aligned. A fault on either side
// panics (SetPanicOnFault) like the runtime's memmove.
TEXT ·streamAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $128, CX
	JNZ  loop

	SFENCE
	VZEROUPPER
	RET
