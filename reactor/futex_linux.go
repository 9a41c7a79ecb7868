//go:build linux

package reactor

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The futex calls of an own-thread worker. The words live in mappings
// shared with clients, so every call is the shared (not private) form.

// waitv is struct futex_waitv.
type waitv struct {
	val   uint64
	uaddr uint64
	flags uint32
	_     uint32
}

var _ = [1]struct{}{}[unsafe.Sizeof(waitv{})-24]

const (
	futex2SizeU32 = 0x02 // FUTEX2_SIZE_U32, shared
	futexWakeOp   = 1    // FUTEX_WAKE
	futexWaitOp   = 0    // FUTEX_WAIT
)

func waitvOf(w *atomic.Uint32, v uint32) waitv {
	return waitv{val: uint64(v), uaddr: uint64(uintptr(unsafe.Pointer(w))), flags: futex2SizeU32}
}

var (
	waitvOnce sync.Once
	waitvOK   bool
)

// haveWaitv reports whether the kernel has futex_waitv(2) (5.16 on):
// without it, a sleep watches the worker's own word only, bounded by
// threadPoll.
func haveWaitv() bool {
	waitvOnce.Do(func() {
		_, _, errno := unix.Syscall6(unix.SYS_FUTEX_WAITV, 0, 0, 0, 0, 0, 0)
		waitvOK = errno != unix.ENOSYS
	})
	return waitvOK
}

// waitAny sleeps until one of the words no longer holds its value (woken,
// or changed before the call), or timeout passes (negative: no limit).
// ws[0] is the worker's own word.
func waitAny(ws []waitv, timeout time.Duration) {
	if !haveWaitv() {
		if timeout < 0 || timeout > threadPoll {
			timeout = threadPoll
		}
		ts := unix.NsecToTimespec(int64(timeout))
		unix.Syscall6(unix.SYS_FUTEX, uintptr(ws[0].uaddr), futexWaitOp, uintptr(ws[0].val), uintptr(unsafe.Pointer(&ts)), 0, 0) //nolint:errcheck
		return
	}
	var tsp *unix.Timespec
	if timeout >= 0 {
		var now unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &now) //nolint:errcheck // cannot fail with a valid clock
		ts := unix.NsecToTimespec(now.Nano() + int64(timeout))
		tsp = &ts
	}
	// Returns on a wake-up, a word that changed (EAGAIN), a signal or the
	// timeout: the loop looks at its queues again in every case.
	unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&ws[0])), uintptr(len(ws)), 0, //nolint:errcheck
		uintptr(unsafe.Pointer(tsp)), uintptr(unix.CLOCK_MONOTONIC), 0)
}

// futexWake wakes every sleeper on w.
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0) //nolint:errcheck
}
