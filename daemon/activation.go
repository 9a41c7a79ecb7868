package daemon

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// listenFDsStart is the first descriptor systemd passes (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// inheritedListener returns the control socket systemd passed by socket
// activation (LISTEN_PID is this process, LISTEN_FDS counts descriptors
// from 3, LISTEN_FDNAMES names them), or nil when none was passed. With
// several, the one named "control" is taken, else the first. It must be a
// listening unix stream socket; descriptors not taken are closed.
func inheritedListener(getenv func(string) string) (*net.UnixListener, error) {
	if getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(getenv("LISTEN_FDS"))
	if err != nil || n <= 0 {
		return nil, nil
	}
	if n > 64 {
		return nil, fmt.Errorf("%w: LISTEN_FDS = %d: more descriptors than a control socket needs", ErrConfig, n)
	}
	names := strings.Split(getenv("LISTEN_FDNAMES"), ":")
	pick := 0
	for i, name := range names {
		if name == "control" && i < n {
			pick = i
		}
	}
	var ln *net.UnixListener
	for i := 0; i < n; i++ {
		fd := listenFDsStart + i
		syscall.CloseOnExec(fd)
		if i != pick {
			syscall.Close(fd)
			continue
		}
		f := os.NewFile(uintptr(fd), "LISTEN_FDS:"+strconv.Itoa(fd))
		l, err := net.FileListener(f)
		f.Close() // FileListener holds its own duplicate
		if err != nil {
			return nil, fmt.Errorf("inherited socket (fd %d): %w", fd, err)
		}
		ul, ok := l.(*net.UnixListener)
		if !ok {
			l.Close()
			return nil, fmt.Errorf("%w: inherited socket (fd %d) is %s, not a unix stream socket", ErrConfig, fd, l.Addr().Network())
		}
		ul.SetUnlinkOnClose(false) // systemd owns the socket file
		ln = ul
	}
	return ln, nil
}
