//go:build linux

package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/fdstore"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// fdStoreSystemd plays systemd for a service with a socket unit and a file
// descriptor store (fdstore.Store): it owns the control socket and starts
// each daemon with it and every stored descriptor from fd 3 on, LISTEN_FDS,
// LISTEN_FDNAMES, LISTEN_PID (the daemon's own) and FDSTORE
// (FileDescriptorStoreMax=).
type fdStoreSystemd struct {
	t    *testing.T
	bin  string
	args []string
	sock string
	ctl  *os.File // the control socket (tensorcastd.socket)
	fds  *fdstore.Store
}

func newFDStoreSystemd(t *testing.T, bin string, args ...string) *fdStoreSystemd {
	dir := t.TempDir()
	s := &fdStoreSystemd{t: t, bin: bin, args: args, sock: filepath.Join(dir, "tensorcastd.sock")}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: s.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	if s.ctl, err = ln.File(); err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if s.fds, err = fdstore.Listen(filepath.Join(dir, "notify.sock")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.fds.Close()
		s.ctl.Close()
	})
	return s
}

// storedNames are the names of the stored descriptors.
func (s *fdStoreSystemd) storedNames() []string { return s.fds.Names() }

// daemonProc is one started daemon.
type daemonProc struct {
	cmd    *exec.Cmd
	log    *lockedBuffer
	exited chan error
}

// start starts the next daemon and waits for its READY=1.
func (s *fdStoreSystemd) start() *daemonProc {
	s.t.Helper()
	// The store is held until the daemon has them: what it asks to drop
	// (FDSTOREREMOVE) is closed only after.
	ready := s.fds.NextReady()
	var cmd *exec.Cmd
	p := &daemonProc{log: &lockedBuffer{}, exited: make(chan error, 1)}
	err := s.fds.Start(func(kept []*os.File, names []string) error {
		files := append([]*os.File{s.ctl}, kept...)
		names = append([]string{"control"}, names...)
		cmd = exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, s.bin}, s.args...)...)
		cmd.ExtraFiles = files
		cmd.Env = append(os.Environ(), s.fds.Env(files, names)...)
		cmd.Stderr = p.log
		return cmd.Start()
	})
	if err != nil {
		s.t.Fatal(err)
	}
	p.cmd = cmd
	go func() { p.exited <- cmd.Wait() }()
	s.t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		if s.t.Failed() {
			s.t.Logf("daemon %d log:\n%s", cmd.Process.Pid, lastLines(p.log.String(), 40))
		}
	})
	for {
		select {
		case <-ready:
			return p
		case err := <-p.exited:
			s.t.Fatalf("daemon exited before READY: %v\n%s", err, p.log.String())
		case <-time.After(30 * time.Second):
			s.t.Fatalf("no READY=1 from the daemon\n%s", p.log.String())
		}
	}
}

// stop ends p with sig and waits for it.
func (p *daemonProc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		if sig == syscall.SIGTERM && err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon did not exit after %v", sig)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// hitlessValue is the value of key: its length (1..4096) and bytes follow
// from the key, so any value served can be checked against its key.
func hitlessValue(key []byte) []byte {
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	v := make([]byte, 1+h%4096)
	for i := range v {
		v[i] = byte(h>>(8*(i%4))) ^ byte(i) ^ key[i%len(key)]
	}
	return v
}

// reservePut puts keys by zero-copy: reserve, write in the pool mapping,
// commit. It returns the keys committed and their pool offsets.
func reservePut(c *client.Client, keys [][]byte) (ok [][]byte, offs []uint64, err error) {
	sizes := make([]uint64, len(keys))
	for i, k := range keys {
		sizes[i] = uint64(len(hitlessValue(k)))
	}
	offsets := make([]uint64, len(keys))
	res := make([]error, len(keys))
	if err := c.StoreReserve(keys, sizes, offsets, res); err != nil && !errors.Is(err, client.ErrFailedPrecondition) {
		return nil, nil, err
	}
	var got [][]byte
	var gotOff []uint64
	for i, k := range keys {
		if res[i] == nil {
			copy(c.PoolBytes()[offsets[i]:], hitlessValue(k))
			got, gotOff = append(got, k), append(gotOff, offsets[i])
		}
	}
	if len(got) == 0 {
		return nil, nil, fmt.Errorf("no key reserved: %v", res[0])
	}
	cres := make([]error, len(got))
	if err := c.StoreCommit(got, false, cres); err != nil && !errors.Is(err, client.ErrFailedPrecondition) {
		return nil, nil, err
	}
	for i, k := range got {
		if cres[i] == nil {
			ok, offs = append(ok, k), append(offs, gotOff[i])
		}
	}
	return ok, offs, nil
}

// dialReader connects a client with a buffer for readAll.
func dialReader(t *testing.T, sock string) (*client.Client, *client.Buffer) {
	t.Helper()
	c, err := client.Dial(sock, client.Options{Name: "check"})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := c.RegisterBuffer(128 * 4096)
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, buf
}

// readAll reads keys through c into a buffer of its own and returns, per
// key, the value (nil when not found); any other failure fails t.
func readAll(t *testing.T, c *client.Client, buf *client.Buffer, keys [][]byte) [][]byte {
	t.Helper()
	out := make([][]byte, len(keys))
	for i := 0; i < len(keys); i += 128 {
		batch := keys[i:min(i+128, len(keys))]
		dests := make([]client.Extent, len(batch))
		for j := range dests {
			dests[j] = client.Extent{Segment: buf.ID, Offset: uint64(j) * 4096, Length: 4096}
		}
		lens := make([]uint64, len(batch))
		res := make([]error, len(batch))
		if err := c.StoreRead(batch, dests, lens, res); err != nil && !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("StoreRead: %v", err)
		}
		for j := range batch {
			switch {
			case res[j] == nil:
				out[i+j] = bytes.Clone(buf.Mem[uint64(j)*4096 : uint64(j)*4096+lens[j]])
			case !errors.Is(res[j], client.ErrNotFound):
				t.Fatalf("StoreRead %q: %v", batch[j], res[j])
			}
		}
	}
	return out
}

// TestHitlessRestart restarts the daemon under an emulation of systemd's
// protocol (socket unit, notify socket, file descriptor store), SIGTERM and
// SIGKILL in turn, with a client putting keys all along: every key
// committed before a restart is served byte-exact after it, nothing
// reserved and not committed (being written) is served, any value served
// is its key's own, and a client that mapped the pool before the first
// restart still sees the values in its mapping where they were.
func TestHitlessRestart(t *testing.T) {
	bin := buildDaemon(t)
	dir := t.TempDir()
	sd := newFDStoreSystemd(t, bin, "--socket", filepath.Join(dir, "configured.sock"), "--data-dir", filepath.Join(dir, "data"),
		"--pool-size", "256MiB", "--hugepages", "off", "--metrics-address", "127.0.0.1:0", "--ebpf", "off", "--drain-timeout", "2s",
		"--store-l2-path", "off", "--store-l1-journal-records", "65536")
	d := sd.start()
	if names := sd.storedNames(); len(names) != 2 || names[0] != "pool-default" || names[1] != "l1journal-default" {
		t.Fatalf("stored descriptors %v, want the pool and the L1 journal", names)
	}

	// 10,000 keys committed by a client whose mapping outlives the daemon.
	old, err := client.Dial(sd.sock, client.Options{Name: "old-mapping", Reconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldPool := old.PoolBytes()
	keys, committed := commitMany(t, old, 10000)

	// Values being written when the daemon goes, and a load client putting
	// keys through every restart.
	halfKeys := halfWritten(t, sd.sock)
	load := startPutLoad(sd.sock)
	defer load.stop()

	acked := 0
	for round, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGTERM, syscall.SIGKILL} {
		// The load runs on this daemon before the signal, and goes on
		// through it.
		load.waitAcked(t, acked+64, fmt.Sprintf("round %d", round))
		before := len(load.acked())
		d.stop(t, sig)
		ackedKeys := load.acked()
		acked = len(ackedKeys)
		d = sd.start()
		if !strings.Contains(d.log.String(), "adopted from the previous daemon") {
			t.Fatalf("round %d (%v): the pool was not adopted", round, sig)
		}

		// The old client reconnects by itself on the call after the one
		// that finds its connection broken, keeping its mapping, and puts
		// through it again.
		if err := old.Ping(nil); err == nil {
			t.Fatalf("round %d: a ping over the connection to the daemon that went succeeded", round)
		}
		if err := old.Ping(nil); err != nil {
			t.Fatalf("round %d (%v): the client did not reconnect: %v", round, sig, err)
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

		c, buf := dialReader(t, sd.sock)
		checkKept(t, fmt.Sprintf("round %d (%v)", round, sig), c, buf, keys, committed, oldPool, halfKeys, ackedKeys, load.sentKeys())
		// New blocks are in the same memory the old mapping has.
		ok, offs, err := reservePut(c, [][]byte{[]byte(fmt.Sprintf("after/%d", round))})
		if err != nil || len(ok) != 1 {
			t.Fatalf("put after the restart: %v", err)
		}
		if v := hitlessValue(ok[0]); !bytes.Equal(oldPool[offs[0]:offs[0]+uint64(len(v))], v) {
			t.Fatalf("round %d: a value put after the restart is not in the old mapping: another pool", round)
		}
		c.Close()
		t.Logf("round %d (%v): %d committed + %d load keys (of %d acked before the signal) read back; %s", round, sig,
			len(keys), acked, before, grepLines(d.log.String(), "kept across the restart"))
	}
	load.stop()
	d.stop(t, syscall.SIGTERM)

	// A daemon that does not keep L1 starts as without systemd's store,
	// and has systemd drop what it kept (the memory would stay held).
	sd.args = append(sd.args, "--store-keep-l1", "off")
	d = sd.start()
	if names := sd.storedNames(); len(names) != 0 {
		t.Fatalf("with store_keep_l1 = off, systemd still keeps %v", names)
	}
	c, buf := dialReader(t, sd.sock)
	if v := readAll(t, c, buf, keys[:1]); v[0] != nil {
		t.Fatalf("store_keep_l1 = off served %q from the previous daemon", keys[0])
	}
	c.Close()
	d.stop(t, syscall.SIGTERM)
}

// halfWritten reserves 50 keys on the daemon at sock and writes half of
// each value, never committing them: what no restart may serve. The client
// stays open until the test ends.
func halfWritten(t *testing.T, sock string) [][]byte {
	t.Helper()
	half, err := client.Dial(sock, client.Options{Name: "half-written"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { half.Close() })
	keys := make([][]byte, 50)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("half/%02d", i))
	}
	sizes, offs, res := make([]uint64, len(keys)), make([]uint64, len(keys)), make([]error, len(keys))
	for i, k := range keys {
		sizes[i] = uint64(len(hitlessValue(k)))
	}
	if err := half.StoreReserve(keys, sizes, offs, res); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		copy(half.PoolBytes()[offs[i]:], hitlessValue(k)[:sizes[i]/2])
	}
	return keys
}

// putLoad is a client putting batches of 8 keys every 5 ms (load through
// every restart without filling L1, which would evict), dialing again when
// its connection breaks. It records what it sent and what was
// acknowledged.
type putLoad struct {
	mu   sync.Mutex
	ack  map[string]bool
	sent [][]byte

	once sync.Once
	quit chan struct{}
	done chan struct{}
}

func startPutLoad(sock string) *putLoad {
	l := &putLoad{ack: map[string]bool{}, quit: make(chan struct{}), done: make(chan struct{})}
	go l.run(sock)
	return l
}

func (l *putLoad) run(sock string) {
	defer close(l.done)
	var c *client.Client
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	pace := time.NewTicker(5 * time.Millisecond)
	defer pace.Stop()
	for n := 0; ; n += 8 {
		select {
		case <-l.quit:
			return
		case <-pace.C:
		}
		if c == nil {
			var err error
			if c, err = client.Dial(sock, client.Options{Name: "load", DialTimeout: time.Second}); err != nil {
				c = nil
				continue
			}
		}
		batch := make([][]byte, 8)
		for j := range batch {
			batch[j] = []byte(fmt.Sprintf("load/%07d", n+j))
		}
		l.mu.Lock()
		l.sent = append(l.sent, batch...)
		l.mu.Unlock()
		ok, _, err := reservePut(c, batch)
		l.mu.Lock()
		for _, k := range ok {
			l.ack[string(k)] = true
		}
		l.mu.Unlock()
		if err != nil {
			c.Close()
			c = nil
		}
	}
}

// waitAcked waits until at least n puts were acknowledged.
func (l *putLoad) waitAcked(t *testing.T, n int, what string) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.ack) >= n
	}, "%s: the load client makes no progress", what)
}

// acked lists the keys whose puts were acknowledged so far.
func (l *putLoad) acked() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([][]byte, 0, len(l.ack))
	for k := range l.ack {
		keys = append(keys, []byte(k))
	}
	return keys
}

// sentKeys lists every key the load tried to put.
func (l *putLoad) sentKeys() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.sent...)
}

// stop ends the load and waits for it; later calls return at once.
func (l *putLoad) stop() {
	l.once.Do(func() { close(l.quit) })
	<-l.done
}

// checkKept reads back through c, after a restart or hand-off (what names
// it): every committed key byte-exact, also in the mapping made before the
// first restart (oldPool, at committed[key]); no half-written key; every
// acknowledged load key byte-exact; no sent load key with other bytes.
func checkKept(t *testing.T, what string, c *client.Client, buf *client.Buffer, keys [][]byte, committed map[string]uint64,
	oldPool []byte, halfKeys, ackedKeys, sent [][]byte) {
	t.Helper()
	for i, v := range readAll(t, c, buf, keys) {
		want := hitlessValue(keys[i])
		if !bytes.Equal(v, want) {
			t.Fatalf("%s: %q read back as %d bytes, want its %d committed bytes", what, keys[i], len(v), len(want))
		}
		if off := committed[string(keys[i])]; !bytes.Equal(oldPool[off:off+uint64(len(want))], want) {
			t.Fatalf("%s: the mapping made before the first restart lost %q", what, keys[i])
		}
	}
	for i, v := range readAll(t, c, buf, halfKeys) {
		if v != nil {
			t.Fatalf("%s: %q was never committed and is served (%d bytes)", what, halfKeys[i], len(v))
		}
	}
	for i, v := range readAll(t, c, buf, ackedKeys) {
		if !bytes.Equal(v, hitlessValue(ackedKeys[i])) {
			t.Fatalf("%s: load key %q acknowledged before the restart read back as %d bytes", what, ackedKeys[i], len(v))
		}
	}
	for i, v := range readAll(t, c, buf, sent) {
		if v != nil && !bytes.Equal(v, hitlessValue(sent[i])) {
			t.Fatalf("%s: load key %q served with bytes that are not its value", what, sent[i])
		}
	}
}

// commitMany commits n keys ("committed/%05d") through c, 250 to a batch,
// and returns them with where c wrote each in its pool.
func commitMany(t *testing.T, c *client.Client, n int) ([][]byte, map[string]uint64) {
	t.Helper()
	committed := map[string]uint64{}
	var keys [][]byte
	for i := 0; i < n; i += 250 {
		batch := make([][]byte, min(250, n-i))
		for j := range batch {
			batch[j] = []byte(fmt.Sprintf("committed/%05d", i+j))
		}
		ok, offs, err := reservePut(c, batch)
		if err != nil || len(ok) != len(batch) {
			t.Fatalf("put of %d keys: %d committed, %v", len(batch), len(ok), err)
		}
		for j, k := range ok {
			committed[string(k)] = offs[j]
		}
		keys = append(keys, ok...)
	}
	return keys, committed
}
