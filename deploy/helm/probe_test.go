package helm

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// lockedBuffer is the daemon's log, written by its process and read by the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// build builds the command at pkg (relative to the repository's root) into
// dir.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	if b, err := exec.Command("go", "build", "-o", out, "../../"+pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// probe runs p's command as the kubelet does, with the probe's timeout,
// the image's tcctl being tcctl and the chart's socket path sock.
func probe(t *testing.T, p *corev1.Probe, chartSock, tcctl, sock string) error {
	t.Helper()
	return probeVia(t, p, chartSock, tcctl, sock)
}

// probeVia is probe with the command run under prefix (a command and its
// arguments that run the rest).
func probeVia(t *testing.T, p *corev1.Probe, chartSock, tcctl, sock string, prefix ...string) error {
	t.Helper()
	if p == nil || p.Exec == nil || len(p.Exec.Command) == 0 || p.Exec.Command[0] != "tcctl" {
		t.Fatalf("probe %+v is not a tcctl command", p)
	}
	args := make([]string, 0, len(p.Exec.Command)-1)
	for _, a := range p.Exec.Command[1:] {
		args = append(args, strings.ReplaceAll(a, chartSock, sock))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(p.TimeoutSeconds)*time.Second)
	defer cancel()
	argv := append(append(prefix, tcctl), args...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return &probeError{err: err, out: string(out)}
	}
	return nil
}

type probeError struct {
	err error
	out string
}

func (e *probeError) Error() string { return e.err.Error() + ": " + e.out }

// startDaemon runs daemonBin through /bin/sh -c script (which execs it)
// on a socket of its own, with more args, until the test ends; it returns
// once the daemon is ready, with the socket and the daemon's log.
func startDaemon(t *testing.T, script, daemonBin string, args ...string) (string, *lockedBuffer) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "tc.sock")
	log := &lockedBuffer{}
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, daemonBin,
		"--socket", sock, "--data-dir", filepath.Join(dir, "data"), "--pool-size", "16MiB",
		"--ebpf", "off", "--metrics-address", "off", "--drain-timeout", "2s"}, args...)...)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", log)
		}
	})
	testutil.Eventually(t, 20*time.Second, func() bool { return strings.Contains(log.String(), "tensorcastd ready") },
		"the daemon's ready line:\n%s", log)
	return sock, log
}

// TestChartProbesFollowHealth: the readiness and liveness probes the chart
// renders, run as the kubelet runs them against a real tensorcastd, pass
// while it serves, fail while accepting on the control socket has failed
// for longer than accept_stall_timeout (which is what makes the daemon
// unhealthy: out of descriptors here, under RLIMIT_NOFILE 96 with 150
// connections it cannot all accept), and pass again once it accepts.
func TestChartProbesFollowHealth(t *testing.T) {
	r := render(t)
	c := r.container(t)
	chartSock, _ := r.config["socket"].(string)

	bin := t.TempDir()
	daemonBin := build(t, bin, "cmd/tensorcastd")
	tcctl := build(t, bin, "cmd/tcctl")
	sock, log := startDaemon(t, `ulimit -n 96 && exec "$0" "$@"`, daemonBin,
		"--max-conns", "1024", "--max-conns-per-uid", "1024", "--accept-stall-timeout", "300ms")

	probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
	for name, p := range probes {
		if err := probe(t, p, chartSock, tcctl, sock); err != nil {
			t.Fatalf("%s probe against a serving daemon: %v", name, err)
		}
	}

	conns := make([]*net.UnixConn, 0, 150)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 150 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(log.String(), "too many open files") },
		"the daemon failing to accept:\n%s", log)
	// Past accept_stall_timeout (300ms) the daemon is unhealthy; the
	// probes run longer than that (their timeout).
	for name, p := range probes {
		if err := probe(t, p, chartSock, tcctl, sock); err == nil {
			t.Errorf("%s probe passed while the daemon could not accept", name)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(log.String(), "accepting again") },
		"the daemon accepting again:\n%s", log)
	for name, p := range probes {
		if err := probe(t, p, chartSock, tcctl, sock); err != nil {
			t.Errorf("%s probe after the daemon accepts again: %v", name, err)
		}
	}
}

// TestChartStartupProbeOwnDaemon: the hand-off's startup probe passes only
// for a daemon of the probe's own pid namespace. Run as the kubelet runs
// it, in the daemon's namespace it passes; run in a pid namespace of its
// own (unshare, as the new pod's probe is beside the old pod's daemon) it
// fails, while the readiness probe, which asks whoever answers, passes.
func TestChartStartupProbeOwnDaemon(t *testing.T) {
	r := render(t, handoffOptions)
	c := r.container(t)
	chartSock, _ := r.config["socket"].(string)
	bin := t.TempDir()
	daemonBin := build(t, bin, "cmd/tensorcastd")
	tcctl := build(t, bin, "cmd/tcctl")
	sock, _ := startDaemon(t, `exec "$0" "$@"`, daemonBin)

	if err := probe(t, c.StartupProbe, chartSock, tcctl, sock); err != nil {
		t.Fatalf("startup probe in the daemon's pid namespace: %v", err)
	}
	testutil.Require(t, testutil.Root)
	unshare := []string{"unshare", "--pid", "--fork"}
	if _, err := exec.LookPath("unshare"); err != nil {
		testutil.Missing(t, testutil.Root, "no unshare (util-linux) to run the probe in a pid namespace of its own")
	}
	err := probeVia(t, c.StartupProbe, chartSock, tcctl, sock, unshare...)
	if err == nil || !strings.Contains(err.Error(), "another pid namespace") {
		t.Errorf("startup probe in another pid namespace: %v, want it to fail naming the other pid namespace", err)
	}
	if err := probeVia(t, c.ReadinessProbe, chartSock, tcctl, sock, unshare...); err != nil {
		t.Errorf("readiness probe in another pid namespace: %v (the namespace is not what failed the startup probe)", err)
	}
}
