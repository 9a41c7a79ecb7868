package daemon

import (
	"net"
	"os"
	"strconv"
	"sync"
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
	return time.Duration(usec) * time.Microsecond / 2
}
