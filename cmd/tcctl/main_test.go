package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func startDaemon(t *testing.T) string { return startDaemonWith(t, nil) }

// fakePlane is a peer plane with one peer whose segments open at once.
type fakePlane struct{}

type fakeRemote struct{ size uint64 }

func (r fakeRemote) ID() xfer.SegmentID { return 1 }
func (r fakeRemote) Kind() xfer.Kind    { return xfer.KindRemote }
func (r fakeRemote) Size() uint64       { return r.size }
func (r fakeRemote) Acquire() bool      { return true }
func (r fakeRemote) Release()           {}
func (r fakeRemote) Epoch() uint64      { return 0xabc }
func (r fakeRemote) Close() error       { return nil }

func (fakePlane) OpenRemote(_ control.OpenContext, peer, segment string, rights, transport uint8) (control.RemoteSegment, error) {
	return fakeRemote{size: 3 << 20}, nil
}
func (fakePlane) Code(error) (wire.Code, bool) { return 0, false }
func (fakePlane) Peers() []wire.PeerInfo {
	return []wire.PeerInfo{{ID: []byte("decode-1"), Addr: []byte("10.0.0.2:7400"), Epoch: 0xabc, Connected: true,
		BytesIn: 10, BytesOut: 20, Errors: 1}}
}

func startDaemonWith(t *testing.T, peers control.PeerPlane) string {
	t.Helper()
	return startDaemonDeps(t, func(d *control.Deps) { d.Peers = peers })
}

// startDaemonDeps runs a control server on a real pool and engine, with
// deps adjusting what else it serves from.
func startDaemonDeps(t *testing.T, deps func(*control.Deps)) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tcctl")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Size: 8 << 20, Hugepages: shm.HugepagesOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	reg := xfer.NewRegistry()
	reg.Add(pool)
	tr := xfer.NewLocal(xfer.LocalConfig{Workers: 1}, log)
	eng := xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), log)
	sock := filepath.Join(dir, "d.sock")
	d := control.Deps{Engine: eng, Pool: pool, Registry: reg}
	deps(&d)
	srv, err := control.NewServer(control.Config{Socket: sock, DaemonID: "host-a", Version: "0.1"}, d, log)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		eng.Close()
		tr.Close()
		pool.Close()
		os.RemoveAll(dir)
	})
	return sock
}

// startTensorcastd runs a tensorcastd (the daemon package, not a bare
// control server) until the test ends, on small defaults under a short
// temporary directory (a unix socket's path must be short), mut adjusting
// its config. It returns the daemon and the config it runs on.
func startTensorcastd(t *testing.T, mut func(*daemon.Config)) (*daemon.Daemon, daemon.Config) {
	t.Helper()
	dir, err := os.MkdirTemp("", "tcctl-d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := daemon.Defaults()
	cfg.Socket = filepath.Join(dir, "d.sock")
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.PoolSize = 16 << 20
	cfg.DrainTimeout = daemon.Duration(2 * time.Second)
	mut(&cfg)
	d, err := daemon.New(cfg, slog.New(slog.DiscardHandler), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "daemon "+cfg.DaemonID+" Run", d.Run)
	return d, cfg
}

func tcctl(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	sock := startDaemon(t)
	code, out, errs := tcctl(t, nil, "--socket", sock, "info")
	if code != 0 || !strings.Contains(out, "daemon id:        host-a") || !strings.Contains(out, "pool:             segment 1, 8MiB") ||
		!strings.Contains(out, "peer plane:       off") {
		t.Fatalf("info: %d %q %q", code, out, errs)
	}
	// The server counts info's connection until it has seen it close,
	// which may be just after this call: stats must come to count only
	// its own.
	testutil.Eventually(t, 5*time.Second, func() bool {
		code, out, errs = tcctl(t, map[string]string{"TENSORCAST_SOCKET": sock}, "stats")
		if code != 0 || !strings.Contains(out, "pool.size 8388608") || !strings.Contains(out, "engine.batches_live 0") {
			t.Fatalf("stats: %d %q %q", code, out, errs)
		}
		return strings.Contains(out, "connections 1\n")
	}, "stats counting only its own connection: %q", testutil.Lazy(func() string { return out }))
	code, out, errs = tcctl(t, nil, "--socket", sock, "ping", "-n", "50", "-size", "64")
	if code != 0 || !strings.Contains(out, "50 round trips to host-a") || !strings.Contains(out, "p99") {
		t.Fatalf("ping: %d %q %q", code, out, errs)
	}
	code, out, _ = tcctl(t, nil, "--socket", sock, "ping")
	if code != 0 || !strings.HasPrefix(out, "pong from host-a") {
		t.Fatalf("single ping: %d %q", code, out)
	}
	code, out, errs = tcctl(t, nil, "--socket", sock, "ping", "-n", "500", "--queue")
	if code != 0 || !strings.Contains(out, "500 round trips to host-a") || !strings.Contains(out, "through a queue") || !strings.Contains(out, "p50") {
		t.Fatalf("ping --queue: %d %q %q", code, out, errs)
	}
	if code, _, errs = tcctl(t, nil, "--socket", sock, "ping", "--queue", "-size", "8"); code != 2 {
		t.Fatalf("ping --queue -size: exit %d %q, want a usage error", code, errs)
	}
	// The daemon runs in this process: --own passes.
	if code, out, errs = tcctl(t, nil, "--socket", sock, "ping", "--own"); code != 0 || !strings.HasPrefix(out, "pong from host-a") {
		t.Fatalf("ping --own of a daemon in this pid namespace: %d %q %q", code, out, errs)
	}
}

// TestPingOwn: the daemon's pid as SO_PEERCRED gives it is this process's
// for a daemon of this pid namespace; 0, a daemon of another (another
// pod's on a shared socket directory), fails ping --own.
func TestPingOwn(t *testing.T) {
	sock := startDaemon(t)
	c, err := client.Dial(sock, client.Options{Name: "pid", NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if pid, err := c.DaemonPID(); err != nil || pid != os.Getpid() {
		t.Fatalf("DaemonPID %d, %v; the daemon is this process, %d", pid, err, os.Getpid())
	}
	if err := ownDaemon(0); err == nil || !strings.Contains(err.Error(), "another pid namespace") {
		t.Fatalf("ownDaemon(0): %v", err)
	}
	if err := ownDaemon(1); err != nil {
		t.Fatalf("ownDaemon(1): %v", err)
	}
}

func TestErrors(t *testing.T) {
	code, _, errs := tcctl(t, map[string]string{"TENSORCAST_SOCKET": "/nonexistent/x.sock"}, "info")
	if code != 1 || !strings.Contains(errs, "/nonexistent/x.sock") || !strings.Contains(errs, "is tensorcastd running?") {
		t.Fatalf("no daemon: %d %q", code, errs)
	}
	code, _, errs = tcctl(t, nil, "ping")
	if code != 1 || !strings.Contains(errs, "/run/tensorcast/tensorcastd.sock") && !strings.Contains(errs, "connect") {
		t.Fatalf("default socket: %d %q", code, errs)
	}
	if code, _, _ = tcctl(t, nil, "bogus"); code != 2 {
		t.Fatalf("unknown command exit %d", code)
	}
	if code, _, _ = tcctl(t, nil); code != 2 {
		t.Fatalf("no command exit %d", code)
	}
	sock := startDaemon(t)
	if code, _, errs = tcctl(t, nil, "--socket", sock, "ping", "-n", "0"); code != 2 {
		t.Fatalf("ping -n 0: %d %q", code, errs)
	}
}

func TestPeersAndSegments(t *testing.T) {
	sock := startDaemonWith(t, fakePlane{})
	c, err := client.Dial(sock, client.Options{Name: "exporter"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf, err := c.RegisterBuffer(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExportSegment("kvcache", buf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	rs, err := c.OpenRemote("decode-1/kvpool", client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := tcctl(t, nil, "--socket", sock, "peers")
	if code != 0 || !strings.Contains(out, "decode-1") || !strings.Contains(out, "10.0.0.2:7400") ||
		!strings.Contains(out, "0xabc") || !strings.Contains(out, "true") {
		t.Fatalf("peers: %d %q %q", code, out, errs)
	}
	code, out, errs = tcctl(t, nil, "--socket", sock, "segments")
	if code != 0 || !strings.Contains(out, "kvcache") || !strings.Contains(out, "2MiB") || !strings.Contains(out, "rw") ||
		strings.Contains(out, "kvpool") {
		t.Fatalf("segments: %d %q %q", code, out, errs)
	}
	code, out, errs = tcctl(t, nil, "--socket", sock, "segments", "--remote")
	if code != 0 || !strings.Contains(out, "decode-1") || !strings.Contains(out, "kvpool") || !strings.Contains(out, "3MiB") ||
		!strings.Contains(out, strconv.FormatUint(uint64(rs.ID), 10)) || strings.Contains(out, "kvcache") {
		t.Fatalf("segments --remote: %d %q %q", code, out, errs)
	}
	if code, _, _ = tcctl(t, nil, "--socket", sock, "segments", "extra"); code != 2 {
		t.Fatalf("segments with an argument: exit %d", code)
	}
	// Without a peer plane, peers says what to configure.
	plain := startDaemon(t)
	code, _, errs = tcctl(t, nil, "--socket", plain, "peers")
	if code != 1 || !strings.Contains(errs, "peer_listen") {
		t.Fatalf("peers without a peer plane: %d %q", code, errs)
	}
}
