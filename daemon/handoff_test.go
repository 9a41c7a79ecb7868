package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/daemon/config"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// handoffProc is a tensorcastd process started with store_handoff = on.
type handoffProc struct {
	cmd    *exec.Cmd
	log    *lockedBuffer
	exited chan error
}

// startHandoffProc starts bin with args and waits for it to log that it
// is ready.
func startHandoffProc(t *testing.T, bin string, args ...string) *handoffProc {
	t.Helper()
	p := &handoffProc{cmd: exec.Command(bin, args...), log: &lockedBuffer{}, exited: make(chan error, 1)}
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-p.exited:
			p.exited <- err
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("daemon %d log:\n%s", p.cmd.Process.Pid, lastLines(p.log.String(), 40))
		}
	})
	testutil.Eventually(t, 60*time.Second, func() bool {
		select {
		case err := <-p.exited:
			p.exited <- err // for the clean-up, which must not wait for it again
			t.Fatalf("daemon exited before it was ready: %v\n%s", err, p.log.String())
		default:
		}
		return strings.Contains(p.log.String(), "tensorcastd ready")
	}, "daemon ready\n%s", p.log)
	return p
}

// alive says whether p has not exited.
func (p *handoffProc) alive() bool {
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// holds lists what p still maps or holds open of the pool, the L1 journal,
// the L2 file, the socket's lock (memfds and files under dir).
func (p *handoffProc) holds(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.Contains(line, "memfd:") || strings.Contains(line, dir) {
			out = append(out, "mapped: "+line)
		}
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && (strings.Contains(target, "memfd:") || strings.HasPrefix(target, dir)) {
			out = append(out, "open: "+target)
		}
	}
	return out
}

// TestHandoffBetweenDaemons runs the rolling update of a DaemonSet with
// maxSurge on one host: a daemon with 10,000 committed keys and a client
// putting keys all along, then a second daemon started beside it (same
// socket, same data_dir) that takes over, twice. After each hand-off
// every committed key is served byte-exact by the new daemon, nothing
// reserved and not committed is served, the load's acknowledged keys are
// there, a client that mapped the pool before reconnects by itself and
// keeps its mapping, and the old daemon, still running, maps and holds
// nothing of the pool, the journal, the L2 file or the lock (it can never
// write them again) and exits at SIGTERM.
func TestHandoffBetweenDaemons(t *testing.T) {
	bin := buildDaemon(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "tensorcastd.sock")
	args := []string{"--socket", sock, "--data-dir", filepath.Join(dir, "data"),
		"--pool-size", "256MiB", "--hugepages", "off", "--metrics-address", "127.0.0.1:0", "--ebpf", "off", "--drain-timeout", "2s",
		"--store-l2-size", "256MiB", "--store-l1-journal-records", "65536", "--store-handoff", "on"}
	d := startHandoffProc(t, bin, args...)
	if !strings.Contains(d.log.String(), "no daemon runs on the socket: starting cold") {
		t.Fatalf("the first daemon did not say it starts cold:\n%s", d.log.String())
	}

	old, err := client.Dial(sock, client.Options{Name: "old-mapping", Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldPool := old.PoolBytes()
	keys, committed := commitMany(t, old, 10000)

	// Reserved and written, never committed: never served after; and the
	// load, putting through every hand-off.
	halfKeys := halfWritten(t, sock)
	load := startPutLoad(sock)
	defer load.stop()

	acked := 0
	recovered := regexp.MustCompile(`L1 values kept across the restart.* recovered=(\d+)`)
	for round := 0; round < 2; round++ {
		load.waitAcked(t, acked+64, fmt.Sprintf("round %d", round))

		next := startHandoffProc(t, bin, args...)
		// Everything the load had acknowledged when the old daemon
		// stopped taking work is committed there.
		ackedKeys := load.acked()
		acked = len(ackedKeys)

		if !strings.Contains(d.log.String(), "hand-off: pools and L1 journals handed over") {
			t.Fatalf("round %d: the old daemon did not hand over:\n%s", round, lastLines(d.log.String(), 20))
		}
		if !strings.Contains(next.log.String(), "adopted from the previous daemon") {
			t.Fatalf("round %d: the new daemon did not adopt the pool:\n%s", round, lastLines(next.log.String(), 20))
		}
		m := recovered.FindStringSubmatch(next.log.String())
		if m == nil {
			t.Fatalf("round %d: the new daemon did not say what it kept:\n%s", round, lastLines(next.log.String(), 20))
		}
		// The old daemon waits for SIGTERM, with nothing to write with.
		if !d.alive() {
			t.Fatalf("round %d: the old daemon exited after handing over (its pod would restart it)", round)
		}
		if h := d.holds(t, dir); len(h) > 0 {
			t.Fatalf("round %d: the old daemon still holds, after handing over:\n%s", round, strings.Join(h, "\n"))
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.exited:
			d.exited <- err
			if err != nil {
				t.Fatalf("round %d: the old daemon's exit at SIGTERM: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the old daemon did not exit at SIGTERM", round)
		}
		d = next

		// The client of the first daemon reconnects by itself (the call
		// that finds the connection broken fails) and keeps its mapping.
		if err := old.Ping(nil); err == nil {
			t.Fatalf("round %d: a ping over the connection to the old daemon succeeded", round)
		}
		if err := old.Ping(nil); err != nil {
			t.Fatalf("round %d: the client did not reconnect: %v", round, err)
		}
		if &old.PoolBytes()[0] != &oldPool[0] {
			t.Fatalf("round %d: the client mapped the pool again", round)
		}
		again := []byte(fmt.Sprintf("reconnected/%d", round))
		if ok, offs, err := reservePut(old, [][]byte{again}); err != nil || len(ok) != 1 {
			t.Fatalf("round %d: put after reconnecting: %v", round, err)
		} else {
			committed[string(again)] = offs[0]
			keys = append(keys, again)
		}

		c, buf := dialReader(t, sock)
		checkKept(t, fmt.Sprintf("round %d", round), c, buf, keys, committed, oldPool, halfKeys, ackedKeys, load.sentKeys())
		c.Close()
		t.Logf("round %d: %d committed + %d load keys read back; the new daemon recovered %s L1 values", round, len(keys), acked, m[1])
	}
	load.stop()
	d.cmd.Process.Signal(syscall.SIGTERM)
	err = <-d.exited
	d.exited <- err
	if err != nil {
		t.Fatalf("last daemon's exit: %v", err)
	}
}

// TestHandoffStaleWriter: a part of the old daemon that does not let go
// of its pool (here a reference the test holds, as a transfer abandoned at
// drain_timeout would) and writes into it after the hand-off. The old
// daemon hands over no state then, the new one starts cold on a pool of
// its own and says why, and what the stale writer writes never reaches
// the new daemon's values. Without such a part, the old daemon's pool is
// unmapped before the new one serves.
func TestHandoffStaleWriter(t *testing.T) {
	for _, stuck := range []bool{true, false} {
		t.Run(fmt.Sprintf("stuck=%v", stuck), func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir)
			cfg.StoreHandoff = "on"
			cfg.StoreL2Path = "off"
			log1, log2 := &lockedBuffer{}, &lockedBuffer{}
			d1, err := New(cfg, slog.New(slog.NewTextHandler(log1, nil)), env(nil))
			if err != nil {
				t.Fatal(err)
			}
			ctx1, cancel1 := context.WithCancel(context.Background())
			done1 := make(chan error, 1)
			go func() { done1 <- d1.Run(ctx1) }()
			defer func() {
				cancel1()
				if err := <-done1; err != nil {
					t.Errorf("old daemon: %v", err)
				}
			}()
			c1, err := client.Dial(cfg.Socket, client.Options{Name: "before"})
			if err != nil {
				t.Fatal(err)
			}
			var keys [][]byte
			for i := 0; i < 100; i++ {
				keys = append(keys, []byte(fmt.Sprintf("k/%03d", i)))
			}
			if ok, _, err := reservePut(c1, keys); err != nil || len(ok) != len(keys) {
				t.Fatalf("put: %d of %d, %v", len(ok), len(keys), err)
			}
			c1.Close()

			pool := d1.pools[0]
			if stuck && !pool.Acquire() {
				t.Fatal("cannot hold the old daemon's pool")
			}
			d2, err := New(cfg, slog.New(slog.NewTextHandler(log2, nil)), env(nil))
			if err != nil {
				t.Fatalf("new daemon: %v\nold daemon:\n%s", err, log1.String())
			}
			runDaemon(t, d2)
			// The new daemon serves only once the old one let go: its pool
			// is unmapped, unless the stuck part holds it.
			if pool.Unmapped() == stuck {
				t.Fatalf("new daemon serving; the old daemon's pool unmapped: %v, want %v", pool.Unmapped(), !stuck)
			}
			c2, buf := dialReader(t, cfg.Socket)
			defer c2.Close()
			got := readAll(t, c2, buf, keys)
			if !stuck {
				for i, v := range got {
					if !bytes.Equal(v, hitlessValue(keys[i])) {
						t.Fatalf("%q read back as %d bytes after the hand-off", keys[i], len(v))
					}
				}
				return
			}
			defer pool.Release()
			if !strings.Contains(log1.String(), "is still mapped by a part of this daemon") ||
				!strings.Contains(log2.String(), "the old daemon handed over no state") {
				t.Fatalf("no state refusal said in the logs:\nold:\n%s\nnew:\n%s", log1.String(), log2.String())
			}
			for i, v := range got {
				if v != nil {
					t.Fatalf("%q served by a daemon that started cold", keys[i])
				}
			}
			// The new daemon's values, then the stale writer writes over
			// all of the memory it still maps.
			var fresh [][]byte
			for i := 0; i < 100; i++ {
				fresh = append(fresh, []byte(fmt.Sprintf("fresh/%03d", i)))
			}
			if ok, _, err := reservePut(c2, fresh); err != nil || len(ok) != len(fresh) {
				t.Fatalf("put on the new daemon: %d of %d, %v", len(ok), len(fresh), err)
			}
			stale := pool.Bytes()
			for i := range stale {
				stale[i] = 0xa5
			}
			for i, v := range readAll(t, c2, buf, fresh) {
				if !bytes.Equal(v, hitlessValue(fresh[i])) {
					t.Fatalf("%q changed by the old daemon's stale writer", fresh[i])
				}
			}
		})
	}
}

// TestHandoffColdAndRefused: with store_handoff = off a second daemon on a
// socket in use is refused; with it on, a daemon that offers no hand-off
// is waited for and the new one starts cold once it is gone, saying why;
// and a client of another uid than the daemon's (not root) is refused.
func TestHandoffColdAndRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.StoreL2Path = "off"
	log1 := &lockedBuffer{}
	d1, err := New(cfg, slog.New(slog.NewTextHandler(log1, nil)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- d1.Run(ctx1) }()

	if _, err := New(cfg, discardLogger(), env(nil)); !errors.Is(err, control.ErrAddrInUse) || !strings.Contains(err.Error(), "store_handoff = on") {
		cancel1()
		<-done1
		t.Fatalf("a second daemon with store_handoff = off: %v, want refused as in use", err)
	}

	// The running daemon has store_handoff = off: no hand-off socket.
	cfg2 := cfg
	cfg2.StoreHandoff = "on"
	log2 := &lockedBuffer{}
	type result struct {
		d   *Daemon
		err error
	}
	res := make(chan result, 1)
	go func() {
		d, err := New(cfg2, slog.New(slog.NewTextHandler(log2, nil)), env(nil))
		res <- result{d, err}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(log2.String(), "no hand-off offered") },
		"the new daemon does not say the old one offers no hand-off")
	select {
	case r := <-res:
		t.Fatalf("the new daemon started while the old one runs: %v", r.err)
	default:
	}
	cancel1()
	if err := <-done1; err != nil {
		t.Fatalf("old daemon: %v", err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("the new daemon did not start once the old one was gone: %v\n%s", r.err, log2.String())
	}
	runDaemon(t, r.d)
	if !strings.Contains(log2.String(), "starting cold once the old daemon is gone") {
		t.Fatalf("the cold start is not said:\n%s", log2.String())
	}
	c, err := client.Dial(cfg.Socket, client.Options{Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

}

// TestHandoffRefusesOtherUID: a process of another uid than the daemon's
// (and not root) asking for a hand-off is refused and logged, whatever the
// hand-off socket's mode, and the daemon goes on serving.
func TestHandoffRefusesOtherUID(t *testing.T) {
	cfg, bin := tenantConfig(t) // root, and a helper binary other uids may run
	cfg.Tenants = nil
	cfg.StoreHandoff = "on"
	cfg.StoreL2Path = "off"
	logBuf := &lockedBuffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logBuf, nil)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	hs := cfg.Socket + handoffSuffix
	if fi, err := os.Stat(hs); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("hand-off socket: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	if err := os.Chmod(hs, 0o666); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"=handoff-dial", "TC_SOCKET="+hs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uidA, Gid: uidA}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("refused uid %d is neither", uidA); !strings.HasPrefix(string(out), want) {
		t.Fatalf("uid %d asking for a hand-off was answered %q, want %q...", uidA, out, want)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logBuf.String(), "hand-off refused") },
		"the refusal is not logged")
	c, err := client.Dial(cfg.Socket, client.Options{Name: "still"})
	if err != nil {
		t.Fatalf("the daemon stopped serving after a refused hand-off: %v", err)
	}
	c.Close()
}

// runHandoffDial is the helper that asks for a hand-off (as another uid)
// and prints the answer.
func runHandoffDial() int {
	c, err := net.DialTimeout("unixpacket", os.Getenv("TC_SOCKET"), 5*time.Second)
	if err != nil {
		fmt.Println("dial", err)
		return 2
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte(handoffHello + "\n"))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		fmt.Println("read", err)
		return 2
	}
	fmt.Print(string(buf[:n]))
	return 0
}

// TestHandoffRefusesImpostor: what answers on SOCKET.handoff must be a
// daemon of this daemon's uid or root. A process of another uid that got
// the socket's name (a socket directory others may write) and offers
// "state" with memfds of its own is refused: a daemon that adopted them
// would keep every tenant's values in memory that process maps.
func TestHandoffRefusesImpostor(t *testing.T) {
	cfg, bin := tenantConfig(t) // root, and a helper binary other uids may run
	cfg.Tenants = nil
	cfg.StoreHandoff = "on"
	if err := os.Chmod(filepath.Dir(cfg.Socket), 0o1777); err != nil {
		t.Fatal(err)
	}
	hs := cfg.Socket + handoffSuffix
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"=handoff-offer", "TC_SOCKET="+hs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uidA, Gid: uidA}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("helper: %q %v", line, err)
	}

	logBuf := &lockedBuffer{}
	d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(logBuf, nil))}
	in, _, why, err := d.takeOver()
	if in != nil {
		defer in.closeAll()
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", uidA)) {
		n := 0
		if in != nil {
			n = len(in.fds)
		}
		t.Fatalf("a hand-off answered by uid %d: err %v, why %q, %d descriptors taken; want refused, naming the uid", uidA, err, why, n)
	}
	if !errors.Is(err, control.ErrAddrInUse) {
		t.Fatalf("refusal %v does not match ErrAddrInUse", err)
	}
}

// runHandoffOffer is the helper that plays an old daemon (as another
// uid): it listens on TC_SOCKET, accepts a hand-off and sends a state of
// two memfds of its own.
func runHandoffOffer() int {
	path := os.Getenv("TC_SOCKET")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen", err)
		return 2
	}
	defer ln.Close()
	fmt.Println("listening")
	c, err := ln.AcceptUnix()
	if err != nil {
		return 2
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	if _, err := c.Read(buf); err != nil {
		return 2
	}
	c.Write([]byte("accepted 0\n"))
	var fds []int
	for _, name := range []string{"pool", "journal"} {
		fd, err := unix.MemfdCreate(name, 0)
		if err != nil {
			return 2
		}
		fds = append(fds, fd)
	}
	c.WriteMsgUnix([]byte("state "+poolFDPrefix+"default:"+journalFDPrefix+"default\n"), syscall.UnixRights(fds...), nil)
	c.Write([]byte("listeners\n"))
	c.Read(buf) // until the asker closes
	return 0
}

// oldDaemonStub plays an old daemon of this uid on sock's hand-off socket:
// it reads one request, has send answer it, and waits for the asker to
// close the connection. The channel it returns is closed once it closed
// its end.
func oldDaemonStub(t *testing.T, sock string, send func(c *net.UnixConn) error) <-chan struct{} {
	t.Helper()
	path := sock + handoffSuffix
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 256)
		if _, err := c.Read(buf); err != nil {
			return
		}
		if err := send(c); err != nil {
			// An asker that refuses an answer closes its end at once: the
			// rest of the answer has nowhere to go, which is the asker's
			// to judge (each test checks what it made of the answer).
			if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the stub's answer: %v", err)
			}
			return
		}
		c.Read(buf) // until the asker closes
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return done
}

// sendAll sends each of msgs as a message of its own.
func sendAll(msgs ...string) func(c *net.UnixConn) error {
	return func(c *net.UnixConn) error {
		for _, m := range msgs {
			if _, err := c.Write([]byte(m)); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestHandoffBoundsStatedDrain: the new daemon waits for the old one's
// state as long as the old one says it drains, up to the longest
// drain_timeout a config accepts: a drain of hours, or one past 32 or 64
// bits, is clamped to that and said in the log; what is not a number is
// no hand-off.
func TestHandoffBoundsStatedDrain(t *testing.T) {
	longest := config.MaxDrainTimeout
	for _, tc := range []struct {
		name, stated string
		drain        time.Duration // 0: none accepted
		clamped      bool
	}{
		{"within", "30000", 30 * time.Second, false},
		{"the longest", strconv.FormatInt(longest.Milliseconds(), 10), longest, false},
		{"an hour", "3600000", longest, true},
		{"past 32 bits", "4294967296", longest, true},
		{"past a Duration", "9223372036854775807", longest, true},
		{"past 64 bits", "18446744073709551616", longest, true},
		{"not a number", "-1", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.StoreHandoff = "on"
			oldDaemonStub(t, cfg.Socket, sendAll("accepted "+tc.stated+"\n", "nostate a stub\n", "listeners\n"))
			log := &lockedBuffer{}
			d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(log, nil))}
			in, _, why, err := d.takeOver()
			if err != nil {
				t.Fatal(err)
			}
			in.closeAll()
			if tc.drain == 0 {
				if !strings.Contains(why, "answered") || !strings.Contains(why, tc.stated) {
					t.Fatalf("why %q, want it to say what the old daemon answered", why)
				}
				if strings.Contains(log.String(), "accepted and drains") {
					t.Fatalf("a drain of %q was accepted:\n%s", tc.stated, log)
				}
				return
			}
			if why != "the old daemon handed over no state: a stub" {
				t.Fatalf("why %q, want the stub's nostate", why)
			}
			if want := "drain_timeout=" + tc.drain.String(); !strings.Contains(log.String(), want) {
				t.Fatalf("a stated drain of %s ms: log does not say %s:\n%s", tc.stated, want, log)
			}
			if said := strings.Contains(log.String(), "states a drain longer than any drain_timeout may be"); said != tc.clamped {
				t.Fatalf("the clamp said %v, want %v:\n%s", said, tc.clamped, log)
			}
		})
	}
}

// TestHandoffDistrustsState: what the old daemon passes is taken only
// when it is what a hand-off sends. A state that names a descriptor twice,
// or is longer than a hand-off message (so truncated), is dropped whole;
// descriptors of tenants this daemon does not have (or names no tenant
// has, such as one carrying a line for systemd's notify socket) are
// closed, never taken or sent to systemd; texts the old daemon sends reach
// the log and the errors bounded. Whatever is dropped is closed.
func TestHandoffDistrustsState(t *testing.T) {
	pool, journal := poolFDPrefix+"default", journalFDPrefix+"default"
	for _, tc := range []struct {
		name  string
		state string
		fds   int
		taken []string // nil: no state taken
		why   string   // in why, or in the log when the state is taken
	}{
		{"whole", "state " + pool + ":" + journal, 2, []string{pool, journal}, ""},
		{"named twice", "state " + pool + ":" + pool, 2, nil, "names \"" + pool + "\" twice"},
		{"another tenant", "state " + pool + ":" + journal + ":" + poolFDPrefix + "gone", 3, []string{pool, journal}, "of no tenant of this daemon"},
		{"a notify line in a name", "state " + pool + "\nFDSTOREREMOVE=1\nFDNAME=" + pool + ":" + journal, 2, []string{journal}, "of no tenant of this daemon"},
		{"longer than a message", "state " + pool + ":" + journal + strings.Repeat("\n", maxHandoffMsg), 2, nil, "longer than a hand-off message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.StoreHandoff = "on"
			stub := oldDaemonStub(t, cfg.Socket, func(c *net.UnixConn) error {
				if _, err := c.Write([]byte("accepted 100\n")); err != nil {
					return err
				}
				var fds []int
				for range tc.fds {
					fd, err := unix.MemfdCreate("stub", unix.MFD_CLOEXEC)
					if err != nil {
						return err
					}
					fds = append(fds, fd)
				}
				_, _, err := c.WriteMsgUnix([]byte(tc.state+"\n"), syscall.UnixRights(fds...), nil)
				for _, fd := range fds {
					syscall.Close(fd)
				}
				if err != nil {
					return err
				}
				_, err = c.Write([]byte("listeners\n"))
				return err
			})
			log := &lockedBuffer{}
			d := &Daemon{cfg: cfg, log: slog.New(slog.NewTextHandler(log, nil))}
			before := openFDs(t)
			in, _, why, err := d.takeOver()
			if err != nil {
				t.Fatal(err)
			}
			var taken []string
			for i, fd := range in.fds {
				taken = append(taken, in.names[i])
				if target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil || !strings.Contains(target, "memfd:stub") {
					t.Errorf("%s taken as fd %d, which is %q (%v)", in.names[i], fd, target, err)
				}
			}
			in.closeAll()
			<-stub
			if after := openFDs(t); after > before {
				t.Errorf("%d descriptors open after the hand-off, %d before: a dropped one leaked", after, before)
			}
			if tc.taken == nil {
				if len(taken) > 0 || !strings.Contains(why, tc.why) {
					t.Fatalf("took %q, why %q; want nothing taken, saying %q", taken, why, tc.why)
				}
				return
			}
			if why != "" || !slices.Equal(taken, tc.taken) {
				t.Fatalf("took %q, why %q; want %q", taken, why, tc.taken)
			}
			if !strings.Contains(log.String(), tc.why) {
				t.Fatalf("the log does not say %q:\n%s", tc.why, log)
			}
		})
	}
}

// TestHandoffBoundsOldDaemonText: what the old daemon says when it refuses
// or stops reaches the new daemon's error or log bounded, however long it
// is.
func TestHandoffBoundsOldDaemonText(t *testing.T) {
	long := strings.Repeat("x", maxHandoffMsg-16)
	for _, verb := range []string{"refused", "stopping"} {
		t.Run(verb, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.StoreHandoff = "on"
			oldDaemonStub(t, cfg.Socket, sendAll(verb+" "+long+"\n"))
			d := &Daemon{cfg: cfg, log: discardLogger()}
			in, _, why, err := d.takeOver()
			if in != nil {
				in.closeAll()
			}
			text := why
			if err != nil {
				text = err.Error()
			}
			if (err != nil) != (verb == "refused") || !strings.Contains(text, "xxxx") {
				t.Fatalf("err %v, why of %d bytes: want the old daemon's %s said", err, len(why), verb)
			}
			if len(text) > 1024 {
				t.Fatalf("the old daemon's %d bytes after %q reach the new daemon's %d-byte text", len(long), verb, len(text))
			}
		})
	}
}
