#include "textflag.h"

// func foldAVX512(s uint32, p []byte, k *[16]uint64) uint32
//
// The fold described in crc32c.go, four 64-byte registers (sixteen 16-byte
// pieces) at a time. len(p) is a multiple of 256, at least 256.
TEXT ·foldAVX512(SB), NOSPLIT, $0-44
	MOVL s+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX

	VMOVDQU64 0(SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4        // the state goes into the first four bytes
	VPXORQ    Z4, Z0, Z0
	VBROADCASTI32X4 0(DX), Z5 // move 256 bytes on
	ADDQ $256, SI
	SUBQ $256, CX
	JZ   reduce

loop:
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGD $0x96, 0(SI), Z6, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGD $0x96, 64(SI), Z7, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z6
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGD $0x96, 128(SI), Z6, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z7
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGD $0x96, 192(SI), Z7, Z3
	ADDQ $256, SI
	SUBQ $256, CX
	JNZ  loop

reduce:
	// Z0, Z1, Z2 onto Z3: 192, 128 and 64 bytes on.
	VBROADCASTI32X4 16(DX), Z5
	VPCLMULQDQ      $0x00, Z5, Z0, Z6
	VPCLMULQDQ      $0x11, Z5, Z0, Z0
	VPTERNLOGD      $0x96, Z6, Z0, Z3
	VBROADCASTI32X4 32(DX), Z5
	VPCLMULQDQ      $0x00, Z5, Z1, Z6
	VPCLMULQDQ      $0x11, Z5, Z1, Z1
	VPTERNLOGD      $0x96, Z6, Z1, Z3
	VBROADCASTI32X4 48(DX), Z5
	VPCLMULQDQ      $0x00, Z5, Z2, Z6
	VPCLMULQDQ      $0x11, Z5, Z2, Z2
	VPTERNLOGD      $0x96, Z6, Z2, Z3

	// Z3's lanes 0, 1, 2 onto lane 3 (48, 32, 16 bytes on; lane 3's own
	// multipliers are zero), then the lanes added up.
	VMOVDQU64      64(DX), Z5
	VPCLMULQDQ     $0x00, Z5, Z3, Z6
	VPCLMULQDQ     $0x11, Z5, Z3, Z7
	VPXORQ         Z7, Z6, Z6
	VEXTRACTI32X4  $3, Z3, X7
	VEXTRACTI64X4  $1, Z6, Y8
	VPXORQ         Y8, Y6, Y6
	VEXTRACTI128   $1, Y6, X8
	VPXOR          X8, X6, X6
	VPXOR          X7, X6, X6

	// The crc of the 16 bytes left, from state zero.
	VMOVQ   X6, AX
	VPEXTRQ $1, X6, BX
	XORL    CX, CX
	CRC32Q  AX, CX
	CRC32Q  BX, CX
	VZEROUPPER
	MOVL    CX, ret+40(FP)
	RET
