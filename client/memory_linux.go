package client

import "golang.org/x/sys/unix"

// sharedMemory says this OS has what the pool mapping and client buffers
// need: memfds, their seals, and mmap of them shared with the daemon.
const sharedMemory = true

// peerGone reports whether the daemon closed its end of the connection
// (it died, or dropped this client), by polling the socket for a hang-up
// without reading from it.
func (c *Client) peerGone() bool {
	raw, err := c.uc.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	cerr := raw.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(p, 0)
		gone = err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return gone || cerr != nil
}
