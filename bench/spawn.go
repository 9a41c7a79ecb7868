package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Daemon is a private tensorcastd started by --spawn. Its process is waited
// for by one goroutine started in SpawnDaemon; Stop signals it and collects
// that wait.
type Daemon struct {
	Socket string
	Dir    string
	Args   []string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
	log    *slog.Logger
	logf   *os.File
}

// FindDaemonBin locates tensorcastd: the explicit path, else next to the
// running executable, else on PATH.
func FindDaemonBin(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("%w: --daemon-bin: %w", ErrDaemon, err)
		}
		return explicit, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "tensorcastd")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath("tensorcastd")
	if err != nil {
		return "", fmt.Errorf("%w: tensorcastd not found next to tcbench nor on PATH (build it with `make build`, or give --daemon-bin)", ErrDaemon)
	}
	return p, nil
}

// SpawnDaemon starts bin with a socket and data directory in a new
// temporary directory and waits until the socket accepts connections.
// allowedFiles are the directories file segments may be opened in (written
// to the daemon's config as allowed_files).
func SpawnDaemon(bin string, poolSize uint64, allowedFiles []string, log *slog.Logger) (*Daemon, error) {
	return spawnDaemon(bin, poolSize, allowedFiles, nil, log)
}

// spawnDaemon is SpawnDaemon with extra daemon flags.
func spawnDaemon(bin string, poolSize uint64, allowedFiles, extra []string, log *slog.Logger) (*Daemon, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := os.MkdirTemp("", "tcbench-daemon-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDaemon, err)
	}
	d := &Daemon{Socket: filepath.Join(dir, "s.sock"), Dir: dir, log: log, exited: make(chan error, 1)}
	// Spawned daemons run side by side: none binds the default metrics port.
	d.Args = []string{"--socket", d.Socket, "--data-dir", filepath.Join(dir, "data"), "--pool-size", sizeArg(poolSize),
		"--metrics-address", "off"}
	d.Args = append(d.Args, extra...)
	if len(allowedFiles) > 0 {
		cfg := filepath.Join(dir, "tensorcastd.toml")
		body := "allowed_files = ["
		for i, p := range allowedFiles {
			if i > 0 {
				body += ", "
			}
			body += strconv.Quote(p)
		}
		body += "]\n"
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("%w: %w", ErrDaemon, err)
		}
		d.Args = append([]string{"--config", cfg}, d.Args...)
	}
	d.logf, err = os.Create(filepath.Join(dir, "daemon.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: %w", ErrDaemon, err)
	}
	d.cmd = exec.Command(bin, d.Args...)
	d.cmd.Stdout, d.cmd.Stderr = d.logf, d.logf
	d.cmd.Env = append(os.Environ(), "TENSORCAST_SOCKET="+d.Socket)
	if err := d.cmd.Start(); err != nil {
		d.logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w: start %s: %w", ErrDaemon, bin, err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	log.Info("spawned tensorcastd", "bin", bin, "pid", d.cmd.Process.Pid, "socket", d.Socket)
	wait := readyWait(poolSize)
	deadline := time.Now().Add(wait)
	for {
		select {
		case err := <-d.exited:
			d.exited <- err
			tail := d.logTail()
			d.cleanup()
			return nil, fmt.Errorf("%w: tensorcastd exited during start-up (%v): %s\n--- its log ---\n%s", ErrDaemon, err, lastLine(tail), tail)
		default:
		}
		if c, err := net.Dial("unix", d.Socket); err == nil {
			c.Close()
			return d, nil
		}
		if time.Now().After(deadline) {
			err := d.Stop()
			return nil, fmt.Errorf("%w: tensorcastd socket %s not ready after %v (stop: %v)", ErrDaemon, d.Socket, wait, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readyWait is how long a spawned daemon may take to open its socket: 20 s,
// and 20 s more per GiB of pool. Before it listens the daemon registers
// the pool with io_uring, which faults in and pins every page of it; on a
// virtual machine whose host backs guest memory on first touch that ran at
// 70 MB/s (a 4 GiB pool took 61 s).
func readyWait(poolSize uint64) time.Duration {
	return 20*time.Second + time.Duration(poolSize>>20)*20*time.Second/1024
}

func (d *Daemon) logTail() string {
	b, err := os.ReadFile(d.logf.Name())
	if err != nil {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}

func (d *Daemon) cleanup() {
	d.logf.Close()
	os.RemoveAll(d.Dir)
}

// Stop sends SIGTERM, waits up to 20 s for a clean exit (then kills), and
// reports a non-zero exit as an error naming the daemon's last log lines.
func (d *Daemon) Stop() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		d.log.Warn("signal tensorcastd", "err", err)
	}
	var err error
	select {
	case err = <-d.exited:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		err = fmt.Errorf("did not stop within 20s of SIGTERM; killed")
	}
	if err != nil {
		err = fmt.Errorf("%w: tensorcastd: %w: %s", ErrDaemon, err, d.logTail())
	}
	d.cleanup()
	return err
}

// SpawnCheck says whether --spawn can serve jobs: one private daemon serves
// local, uring and store jobs; tcp and rdma jobs share one pair of
// connected daemons (SpawnPeers), so a run holds tcp or rdma jobs, not
// both, and their targets name one peer.
func SpawnCheck(jobs []*Job) error {
	var engine, peer string
	for _, j := range jobs {
		if !isPeerEngine(j.Engine) {
			continue
		}
		if engine != "" && j.Engine != engine {
			return fmt.Errorf("%w: job %s: engine %s and engine %s need differently configured daemons; run them separately", ErrBadValue, j.Name, j.Engine, engine)
		}
		engine = j.Engine
		if j.Target == "" {
			continue
		}
		p, _, _ := strings.Cut(j.Target, "/")
		if peer != "" && p != peer {
			return fmt.Errorf("%w: job %s: target %s names peer %s; the spawned target daemon is %s", ErrBadValue, j.Name, j.Target, p, peer)
		}
		peer = p
	}
	return nil
}

// PoolSizeFor sizes a spawned daemon's pool for the largest group: every
// clone's buffers, and its region where the region lives in the pool (not
// for uring, whose region is the file), plus 64 MiB, rounded up to 2 MiB.
// A pool is pinned whole at the daemon's start, so one sized for a uring
// job's file cost that start 15 s per GiB on a host that backs memory on
// first touch, for nothing the job used.
func PoolSizeFor(jobs []*Job) uint64 {
	per := map[int]uint64{}
	var most uint64
	for _, j := range jobs {
		region := j.Size
		if j.Engine == "uring" {
			region = 0
		}
		per[j.Group] += uint64(j.NumJobs) * (region + uint64(j.IODepth)*j.BSMax)
		most = max(most, per[j.Group])
	}
	const align = 2 << 20
	return (most + 64<<20 + align - 1) / align * align
}

// sizeArg renders a byte count with the largest exact binary suffix, the
// form tensorcastd's --pool-size documents.
func sizeArg(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatUint(n>>30, 10) + "GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatUint(n>>20, 10) + "MiB"
	}
	return strconv.FormatUint(n, 10)
}

// AllowedDirs are the directories of the jobs' files, absolute, once each:
// what a spawned daemon must allow file segments in.
func AllowedDirs(jobs []*Job) []string {
	var dirs []string
	seen := map[string]bool{}
	for _, j := range jobs {
		if j.Filename == "" {
			continue
		}
		p, err := filepath.Abs(j.Filename)
		if err != nil {
			continue
		}
		dir := filepath.Dir(p)
		if !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// lastLine is the last non-empty line of s: a daemon's start-up error.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
