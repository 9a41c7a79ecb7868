package daemon

import (
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// fakeSystemd listens where NOTIFY_SOCKET points and collects datagrams.
func fakeSystemd(t *testing.T) (string, func() string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	next := func() string {
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no notify message: %v", err)
		}
		return string(buf[:n])
	}
	return p, next
}

func TestNotifierSendsStates(t *testing.T) {
	p, next := fakeSystemd(t)
	n := NewNotifier(env(map[string]string{"NOTIFY_SOCKET": p}))
	t.Cleanup(func() { n.Close() })
	for _, s := range []string{"READY=1", "WATCHDOG=1", "STOPPING=1"} {
		if err := n.Notify(s); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != s {
			t.Fatalf("got %q, want %q", got, s)
		}
	}
}

func TestNotifierOffWithoutSocket(t *testing.T) {
	n := NewNotifier(env(nil))
	if n.addr != nil {
		t.Fatalf("a notify socket %v without NOTIFY_SOCKET", n.addr)
	}
	if err := n.Notify("READY=1"); err != nil {
		t.Fatal(err)
	}
	if n.conn != nil {
		t.Fatal("Notify without NOTIFY_SOCKET opened a socket")
	}
	// A socket that does not exist is an error the caller can log.
	n = NewNotifier(env(map[string]string{"NOTIFY_SOCKET": filepath.Join(t.TempDir(), "absent")}))
	if err := n.Notify("READY=1"); err == nil {
		t.Fatal("no error for a missing notify socket")
	}
}

func TestWatchdogInterval(t *testing.T) {
	me := strconv.Itoa(os.Getpid())
	cases := []struct {
		env  map[string]string
		want time.Duration
	}{
		{nil, 0},
		{map[string]string{"WATCHDOG_USEC": "0"}, 0},
		{map[string]string{"WATCHDOG_USEC": "junk"}, 0},
		{map[string]string{"WATCHDOG_USEC": "20000000"}, 10 * time.Second},
		{map[string]string{"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": me}, 10 * time.Second},
		{map[string]string{"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, 0},
		// Past a Duration's range: the longest, never negative (off).
		{map[string]string{"WATCHDOG_USEC": "9223372036854775807"}, time.Duration(math.MaxInt64/int64(time.Microsecond)) * time.Microsecond / 2},
	}
	for _, c := range cases {
		if got := WatchdogInterval(env(c.env)); got != c.want {
			t.Errorf("WatchdogInterval(%v) = %v, want %v", c.env, got, c.want)
		}
	}
}

// Extend sends EXTEND_TIMEOUT_USEC with its status every period; it stops sending when stopped, and by itself at its limit, so
// that systemd's own timeout catches a step that hangs.
func TestNotifierExtend(t *testing.T) {
	p, next := fakeSystemd(t)
	n := NewNotifier(env(map[string]string{"NOTIFY_SOCKET": p}))
	t.Cleanup(func() { n.Close() })
	want := "EXTEND_TIMEOUT_USEC=30000\nSTATUS=pinning the pool"
	fail := func(err error) { t.Errorf("send: %v", err) }

	e := n.Extend("pinning the pool", 10*time.Millisecond, time.Hour, fail)
	for range 3 {
		if got := next(); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	e.Stop()
	e.Stop() // idempotent
	if err := n.Notify("MARK"); err != nil {
		t.Fatal(err)
	}
	for got := next(); got != "MARK"; got = next() {
		if got != want {
			t.Fatalf("got %q, want %q or MARK", got, want)
		}
	}

	// At its limit it ends by itself, unstopped; it ends before its
	// first period here, so it sent nothing.
	e = n.Extend("pinning the pool", time.Hour, time.Millisecond, fail)
	select {
	case <-e.Ended():
	case <-time.After(10 * time.Second):
		t.Fatal("the extension did not end at its limit")
	}
	if err := n.Notify("MARK"); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != "MARK" {
		t.Fatalf("got %q, want MARK: a step shorter than the period sends nothing", got)
	}

	off := NewNotifier(env(nil))
	off.Extend("x", time.Millisecond, time.Hour, fail).Stop() // no socket: nothing to stop
}
