package daemon

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

var (
	daemonBinOnce sync.Once
	daemonBin     string
	daemonBinErr  error
)

// buildDaemon builds cmd/tensorcastd once per test run, into a directory
// any user may read (the capability test runs it as nobody).
func buildDaemon(t *testing.T) string {
	t.Helper()
	daemonBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tensorcastd-bin")
		if err != nil {
			daemonBinErr = err
			return
		}
		os.Chmod(dir, 0o755)
		daemonBin = filepath.Join(dir, "tensorcastd")
		out, err := exec.Command("go", "build", "-o", daemonBin, "../cmd/tensorcastd").CombinedOutput()
		if err != nil {
			daemonBinErr = err
			daemonBin = string(out)
		}
	})
	if daemonBinErr != nil {
		t.Fatalf("building tensorcastd: %v\n%s", daemonBinErr, daemonBin)
	}
	return daemonBin
}

// TestSocketActivationUnderFakeSystemd runs the tensorcastd binary the way
// systemd does with tensorcastd.socket: the listening socket as fd 3
// (LISTEN_FDS, LISTEN_PID of the daemon itself, LISTEN_FDNAMES), a notify
// socket and a watchdog. It must serve on the inherited socket without
// creating its configured one, say READY, WATCHDOG, then STOPPING on
// SIGTERM, exit 0, and leave the socket file to systemd.
func TestSocketActivationUnderFakeSystemd(t *testing.T) {
	bin := buildDaemon(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "activated.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	notifyPath, next := fakeSystemd(t)
	configured := filepath.Join(dir, "configured.sock")
	// systemd sets LISTEN_PID to the pid it execs; a shell that execs
	// the daemon keeps its pid.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin,
		"--socket", configured, "--data-dir", filepath.Join(dir, "data"), "--pool-size", "16MiB",
		"--metrics-address", "127.0.0.1:0", "--ebpf", "off", "--drain-timeout", "2s")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=control", "NOTIFY_SOCKET="+notifyPath, "WATCHDOG_USEC=200000")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", stderr.String())
		}
	}()

	if msg := next(); !strings.HasPrefix(msg, "READY=1") || !strings.Contains(msg, sock) {
		t.Fatalf("first notify %q, want READY=1 naming %s", msg, sock)
	}
	c, err := client.Dial(sock, client.Options{Name: "activation", NoPool: true})
	if err != nil {
		t.Fatalf("inherited socket not served: %v", err)
	}
	if err := c.Ping(nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := os.Stat(configured); err == nil {
		t.Fatalf("daemon created %s although it inherited a socket", configured)
	}
	if msg := next(); msg != "WATCHDOG=1" {
		t.Fatalf("notify %q, want WATCHDOG=1", msg)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for msg := next(); msg != "STOPPING=1"; msg = next() {
		if msg != "WATCHDOG=1" {
			t.Fatalf("unexpected notify %q before STOPPING=1", msg)
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("daemon exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not exit after SIGTERM")
	}
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the inherited socket's file is gone after exit: %v", err)
	}
	if !strings.Contains(stderr.String(), "socket activation") {
		t.Fatalf("log does not say the socket was inherited:\n%s", stderr.String())
	}
}

// TestEBPFWithoutCapability runs the daemon as an unprivileged user:
// with ebpf = auto it logs one line naming the missing capability and
// serves; with ebpf = on it refuses to start, naming it.
func TestEBPFWithoutCapability(t *testing.T) {
	testutil.Require(t, testutil.Root) // to run the daemon as another user
	bin := buildDaemon(t)
	dir, err := os.MkdirTemp("", "tc-nobody")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	// start runs the daemon as nobody; its log lines arrive on the channel,
	// which is closed when it exits.
	start := func(mode string) (*exec.Cmd, <-chan string) {
		sub := filepath.Join(dir, mode)
		os.Mkdir(sub, 0o777)
		os.Chmod(sub, 0o777)
		cmd := exec.Command(bin, "--socket", filepath.Join(sub, "s.sock"), "--data-dir", filepath.Join(sub, "data"),
			"--pool-size", "16MiB", "--metrics-address", "off", "--ebpf", mode)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		pipe, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 64)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		return cmd, lines
	}
	// until collects lines until one contains s (or the log ends).
	until := func(lines <-chan string, s string) (got []string, found bool) {
		timer := time.NewTimer(20 * time.Second)
		defer timer.Stop()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return got, false
				}
				got = append(got, l)
				if strings.Contains(l, s) {
					return got, true
				}
			case <-timer.C:
				return got, false
			}
		}
	}

	cmd, lines := start("on")
	log, _ := until(lines, "\x00never")
	err = cmd.Wait()
	all := strings.Join(log, "\n")
	if err == nil || !strings.Contains(all, "ebpf = on") || !strings.Contains(all, "CAP_BPF") {
		t.Fatalf("ebpf = on without the capability: exit %v, log:\n%s", err, all)
	}

	cmd, lines = start("auto")
	defer cmd.Process.Kill()
	log, ready := until(lines, "tensorcastd ready")
	if !ready {
		t.Fatalf("daemon without the capability did not get ready:\n%s", strings.Join(log, "\n"))
	}
	cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := until(lines, "\x00never")
	cmd.Wait()
	log = append(log, rest...)
	var ebpfLines []string
	for _, l := range log {
		if strings.Contains(l, "ebpf") {
			ebpfLines = append(ebpfLines, l)
		}
	}
	if len(ebpfLines) != 1 || !strings.Contains(ebpfLines[0], "CAP_BPF") || !strings.Contains(ebpfLines[0], "level=WARN") {
		t.Fatalf("want one warning naming CAP_BPF, got %q\nlog:\n%s", ebpfLines, strings.Join(log, "\n"))
	}
}

// unitDir copies the units to a directory with ExecStart pointing at a
// built binary (systemd-analyze verify checks that it exists).
func unitDir(t *testing.T, tool string) string {
	t.Helper()
	testutil.Command(t, tool, "systemd")
	bin := buildDaemon(t)
	dir := t.TempDir()
	for _, u := range []string{"tensorcastd.service", "tensorcastd.socket"} {
		b, err := os.ReadFile(filepath.Join("..", "deploy", u))
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/tensorcastd"), []byte(bin))
		if err := os.WriteFile(filepath.Join(dir, u), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestUnitsVerify(t *testing.T) {
	dir := unitDir(t, "systemd-analyze")
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", "tensorcastd.service", "tensorcastd.socket")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestUnitSecurityExposure keeps README's recorded `systemd-analyze
// security` exposure of the unit true.
func TestUnitSecurityExposure(t *testing.T) {
	dir := unitDir(t, "systemd-analyze")
	cmd := exec.Command("systemd-analyze", "security", "--offline=yes", "tensorcastd.service")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for tensorcastd.service: ([0-9.]+) (\w+)`).FindSubmatch(out)
	if m == nil {
		testutil.Missing(t, testutil.Tools, "systemd-analyze security --offline=yes not supported here: %v\n%s", err, out)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "exposure level " + string(m[1]) + " " + string(m[2])
	if !bytes.Contains(readme, []byte(want)) {
		t.Fatalf("README.md does not record the unit's %q (systemd-analyze security --offline=yes deploy/tensorcastd.service)", want)
	}
}
