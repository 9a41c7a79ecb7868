package metrics

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// processFDs is ServerConfig.FDs on Linux: the descriptors this process
// has open (a listing of /proc/self/fd, paid per connection, not per
// request) and its RLIMIT_NOFILE soft limit. Descriptors are numbered from
// the lowest free one, so fd+1 are open at least.
func processFDs(fd int) (open, limit int, ok bool) {
	limit, ok = FDLimit()
	if !ok {
		return 0, 0, false
	}
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		// Out of descriptors to list them with: as short as can be.
		return limit, limit, true
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, 0, false
	}
	// The listing's own descriptor is in it; fd, still open, counts.
	return max(len(names)-1, fd+1), limit, true
}

// connFD is c's descriptor number, -1 when it has none.
func connFD(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		return -1
	}
	return fd
}

// FDLimit is the process's RLIMIT_NOFILE soft limit; ok is false when it
// cannot be read or is unbounded.
func FDLimit() (limit int, ok bool) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0, false
	}
	return int(rl.Cur), true
}
