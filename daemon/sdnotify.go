package daemon

import (
	"math"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Notifier speaks systemd's notify protocol on $NOTIFY_SOCKET. With no
// socket configured (not started by systemd) every call is a no-op.
//
// It keeps one datagram socket connected to systemd's, opened on first use
// and opened again after a failed send, so that a daemon out of file
// descriptors can still say so (STATUS) and keep its keep-alives going
// while it can serve.
type Notifier struct {
	addr *net.UnixAddr

	// mu guards conn.
	mu   sync.Mutex
	conn *net.UnixConn
}

// NewNotifier reads NOTIFY_SOCKET through getenv. An abstract socket is
// written with a leading '@'.
func NewNotifier(getenv func(string) string) *Notifier {
	path := getenv("NOTIFY_SOCKET")
	if path == "" {
		return &Notifier{}
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	}
	return &Notifier{addr: &net.UnixAddr{Name: path, Net: "unixgram"}}
}

// Notify sends one state string ("READY=1", "STOPPING=1", "WATCHDOG=1",
// "STATUS=..."). A send failure is returned; callers log it.
func (n *Notifier) Notify(state string) error {
	if n.addr == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		c, err := net.DialUnix("unixgram", nil, n.addr)
		if err != nil {
			return err
		}
		n.conn = c
	}
	if _, err := n.conn.Write([]byte(state)); err != nil {
		n.conn.Close()
		n.conn = nil
		return err
	}
	return nil
}

// Close closes the notify socket; a later Notify opens it again.
func (n *Notifier) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}

// WatchdogInterval is how often to send WATCHDOG=1: half of WATCHDOG_USEC,
// and zero when the watchdog is off or meant for another process
// (WATCHDOG_PID set to a pid that is not ours).
func WatchdogInterval(getenv func(string) string) time.Duration {
	usec, err := strconv.ParseUint(getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || usec == 0 {
		return 0
	}
	if p := getenv("WATCHDOG_PID"); p != "" && p != strconv.Itoa(os.Getpid()) {
		return 0
	}
	// A value past what a Duration holds (about 292 years; systemd's
	// "infinity" is not sent) would overflow to a negative interval and
	// turn the keep-alives off: such a watchdog gets the longest.
	return time.Duration(min(usec, uint64(math.MaxInt64/int64(time.Microsecond)))) * time.Microsecond / 2
}

// NotifyFDs sends state with fds attached (SCM_RIGHTS): "FDSTORE=1" and
// "FDNAME=..." hand them to systemd's file descriptor store. It uses a
// socket of its own for the one message (a connected datagram socket
// cannot carry ancillary data in Go). Without a notify socket it is a
// no-op.
func (n *Notifier) NotifyFDs(state string, fds ...int) error {
	if n.addr == nil {
		return nil
	}
	s, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer syscall.Close(s)
	name := n.addr.Name
	if name[0] == 0 {
		name = "@" + name[1:]
	}
	if err := syscall.Sendmsg(s, []byte(state), syscall.UnixRights(fds...), &syscall.SockaddrUnix{Name: name}, 0); err != nil {
		return os.NewSyscallError("sendmsg", err)
	}
	return nil
}

// Enabled says whether a notify socket is configured (started by systemd).
func (n *Notifier) Enabled() bool { return n.addr != nil }

// Extension is an Extend under way.
type Extension struct {
	done  chan struct{} // closed by Stop
	ended chan struct{} // closed when nothing more is sent
	once  sync.Once
}

// Stop ends the extension and returns once nothing more is sent. It is
// idempotent.
func (e *Extension) Stop() {
	e.once.Do(func() { close(e.done) })
	<-e.ended
}

// Ended is closed once nothing more is sent: after Stop, or at the limit.
func (e *Extension) Ended() <-chan struct{} { return e.ended }

// Extend keeps systemd's start-up timeout (TimeoutStartSec) from ending a
// step that is slow but progressing, such as pinning a large pool: until
// Stop, every `every` it sends EXTEND_TIMEOUT_USEC of three times every,
// with STATUS=status, for at most limit in all (a step shorter than every
// sends nothing). Past limit it sends nothing more, so that once the last
// extension runs out systemd's own timeout catches a step that hangs. A
// failed send goes to logf. Without a notify socket nothing is sent.
func (n *Notifier) Extend(status string, every, limit time.Duration, logf func(error)) *Extension {
	e := &Extension{done: make(chan struct{}), ended: make(chan struct{})}
	if n.addr == nil {
		close(e.ended)
		return e
	}
	msg := "EXTEND_TIMEOUT_USEC=" + strconv.FormatInt((3*every).Microseconds(), 10) + "\nSTATUS=" + status
	go func() {
		defer close(e.ended)
		t := time.NewTicker(every)
		defer t.Stop()
		end := time.NewTimer(limit)
		defer end.Stop()
		for {
			select {
			case <-e.done:
				return
			case <-end.C:
				return
			case <-t.C:
			}
			if err := n.Notify(msg); err != nil {
				logf(err)
			}
		}
	}()
	return e
}
