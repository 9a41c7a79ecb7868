package faultcopy

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveStream: the CPU has AVX2 (32-byte loads and non-temporal stores).
var haveStream = cpu.X86.HasAVX2

// stream copies src into dst (of the same length) with non-temporal
// stores for the 32-byte-aligned part of dst that is a multiple of 128
// bytes long, and copy for the bytes around it.
func stream(dst, src []byte) {
	n := len(dst)
	head := int((32 - uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%32) % 32)
	if !haveStream || n < head+streamMin {
		copy(dst, src)
		return
	}
	bulk := (n - head) &^ 127
	copy(dst[:head], src[:head])
	streamAVX2(unsafe.SliceData(dst[head:]), unsafe.SliceData(src[head:]), uintptr(bulk))
	copy(dst[head+bulk:], src[head+bulk:])
}

// streamAVX2 is in stream_amd64.s.
//
//go:noescape
func streamAVX2(dst, src *byte, n uintptr)
