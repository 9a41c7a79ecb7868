// Package etcdtest runs a real etcd for tests: Debian's etcd-server
// binary (scripts/deps.sh, group test), one member on loopback ports with
// its data in a temporary directory, stopped and restarted at will. The
// directory's tests, the daemon's and the churn harness share it.
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// Binary is where Debian's etcd-server installs etcd.
var Binary = "/usr/bin/etcd"

// Server is one etcd member run by a test.
type Server struct {
	t       testing.TB
	dataDir string
	client  string // http://127.0.0.1:port (https:// with TLS)
	peer    string
	tls     *TLSFiles
	opts    Options

	// mu guards the fields below.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  *syncBuffer
}

// syncBuffer is etcd's output, for the failure message.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		s.b.Reset()
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Start runs etcd until the test ends. It skips the test, saying what is
// missing, when the etcd binary is not installed (fails it where
// testutil.ProvidesEnv lists etcd).
func Start(t testing.TB) *Server { return start(t, false, Options{}) }

// StartTLS is Start with etcd serving https and asking for client
// certificates signed by a CA the test made (Server.TLS has the files).
func StartTLS(t testing.TB) *Server { return start(t, true, Options{}) }

// Options are settings of etcd beyond the tests' defaults.
type Options struct {
	// ProgressNotify is how often etcd sends a progress notification to
	// an idle watch that asked for them
	// (--experimental-watch-progress-notify-interval; 0: etcd's default,
	// 10 minutes).
	ProgressNotify time.Duration
}

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Server { return start(t, false, opts) }

func start(t testing.TB, withTLS bool, opts Options) *Server {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		testutil.Missing(t, testutil.Etcd, "etcd is not installed (%s: %v): apt-get install etcd-server, or scripts/deps.sh test", Binary, err)
	}
	s := &Server{t: t, dataDir: filepath.Join(dataRoot(t), "etcd"), opts: opts}
	scheme := "http"
	if withTLS {
		files, err := makeTLS(t.TempDir())
		if err != nil {
			t.Fatalf("etcd TLS files: %v", err)
		}
		s.tls, scheme = files, "https"
	}
	var err error
	for try := 0; try < 3; try++ {
		var cp, pp int
		if cp, pp, err = twoPorts(); err != nil {
			continue
		}
		s.client = fmt.Sprintf("%s://127.0.0.1:%d", scheme, cp)
		s.peer = fmt.Sprintf("http://127.0.0.1:%d", pp)
		if err = s.start(); err == nil {
			break
		}
		_ = os.RemoveAll(s.dataDir)
	}
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// dataRoot is where a test's etcd keeps its data: on tmpfs (/dev/shm)
// when the host has it, because etcd syncs every write and a disk shared
// with benchmarks can hold an fsync for seconds, which tests would read as
// an outage; else the test's temporary directory.
func dataRoot(t testing.TB) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "tensorcast-etcd-"); err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

// twoPorts picks two free loopback ports.
func twoPorts() (int, int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports [2]int
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports[0], ports[1], nil
}

// TLS is the CA, server and client files of a StartTLS server (nil for
// Start).
func (s *Server) TLS() *TLSFiles { return s.tls }

// Endpoint is the client URL.
func (s *Server) Endpoint() string { return s.client }

// Endpoints is the client URL as a list.
func (s *Server) Endpoints() []string { return []string{s.client} }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	out := &syncBuffer{}
	args := []string{
		"--name", "test",
		"--data-dir", s.dataDir,
		"--listen-client-urls", s.client,
		"--advertise-client-urls", s.client,
		"--listen-peer-urls", s.peer,
		"--initial-advertise-peer-urls", s.peer,
		"--initial-cluster", "test=" + s.peer,
		"--initial-cluster-state", "new",
		// Fast elections, so that a restarted member serves at once and
		// short leases (1s) are allowed.
		"--heartbeat-interval", "10",
		"--election-timeout", "100",
		"--logger", "zap", "--log-level", "warn",
	}
	if s.opts.ProgressNotify > 0 {
		args = append(args, "--experimental-watch-progress-notify-interval", s.opts.ProgressNotify.String())
	}
	if f := s.tls; f != nil {
		args = append(args, "--cert-file", f.ServerCert, "--key-file", f.ServerKey,
			"--trusted-ca-file", f.CA, "--client-cert-auth")
	}
	cmd := exec.Command(Binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH=")
	// The member dies with the test process. The kernel sends Pdeathsig
	// when the thread that forked the child exits, not the process; Go
	// ends threads (one a goroutine locked and left, as the uring pollers
	// do when a daemon stops), so etcd is started from a thread locked for
	// as long as etcd runs, or it could be killed mid-test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		if err := cmd.Wait(); err != nil {
			fmt.Fprintf(out, "etcdtest: etcd ended: %v\n", err)
		}
		close(done)
	}()
	if err := <-started; err != nil {
		return err
	}
	s.cmd, s.done, s.out = cmd, done, out
	if err := s.awaitHealthy(done, 15*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-done
		s.cmd = nil
		return fmt.Errorf("%v; its output:\n%s", err, out.String())
	}
	return nil
}

// awaitHealthy polls /health until etcd answers healthy, it exits, or the
// limit passes.
func (s *Server) awaitHealthy(done chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	c := http.Client{Timeout: time.Second}
	if s.tls != nil {
		tc, err := s.tls.clientConfig()
		if err != nil {
			return err
		}
		c.Transport = &http.Transport{TLSClientConfig: tc}
	}
	for {
		select {
		case <-done:
			return errors.New("etcd exited during start-up")
		default:
		}
		resp, err := c.Get(s.client + "/health")
		if err == nil {
			var b [256]byte
			n, _ := resp.Body.Read(b[:])
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b[:n]), `"true"`) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after %v (last: %v)", limit, err)
		}
		// Polling an external process with a deadline: there is no event
		// to wait for.
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-done:
			t.Stop()
		}
	}
}

// Stop ends etcd (SIGTERM, then SIGKILL after 5s); a no-op when it is
// not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Restart starts etcd again on the same ports and data: what was stored
// before Stop is there (leases are renewed for their TTL, as after any
// leader change).
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("etcd restart: %v", err)
	}
}

// Running reports whether etcd runs.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Output is what etcd printed (for failure messages).
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// WaitFor polls cond until it holds or limit passes, and reports which.
// Tests use it for conditions that an outside process (etcd's lease
// expiry) makes true, where there is no event to wait on.
func WaitFor(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return true
}
