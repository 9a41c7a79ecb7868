package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type router struct{ tr xfer.Transport }

func (r router) Route(_, _ xfer.Segment) (xfer.Transport, error) { return r.tr, nil }

func startDaemon(t *testing.T) string {
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
	eng := xfer.NewEngine(xfer.Config{}, router{tr}, log)
	sock := filepath.Join(dir, "d.sock")
	srv, err := control.NewServer(control.Config{Socket: sock, DaemonID: "host-a", Version: "0.1"},
		control.Deps{Engine: eng, Pool: pool, Registry: reg}, log)
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

func tcctl(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	sock := startDaemon(t)
	code, out, errs := tcctl(t, nil, "--socket", sock, "info")
	if code != 0 || !strings.Contains(out, "daemon id:        host-a") || !strings.Contains(out, "pool:             segment 1, 8MiB") {
		t.Fatalf("info: %d %q %q", code, out, errs)
	}
	code, out, errs = tcctl(t, map[string]string{"TENSORCAST_SOCKET": sock}, "stats")
	if code != 0 || !strings.Contains(out, "connections 1") || !strings.Contains(out, "pool.size 8388608") ||
		!strings.Contains(out, "engine.batches_live 0") {
		t.Fatalf("stats: %d %q %q", code, out, errs)
	}
	code, out, errs = tcctl(t, nil, "--socket", sock, "ping", "-n", "50", "-size", "64")
	if code != 0 || !strings.Contains(out, "50 round trips to host-a") || !strings.Contains(out, "p99") {
		t.Fatalf("ping: %d %q %q", code, out, errs)
	}
	code, out, _ = tcctl(t, nil, "--socket", sock, "ping")
	if code != 0 || !strings.HasPrefix(out, "pong from host-a") {
		t.Fatalf("single ping: %d %q", code, out)
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
