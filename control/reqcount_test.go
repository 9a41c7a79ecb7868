package control

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// TestRequestCounts: every decoded request is counted once under its kind,
// refused ones included.
func TestRequestCounts(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	for range 3 {
		expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	}
	expectCode(t, c.call(&wire.StatsRequest{}), tcproto.CodeOK)
	expectCode(t, c.call(&wire.FreeBatchRequest{Batch: 12345}), tcproto.CodeNOT_FOUND)
	got := map[string]uint64{}
	for _, rc := range e.srv.RequestCounts(nil) {
		got[rc.Kind] = rc.Count
	}
	want := map[string]uint64{"PingRequest": 3, "StatsRequest": 1, "FreeBatchRequest": 1}
	if len(got) != len(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("counts %v, want %v", got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { e.srv.reqs.count(tcproto.RequestBodyPingRequest) }); n != 0 {
		t.Fatalf("counting a request allocates %v times", n)
	}
}

// TestServeInheritedListener: a server given a listening socket serves on
// it and, closing, leaves the socket file to its owner (systemd).
func TestServeInheritedListener(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "inherited.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.Listener = ln })
	if _, err := os.Stat(e.sock); err == nil {
		t.Fatalf("server created %s although it was given a listener", e.sock)
	}
	c := dialRaw(t, path)
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	c.uc.Close()
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("closing removed the inherited socket's file: %v", err)
	}
}
