package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
// 3) and LISTEN_FDNAMES; none passed gives an empty set. LISTEN_FDS
// counting a descriptor that was not passed fails the start; every one
// passed is made close-on-exec. The control socket among them is checked here,
// before the daemon takes the socket's lock or a hand-off: one that is not
// a listening unix stream socket fails the start, saying what it is.
func listenFDs(getenv func(string) string) (*inheritedFDs, error) {
	in := &inheritedFDs{}
	if getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return in, nil
	}
	// LISTEN_PID names this process, so whoever started it meant to pass
	// descriptors: a count that is not one fails the start rather than
	// leaving what was passed open and unused.
	v := getenv("LISTEN_FDS")
	if v == "" || v == "0" {
		return in, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("%w: LISTEN_FDS = %q with LISTEN_PID this process: not a count of descriptors", ErrConfig, v)
	}
	if n > maxListenFDs {
		return nil, fmt.Errorf("%w: LISTEN_FDS = %d: more descriptors than the daemon ever stores (%d)", ErrConfig, n, maxListenFDs)
	}
	names := strings.Split(getenv("LISTEN_FDNAMES"), ":")
	for i := 0; i < n; i++ {
		fd := listenFDsStart + i
		name := "unknown"
		if i < len(names) && names[i] != "" {
			name = names[i]
		}
		if err := passedAcrossExec(fd); err != nil {
			return nil, fmt.Errorf("%w: LISTEN_FDS = %d, but fd %d (LISTEN_FDNAMES %q) was not passed: %v", ErrConfig, n, fd, name, err)
		}
		syscall.CloseOnExec(fd)
		in.fds, in.names, in.taken = append(in.fds, fd), append(in.names, name), append(in.taken, false)
	}
	if i, ok := in.control(); ok {
		if what := notUnixListener(in.fds[i]); what != "" {
			return nil, fmt.Errorf("%w: the control socket passed by socket activation, fd %d (LISTEN_FDNAMES %q), is %s, not a listening unix stream socket",
				ErrConfig, in.fds[i], in.names[i], what)
		}
	}
	return in, nil
}

// passedAcrossExec is nil when fd is open with close-on-exec clear, as
// every descriptor passed across exec is until listenFDs sets it. One that
// is not open, or has it set (this process opened it: the Go runtime keeps
// its cgroup files open), is not one LISTEN_FDS may count: the daemon
// would take it for a passed one and close it when unused, under the part
// that opened it, or close the number once that part reused it.
func passedAcrossExec(fd int) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	switch {
	case err != nil:
		return os.NewSyscallError("fcntl F_GETFD", err)
	case flags&unix.FD_CLOEXEC != 0:
		what := "a descriptor"
		if target := fdTarget(fd); target != "" {
			what = target
		}
		return fmt.Errorf("it is %s, which this process opened (close-on-exec is set)", what)
	}
	return nil
}

// fdTarget is what fd refers to as /proc names it, "" when that cannot
// be read.
func fdTarget(fd int) string {
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return ""
	}
	return target
}

// control is the index of the control socket socket activation passed:
// the descriptor named "control", else the first that is neither from the
// fd store nor from a hand-off (which passes no control socket: its
// descriptors are the store's and the peer listener); false when none.
func (in *inheritedFDs) control() (int, bool) {
	first := -1
	for i, name := range in.names {
		switch {
		case in.taken[i]:
		case name == "control":
			return i, true
		case first < 0 && !stored(name) && (i >= len(in.handed) || !in.handed[i]):
			first = i
		}
	}
	return first, first >= 0
}

// notUnixListener says what fd is when it is not a listening unix stream
// socket, "" when it is.
func notUnixListener(fd int) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Sprintf("not usable (%v)", os.NewSyscallError("fstat", err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		what := fileKind(st.Mode)
		if target := fdTarget(fd); target != "" {
			what += " (" + target + ")"
		}
		return what
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Sprintf("a socket whose family cannot be read (%v)", os.NewSyscallError("getsockopt SO_DOMAIN", err))
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Sprintf("a socket whose type cannot be read (%v)", os.NewSyscallError("getsockopt SO_TYPE", err))
	}
	listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Sprintf("a socket whose state cannot be read (%v)", os.NewSyscallError("getsockopt SO_ACCEPTCONN", err))
	}
	what := fmt.Sprintf("a %s socket (%s)", socketTypes[typ], socketFamilies[domain])
	if socketTypes[typ] == "" || socketFamilies[domain] == "" {
		what = fmt.Sprintf("a socket of type %d, family %d", typ, domain)
	}
	switch {
	case domain != unix.AF_UNIX || typ != unix.SOCK_STREAM:
		return what
	case listening != 1:
		return what + " that does not listen (connected, or only bound)"
	}
	return ""
}

// socketTypes and socketFamilies name what notUnixListener may find.
var (
	socketTypes    = map[int]string{unix.SOCK_STREAM: "stream", unix.SOCK_DGRAM: "datagram", unix.SOCK_SEQPACKET: "seqpacket", unix.SOCK_RAW: "raw"}
	socketFamilies = map[int]string{unix.AF_UNIX: "AF_UNIX", unix.AF_INET: "AF_INET", unix.AF_INET6: "AF_INET6", unix.AF_NETLINK: "AF_NETLINK",
		unix.AF_PACKET: "AF_PACKET", unix.AF_VSOCK: "AF_VSOCK"}
)

// fileKind names a file's type from its mode.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a pipe"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("a file of type %#o", mode&unix.S_IFMT)
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
// activation (the one control picks, which listenFDs checked is a
// listening unix stream socket), or nil when none was passed.
func inheritedListener(in *inheritedFDs) (*net.UnixListener, error) {
	i, ok := in.control()
	if !ok {
		return nil, nil
	}
	in.taken[i] = true
	fd := in.fds[i]
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
