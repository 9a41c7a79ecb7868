// Package faultcopy copies memory that another process may unmap or
// truncate under the copy (a client's shared buffer, the pool a client
// maps) and turns the fault into a result, not a crash of the daemon.
// Each caller maps it to its own package's error.
package faultcopy

import "runtime/debug"

// Copy copies src to dst and reports false when the copy touched memory
// that is no longer mapped. The calling goroutine must have
// runtime/debug.SetPanicOnFault on (a worker sets it once for its life);
// Guarded sets it for one copy. Any other panic is not a fault and goes on.
func Copy(dst, src []byte) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); fault {
				ok = false
				return
			}
			panic(r)
		}
	}()
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
