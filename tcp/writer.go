package tcp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Writing requests on a connection this node dialed. A frame goes to the
// socket straight from the submitting goroutine when nothing waits ahead
// of it and it is small (at most directWriteMax bytes): no wake-up, no
// hand-off. Any other frame, and the rest of a direct write the socket did
// not take whole, waits in the connection's queue for its writer, a
// goroutine of the connection that writes the queue in order and, when the
// socket is full, waits in poll(2) for room. Large frames are not written
// by the submitter because the copy into the kernel is most of what a
// transfer costs: one submitter writing every connection of a peer does
// that copy on one CPU, while each connection's writer runs on whichever
// CPU is free. Nothing is copied in user space on the way.
//
// The writer owns wfd, a duplicate of the connection's socket that it alone
// closes, when it ends; so no write can reach a descriptor number gnet has
// closed and the kernel handed out again. The connection's OnClose stops
// it: it sets fdClosed and shuts the socket down under wmu (waking a
// writer waiting for room), then takes wlock, which the writer holds
// across each write, so that once OnClose fails the connection's requests
// no write touches their memory any more.
//
// Lock order: wlock before wmu.

// directWriteMax is the largest frame the submitting goroutine writes
// itself: a payload of 64 KiB with its header and token.
const directWriteMax = 64<<10 + 4<<10

// wlist is a FIFO of frames waiting for a connection's writer, linked
// through pending.wnext.
type wlist struct{ head, tail *pending }

func (l *wlist) push(pd *pending) {
	pd.wnext = nil
	if l.tail != nil {
		l.tail.wnext = pd
	} else {
		l.head = pd
	}
	l.tail = pd
}

func (l *wlist) pop() *pending {
	pd := l.head
	l.head = pd.wnext
	if l.head == nil {
		l.tail = nil
	}
	pd.wnext = nil
	return pd
}

// writerFD returns a close-on-exec duplicate of nc's socket for the
// connection's writer.
func writerFD(nc net.Conn) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("%T has no descriptor", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		if fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0); derr != nil {
			derr = os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", derr)
		}
	}); err != nil {
		return -1, err
	}
	return fd, derr
}

// closeWriterFD closes wfd of a connection whose writer never started.
func (c *conn) closeWriterFD() {
	c.wmu.Lock()
	_ = unix.Close(c.wfd)
	c.wfd = -1
	c.wmu.Unlock()
}

// iovLen is the byte count of bufs.
func iovLen(bufs [][]byte) int {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	return total
}

// writev writes bufs to fd once, retrying on EINTR.
func writev(fd int, bufs [][]byte) (int, error) {
	for {
		n, err := unix.Writev(fd, bufs)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// send writes pd's frame (pd.bufs[:nb]) on a client connection: itself
// when the frame is small and nothing waits, otherwise through the
// connection's writer, keeping frames in order. The write reference of pd
// is dropped once the frame is in the kernel, or once it is known it never
// will be (the connection closed: its close ends the request).
func (c *conn) send(pd *pending, nb int) {
	pd.iov = pd.bufs[:nb]
	c.wmu.Lock()
	if c.fdClosed {
		c.wmu.Unlock()
		pd.release()
		return
	}
	if c.wq.head == nil && iovLen(pd.iov) <= directWriteMax {
		// wfd is open: the writer closes it only after fdClosed is set,
		// and wmu is held.
		n, err := writev(c.wfd, pd.iov)
		if err == nil && n == iovLen(pd.iov) {
			c.wmu.Unlock()
			pd.release()
			return
		}
		if err != nil && err != unix.EAGAIN {
			c.wmu.Unlock()
			// The connection is broken; its close ends the request.
			c.n.log.Debug("peer connection write failed", "peer", c.peer.id, "err", err)
			_ = c.g.Close()
			pd.release()
			return
		}
		if n > 0 {
			pd.iov = trimIovec(pd.iov, n)
		}
	}
	c.wq.push(pd)
	c.wmu.Unlock()
	c.kickWriter()
}

func (c *conn) kickWriter() {
	select {
	case c.wkick <- struct{}{}:
	default:
	}
}

// stopWriter is OnClose's part (see above): no frame is written after it
// returns. It runs on the event loop, before gnet closes the connection's
// own descriptor.
func (c *conn) stopWriter() {
	c.wmu.Lock()
	c.fdClosed = true
	if c.wfd >= 0 {
		_ = unix.Shutdown(c.wfd, unix.SHUT_RDWR)
	}
	c.wmu.Unlock()
	c.kickWriter()
	// Wait out a write in progress (the writer holds wlock across each);
	// it is non-blocking and ends soon. Later ones see fdClosed.
	c.wlock.Lock()
	//lint:ignore SA2001 the empty critical section is the wait
	c.wlock.Unlock()
}

// writer writes the connection's queue until the connection closes; then
// it drops the queued frames (their requests fail with the close) and
// closes wfd. One per dialed connection, counted by Node.writerWG.
func (c *conn) writer() {
	defer c.n.writerWG.Done()
	for {
		c.wmu.Lock()
		for c.wq.head == nil && !c.fdClosed {
			c.wmu.Unlock()
			<-c.wkick
			c.wmu.Lock()
		}
		if c.fdClosed {
			var left wlist
			left, c.wq = c.wq, wlist{}
			c.wmu.Unlock()
			for left.head != nil {
				left.pop().release()
			}
			_ = unix.Close(c.wfd)
			return
		}
		pd := c.wq.head
		c.wmu.Unlock()
		err := c.writeOut(pd)
		c.wmu.Lock()
		c.wq.pop() // pd: only the writer takes frames out while the connection is open
		c.wmu.Unlock()
		pd.release()
		if err != nil && !errors.Is(err, errWriterStopped) {
			c.n.log.Debug("peer connection write failed", "peer", c.peer.id, "err", err)
			_ = c.g.Close()
		}
	}
}

// errWriterStopped: the connection closed while its writer had frames.
var errWriterStopped = fmt.Errorf("%w: connection closed", ErrConnLost)

// writeOut writes the rest of pd's frame, waiting for room in the socket
// as long as it takes; it fails when the connection closes or breaks.
func (c *conn) writeOut(pd *pending) error {
	for len(pd.iov) > 0 {
		c.wlock.Lock()
		c.wmu.Lock()
		closed := c.fdClosed
		c.wmu.Unlock()
		if closed {
			c.wlock.Unlock()
			return errWriterStopped
		}
		n, err := writev(c.wfd, pd.iov)
		c.wlock.Unlock()
		if n > 0 {
			pd.iov = trimIovec(pd.iov, n)
		}
		switch err {
		case nil:
		case unix.EAGAIN:
			// Wait for room. Shutting the socket down (stopWriter) ends
			// the wait; the next write then fails or sees fdClosed.
			pfd := []unix.PollFd{{Fd: int32(c.wfd), Events: unix.POLLOUT}}
			for {
				if _, err := unix.Poll(pfd, -1); err != unix.EINTR {
					break
				}
			}
		default:
			return os.NewSyscallError("writev", err)
		}
	}
	return nil
}

// trimIovec drops the first n bytes of bufs, in place.
func trimIovec(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}
