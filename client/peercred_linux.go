package client

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DaemonPID is the process id of the daemon at the other end of the
// connection (SO_PEERCRED) as this process's pid namespace numbers it: 0
// when the daemon runs in a pid namespace this one does not see, such as
// another pod's that answers on a socket directory both pods mount.
func (c *Client) DaemonPID() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.uc == nil {
		return 0, fmt.Errorf("%w: not connected", ErrClosed)
	}
	raw, err := c.uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var u *unix.Ucred
	var uerr error
	if err := raw.Control(func(fd uintptr) { u, uerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if uerr != nil {
		return 0, os.NewSyscallError("getsockopt SO_PEERCRED", uerr)
	}
	return int(u.Pid), nil
}
