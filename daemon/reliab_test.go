package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// helperEnv makes the daemon test binary run a client helper (runHelper)
// instead of the tests, so a test can run clients as other uids.
const helperEnv = "TENSORCAST_DAEMON_TEST_HELPER"

// TestAcceptSurvivesEMFILE runs the tensorcastd binary under RLIMIT_NOFILE
// 96, with a fake systemd watching it, and opens 150 connections that it
// cannot all accept. While accepting fails for longer than
// accept_stall_timeout the daemon says it is unhealthy and stops its
// WATCHDOG keep-alives; once the connections close it accepts again, says
// so, resumes them, and serves a new client. The accept failures are
// logged a few times, not once per retry. A scrape over a keep-alive
// connection opened before shows the stall while it lasts
// (tensorcast_control_accept_failing_seconds), and the failed accepts
// after.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	p := startLimitedDaemon(t, 96, "--metrics-address", "127.0.0.1:0", "--metrics-reserved-fds", "8",
		"--metrics-idle-timeout", "1m", "--metrics-snapshot-interval", "1ms",
		"--max-conns", "1024", "--max-conns-per-uid", "1024", "--accept-stall-timeout", "300ms")
	if msg := p.next(t); msg != "WATCHDOG=1" {
		t.Fatalf("notify %q, want WATCHDOG=1 while healthy", msg)
	}
	mc, err := net.Dial("tcp", p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	br := bufio.NewReader(mc)
	if exp := scrapeOn(t, mc, br); sample(t, exp, "tensorcast_control_accept_failures_total") != 0 {
		t.Fatalf("accept failures before the flood:\n%s", exp)
	}

	conns := make([]*net.UnixConn, 0, 150)
	for range 150 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p.sock, Net: "unix"})
		if err != nil {
			t.Fatalf("connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	// Unhealthy: the status says why, and the keep-alives stop.
	for msg := p.next(t); !strings.HasPrefix(msg, "STATUS=unhealthy"); msg = p.next(t) {
		if msg != "WATCHDOG=1" {
			t.Fatalf("notify %q while accepting fails, want WATCHDOG=1 until STATUS=unhealthy", msg)
		}
	}
	exp := scrapeOn(t, mc, br)
	if sample(t, exp, "tensorcast_control_accept_failing_seconds") <= 0.3 || sample(t, exp, "tensorcast_control_accept_failures_total") == 0 ||
		sample(t, exp, "tensorcast_healthy") != 0 {
		t.Fatalf("the scrape while unhealthy does not show accepting failing past accept_stall_timeout (300ms):\n%s", exp)
	}
	// Six watchdog periods without a keep-alive.
	select {
	case msg := <-p.notes:
		t.Fatalf("notify %q while unhealthy: the keep-alives did not stop", msg)
	case <-time.After(300 * time.Millisecond):
	}
	for _, c := range conns {
		c.Close()
	}
	if msg := p.next(t); !strings.HasPrefix(msg, "STATUS=serving") {
		t.Fatalf("notify %q after the connections closed, want STATUS=serving", msg)
	}
	if msg := p.next(t); msg != "WATCHDOG=1" {
		t.Fatalf("notify %q, want WATCHDOG=1 once healthy again", msg)
	}
	c, err := client.Dial(p.sock, client.Options{Name: "after-emfile"})
	if err != nil {
		t.Fatalf("a new client after the flood: %v", err)
	}
	if err := c.Ping(nil); err != nil {
		t.Fatal(err)
	}
	c.Close()
	exp = scrapeOn(t, mc, br)
	if sample(t, exp, "tensorcast_control_accept_failing_seconds") != 0 || sample(t, exp, "tensorcast_control_accept_failures_total") == 0 {
		t.Fatalf("the scrape after recovery: want accepting no longer failing and the failures counted:\n%s", exp)
	}
	mc.Close()
	p.stop(t)
	log := p.log.String()
	n := strings.Count(log, "accept failing; retrying with back-off")
	if n == 0 || n > 4 || !strings.Contains(log, "too many open files") {
		t.Fatalf("%d accept-failure lines, want a few naming EMFILE:\n%s", n, log)
	}
	if !strings.Contains(log, "daemon unhealthy") || !strings.Contains(log, "accepting again") {
		t.Fatalf("log does not say the daemon went unhealthy and recovered:\n%s", log)
	}
}

// notifyChan is a fake systemd's notify socket whose datagrams arrive on a
// channel, so a test can also check that none comes for a while.
func notifyChan(t *testing.T) (string, <-chan string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			select {
			case ch <- string(buf[:n]):
			default: // nobody reads that many: drop
			}
		}
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
	})
	return p, ch
}

// tenantConfig is testConfig with two tenants, a (uid A) and b (uid B),
// a socket every user may reach and a test binary every user may run.
func tenantConfig(t *testing.T) (Config, string) {
	t.Helper()
	testutil.Require(t, testutil.Root) // to run clients as two other uids (setuid)
	dir, err := os.MkdirTemp("", "tc-tenants")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	cfg := testConfig(dir)
	cfg.SocketMode = 0o666
	cfg.Tenants = []TenantConfig{
		{Name: "a", UIDs: []uint32{uidA}, PoolSize: 16 << 20},
		{Name: "b", UIDs: []uint32{uidB}, PoolSize: 8 << 20},
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return cfg, bin
}

const uidA, uidB = 65534, 65533

// runAsUID runs the client helper kind (runHelper) as uid, with gid uid,
// against the daemon at socket with TC_ARGS args, and returns what it
// printed ("key value" lines); it fails the test unless the helper ended
// with "done ok".
func runAsUID(t *testing.T, bin, kind, socket string, uid uint32, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"="+kind, "TC_SOCKET="+socket, "TC_ARGS="+strings.Join(args, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, " ")
		got[k] = v
	}
	if err != nil || got["done"] != "ok" {
		t.Fatalf("%s helper as uid %d: %v\n%s", kind, uid, err, out)
	}
	return got
}

// TestTenantsTwoUIDs runs a daemon with two tenants and a client of each
// as its own uid. Each client maps only its tenant's pool (its own memfd,
// its own size); a fills all of its pool and writes a file in its own
// directory; b's whole pool is zero, b cannot name a's pool or open a's
// file; root is served without a pool and sees both tenants' usage in its
// stats and in the metrics.
func TestTenantsTwoUIDs(t *testing.T) {
	cfg, bin := tenantConfig(t)
	d, err := New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	if len(d.pools) != 2 || d.pools[0].ID() == d.pools[1].ID() || d.pools[0].Fd() == d.pools[1].Fd() {
		t.Fatalf("want two pools with their own ids and memfds, got %d", len(d.pools))
	}
	run := func(uid int, args ...string) map[string]string {
		return runAsUID(t, bin, "tenant", cfg.Socket, uint32(uid), args...)
	}
	a := run(uidA, "fill=165", "file=a.bin", "other="+strconv.FormatUint(uint64(d.pools[1].ID()), 10))
	b := run(uidB, "fill=0", "file="+filepath.Join(cfg.DataDir, "tenants", "a", "a.bin"),
		"other="+strconv.FormatUint(uint64(d.pools[0].ID()), 10))

	if a["seg"] != strconv.FormatUint(uint64(d.pools[0].ID()), 10) || a["size"] != strconv.Itoa(16<<20) {
		t.Fatalf("tenant a mapped pool %s of %s bytes", a["seg"], a["size"])
	}
	if b["seg"] != strconv.FormatUint(uint64(d.pools[1].ID()), 10) || b["size"] != strconv.Itoa(8<<20) {
		t.Fatalf("tenant b mapped pool %s of %s bytes", b["seg"], b["size"])
	}
	if b["nonzero"] != "0" {
		t.Fatalf("tenant b's pool has %s non-zero bytes after a filled all of its own", b["nonzero"])
	}
	if a["file"] != "OK" || a["file_roundtrip"] != "OK" {
		t.Fatalf("tenant a in its own directory: %s, %s", a["file"], a["file_roundtrip"])
	}
	if b["file"] != "PERMISSION_DENIED" {
		t.Fatalf("tenant b opening tenant a's file: %s, want PERMISSION_DENIED", b["file"])
	}
	for _, r := range []map[string]string{a, b} {
		if r["other_pool"] != "NOT_FOUND" {
			t.Fatalf("a transfer naming the other tenant's pool: %s, want NOT_FOUND", r["other_pool"])
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "tenants", "a", "a.bin")); err != nil {
		t.Fatalf("tenant a's file is not in its directory: %v", err)
	}
	// Each tenant has its own store over its own pool: b does not see the
	// key a put, and b's value under the same key is b's alone.
	if len(d.stores) != 2 {
		t.Fatalf("%d stores for 2 tenants", len(d.stores))
	}
	a = run(uidA, "store_only=1", "put=from-a")
	b = run(uidB, "store_only=1")
	if a["put"] != "OK" || a["get"] != "from-a" || b["get"] != "NOT_FOUND" {
		t.Fatalf("tenant a put %s and reads %q; tenant b reads %q, want NOT_FOUND", a["put"], a["get"], b["get"])
	}
	if b = run(uidB, "store_only=1", "put=from-b"); b["get"] != "from-b" {
		t.Fatalf("tenant b reads %q under its own key", b["get"])
	}
	if a = run(uidA, "store_only=1"); a["get"] != "from-a" {
		t.Fatalf("tenant a reads %q after b put under the same key, want its own from-a", a["get"])
	}

	c, err := client.Dial(cfg.Socket, client.Options{Name: "root", NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	counters := map[string]uint64{}
	for _, x := range st.Pool {
		counters[x.Name] = x.Value
	}
	if counters["tenant.a.size"] != 16<<20 || counters["tenant.b.size"] != 8<<20 {
		t.Fatalf("root's stats lack the tenants' pools: %v", counters)
	}
	m := scrapeMetrics(t, d.metricsSrv.Addr())
	for _, want := range []string{`tensorcast_pool_size_bytes{tenant="a"} 1.6777216e+07`, `tensorcast_pool_size_bytes{tenant="b"} 8.388608e+06`, "tensorcast_healthy 1"} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %q:\n%s", want, grepLines(m, "tensorcast_pool_size|healthy"))
		}
	}
}

func grepLines(s, alts string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, a := range strings.Split(alts, "|") {
			if strings.Contains(l, a) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// runHelper is the body of a helper process: "tenant" maps its pool,
// counts its non-zero bytes, fills it, tries a transfer naming the pool
// TC_ARGS other=, and registers TC_ARGS file= with a round trip through
// it, printing what each gave.
func runHelper(kind string) int {
	switch kind {
	case "handoff-dial":
		return runHandoffDial()
	case "handoff-offer":
		return runHandoffOffer()
	}
	if kind != "tenant" && kind != "peer-tenant" {
		fmt.Println("unknown helper", kind)
		return 2
	}
	args := map[string]string{}
	for _, kv := range strings.Split(os.Getenv("TC_ARGS"), ",") {
		k, v, _ := strings.Cut(kv, "=")
		args[k] = v
	}
	code := func(err error) string {
		var se *client.StatusError
		switch {
		case err == nil:
			return "OK"
		case errors.As(err, &se):
			return se.Code.String()
		}
		return err.Error()
	}
	if kind == "peer-tenant" {
		return runPeerTenantHelper(args, code)
	}
	c, err := client.Dial(os.Getenv("TC_SOCKET"), client.Options{Name: "tenant"})
	if err != nil {
		fmt.Println("dial", err)
		return 2
	}
	defer c.Close()
	// The store first (before the pool is filled): the tenant's own. Put
	// TC_ARGS put= under "shared/key" if given, then say what it holds for
	// this tenant.
	if v := args["put"]; v != "" {
		fmt.Println("put", code(c.PutBytes([]byte("shared/key"), []byte(v), false)))
	}
	if got, err := c.GetBytes([]byte("shared/key")); err == nil {
		fmt.Println("get", string(got))
	} else {
		fmt.Println("get", code(err))
	}
	if args["store_only"] != "" {
		fmt.Println("done ok")
		return 0
	}
	info, _ := c.Pool()
	fmt.Println("seg", info.Segment)
	fmt.Println("size", info.Size)
	const blk = 4 << 20
	offs, err := c.AllocBlocks(nil, int(info.Size/blk), blk)
	if err != nil {
		fmt.Println("alloc", err)
		return 2
	}
	mem := c.PoolBytes()
	nonzero := 0
	for _, v := range mem {
		if v != 0 {
			nonzero++
		}
	}
	fmt.Println("nonzero", nonzero)
	if f, _ := strconv.Atoi(args["fill"]); f != 0 {
		for i := range mem {
			mem[i] = byte(f)
		}
	}
	other, _ := strconv.ParseUint(args["other"], 10, 64)
	res := make([]error, 1)
	_, err = c.Transfer([]xfer.Request{{Op: xfer.OpRead, Local: info.Segment, LocalOffset: offs[0],
		Target: xfer.SegmentID(other), Length: 4096}}, 5*time.Second, res)
	if err == nil {
		err = res[0]
	}
	fmt.Println("other_pool", code(err))
	id, _, err := c.RegisterFile(args["file"], false, 1<<20)
	fmt.Println("file", code(err))
	if err == nil {
		_, err = c.Transfer([]xfer.Request{{Op: xfer.OpWrite, Local: info.Segment, LocalOffset: offs[0], Target: id, Length: 1 << 20}}, 5*time.Second, res)
		if err == nil {
			err = res[0]
		}
		fmt.Println("file_roundtrip", code(err))
	}
	if err := c.FreeBlocks(offs, make([]error, len(offs))); err != nil {
		fmt.Println("free", err)
		return 2
	}
	fmt.Println("done ok")
	return 0
}
