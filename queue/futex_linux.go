//go:build linux

package queue

import (
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The futex words live in a mapping shared between processes, so the calls
// are the shared (not FUTEX_PRIVATE_FLAG) forms.

// futex(2) operations (linux/futex.h).
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *w == val, at most timeout (negative: no limit).
// It returns nil when woken, when *w no longer equals val, or on a signal
// (the caller re-checks its condition in every case), and ErrTimeout when
// the time ran out.
func futexWait(w *atomic.Uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp,
		uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	switch errno {
	case 0, unix.EAGAIN, unix.EINTR:
		return nil
	case unix.ETIMEDOUT:
		return ErrTimeout
	}
	return os.NewSyscallError("futex wait", errno)
}

// futexWake wakes every sleeper on w.
func futexWake(w *atomic.Uint32) {
	// A wake cannot fail on a valid, mapped word; there is nothing to do
	// about an error here but the sleeper's own timeout.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0) //nolint:errcheck
}

// napSleep sleeps the calling thread for d without asking anyone to wake
// it: the clock ends it (a nap, see tail.nap). A variable, so that a test
// can post completions in its place.
var napSleep = func(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Nanosleep(&ts, nil) //nolint:errcheck // EINTR ends a nap early, which the wait's loop absorbs
}

// timerSlack is how late the kernel may end this thread's timed sleeps
// (PR_GET_TIMERSLACK; threads inherit it, 50 µs by default), which a nap
// takes off its length. When it cannot be read, the default is assumed.
func timerSlack() time.Duration {
	if ns, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0); err == nil && ns >= 0 {
		return time.Duration(ns)
	}
	return 50 * time.Microsecond
}
