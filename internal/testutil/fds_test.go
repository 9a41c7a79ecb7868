//go:build linux

package testutil

import (
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
