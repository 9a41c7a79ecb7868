package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/fdstore"
)

// daemon is one tensorcastd process of the soak, and how to start it again
// after it was killed.
type daemon struct {
	name    string // "a" or "b": also its daemon_id
	bin     string
	dir     string
	socket  string
	config  string
	metrics string         // host:port of its /metrics
	netns   string         // network namespace it runs in ("" = the soak's)
	logf    *os.File       // its stderr, appended over restarts
	fds     *fdstore.Store // systemd's fd store played for it (hitless restarts), or nil

	// mu guards the fields below.
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	stopped bool          // SIGSTOPped now
}

// network is how the two daemons reach each other: a veth pair into a
// network namespace for b when the soak may make one (the link-cut fault
// needs it), else loopback.
type network struct {
	ns       string // b's namespace, "" without one
	hostVeth string
	addrA    string
	addrB    string
	why      string // why there is no namespace
}

const (
	vethAddrA = "10.233.91.1"
	vethAddrB = "10.233.91.2"
)

func setupNetwork() (*network, error) {
	n := &network{addrA: "127.0.0.1", addrB: "127.0.0.1"}
	if os.Geteuid() != 0 {
		n.why = "not root: no network namespace, so no link cut"
		return n, nil
	}
	if _, err := exec.LookPath("ip"); err != nil {
		n.why = "no ip command (iproute2): no network namespace, so no link cut"
		return n, nil
	}
	id := os.Getpid() % 100000
	n.ns = fmt.Sprintf("tcsoak%d", id)
	n.hostVeth = fmt.Sprintf("tcsa%d", id)
	peerVeth := fmt.Sprintf("tcsb%d", id)
	steps := [][]string{
		{"ip", "netns", "add", n.ns},
		{"ip", "link", "add", n.hostVeth, "type", "veth", "peer", "name", peerVeth, "netns", n.ns},
		{"ip", "addr", "add", vethAddrA + "/24", "dev", n.hostVeth},
		{"ip", "-n", n.ns, "addr", "add", vethAddrB + "/24", "dev", peerVeth},
		{"ip", "link", "set", n.hostVeth, "up"},
		{"ip", "-n", n.ns, "link", "set", peerVeth, "up"},
		{"ip", "-n", n.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			n.teardown()
			return nil, fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	n.addrA, n.addrB = vethAddrA, vethAddrB
	return n, nil
}

func (n *network) teardown() {
	if n.ns != "" {
		// Deleting the namespace deletes its veth end, and so the pair.
		_ = exec.Command("ip", "netns", "del", n.ns).Run()
	}
}

// link sets the host's end of the veth pair up or down.
func (n *network) link(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	if out, err := exec.Command("ip", "link", "set", n.hostVeth, state).CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set %s %s: %v: %s", n.hostVeth, state, err, out)
	}
	return nil
}

// newDaemon writes a daemon's config; start runs it.
func newDaemon(name, bin, work, key string, listen, peerName, peerAddr, metrics, netns string, extra, tables []string) (*daemon, error) {
	dir := filepath.Join(work, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d := &daemon{name: name, bin: bin, dir: dir, socket: filepath.Join(dir, "tc.sock"),
		config: filepath.Join(dir, "tensorcastd.toml"), metrics: metrics, netns: netns}
	conf := []string{
		fmt.Sprintf("socket = %q", d.socket),
		fmt.Sprintf("data_dir = %q", filepath.Join(dir, "data")),
		`pool_size = "64MiB"`,
		`hugepages = "off"`,
		fmt.Sprintf("daemon_id = %q", name),
		fmt.Sprintf("peer_listen = %q", listen),
		fmt.Sprintf("cluster_key_file = %q", key),
		`rdma = "off"`,
		`ebpf = "off"`,
		`drain_timeout = "3s"`,
		fmt.Sprintf("metrics_address = %q", metrics),
		`log_format = "text"`,
		"[[peers]]",
		fmt.Sprintf("id = %q", peerName),
		fmt.Sprintf("addr = %q", peerAddr),
	}
	// Top-level keys must come before the [[peers]] table, other tables
	// after it.
	conf = append(append(extra, conf...), tables...)
	if err := os.WriteFile(d.config, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	d.logf = f
	return d, nil
}

// start runs the daemon and waits until its socket answers.
func (d *daemon) start() error {
	var cmd *exec.Cmd
	var ready <-chan struct{}
	switch {
	case d.fds != nil:
		// As systemd starts a unit with a file descriptor store: what it
		// holds from fd 3 on, LISTEN_PID the daemon's own (the shell execs
		// it).
		var files []*os.File
		var env []string
		ready = d.fds.NextReady()
		d.fds.Start(func(kept []*os.File, names []string) error {
			files, env = kept, d.fds.Env(kept, names)
			return nil
		})
		cmd = exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, d.bin, "--config", d.config)
		cmd.ExtraFiles = files
		for _, e := range os.Environ() {
			if !strings.HasPrefix(e, "LISTEN_") && !strings.HasPrefix(e, "NOTIFY_SOCKET=") && !strings.HasPrefix(e, "FDSTORE=") {
				cmd.Env = append(cmd.Env, e)
			}
		}
		cmd.Env = append(cmd.Env, env...)
	case d.netns != "":
		cmd = exec.Command("ip", "netns", "exec", d.netns, d.bin, "--config", d.config)
	default:
		cmd = exec.Command(d.bin, "--config", d.config)
	}
	cmd.Stderr = d.logf
	cmd.Stdout = d.logf
	fmt.Fprintf(d.logf, "--- tcsoak: starting %s at %s\n", d.name, time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	d.mu.Lock()
	d.cmd, d.exited, d.stopped = cmd, exited, false
	d.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	if ready != nil {
		// READY=1 comes after the daemon handed its pools and journals to
		// the store.
		select {
		case <-ready:
		case <-exited:
			return fmt.Errorf("daemon %s exited during start-up (see %s)", d.name, d.logf.Name())
		case <-time.After(30 * time.Second):
			return fmt.Errorf("daemon %s sent no READY=1 in 30s", d.name)
		}
	}
	for {
		c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-probe", NoPool: true, DialTimeout: time.Second, CallTimeout: 5 * time.Second})
		if err == nil {
			err = c.Ping(nil)
			c.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("daemon %s exited during start-up (see %s)", d.name, d.logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon %s not serving after 30s: %v", d.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pid is the daemon's pid (ip netns exec execs it, so the command's pid is
// the daemon's).
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

func (d *daemon) signal(sig syscall.Signal) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil || d.cmd.Process == nil {
		return errors.New("not running")
	}
	switch sig {
	case syscall.SIGSTOP:
		d.stopped = true
	case syscall.SIGCONT:
		d.stopped = false
	}
	return d.cmd.Process.Signal(sig)
}

// kill SIGKILLs the daemon and waits until it is gone.
func (d *daemon) kill() {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// stop SIGTERMs the daemon and waits (bounded) for it to exit; it reports
// how long the exit took.
func (d *daemon) stop(limit time.Duration) (time.Duration, error) {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	if cmd == nil {
		return 0, nil
	}
	start := time.Now()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return time.Since(start), nil
	case <-time.After(limit):
		d.kill()
		return time.Since(start), fmt.Errorf("daemon %s did not exit within %v of SIGTERM", d.name, limit)
	}
}

// usage is what a leak check compares: the process's and the daemon's own
// counts.
type usage struct {
	FDs         int    `json:"fds"`
	RSSKiB      uint64 `json:"rss_kib"`
	Goroutines  int    `json:"goroutines"`
	PoolBlocks  uint64 `json:"pool_blocks"`
	PoolUsed    uint64 `json:"pool_used_bytes"`
	Waiting     uint64 `json:"tasks_waiting"`
	Pending     uint64 `json:"tasks_pending"`
	Batches     uint64 `json:"batches_live"`
	Segments    uint64 `json:"segments_registered"`
	Connections int    `json:"connections"`    // besides the probe's own
	StorePins   int    `json:"store_pins"`     // pins and leases, all tenants
	StoreRsv    int    `json:"store_reserved"` // reservations and puts in flight
	StoreL1     uint64 `json:"store_l1_bytes"` // pool bytes the store's values hold (at block size)
}

// measure reads the daemon's usage from /proc, its stats and its metrics.
func (d *daemon) measure() (usage, error) {
	var u usage
	pid := d.pid()
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return u, err
	}
	u.FDs = len(ents)
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					u.RSSKiB, _ = strconv.ParseUint(f[0], 10, 64)
				}
			}
		}
	}
	c, err := client.Dial(d.socket, client.Options{Name: "tcsoak-measure", NoPool: true, CallTimeout: 10 * time.Second})
	if err != nil {
		return u, err
	}
	st, err := c.Stats()
	c.Close()
	if err != nil {
		return u, err
	}
	u.Connections = st.Connections - 1
	for _, x := range st.Pool {
		switch x.Name {
		case "blocks":
			u.PoolBlocks += x.Value
		case "used":
			u.PoolUsed += x.Value
		}
	}
	for _, x := range st.Engine {
		switch x.Name {
		case "waiting":
			u.Waiting = x.Value
		case "pending":
			u.Pending = x.Value
		case "batches_live":
			u.Batches = x.Value
		case "segments_registered":
			u.Segments = x.Value
		}
	}
	if u.Goroutines, err = scrapeGauge(d.metrics, "go_goroutines"); err != nil {
		return u, err
	}
	if u.StorePins, err = scrapeGauge(d.metrics, "tensorcast_store_pins"); err != nil {
		return u, err
	}
	if u.StoreRsv, err = scrapeGauge(d.metrics, "tensorcast_store_reserved"); err != nil {
		return u, err
	}
	l1, err := scrapeGauge(d.metrics, `tensorcast_store_tier_bytes`, `tier="l1"`)
	u.StoreL1 = uint64(l1)
	return u, err
}

// clientPool is the pool bytes held for clients: what the store's values
// hold stays after the clients leave, and is not a leak.
func (u usage) clientPool() uint64 {
	if u.PoolUsed < u.StoreL1 {
		return 0
	}
	return u.PoolUsed - u.StoreL1
}

// scrapeGauge reads a gauge from the daemon's metrics, summing its series
// (one per tenant); with labels given, only series whose labels contain
// each of them.
func scrapeGauge(addr, name string, labels ...string) (int, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	// A gauge with labels (one series per tenant) is summed.
	sum, found := 0.0, false
	for sc.Scan() {
		l := sc.Text()
		rest, ok := strings.CutPrefix(l, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if rest[0] == '{' {
			i := strings.IndexByte(rest, '}')
			if i < 0 {
				continue
			}
			if !containsAll(rest[:i], labels) {
				continue
			}
			rest = rest[i+1:]
		} else if len(labels) > 0 {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return 0, fmt.Errorf("%s in %s/metrics: %w", name, addr, err)
		}
		sum, found = sum+f, true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("no %s in %s/metrics", name, addr)
	}
	return int(sum), nil
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// freePort returns a TCP port free on host now.
func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
