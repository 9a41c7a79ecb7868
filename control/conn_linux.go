package control

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// recvState is one recvmsg(2): its arguments, kept in the connection so a
// read allocates nothing, and what it returned.
type recvState struct {
	msg     unix.Msghdr
	iov     unix.Iovec
	n, oobn int
	flags   int
	err     error
}

// recvmsg is one recvmsg(2) into rbuf[rend:] and oob, for RawConn.Read: it
// reports false on EAGAIN so the poller waits for readability. unix.Recvmsg
// would allocate its iovec and address per call; this reuses c.recv.
func (c *conn) recvmsg(fd uintptr) bool {
	r := &c.recv
	p := c.rbuf[c.rend:]
	r.iov.Base = &p[0]
	r.iov.SetLen(len(p))
	r.msg = unix.Msghdr{Iov: &r.iov, Control: &c.oob[0]}
	r.msg.SetIovlen(1)
	r.msg.SetControllen(len(c.oob))
	n, _, errno := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.msg)), unix.MSG_CMSG_CLOEXEC)
	if errno == unix.EAGAIN {
		return false
	}
	r.err = nil
	if errno != 0 {
		r.err = errno
		n = 0
	}
	r.n, r.oobn, r.flags = int(n), int(r.msg.Controllen), int(r.msg.Flags)
	return true
}

// peerCred is the connecting process's pid, uid and gid (SO_PEERCRED).
func peerCred(raw syscall.RawConn) (cred, error) {
	var c cred
	var cerr error
	err := raw.Control(func(fd uintptr) {
		var u *unix.Ucred
		if u, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); cerr == nil {
			c = cred{Pid: u.Pid, Uid: u.Uid, Gid: u.Gid}
		}
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return cred{}, os.NewSyscallError("getsockopt SO_PEERCRED", err)
	}
	return c, nil
}

// soPeerGroups is SO_PEERGROUPS (Linux 4.13): the supplementary groups of
// a unix socket's peer as they were when it connected. golang.org/x/sys
// does not name it; it is 59 on every architecture the project builds for.
const soPeerGroups = 59

// maxPeerGroups bounds the groups read for one peer (the kernel's
// NGROUPS_MAX is 65536; a peer in more than this many is refused).
const maxPeerGroups = 4096

// peerGroups is the connecting process's supplementary groups: taken by
// the kernel at connect (SO_PEERGROUPS), so they are the connecting
// process's whatever happened to it since. On kernels without the option
// they are read from /proc/PID/status (Groups:), for the pid SO_PEERCRED
// named, and only if that process still has the uid and gid it connected
// with; a process that is gone yields no groups (its primary gid still
// counts).
func peerGroups(raw syscall.RawConn, cr cred) ([]uint32, error) {
	var gs []uint32
	var gerr error
	err := raw.Control(func(fd uintptr) {
		buf := make([]uint32, 64)
		for {
			n := uint32(len(buf) * 4)
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, soPeerGroups,
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
			switch {
			case e == 0:
				gs = buf[:n/4]
				return
			case e == unix.ERANGE && len(buf) < maxPeerGroups:
				buf = make([]uint32, min(max(int(n/4), 2*len(buf)), maxPeerGroups))
			default:
				gerr = e
				return
			}
		}
	})
	if err == nil {
		err = gerr
	}
	switch {
	case err == nil:
		return gs, nil
	case errors.Is(err, unix.ENOPROTOOPT):
		return procGroups(cr)
	}
	return nil, os.NewSyscallError("getsockopt SO_PEERGROUPS", err)
}

// procGroups reads the Groups: line of /proc/PID/status for a peer whose
// kernel has no SO_PEERGROUPS, checking that the process there still has
// the peer's real uid and gid.
func procGroups(cr cred) ([]uint32, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(cr.Pid)) + "/status")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseStatusGroups(b, cr)
}

// parseStatusGroups reads the groups of a /proc/PID/status file, nil when
// its Uid: or Gid: line does not start with cr's uid and gid (another
// process has the pid now).
func parseStatusGroups(b []byte, cr cred) ([]uint32, error) {
	var gs []uint32
	same := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		switch k {
		case "Uid":
			if len(f) > 0 && f[0] == strconv.FormatUint(uint64(cr.Uid), 10) {
				same++
			}
		case "Gid":
			if len(f) > 0 && f[0] == strconv.FormatUint(uint64(cr.Gid), 10) {
				same++
			}
		case "Groups":
			if len(f) > maxPeerGroups {
				return nil, fmt.Errorf("%w: peer in %d groups (max %d)", ErrPermission, len(f), maxPeerGroups)
			}
			for _, x := range f {
				g, err := strconv.ParseUint(x, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("%w: /proc/%d/status Groups: %q", ErrMalformed, cr.Pid, x)
				}
				gs = append(gs, uint32(g))
			}
		}
	}
	if same != 2 {
		return nil, nil
	}
	return gs, nil
}

// peerGone reports whether the client has closed its end of the
// connection, without reading from it: POLLHUP, which a unix stream socket
// reports once both directions are shut. A client that shut only its
// writing side (SHUT_WR) still reads the answer and is not gone; nor is
// one whose socket the server closed (Control fails then).
func (c *conn) peerGone() bool {
	gone := false
	c.raw.Control(func(fd uintptr) { //nolint:errcheck // a closed socket is not a gone client: the server closes it
		p := [1]unix.PollFd{{Fd: int32(fd)}}
		n, err := unix.Poll(p[:], 0)
		gone = err == nil && n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
	})
	return gone
}
