package control

import (
	"os"
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
