package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
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
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// Environment that makes this test binary a child of the store tests: a
// daemon to SIGKILL, or a client to SIGKILL.
const (
	storeDaemonEnv = "TENSORCAST_TEST_STORE_DAEMON" // the child daemon's directory
	storeClientEnv = "TENSORCAST_TEST_STORE_CLIENT" // the socket the child client uses
)

// storeValue is the value a test stores under key: its length and bytes
// follow from the key, so a verifier needs nothing but the key.
func storeValue(key []byte) []byte {
	sum := crc32.ChecksumIEEE(key)
	v := make([]byte, 1+int(sum%(96<<10)))
	fillValue(v, sum)
	return v
}

func fillValue(v []byte, seed uint32) {
	x := seed | 1
	for i := range v {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		v[i] = byte(x)
	}
}

func dialStore(t *testing.T, sock string) *client.Client {
	t.Helper()
	c, err := client.Dial(sock, client.Options{Name: "store-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func storeCounters(t *testing.T, c *client.Client) map[string]uint64 {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, k := range st.Store {
		m[k.Name] = k.Value
	}
	return m
}

// TestStoreThroughDaemon: make run's defaults give a working store (an L2
// file under data_dir, no setup): a durable put through the socket and a
// zero-copy put through the queue read back, the figures show in Stats and
// on the metrics endpoint, clients may not open the L2 file, and a
// restarted daemon finds every durable key again.
func TestStoreThroughDaemon(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	d, err := New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d.files == nil {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier (the store would run without its L2)")
	}
	stop := runUntil(t, d)
	c := dialStore(t, cfg.Socket)
	if err := c.PutBytes([]byte("sock/durable"), storeValue([]byte("sock/durable")), true); err != nil {
		t.Fatalf("durable put: %v", err)
	}
	exp := scrapeMetrics(t, d.MetricsAddr())
	for _, series := range []string{`tensorcast_store_hits_total{tenant="default",tier="l1"}`, `tensorcast_store_hits_total{tenant="default",tier="l2"}`,
		`tensorcast_store_misses_total{tenant="default"}`} {
		if got := sample(t, exp, series); got != 0 {
			t.Fatalf("%s = %v after a put only", series, got)
		}
	}
	q, err := c.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.NewResults(8)
	if err != nil {
		t.Fatal(err)
	}
	keys := [][]byte{[]byte("queue/0"), []byte("queue/1")}
	qcall := func(ud uint64, submit func() (bool, error)) {
		t.Helper()
		if ok, err := submit(); !ok || err != nil {
			t.Fatalf("submit %d: %v %v", ud, ok, err)
		}
		cqes := make([]client.Completion, 1)
		if n, err := q.Reap(cqes, 1, 10*time.Second); n != 1 || err != nil || cqes[0].UserData != ud {
			t.Fatalf("reap %d: %d %v %+v", ud, n, err, cqes[0])
		}
		if err := res.Check(cqes[0]); err != nil || cqes[0].N != uint64(res.Len()) {
			t.Fatalf("call %d: %v %+v", ud, err, cqes[0])
		}
	}
	qcall(1, func() (bool, error) { return q.Reserve(keys, 8192, res, 1) })
	for i := range keys {
		fillValue(res.Value(i), uint32(i))
	}
	qcall(2, func() (bool, error) { return q.Commit(keys, true, res, 2) })
	qcall(3, func() (bool, error) { return q.Get(keys, res, 3) })
	for i := range keys {
		want := make([]byte, 8192)
		fillValue(want, uint32(i))
		if !bytes.Equal(res.Value(i), want) {
			t.Fatalf("queue/%d read in place differs", i)
		}
	}
	qcall(4, func() (bool, error) { return q.Unpin(keys, res, 4) })

	m := storeCounters(t, c)
	if m["keys"] != 3 || m["durable_puts"] != 3 || m["l2_capacity"] == 0 || m["pins"] != 0 {
		t.Fatalf("store counters %v", m)
	}
	rbuf, err := c.RegisterBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	rres := []error{nil}
	if err := c.StoreRead([][]byte{[]byte("sock/absent")}, []client.Extent{{Segment: rbuf.ID, Length: 4096}}, []uint64{0}, rres); err != nil ||
		!errors.Is(rres[0], client.ErrNotFound) {
		t.Fatalf("read of an absent key: %v, %v", err, rres[0])
	}
	exp = scrapeMetrics(t, d.MetricsAddr())
	for _, want := range []string{`tensorcast_store_keys{tenant="default"} 3`, `tensorcast_store_tier_keys{tenant="default",tier="l2"} 3`,
		`tensorcast_store_durable_puts_total{tenant="default"} 3`,
		// The queue's Get of its two keys, in L1; the absent key.
		`tensorcast_store_hits_total{tenant="default",tier="l1"} 2`, `tensorcast_store_misses_total{tenant="default"} 1`,
		// No ghost to sweep on a device that never failed.
		`tensorcast_store_ghosts_zeroed_total{tenant="default"} 0`, `tensorcast_store_ghost_zero_failures_total{tenant="default"} 0`,
		// Quarantined L2 slots can come back into use: a gauge.
		"# TYPE tensorcast_store_l2_slots_quarantined gauge", `tensorcast_store_l2_slots_quarantined{tenant="default"} 0`} {
		if !strings.Contains(exp, want+"\n") {
			t.Fatalf("the scrape lacks %q", want)
		}
	}
	l2 := filepath.Join(cfg.DataDir, "store.l2")
	if _, _, err := c.RegisterFile(l2, false, 0); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("RegisterFile of the store's L2: %v, want PERMISSION_DENIED", err)
	}
	c.Close()
	stop()

	d, err = New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, d)
	c = dialStore(t, cfg.Socket)
	for _, k := range [][]byte{[]byte("sock/durable"), keys[0], keys[1]} {
		v, err := c.GetBytes(k)
		if err != nil {
			t.Fatalf("%s after a restart: %v", k, err)
		}
		if k[0] == 's' && !bytes.Equal(v, storeValue(k)) || k[0] == 'q' && len(v) != 8192 {
			t.Fatalf("%s after a restart: %d bytes differ", k, len(v))
		}
	}
	if m := storeCounters(t, c); m["recovered"] != 3 {
		t.Fatalf("recovered %d blocks, want 3", m["recovered"])
	}
}

// contextUntil is a context canceled when stop closes (never for nil).
func contextUntil(stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	if stop != nil {
		go func() {
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// runUntil runs d until the test ends or the returned stop is called.
func runUntil(t *testing.T, d *Daemon) (stop func()) {
	t.Helper()
	stopCh := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		ctx, cancel := contextUntil(stopCh)
		defer cancel()
		done <- d.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(stopCh)
			if err := <-done; err != nil {
				t.Errorf("daemon Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestStorePinsReleasedOnClientKill: a client process that holds pins,
// a lease, a Get's pin and a reservation is SIGKILLed; the daemon gives
// all of them back, and another client can remove and reserve those keys.
func TestStorePinsReleasedOnClientKill(t *testing.T) {
	if os.Getenv(storeClientEnv) != "" {
		storeClientChild()
		return
	}
	cfg := testConfig(t.TempDir())
	cfg.StoreL2Path = "off"
	d, err := New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, d)
	cmd := exec.Command(os.Args[0], "-test.run=^TestStorePinsReleasedOnClientKill$")
	cmd.Env = append(os.Environ(), storeClientEnv+"="+cfg.Socket)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, _ = os.Open(os.DevNull)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(out)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the child client ended before it was ready: %v", err)
		}
		if strings.HasPrefix(l, "error") {
			t.Fatalf("child client: %s", l)
		}
		if strings.TrimSpace(l) == "ready" {
			break
		}
	}
	c := dialStore(t, cfg.Socket)
	if m := storeCounters(t, c); m["pins"] != 4 || m["reserved"] != 1 {
		t.Fatalf("while the child holds them: %v", m)
	}
	keys := [][]byte{[]byte("held/0"), []byte("held/1"), []byte("held/2"), []byte("held/3")}
	res := make([]error, 4)
	if err := c.StoreRemove(keys, res); err != nil || !errors.Is(res[0], client.ErrFailedPrecondition) {
		t.Fatalf("removing a key pinned by another client: %v %v", err, res)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	var m map[string]uint64
	testutil.Eventually(t, 10*time.Second, func() bool {
		m = storeCounters(t, c)
		return m["pins"] == 0 && m["reserved"] == 0
	}, "pins and reservations of a SIGKILLed client released: %v", testutil.Lazy(func() any { return m }))
	if err := c.StoreRemove(keys, res); err != nil || res[0] != nil || res[1] != nil || res[2] != nil || res[3] != nil {
		t.Fatalf("remove after the holder died: %v %v", err, res)
	}
	offs := make([]uint64, 1)
	if err := c.StoreReserve([][]byte{[]byte("held/r")}, []uint64{4096}, offs, res[:1]); err != nil || res[0] != nil {
		t.Fatalf("reserve a key the dead client had reserved: %v %v", err, res[0])
	}
}

// storeClientChild takes pins of every kind and a reservation, says ready
// and waits to be killed.
func storeClientChild() {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(2)
	}
	c, err := client.Dial(os.Getenv(storeClientEnv), client.Options{Name: "store-holder"})
	if err != nil {
		fail(err)
	}
	keys := [][]byte{[]byte("held/0"), []byte("held/1"), []byte("held/2"), []byte("held/3")}
	for _, k := range keys {
		if err := c.PutBytes(k, storeValue(k), false); err != nil {
			fail(err)
		}
	}
	res := make([]error, 2)
	if err := c.StorePin(keys[:2], 0, res); err != nil || res[0] != nil {
		fail(fmt.Errorf("pin: %v %v", err, res))
	}
	if err := c.StorePin(keys[2:3], time.Hour, res[:1]); err != nil || res[0] != nil {
		fail(fmt.Errorf("lease: %v %v", err, res))
	}
	q, err := c.OpenQueue(8)
	if err != nil {
		fail(err)
	}
	r, err := c.NewResults(1)
	if err != nil {
		fail(err)
	}
	if ok, err := q.Get(keys[3:], r, 1); !ok || err != nil {
		fail(fmt.Errorf("get: %v %v", ok, err))
	}
	cq := make([]client.Completion, 1)
	if _, err := q.Reap(cq, 1, 10*time.Second); err != nil || r.Check(cq[0]) != nil || r.Code(0) != tcproto.CodeOK {
		fail(fmt.Errorf("get: %v %+v", err, cq[0]))
	}
	if err := c.StoreReserve([][]byte{[]byte("held/r")}, []uint64{4096}, make([]uint64, 1), res[:1]); err != nil || res[0] != nil {
		fail(fmt.Errorf("reserve: %v %v", err, res[0]))
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // killed before stdin ends
	select {}
}

// TestStoreDaemonKilledDuringDurablePuts: a daemon process takes a stream
// of zero-copy durable puts through its queue from several clients and is
// SIGKILLed in the middle; a daemon restarted on its data_dir serves every
// put that was acknowledged with its exact bytes, and any put that was in
// flight is either absent or exact.
func TestStoreDaemonKilledDuringDurablePuts(t *testing.T) {
	if dir := os.Getenv(storeDaemonEnv); dir != "" {
		storeDaemonChild(t, dir)
		return
	}
	requireIOURing(t)
	dir := t.TempDir()
	cfg := killConfig(dir)
	child := startChild(t, "TestStoreDaemonKilledDuringDurablePuts", storeDaemonEnv+"="+dir, cfg.Socket)
	cmd, exited, childOut := child.cmd, child.exited, &child.out

	var mu sync.Mutex // guards acked, tried
	acked := map[string]bool{}
	tried := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(cfg.Socket, client.Options{Name: fmt.Sprintf("putter-%d", w)})
			if err != nil {
				return
			}
			defer c.Close()
			q, err := c.OpenQueue(16)
			if err != nil {
				return
			}
			res, err := c.NewResults(4)
			if err != nil {
				return
			}
			cq := make([]client.Completion, 1)
			call := func(ud uint64, submit func() (bool, error)) bool {
				if ok, err := submit(); !ok || err != nil {
					return false
				}
				n, err := q.Reap(cq, 1, 30*time.Second)
				return n == 1 && err == nil && res.Check(cq[0]) == nil
			}
			// A bounded stream (at most 1600 values of up to 96 KiB over
			// the four clients, well inside the default 1 GiB L2): a put
			// acknowledged is never evicted before the check.
			for i := 0; i < 100; i++ {
				// One size per call (a queue Reserve has one size for all
				// its keys): the keys' values are cut to it.
				keys := make([][]byte, 4)
				for j := range keys {
					keys[j] = []byte(fmt.Sprintf("kill/%d/%06d/%d", w, i, j))
				}
				size := uint64(len(storeValue(keys[0])))
				for j := range keys {
					keys[j] = []byte(fmt.Sprintf("kill/%d/%06d/%d/%d", w, i, j, size))
				}
				if !call(uint64(2*i), func() (bool, error) { return q.Reserve(keys, size, res, uint64(2*i)) }) {
					return
				}
				for j, k := range keys {
					copy(res.Value(j), sized(k))
				}
				mu.Lock()
				for _, k := range keys {
					tried[string(k)] = true
				}
				mu.Unlock()
				if !call(uint64(2*i+1), func() (bool, error) { return q.Commit(keys, true, res, uint64(2*i+1)) }) {
					return
				}
				mu.Lock()
				for j, k := range keys {
					if res.Code(j) == tcproto.CodeOK {
						acked[string(k)] = true
					}
				}
				mu.Unlock()
			}
		}()
	}
	testutil.Eventually(t, 60*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("the daemon died before it was killed:\n%s", childOut.String())
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 200
	}, "200 keys acknowledged before the kill; daemon log:\n%s", childOut)
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	wg.Wait()

	var log lockedBuffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&log, nil)), env(nil))
	if err != nil {
		t.Fatalf("restart after kill -9: %v", err)
	}
	runUntil(t, d)
	c := dialStore(t, cfg.Socket)
	mu.Lock()
	defer mu.Unlock()
	for k := range acked {
		v, err := c.GetBytes([]byte(k))
		if err != nil || !bytes.Equal(v, sized([]byte(k))) {
			t.Fatalf("acknowledged durable put %s after kill -9: %d bytes, %v", k, len(v), err)
		}
	}
	lost := 0
	for k := range tried {
		if acked[k] {
			continue
		}
		v, err := c.GetBytes([]byte(k))
		switch {
		case errors.Is(err, client.ErrNotFound):
			lost++
		case err != nil || !bytes.Equal(v, sized([]byte(k))):
			t.Fatalf("unacknowledged put %s came back wrong: %d bytes, %v", k, len(v), err)
		}
	}
	m := storeCounters(t, c)
	t.Logf("%d acknowledged, %d in flight at the kill (%d absent after it); recovered %d, torn %d",
		len(acked), len(tried)-len(acked), lost, m["recovered"], m["torn_dropped"])
	if m["recovered"] < uint64(len(acked)) {
		t.Fatalf("recovered %d blocks for %d acknowledged puts", m["recovered"], len(acked))
	}
}

// sized is a kill-test key's value: its size is the key's last field.
func sized(key []byte) []byte {
	var size int
	s := string(key)
	fmt.Sscanf(s[strings.LastIndexByte(s, '/')+1:], "%d", &size)
	v := make([]byte, size)
	fillValue(v, crc32.ChecksumIEEE(key))
	return v
}

// killConfig is the kill test's daemon: a pool with room for a slab per
// value size class (values of 1 byte to 96 KiB are read back through it).
func killConfig(dir string) Config {
	cfg := testConfig(dir)
	cfg.PoolSize = 16 << 20
	return cfg
}

// storeDaemonChild is the daemon the kill test SIGKILLs: it serves on dir
// until it dies.
func storeDaemonChild(t *testing.T, dir string) {
	cfg := killConfig(dir)
	d, err := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)), env(nil))
	if err != nil {
		t.Fatalf("child daemon: %v", err)
	}
	ctx, cancel := contextUntil(nil)
	defer cancel()
	d.Run(ctx) //nolint:errcheck // killed while it runs
}

// childProc is the test's own binary run again as a child process
// whose environment (env) makes it run a daemon, so that the test can
// SIGSTOP and SIGKILL it; exited is closed once it has exited, out has
// what it printed.
type childProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    lockedBuffer
}

// startChild starts the child and waits until its daemon's socket
// sock accepts; the child is killed at the end of the test.
func startChild(t *testing.T, run, env, sock string) *childProc {
	t.Helper()
	ch := &childProc{cmd: exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.timeout=5m"), exited: make(chan struct{})}
	ch.cmd.Env = append(os.Environ(), env)
	ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, &ch.out
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { ch.cmd.Wait(); close(ch.exited) }()
	t.Cleanup(func() { ch.cmd.Process.Kill(); <-ch.exited })
	waitSocket(t, sock, ch.exited, &ch.out)
	return ch
}

// waitSocket waits until a child daemon's socket accepts.
func waitSocket(t *testing.T, sock string, exited <-chan struct{}, out *lockedBuffer) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("the child daemon exited during start-up:\n%s", out.String())
		default:
		}
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, "the child daemon's socket accepting:\n%s", out)
}

// requireIOURing skips, saying so, on a host without io_uring.
func requireIOURing(t *testing.T) {
	t.Helper()
	d, err := New(testConfig(t.TempDir()), discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	files := d.files != nil
	d.closeParts()
	if !files {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier (the store would run without its L2)")
	}
}

// TestStoreL2FullThroughProtocol: an L2 larger than its file system
// fills; the durable put that does not fit gets RESOURCE_EXHAUSTED as its
// own result, on the socket and on the queue (where the reservation stays
// to be committed again), the daemon says why in its log, and it keeps
// serving what it stored.
func TestStoreL2FullThroughProtocol(t *testing.T) {
	requireIOURing(t)
	mnt := testutil.MountSmallExt4(t)
	cfg := testConfig(t.TempDir())
	cfg.DataDir = filepath.Join(mnt, "data")
	cfg.PoolSize = 64 << 20
	var log lockedBuffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&log, nil)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, d)
	c := dialStore(t, cfg.Socket)
	buf, err := c.RegisterBuffer(256 << 10)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 2)
	var stored [][]byte
	round := map[string]byte{}
	full := -1
	for i := 0; i < 128 && full < 0; i++ {
		keys := [][]byte{[]byte(fmt.Sprintf("full/%03d/a", i)), []byte(fmt.Sprintf("full/%03d/b", i))}
		buf.Mem[0] = byte(i)
		vals := []client.Extent{{Segment: buf.ID, Length: 256 << 10}, {Segment: buf.ID, Length: 256 << 10}}
		if err := c.StorePut(keys, vals, true, res); err != nil {
			t.Fatal(err)
		}
		for j, r := range res {
			switch {
			case r == nil:
				stored = append(stored, keys[j])
				round[string(keys[j])] = byte(i)
			case errors.Is(r, client.ErrResourceExhausted):
				full = i
			default:
				t.Fatalf("durable put %s: %v", keys[j], r)
			}
		}
	}
	if full < 0 {
		t.Fatalf("%d durable puts of 256 KiB fit a 16 MiB file system", len(stored))
	}
	// The queue: a reservation whose durable commit does not fit keeps its
	// reservation (RESOURCE_EXHAUSTED for its key, OK for nothing else).
	q, err := c.OpenQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.NewResults(1)
	if err != nil {
		t.Fatal(err)
	}
	cq := make([]client.Completion, 1)
	call := func(ud uint64, submit func() (bool, error)) {
		t.Helper()
		if ok, err := submit(); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, err := q.Reap(cq, 1, 10*time.Second); err != nil || r.Check(cq[0]) != nil {
			t.Fatalf("call %d: %v %+v", ud, err, cq[0])
		}
	}
	key := [][]byte{[]byte("full/queue")}
	call(1, func() (bool, error) { return q.Reserve(key, 256<<10, r, 1) })
	call(2, func() (bool, error) { return q.Commit(key, true, r, 2) })
	if r.Code(0) != tcproto.CodeRESOURCE_EXHAUSTED || cq[0].N != 0 {
		t.Fatalf("durable commit into a full L2: %s, %d OK", r.Code(0), cq[0].N)
	}
	call(3, func() (bool, error) { return q.Commit(key, false, r, 3) })
	if r.Code(0) != tcproto.CodeOK {
		t.Fatalf("the reservation did not stay after the failed durable commit: %s", r.Code(0))
	}
	if !strings.Contains(log.String(), "durable put failed") || !strings.Contains(log.String(), "no space left on device") {
		t.Fatalf("the daemon's log does not say why:\n%s", log.String())
	}
	for _, k := range stored {
		if v, err := c.GetBytes(k); err != nil || len(v) != 256<<10 || v[0] != round[string(k)] {
			t.Fatalf("stored key %s after the L2 filled: %d bytes %v", k, len(v), err)
		}
	}
	t.Logf("L2 full after %d durable puts", len(stored))
}
