//go:build linux

package testutil

import (
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLeakedAndHandles: a descriptor opened after the baseline is listed
// as leaked (a memfd also as a handle) until it is closed.
func TestLeakedAndHandles(t *testing.T) {
	WarmFDs()
	before, err := OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	if l := before.Leaked(now(t)); len(l) != 0 {
		t.Fatalf("leaks against a fresh baseline: %v", l)
	}
	fd, err := unix.MemfdCreate("testutil-probe", 0)
	if err != nil {
		t.Fatal(err)
	}
	leaked := before.Leaked(now(t))
	if len(leaked) != 1 || !strings.Contains(leaked[0], "memfd:testutil-probe") {
		t.Fatalf("leaked = %v, want the probe memfd", leaked)
	}
	hs, err := HandleFDs()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, h := range hs {
		found = found || strings.Contains(h, "memfd:testutil-probe")
	}
	if !found {
		t.Fatalf("handles %v miss the probe memfd", hs)
	}
	f := os.NewFile(uintptr(fd), "probe")
	f.Close()
	if l := before.Leaked(now(t)); len(l) != 0 {
		t.Fatalf("leaks after closing the probe: %v", l)
	}
}

func now(t *testing.T) FDs {
	t.Helper()
	fds, err := OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	return fds
}

// TestLeakedSocketDescribed: a leaked tcp listener is reported with its
// address and state, a unix socket pair with its kind.
func TestLeakedSocketDescribed(t *testing.T) {
	WarmFDs()
	before := now(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	leaked := strings.Join(before.Leaked(now(t)), "\n")
	want := "(tcp " + ln.Addr().String() + " -> 0.0.0.0:0 LISTEN)"
	if !strings.Contains(leaked, want) || strings.Count(leaked, "(unix type 0001") != 2 {
		t.Fatalf("leak report:\n%s\nwants %q and two unix stream sockets", leaked, want)
	}
}
