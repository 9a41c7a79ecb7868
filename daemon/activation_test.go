//go:build linux

package daemon

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// activated is how a tensorcastd started by startActivated ended.
type activated struct {
	log   string
	err   error // its exit, when it exited
	ready bool  // it said it is ready (then it was killed)
}

// startActivated runs the tensorcastd binary as systemd runs it with a
// socket unit (TestSocketActivationUnderFakeSystemd): files from fd 3 on,
// LISTEN_FDS (count, or len(files) when 0), LISTEN_FDNAMES and LISTEN_PID
// its own. It returns once the daemon exited, or said it is ready (then it
// is killed).
func startActivated(t *testing.T, dir string, files []*os.File, count int, fdnames string) activated {
	t.Helper()
	bin := buildDaemon(t)
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin,
		"--socket", filepath.Join(dir, "configured.sock"), "--data-dir", filepath.Join(dir, "data"), "--pool-size", "16MiB",
		"--hugepages", "off", "--metrics-address", "off", "--ebpf", "off", "--drain-timeout", "2s")
	cmd.ExtraFiles = files
	if count == 0 {
		count = len(files)
	}
	cmd.Env = append(os.Environ(), "LISTEN_FDS="+strconv.Itoa(count), "LISTEN_FDNAMES="+fdnames)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got activated
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		got.log += lines.Text() + "\n"
		if strings.Contains(lines.Text(), "tensorcastd ready") {
			got.ready = true
			cmd.Process.Kill()
			break
		}
	}
	got.err = cmd.Wait()
	return got
}

// TestActivationRefusesWrongControlFD: a descriptor passed as the control
// socket that is not a listening unix stream socket fails the start at
// once, with an error naming the descriptor and what it is, before the
// daemon takes the socket's lock (so before it would ask a running daemon
// to hand over). It never serves, or says it is ready, on what it cannot
// accept on.
func TestActivationRefusesWrongControlFD(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T, dir string) *os.File
		want string
	}{
		{"datagram socket", func(t *testing.T, dir string) *os.File {
			c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "dgram.sock"), Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			return fileOf(t, c)
		}, "is a datagram socket (AF_UNIX)"},
		{"seqpacket listener", func(t *testing.T, dir string) *os.File {
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "seq.sock"), Net: "unixpacket"})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			return fileOf(t, ln)
		}, "is a seqpacket socket (AF_UNIX)"},
		{"bound, not listening", func(t *testing.T, dir string) *os.File {
			fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(dir, "bound.sock")}); err != nil {
				syscall.Close(fd)
				t.Fatal(err)
			}
			return os.NewFile(uintptr(fd), "bound")
		}, "is a stream socket (AF_UNIX) that does not listen"},
		{"socketpair", func(t *testing.T, dir string) *os.File {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			syscall.Close(fds[1])
			return os.NewFile(uintptr(fds[0]), "pair")
		}, "is a stream socket (AF_UNIX) that does not listen"},
		{"tcp listener", func(t *testing.T, dir string) *os.File {
			ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			return fileOf(t, ln)
		}, "is a stream socket (AF_INET)"},
		{"regular file", func(t *testing.T, dir string) *os.File {
			f, err := os.Create(filepath.Join(dir, "file"))
			if err != nil {
				t.Fatal(err)
			}
			return f
		}, "is a regular file (DIR/file)"},
		{"pipe", func(t *testing.T, dir string) *os.File {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			return r
		}, "is a pipe (pipe:["},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			f := tc.open(t, dir)
			got := startActivated(t, dir, []*os.File{f}, 0, "control")
			f.Close()
			if got.ready {
				t.Fatalf("the daemon started on %s as its control socket:\n%s", tc.name, got.log)
			}
			var exit *exec.ExitError
			if !errors.As(got.err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want a failed start (1):\n%s", got.err, got.log)
			}
			want := strings.ReplaceAll(tc.want, "DIR", dir)
			for _, w := range []string{"fd 3", "control", want, "not a listening unix stream socket"} {
				if !strings.Contains(got.log, w) {
					t.Errorf("the start-up error does not say %s:\n%s", w, got.log)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "configured.sock.lock")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the socket's lock was taken before the control socket was checked: %v", err)
			}
		})
	}
}

// TestActivationRefusesUnpassedFDs: LISTEN_FDS counting more descriptors
// than were passed fails the start, naming the first that was not. Such a
// number is either not open or one this process opened itself (the Go
// runtime keeps cgroup files open from fd 4 on): taken for a passed one, it
// would be closed as unused under the part that opened it.
func TestActivationRefusesUnpassedFDs(t *testing.T) {
	for _, count := range []int{2, 3, 40} {
		t.Run(strconv.Itoa(count), func(t *testing.T) {
			dir := t.TempDir()
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "ctl.sock"), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			f := fileOf(t, ln)
			ln.Close()
			got := startActivated(t, dir, []*os.File{f}, count, "control")
			f.Close()
			if got.ready {
				t.Fatalf("the daemon started with LISTEN_FDS = %d and one descriptor passed:\n%s", count, got.log)
			}
			var exit *exec.ExitError
			if !errors.As(got.err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("exit %v, want a failed start (1):\n%s", got.err, got.log)
			}
			for _, w := range []string{"LISTEN_FDS = " + strconv.Itoa(count), "but fd 4 ", "was not passed"} {
				if !strings.Contains(got.log, w) {
					t.Errorf("the start-up error does not say %q:\n%s", w, got.log)
				}
			}
		})
	}
}

// fileOf is a duplicate of a socket's descriptor.
func fileOf(t *testing.T, c interface{ File() (*os.File, error) }) *os.File {
	t.Helper()
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestActivationRefusesBadCount: with LISTEN_PID naming this process, a
// LISTEN_FDS that is not a count of descriptors fails the start, naming
// the value; none set, or zero, is a start without inherited descriptors.
func TestActivationRefusesBadCount(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, v := range []string{"x", "-1", "1.5", " 1", "0x1"} {
		env := map[string]string{"LISTEN_PID": pid, "LISTEN_FDS": v}
		_, err := listenFDs(func(k string) string { return env[k] })
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), strconv.Quote(v)) {
			t.Errorf("LISTEN_FDS = %q: %v, want ErrConfig naming the value", v, err)
		}
	}
	for _, v := range []string{"", "0"} {
		env := map[string]string{"LISTEN_PID": pid, "LISTEN_FDS": v}
		in, err := listenFDs(func(k string) string { return env[k] })
		if err != nil || len(in.fds) != 0 {
			t.Errorf("LISTEN_FDS = %q: %d descriptors, %v; want none and no error", v, len(in.fds), err)
		}
	}
}
