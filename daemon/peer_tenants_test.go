package daemon

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestPeerTenants runs two daemons with tenants a and b, their clients as
// two uids. On d1, a exports "kv" (bytes 0xa1) and "shared" (0x5a,
// granted to b), and b exports "kv" too (0xb2): the same name in two
// tenants. b's listing shows its own export only. On d2, b's client
// reads b's "d1/kv" and a's "d1/a/shared"; asking for a's "d1/a/kv" it is
// refused PERMISSION_DENIED and nothing reaches its buffer; a's client
// reads a's "d1/kv". d1 logs the refusal and counts it for tenant a.
func TestPeerTenants(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tenants across daemons")
	cfg1, bin := tenantConfig(t)
	cfg2, _ := tenantConfig(t)
	cfg1.DaemonID, cfg1.PeerListen, cfg1.ClusterKeyFile = "d1", "127.0.0.1:0", key
	cfg1.Peers = []PeerConfig{dialsIn("d2")}
	log1 := &lockedBuffer{}
	d1, err := New(cfg1, slog.New(slog.NewTextHandler(log1, nil)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d1)
	cfg2.DaemonID, cfg2.PeerListen, cfg2.ClusterKeyFile = "d2", "127.0.0.1:0", key
	cfg2.Peers = []PeerConfig{{ID: "d1", Addr: d1.PeerAddr()}}
	d2, err := New(cfg2, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d2)

	exporter := func(uid uint32, args ...string) map[string]string {
		t.Helper()
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), helperEnv+"=peer-tenant", "TC_SOCKET="+cfg1.Socket, "TC_ARGS="+strings.Join(args, ","))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stdin.Close() // the helper ends, and its exports with it
			if err := cmd.Wait(); err != nil {
				t.Errorf("exporter as uid %d: %v", uid, err)
			}
		})
		got := map[string]string{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), " ")
			got[k] = v
			if k == "ready" || k == "failed" {
				break
			}
		}
		if _, ok := got["ready"]; !ok {
			t.Fatalf("exporter as uid %d: %v", uid, got)
		}
		go io.Copy(io.Discard, stdout) //nolint:errcheck // drained until the helper exits
		return got
	}
	a := exporter(uidA, "export=kv+shared", "fill=161+90", "grants=+b")
	b := exporter(uidB, "export=kv", "fill=178")
	if a["export"] != "OK+OK" || b["export"] != "OK" {
		t.Fatalf("exports: a %q, b %q (b must be able to use the name a uses)", a["export"], b["export"])
	}
	if a["list"] != "kv+shared" || b["list"] != "kv" {
		t.Fatalf("listings: a %q, b %q; want each tenant's own exports only", a["list"], b["list"])
	}

	opener := func(uid uint32, names ...string) map[string]string {
		t.Helper()
		return runAsUID(t, bin, "peer-tenant", cfg2.Socket, uid, "open="+strings.Join(names, "+"))
	}
	gotB := opener(uidB, "d1/kv", "d1/a/shared", "d1/a/kv")
	want := map[string]string{"d1/kv": "OK b2", "d1/a/shared": "OK 5a", "d1/a/kv": "PERMISSION_DENIED untouched"}
	for name, w := range want {
		if gotB[name] != w {
			t.Errorf("b's client on d2, %s: %q, want %q", name, gotB[name], w)
		}
	}
	if gotB["remotes"] != "d1/a/shared+d1/kv" {
		t.Errorf("b's client on d2 lists %q, want the remote names it opened", gotB["remotes"])
	}
	if got := opener(uidA, "d1/kv")["d1/kv"]; got != "OK a1" {
		t.Errorf("a's client on d2, d1/kv: %q, want a's bytes", got)
	}
	if !strings.Contains(log1.String(), "request refused: open") {
		t.Errorf("d1 did not log the refused open:\n%s", log1.String())
	}
	if n, _ := d1.exports.Denied("a"); n != 1 {
		t.Errorf("d1 counts %d refusals for tenant a's exports, want 1", n)
	}
	m := scrapeMetrics(t, d1.metricsSrv.Addr())
	if !strings.Contains(m, `tensorcast_peer_tenant_denied_total{tenant="a"} 1`) {
		t.Errorf("metrics lack the refusal:\n%s", grepLines(m, "denied"))
	}
}

// runPeerTenantHelper is the client of TestPeerTenants (TC_ARGS):
// export=n1+n2 with fill=b1+b2 and grants=g1+g2 (each a tenant, or
// empty) exports a 64 KiB buffer of byte bi as ni granting gi, prints
// "export" (the codes), "list" (its Segments) and "ready", and holds the
// exports until stdin closes; open=r1+r2 opens each remote name and reads
// 4 KiB of it into a zeroed buffer, printing "ri OK xx" (the first byte)
// or "ri CODE untouched|touched", then "remotes" (its Segments).
func runPeerTenantHelper(args map[string]string, code func(error) string) int {
	c, err := client.Dial(os.Getenv("TC_SOCKET"), client.Options{Name: "peer-tenant", CallTimeout: 30 * time.Second})
	if err != nil {
		fmt.Println("failed dial", err)
		return 2
	}
	defer c.Close()
	if names := args["open"]; names != "" {
		buf, err := c.RegisterBuffer(4096)
		if err != nil {
			fmt.Println("failed register", err)
			return 2
		}
		for _, name := range strings.Split(names, "+") {
			clear(buf.Mem)
			rs, err := c.OpenRemote(name, client.RightRead)
			if err != nil {
				state := "untouched"
				if slices.ContainsFunc(buf.Mem, func(b byte) bool { return b != 0 }) {
					state = "touched"
				}
				fmt.Println(name, code(err), state)
				continue
			}
			res := make([]error, 1)
			r := xfer.Request{Op: xfer.OpRead, Local: buf.ID, Target: rs.ID, Length: 4096}
			if _, err := c.Transfer([]xfer.Request{r}, 20*time.Second, res); err != nil || res[0] != nil {
				fmt.Println(name, "read", code(err), code(res[0]))
				continue
			}
			fmt.Printf("%s OK %02x\n", name, buf.Mem[0])
		}
		segs, err := c.Segments()
		if err != nil {
			fmt.Println("failed segments", code(err))
			return 2
		}
		var remotes []string
		for _, s := range segs {
			remotes = append(remotes, s.Peer+"/"+s.Name)
		}
		slices.Sort(remotes)
		fmt.Println("remotes", strings.Join(remotes, "+"))
		fmt.Println("done ok")
		return 0
	}
	names := strings.Split(args["export"], "+")
	fills := strings.Split(args["fill"], "+")
	grants := strings.Split(args["grants"], "+")
	var codes []string
	for i, name := range names {
		buf, err := c.RegisterBuffer(64 << 10)
		if err != nil {
			fmt.Println("failed register", err)
			return 2
		}
		var fill byte
		fmt.Sscan(fills[i], &fill) //nolint:errcheck // the test passes numbers
		for j := range buf.Mem {
			buf.Mem[j] = fill
		}
		var g []string
		if i < len(grants) && grants[i] != "" {
			g = []string{grants[i]}
		}
		_, err = c.ExportSegmentTo(name, g, buf.ID, 0, 0, client.RightRead)
		codes = append(codes, code(err))
	}
	fmt.Println("export", strings.Join(codes, "+"))
	segs, err := c.Segments()
	if err != nil {
		fmt.Println("failed segments", code(err))
		return 2
	}
	var listed []string
	for _, s := range segs {
		if s.Peer == "" {
			listed = append(listed, s.Name)
		}
	}
	slices.Sort(listed)
	fmt.Println("list", strings.Join(listed, "+"))
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) //nolint:errcheck // until the test closes it
	return 0
}
