// Package faultcopy copies memory that another process may unmap or
// truncate under the copy (a client's shared buffer, the pool a client
// maps) and turns the fault into a result, not a crash of the daemon.
// Each caller maps it to its own package's error. It counts the faults it
// caught, process-wide, for the daemon's metrics.
package faultcopy

import (
	"runtime/debug"
	"sync/atomic"
	"unsafe"
)

// faults counts the faults caught since the process started.
var faults atomic.Uint64

// Faults is the number of faults Copy, Guarded and Call caught.
func Faults() uint64 { return faults.Load() }

// Copy copies src to dst and reports false when the copy touched memory
// that is no longer mapped. The calling goroutine must have
// runtime/debug.SetPanicOnFault on (a worker sets it once for its life);
// Guarded sets it for one copy. Any other panic is not a fault and goes on.
func Copy(dst, src []byte) (ok bool) {
	defer catch(&ok)
	copy(dst, src)
	return true
}

// Guarded is Copy on a goroutine that does not have SetPanicOnFault on: it
// is on for this copy alone.
func Guarded(dst, src []byte) bool {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	return Copy(dst, src)
}

// streamMin is the shortest copy Stream makes with non-temporal stores:
// below it the destination's cache lines cost little, above it reading
// them in before writing them (what ordinary stores do) is a third of the
// copy's memory traffic.
const streamMin = 64 << 10

// Stream is Copy for a destination that is not read again soon (a value
// put in the store's pool, a page read into an engine's host pool that the
// GPU copies from): its aligned bulk is written with non-temporal stores
// where the CPU has them, the rest by copy. dst and src have the same
// length; overlapping slices are copied by copy.
func Stream(dst, src []byte) (ok bool) {
	defer catch(&ok)
	if len(dst) != len(src) || overlap(dst, src) {
		copy(dst, src)
		return true
	}
	stream(dst, src)
	return true
}

// GuardedStream is Stream on a goroutine without SetPanicOnFault on.
func GuardedStream(dst, src []byte) bool {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	return Stream(dst, src)
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// Call runs fn(arg) with SetPanicOnFault on and reports false when fn
// touched memory that is no longer mapped (fn then stopped there). It is
// for writes into shared memory that are not one copy (records encoded in
// place); fn and arg are separate so that a call allocates nothing.
func Call[T any](fn func(T), arg T) (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer catch(&ok)
	fn(arg)
	return true
}

// catch turns a memory fault's panic into *ok = false; any other panic
// goes on.
func catch(ok *bool) {
	if r := recover(); r != nil {
		if _, fault := r.(interface{ Addr() uintptr }); fault {
			faults.Add(1)
			*ok = false
			return
		}
		panic(r)
	}
}
