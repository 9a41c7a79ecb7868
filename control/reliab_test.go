package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Two users that are not root, for the tests that run helper processes
// under other uids (they need not exist in /etc/passwd).
const (
	uidA, uidB = 65534, 65533
	gidOther   = 4242
)

// openToAll makes the env's socket reachable by any user (mode 0666 is
// set by the caller's Config) and returns a copy of the test binary that
// any user may run (the test binary's own directory may be private).
func openToAll(t *testing.T, e *env) string {
	t.Helper()
	testutil.Require(t, testutil.Root) // to run helper processes under other uids (setuid)
	for _, d := range []string{e.dir, filepath.Dir(e.sock)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(e.dir, "helper")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runAs runs helper kind (runHelper) as uid, gid and supplementary groups
// against e's socket and returns what it printed, trimmed.
func runAs(t *testing.T, e *env, bin, kind string, uid, gid uint32, groups []uint32, env ...string) string {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), helperEnv+"="+kind, "TENSORCAST_TEST_SOCKET="+e.sock), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper %s as uid %d: %v: %s", kind, uid, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPartialFrameTimesOut: a client that sends 8 bytes of an 80-byte
// frame is answered DEADLINE_EXCEEDED and disconnected once FrameTimeout
// has passed; a connection idle between frames, and one whose frame came
// in two parts within the time, stay open and are served.
func TestPartialFrameTimesOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.FrameTimeout = timeout })
	idle := dialRaw(t, e.sock)
	expectCode(t, idle.call(&wire.PingRequest{}), tcproto.CodeOK)

	// A frame in two writes, the second well within the timeout: served,
	// and the deadline it armed is gone once it is whole.
	slow := dialRaw(t, e.sock)
	slow.id++
	slow.req.Ctx, slow.req.Body = wire.Context{RequestID: slow.id}, &wire.PingRequest{Payload: []byte("two parts")}
	frame := append([]byte(nil), wire.EncodeRequest(slow.b, &slow.req)...)
	if err := slow.send(frame[:6]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(timeout / 6) // the slow writer's pause: the behaviour under test, not a wait for an event
	if err := slow.send(frame[6:]); err != nil {
		t.Fatal(err)
	}
	r, _, err := slow.recv()
	if err != nil || r.Status != tcproto.CodeOK || r.RequestID != slow.id {
		t.Fatalf("two-part frame: %+v, %v", r, err)
	}

	partial := dialRaw(t, e.sock)
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[:], 76) // 4 + 76 = 80 bytes announced, 8 sent
	start := time.Now()
	if err := partial.send(hdr[:]); err != nil {
		t.Fatal(err)
	}
	r, _, err = partial.recv()
	if err != nil {
		t.Fatalf("no answer to a partial frame: %v", err)
	}
	expectCode(t, r, tcproto.CodeDEADLINE_EXCEEDED)
	partial.expectClosed()
	if took := time.Since(start); took < timeout || took > timeout+5*time.Second {
		t.Fatalf("partial frame closed after %v, want about %v", took, timeout)
	}
	// Both others have now been idle longer than the timeout.
	expectCode(t, idle.call(&wire.PingRequest{}), tcproto.CodeOK)
	expectCode(t, slow.call(&wire.PingRequest{}), tcproto.CodeOK)
	if !strings.Contains(e.logBuf.String(), "frame not completed in time") {
		t.Fatalf("timeout not logged:\n%s", e.logBuf.String())
	}
}

// TestLimitBreakingFrameFailsThatCall: a Submit of MaxRequests+1 requests
// and a FreeBlocks of MaxBlocks+1 offsets are refused with their request
// ids, and the next call on the same connection succeeds.
func TestLimitBreakingFrameFailsThatCall(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.Limits.MaxBlocks = 16 })
	c := dialRaw(t, e.sock)
	batch := body[wire.AllocBatchResponse](t, c.call(&wire.AllocBatchRequest{Capacity: 8})).Batch
	reqs := make([]xfer.Request, 4097)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: testPoolID, Target: testPoolID, Length: 4096}
	}
	// exchange checks that the answer carries the call's request id.
	expectCode(t, c.call(&wire.SubmitRequest{Batch: batch, Requests: reqs}), tcproto.CodeRESOURCE_EXHAUSTED)
	expectCode(t, c.call(&wire.PingRequest{Payload: []byte("after submit")}), tcproto.CodeOK)
	expectCode(t, c.call(&wire.FreeBlocksRequest{Offsets: make([]uint64, 17)}), tcproto.CodeRESOURCE_EXHAUSTED)
	expectCode(t, c.call(&wire.PingRequest{Payload: []byte("after free")}), tcproto.CodeOK)
	expectCode(t, c.call(&wire.TransferRequestBody{Requests: reqs, TimeoutMS: 1000}), tcproto.CodeRESOURCE_EXHAUSTED)
	r := c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})
	expectCode(t, r, tcproto.CodeOK)
	off := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	expectCode(t, c.call(&wire.FreeBlocksRequest{Offsets: []uint64{off}}), tcproto.CodeOK)
}

// TestPerUIDLimit: one uid at MaxConnsPerUID is refused more connections
// while another uid is still served; a flood of refusals is one log line
// and then a count, not a line each.
func TestPerUIDLimit(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) {
		c.Mode, c.MaxConns, c.MaxConnsPerUID = 0o666, 16, 4
		c.AllowedUIDs = []uint32{uidA}
		c.LogInterval = time.Hour // the count comes with Close
	})
	bin := openToAll(t, e)
	var mine []*rawClient
	for range 4 {
		c := dialRaw(t, e.sock)
		expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
		mine = append(mine, c)
	}
	const flood = 50
	for range flood {
		c := dialRaw(t, e.sock)
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, r, tcproto.CodeRESOURCE_EXHAUSTED)
		c.expectClosed()
	}
	if got := runAs(t, e, bin, "ping", uidA, uidA, nil); got != "status OK" {
		t.Fatalf("uid %d, while uid %d floods: %q", uidA, os.Getuid(), got)
	}
	for _, c := range mine {
		expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	}
	if n := strings.Count(e.logBuf.String(), "peer refused: its uid is at max_conns_per_uid"); n != 1 {
		t.Fatalf("%d log lines for %d refusals, want 1 until the interval ends:\n%s", n, flood, e.logBuf.String())
	}
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	log := e.logBuf.String()
	if !strings.Contains(log, fmt.Sprintf("count=%d", flood-1)) {
		t.Fatalf("the refusals after the first are not counted when the log flushes:\n%s", log)
	}
}

// TestCredentials: with AllowedUIDs naming someone else, root still gets
// in; DeniedUIDs keeps it out (TestPeerCredentials); a supplementary group
// listed in AllowedGIDs lets its member in, and without it the same user is
// refused.
func TestCredentials(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) {
		c.Mode = 0o666
		c.AllowedUIDs = []uint32{54321}
		c.AllowedGIDs = []uint32{gidOther}
	})
	if os.Getuid() == 0 {
		expectCode(t, dialRaw(t, e.sock).call(&wire.PingRequest{}), tcproto.CodeOK)
	}
	bin := openToAll(t, e)
	if got := runAs(t, e, bin, "ping", uidA, uidA, []uint32{100, gidOther}); got != "status OK" {
		t.Fatalf("member of supplementary group %d: %q", gidOther, got)
	}
	if got := runAs(t, e, bin, "ping", uidA, uidA, []uint32{100}); got != "status PERMISSION_DENIED" {
		t.Fatalf("same user without the group: %q", got)
	}
	if got := runAs(t, e, bin, "ping", uidA, gidOther, nil); got != "status OK" {
		t.Fatalf("primary gid %d: %q", gidOther, got)
	}
}

func TestParseStatusGroups(t *testing.T) {
	status := "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\nGroups:\t4 24 27 4242 \n"
	for _, c := range []struct {
		cr   cred
		want string
	}{
		{cred{Uid: 1000, Gid: 100}, "[4 24 27 4242]"},
		{cred{Uid: 1001, Gid: 100}, "[]"}, // the pid is another process's now
		{cred{Uid: 1000, Gid: 101}, "[]"},
	} {
		got, err := parseStatusGroups([]byte(status), c.cr)
		if err != nil || fmt.Sprint(got) != c.want {
			t.Errorf("%+v: %v %v, want %s", c.cr, got, err, c.want)
		}
	}
	if _, err := parseStatusGroups([]byte("Uid:\t1\nGid:\t1\nGroups:\tx\n"), cred{Uid: 1, Gid: 1}); err == nil {
		t.Error("a bad group number is accepted")
	}
}

// tenantEnv is an env with two tenants, a (uid A) and b (uid B), each with
// its own pool of testPoolSz bytes; opts apply after.
func tenantEnv(t *testing.T, opts ...envOpt) (*env, *shm.Pool) {
	t.Helper()
	var poolB *shm.Pool
	tenants := func(c *Config, d *Deps) {
		c.Mode = 0o666
		var err error
		poolB, err = shm.NewPool(shm.PoolConfig{ID: d.Registry.NextID(), Size: testPoolSz, Hugepages: shm.HugepagesOff,
			MinBlock: testMinBlk, MaxBlock: testMaxBlk}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { poolB.Close() })
		if err := d.Registry.Add(poolB); err != nil {
			t.Fatal(err)
		}
		d.Tenants = []Tenant{{Name: "a", UIDs: []uint32{uidA}, Pool: d.Pool}, {Name: "b", UIDs: []uint32{uidB}, Pool: poolB}}
		d.Pool = nil
	}
	e := newEnv(t, false, append([]envOpt{tenants}, opts...)...)
	return e, poolB
}

// TestTenantIsolation runs a client of tenant a and one of tenant b as two
// real uids. Each is passed only its own tenant's pool; a fills its whole
// pool with its bytes and frees it; b then allocates its whole pool and
// finds only zeros; neither can name the other's pool in a transfer, nor
// open the other's memfd through the daemon's /proc.
func TestTenantIsolation(t *testing.T) {
	e, poolB := tenantEnv(t)
	bin := openToAll(t, e)
	fdOf := func(p *shm.Pool) string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), p.Fd()) }
	run := func(uid uint32, fill byte, other *shm.Pool) map[string]string {
		out := runAs(t, e, bin, "tenant", uid, uid, nil, "TC_FILL="+strconv.Itoa(int(fill)),
			"TC_OTHER_SEG="+strconv.FormatUint(uint64(other.ID()), 10), "TC_OTHER_FD="+fdOf(other))
		got := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			k, v, _ := strings.Cut(l, " ")
			got[k] = v
		}
		if got["done"] != "ok" {
			t.Fatalf("tenant helper as uid %d:\n%s", uid, out)
		}
		return got
	}
	a := run(uidA, 0xa5, poolB)
	if a["seg"] != strconv.FormatUint(uint64(e.pool.ID()), 10) {
		t.Fatalf("tenant a was given pool %s, want %d", a["seg"], e.pool.ID())
	}
	b := run(uidB, 0x5b, e.pool)
	if b["seg"] != strconv.FormatUint(uint64(poolB.ID()), 10) {
		t.Fatalf("tenant b was given pool %s, want %d", b["seg"], poolB.ID())
	}
	if b["nonzero"] != "0" {
		t.Fatalf("tenant b found %s non-zero bytes in its fresh pool after a filled and freed a whole pool", b["nonzero"])
	}
	for _, r := range []map[string]string{a, b} {
		for _, k := range []string{"read_other", "write_other", "buffer_from_other"} {
			if r[k] != tcproto.CodeNOT_FOUND.String() {
				t.Fatalf("a transfer naming the other tenant's pool (%s): %s, want NOT_FOUND", k, r[k])
			}
		}
		if !strings.Contains(r["open_other"], "permission denied") {
			t.Fatalf("opening the other tenant's memfd through /proc: %s", r["open_other"])
		}
	}
	// a's bytes are still in a's pool (its memory never went to b), and b's
	// whole pool holds b's.
	for _, x := range []struct {
		p    *shm.Pool
		want byte
	}{{e.pool, 0xa5}, {poolB, 0x5b}} {
		for i, v := range x.p.Bytes() {
			if v != x.want {
				t.Fatalf("pool %d byte %d is %#x, want %#x", x.p.ID(), i, v, x.want)
			}
		}
	}
	// Root, in no tenant, is let in without a pool; its stats show every
	// tenant's usage.
	c := dialRaw(t, e.sock)
	r, fds := c.callFD(&wire.PoolInfoRequest{})
	closeFDs(fds)
	expectCode(t, r, tcproto.CodePERMISSION_DENIED)
	st := body[wire.StatsResponse](t, c.call(&wire.StatsRequest{}))
	names := map[string]bool{}
	for _, ct := range st.Pool {
		names[ct.Name] = true
	}
	if !names["tenant.a.size"] || !names["tenant.b.used"] {
		t.Fatalf("admin stats without per-tenant pool usage: %+v", st.Pool)
	}
	if a, b := e.pool.Stats(), poolB.Stats(); a.Blocks != 0 || b.Blocks != 0 {
		t.Fatalf("blocks left after the clients freed theirs: a %d, b %d", a.Blocks, b.Blocks)
	}
}

// runTenantHelper is the "tenant" helper: a client that maps its pool,
// allocates all of it, counts the bytes that are not zero, fills it with
// TC_FILL (when not 0), tries to reach the pool TC_OTHER_SEG in transfers
// and the memfd at TC_OTHER_FD, frees what it took, and prints what
// happened, one "key value" per line.
func runTenantHelper() int {
	fail := func(what string, err error) int {
		fmt.Println(what, err)
		return 2
	}
	c, err := client.Dial(os.Getenv("TENSORCAST_TEST_SOCKET"), client.Options{Name: "tenant"})
	if err != nil {
		return fail("dial", err)
	}
	defer c.Close()
	info, _ := c.Pool()
	fmt.Println("seg", info.Segment)
	n := int(info.Size / testMaxBlk)
	offs, err := c.AllocBlocks(nil, n, testMaxBlk)
	if err != nil {
		return fail("alloc", err)
	}
	mem := c.PoolBytes()
	nonzero := 0
	for _, off := range offs {
		for _, v := range mem[off : off+testMaxBlk] {
			if v != 0 {
				nonzero++
			}
		}
	}
	fmt.Println("nonzero", nonzero)
	fill, _ := strconv.Atoi(os.Getenv("TC_FILL"))
	if fill != 0 {
		for _, off := range offs {
			for i := range mem[off : off+testMaxBlk] {
				mem[off+uint64(i)] = byte(fill)
			}
		}
	}
	other, _ := strconv.ParseUint(os.Getenv("TC_OTHER_SEG"), 10, 64)
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		return fail("register", err)
	}
	code := func(r xfer.Request) string {
		res := make([]error, 1)
		if _, err := c.Transfer([]xfer.Request{r}, 5*time.Second, res); err != nil {
			return "call:" + err.Error()
		}
		var ce *client.StatusError
		if res[0] == nil {
			return tcproto.CodeOK.String()
		}
		if errors.As(res[0], &ce) {
			return ce.Code.String()
		}
		return res[0].Error()
	}
	seg := xfer.SegmentID(other)
	fmt.Println("read_other", code(xfer.Request{Op: xfer.OpRead, Local: info.Segment, LocalOffset: offs[0], Target: seg, Length: 4096}))
	fmt.Println("write_other", code(xfer.Request{Op: xfer.OpWrite, Local: info.Segment, LocalOffset: offs[0], Target: seg, Length: 4096}))
	fmt.Println("buffer_from_other", code(xfer.Request{Op: xfer.OpRead, Local: buf.ID, Target: seg, Length: 4096}))
	f, err := os.OpenFile(os.Getenv("TC_OTHER_FD"), os.O_RDWR, 0)
	if err == nil {
		f.Close()
		fmt.Println("open_other opened")
	} else {
		fmt.Println("open_other", err)
	}
	if err := c.FreeBlocks(offs, make([]error, len(offs))); err != nil {
		return fail("free", err)
	}
	fmt.Println("done ok")
	return 0
}

// TestFDLostToEMFILE: a RegisterBuffer whose memfd the daemon cannot
// receive because it is out of file descriptors fails that call with
// RESOURCE_EXHAUSTED and its request id; the connection stays, and the
// same call succeeds once fds are back.
func TestFDLostToEMFILE(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	fd := newMemfd(t, 1<<20)
	defer unix.Close(fd)
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	// No new fd can be had below 3: stdin, stdout and stderr hold them.
	low := unix.Rlimit{Cur: 3, Max: old.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err := c.sendBody(&wire.RegisterBufferRequest{Size: 1 << 20}, fd)
	var r *wire.Response
	if err == nil {
		r, _, err = c.recv()
	}
	if serr := unix.Setrlimit(unix.RLIMIT_NOFILE, &old); serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, tcproto.CodeRESOURCE_EXHAUSTED)
	if r.RequestID != c.id {
		t.Fatalf("answer for request %d, want %d", r.RequestID, c.id)
	}
	r = c.call(&wire.RegisterBufferRequest{Size: 1 << 20}, fd)
	expectCode(t, r, tcproto.CodeOK)
	expectCode(t, c.call(&wire.UnregisterBufferRequest{Segment: body[wire.RegisterBufferResponse](t, r).Segment}), tcproto.CodeOK)
}

// TestStoreKeyNamespace: two tenants' equal keys are different store keys,
// and a tenant strips only its own.
func TestStoreKeyNamespace(t *testing.T) {
	cfg := Config{}
	pa, pb := &fakePoolID{id: 1}, &fakePoolID{id: 2}
	ts, admin, err := buildTenants(&cfg, &Deps{Tenants: []Tenant{{Name: "a", UIDs: []uint32{1}, Pool: pa}, {Name: "b", UIDs: []uint32{2}, Pool: pb}}})
	if err != nil || admin != nil || len(ts) != 2 {
		t.Fatalf("buildTenants: %v %v %d", err, admin, len(ts))
	}
	ka, kb := ts[0].StoreKey(nil, []byte("k")), ts[1].StoreKey(nil, []byte("k"))
	if string(ka) == string(kb) || len(ka) != StoreKeyPrefixLen+1 {
		t.Fatalf("keys %q and %q", ka, kb)
	}
	if k, ok := ts[0].StripStoreKey(ka); !ok || string(k) != "k" {
		t.Fatalf("a strips its own key to %q %v", k, ok)
	}
	if _, ok := ts[0].StripStoreKey(kb); ok {
		t.Fatal("a strips b's key")
	}
	for _, bad := range [][]Tenant{
		{{Name: "a", UIDs: []uint32{1}, Pool: pa}, {Name: "b", UIDs: []uint32{1}, Pool: pb}},
		{{Name: "a", GIDs: []uint32{7}, Pool: pa}, {Name: "b", GIDs: []uint32{7}, Pool: pb}},
		{{Name: "a", UIDs: []uint32{1}, Pool: pa}, {Name: "b", UIDs: []uint32{2}, Pool: pa}},
		{{Name: "a", UIDs: []uint32{1}, Pool: pa}, {Name: "a", UIDs: []uint32{2}, Pool: pb}},
		{{Name: "no/slash", UIDs: []uint32{1}, Pool: pa}},
		{{Name: "a", UIDs: []uint32{1}}},
	} {
		if _, _, err := buildTenants(&cfg, &Deps{Tenants: bad}); !errors.Is(err, ErrConfig) {
			t.Errorf("tenants %+v accepted: %v", bad, err)
		}
	}
}

// fakePoolID is a Pool that only has an id (for configuration checks).
type fakePoolID struct {
	Pool
	id xfer.SegmentID
}

func (p *fakePoolID) ID() xfer.SegmentID { return p.id }

// TestTenantOf: a uid listed by a tenant picks it; else the one tenant of
// its primary or supplementary gids; two are ambiguous and refused; root
// and the daemon's uid get in without a tenant unless denied; anyone else
// is refused.
func TestTenantOf(t *testing.T) {
	pa, pb := &fakePoolID{id: 1}, &fakePoolID{id: 2}
	cfg := Config{DeniedUIDs: []uint32{666}}
	ts, admin, err := buildTenants(&cfg, &Deps{Tenants: []Tenant{
		{Name: "a", UIDs: []uint32{1000}, GIDs: []uint32{50}, Pool: pa},
		{Name: "b", GIDs: []uint32{60}, Pool: pb}}})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{cfg: cfg, tenants: ts, admin: admin}
	for _, c := range []struct {
		cr   cred
		want string // tenant name, "-" for none, "refused"
	}{
		{cred{Uid: 1000, Gid: 60}, "a"}, // the uid wins over the gid
		{cred{Uid: 2000, Gid: 50}, "a"},
		{cred{Uid: 2000, Gid: 1, Groups: []uint32{9, 60}}, "b"},
		{cred{Uid: 2000, Gid: 50, Groups: []uint32{60}}, "refused"}, // in both by group
		{cred{Uid: 2000, Gid: 1}, "refused"},
		{cred{Uid: 0, Gid: 0}, "-"},
		{cred{Uid: uint32(os.Geteuid()), Gid: 1}, "-"},
		{cred{Uid: 666, Gid: 50}, "refused"},
	} {
		tn, err := s.tenantOf(c.cr)
		got := "-"
		switch {
		case err != nil:
			got = "refused"
			if !errors.Is(err, ErrPermission) {
				t.Errorf("%+v: %v is not ErrPermission", c.cr, err)
			}
		case tn != nil:
			got = tn.Name
		}
		if got != c.want {
			t.Errorf("%+v: %s, want %s", c.cr, got, c.want)
		}
	}
}
