//go:build linux

package queue

import (
	"encoding/binary"
	"os"

	"golang.org/x/sys/unix"
)

func closeFD(fd int) error { return os.NewSyscallError("close", unix.Close(fd)) }

// newEventfd makes a queue's eventfd doorbell. It is blocking: a read
// the worker's io_uring arms on it then waits in the kernel (a
// non-blocking one would complete at once with EAGAIN).
func newEventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	return fd, os.NewSyscallError("eventfd", err)
}

func dupFD(fd int) (int, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	return d, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", err)
}

// ringEventfd adds 1 to an eventfd doorbell. A failure (a counter at its
// maximum: the reader is behind, and awake) leaves nothing to do.
func ringEventfd(fd int) {
	unix.Write(fd, eventfdOne[:]) //nolint:errcheck // see above
}

// eventfdOne is the u64 1 in the host's byte order, as eventfd takes it
// (read only: one array for every doorbell, no allocation per ring).
var eventfdOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()
