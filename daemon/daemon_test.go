package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m, testutil.Child(helperEnv, runHelper)) }

// testConfig is a small daemon under dir.
func testConfig(dir string) Config {
	c := Defaults()
	c.Socket = filepath.Join(dir, "tc.sock")
	c.DataDir = filepath.Join(dir, "data")
	c.PoolSize = 16 << 20
	c.DrainTimeout = Duration(2 * time.Second)
	// Tests run daemons side by side: each binds a free port.
	c.MetricsAddress = "127.0.0.1:0"
	// A scrape sees what the test did just before it.
	c.MetricsSnapshotInterval = Duration(time.Millisecond)
	// Loading eBPF programs is what TestKernelViews tests; the rest run
	// without.
	c.EBPF = "off"
	return c
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestRunNotifiesAndDrains starts a daemon under a fake systemd, checks
// READY comes only once the socket accepts, then cancels it and checks
// STOPPING, a prompt clean exit, and that no descriptor is left open.
func TestRunNotifiesAndDrains(t *testing.T) {
	dir := t.TempDir()
	notifyPath, next := fakeSystemd(t)
	before := openFDs(t)

	getenv := env(map[string]string{"NOTIFY_SOCKET": notifyPath, "WATCHDOG_USEC": "100000"})
	d, err := New(testConfig(dir), discardLogger(), getenv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	if msg := next(); !strings.HasPrefix(msg, "READY=1") {
		t.Fatalf("first notify = %q, want READY=1", msg)
	}
	c, err := net.Dial("unix", filepath.Join(dir, "tc.sock"))
	if err != nil {
		t.Fatalf("socket not accepting after READY: %v", err)
	}
	c.Close()
	if msg := next(); msg != "WATCHDOG=1" {
		t.Fatalf("notify = %q, want WATCHDOG=1 within the watchdog period", msg)
	}

	cancel()
	var stopping bool
	for !stopping {
		switch msg := next(); msg {
		case "STOPPING=1":
			stopping = true
		case "WATCHDOG=1":
		default:
			t.Fatalf("unexpected notify %q", msg)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if _, err := os.Stat(filepath.Join(dir, "tc.sock")); err == nil {
		if c, err := net.Dial("unix", filepath.Join(dir, "tc.sock")); err == nil {
			c.Close()
			t.Fatal("socket still accepting after shutdown")
		}
	}
	if after := openFDs(t); after > before {
		t.Fatalf("descriptors leaked: %d before, %d after", before, after)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	c := testConfig(t.TempDir())
	c.PoolSize = 1
	if _, err := New(c, discardLogger(), env(nil)); err == nil || !strings.Contains(err.Error(), "pool_size") {
		t.Fatalf("New accepted a 1-byte pool: %v", err)
	}
	// A socket path that cannot be created fails start-up and leaves nothing open.
	before := openFDs(t)
	c = testConfig(t.TempDir())
	c.Socket = "/proc/tensorcast/tc.sock"
	if _, err := New(c, discardLogger(), env(nil)); err == nil {
		t.Fatal("New accepted a socket under /proc")
	}
	if after := openFDs(t); after > before {
		t.Fatalf("failed start-up leaked descriptors: %d before, %d after", before, after)
	}
}
