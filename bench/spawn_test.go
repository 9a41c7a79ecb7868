package bench

import (
	"errors"
	"flag"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
)

// fakeDaemon stands in for tensorcastd when the test binary runs itself with
// TCBENCH_FAKE_DAEMON set: "ok" serves the socket until SIGTERM and exits 0,
// "fail-start" exits 3 at once, "fail-stop" exits 4 on SIGTERM.
func fakeDaemon(mode string, args []string) int {
	fs := flag.NewFlagSet("fake", flag.ContinueOnError)
	sock := fs.String("socket", "", "")
	fs.String("data-dir", "", "")
	fs.String("config", "", "")
	fs.String("metrics-address", "", "")
	pool := fs.String("pool-size", "", "")
	if err := fs.Parse(args); err != nil || *sock == "" || *pool == "" {
		return 2
	}
	if mode == "fail-start" {
		os.Stderr.WriteString("fake: cannot start\n")
		return 3
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	l, err := net.Listen("unix", *sock)
	if err != nil {
		return 5
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	<-sig
	l.Close()
	if mode == "fail-stop" {
		return 4
	}
	return 0
}

func TestSpawnDaemon(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TCBENCH_FAKE_DAEMON", "ok")
	d, err := SpawnDaemon(self, 64<<20, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(d.Args, "--pool-size") || !contains(d.Args, "64MiB") {
		t.Errorf("daemon args %q", d.Args)
	}
	c, err := net.Dial("unix", d.Socket)
	if err != nil {
		t.Fatalf("socket not served: %v", err)
	}
	c.Close()
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(d.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("daemon dir left behind: %v", err)
	}

	t.Setenv("TCBENCH_FAKE_DAEMON", "fail-start")
	if _, err := SpawnDaemon(self, 64<<20, nil, nil); !errors.Is(err, ErrDaemon) || !strings.Contains(err.Error(), "cannot start") {
		t.Errorf("failed start: %v", err)
	}

	t.Setenv("TCBENCH_FAKE_DAEMON", "fail-stop")
	d, err = SpawnDaemon(self, 64<<20, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); !errors.Is(err, ErrDaemon) || !strings.Contains(err.Error(), "exit status 4") {
		t.Errorf("unclean stop: %v", err)
	}
}

func TestFindDaemonBinAndSpawnCheck(t *testing.T) {
	if _, err := FindDaemonBin("/nonexistent/tensorcastd"); !errors.Is(err, ErrDaemon) {
		t.Errorf("missing explicit binary: %v", err)
	}
	jobs := mustJobs(t, "--size=100m", "--name=a", "--numjobs=2", "--name=b", "--stonewall")
	if got := PoolSizeFor(jobs); got < 200<<20+64<<20 || got%(2<<20) != 0 {
		t.Errorf("pool size %d for 2×100 MiB", got)
	}
	// A uring job's region is its file: the pool holds its buffers only.
	jobs = mustJobs(t, "--engine=uring", "--filename=/var/tmp/x.dat", "--size=1g", "--bs=4k", "--iodepth=32", "--numjobs=4", "--name=r")
	if got := PoolSizeFor(jobs); got < 4*32*4<<10 || got > 128<<20 || got%(2<<20) != 0 {
		t.Errorf("pool size %d for 4 uring jobs of 32 × 4 KiB buffers over a 1 GiB file", got)
	}
}
