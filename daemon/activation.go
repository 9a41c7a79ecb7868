package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// listenFDsStart is the first descriptor systemd passes (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// maxListenFDs bounds LISTEN_FDS: a control socket and two descriptors per
// tenant from the file descriptor store need far fewer.
const maxListenFDs = 1024

// inheritedFDs are the descriptors systemd passed: by socket activation
// (the control socket) and from its file descriptor store (the pools and
// L1 journals an earlier daemon stored, restart.go). Each is taken once by
// name; closeRest closes those nobody took.
type inheritedFDs struct {
	fds   []int
	names []string
	taken []bool
	// handed[i] says fds[i] came from a hand-off (handoff.go), not from
	// systemd's store: systemd does not hold it.
	handed []bool
}

// fromSystemd says whether fd is one systemd holds in its store.
func (in *inheritedFDs) fromSystemd(fd int) bool {
	for i, f := range in.fds {
		if f == fd {
			return i >= len(in.handed) || !in.handed[i]
		}
	}
	return false
}

// merge adds the descriptors of a hand-off to those systemd passed.
func (in *inheritedFDs) merge(h *inheritedFDs) {
	for i, fd := range h.fds {
		for len(in.handed) < len(in.fds) {
			in.handed = append(in.handed, false)
		}
		in.fds, in.names, in.taken, in.handed = append(in.fds, fd), append(in.names, h.names[i]), append(in.taken, false), append(in.handed, true)
	}
}

// closeAll closes every descriptor not taken.
func (in *inheritedFDs) closeAll() {
	for i, fd := range in.fds {
		if !in.taken[i] {
			in.taken[i] = true
			syscall.Close(fd)
		}
	}
}

// listenFDs reads LISTEN_PID (this process), LISTEN_FDS (descriptors from
// 3) and LISTEN_FDNAMES; none passed gives an empty set. Every descriptor
// is made close-on-exec.
func listenFDs(getenv func(string) string) (*inheritedFDs, error) {
	in := &inheritedFDs{}
	if getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return in, nil
	}
	n, err := strconv.Atoi(getenv("LISTEN_FDS"))
	if err != nil || n <= 0 {
		return in, nil
	}
	if n > maxListenFDs {
		return nil, fmt.Errorf("%w: LISTEN_FDS = %d: more descriptors than the daemon ever stores (%d)", ErrConfig, n, maxListenFDs)
	}
	names := strings.Split(getenv("LISTEN_FDNAMES"), ":")
	for i := 0; i < n; i++ {
		fd := listenFDsStart + i
		syscall.CloseOnExec(fd)
		name := "unknown"
		if i < len(names) && names[i] != "" {
			name = names[i]
		}
		in.fds, in.names, in.taken = append(in.fds, fd), append(in.names, name), append(in.taken, false)
	}
	return in, nil
}

// take returns the first descriptor named name not taken yet.
func (in *inheritedFDs) take(name string) (int, bool) {
	for i, n := range in.names {
		if n == name && !in.taken[i] {
			in.taken[i] = true
			return in.fds[i], true
		}
	}
	return -1, false
}

// stored says whether name is one the daemon gives systemd's fd store.
func stored(name string) bool {
	return strings.HasPrefix(name, poolFDPrefix) || strings.HasPrefix(name, journalFDPrefix)
}

// closeRest closes the descriptors nobody took and returns the names of
// those that came from the fd store.
func (in *inheritedFDs) closeRest(log *slog.Logger) []string {
	var names []string
	for i, fd := range in.fds {
		if in.taken[i] {
			continue
		}
		in.taken[i] = true
		syscall.Close(fd)
		if stored(in.names[i]) {
			names = append(names, in.names[i])
		}
		log.Info("an inherited descriptor is not used: closed", "fd", fd, "name", in.names[i])
	}
	return names
}

// inheritedListener returns the control socket systemd passed by socket
// activation, or nil when none was passed: the descriptor named "control",
// else the first one that is not from the fd store or a hand-off. It must be a listening
// unix stream socket.
func inheritedListener(in *inheritedFDs) (*net.UnixListener, error) {
	fd, ok := in.take("control")
	for i, name := range in.names {
		// A hand-off passes no control socket: its descriptors are the
		// store's and the peer listener.
		if !ok && !in.taken[i] && !stored(name) && (i >= len(in.handed) || !in.handed[i]) {
			fd, ok = in.take(name)
		}
	}
	if !ok {
		return nil, nil
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
	return ul, nil
}
