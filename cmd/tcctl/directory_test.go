package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/daemon"
	"github.com/tensorcast/tensorcast/directory/etcdtest"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// startDirDaemon runs a tensorcastd with a peer plane on 127.0.0.1 as id,
// mut adjusting its config; it returns the socket.
func startDirDaemon(t *testing.T, id, key string, mut func(*daemon.Config)) string {
	t.Helper()
	_, cfg := startTensorcastd(t, func(c *daemon.Config) {
		c.DaemonID, c.RDMA, c.MetricsAddress = id, "off", "off"
		c.PeerListen, c.ClusterKeyFile = "127.0.0.1:0", key
		if mut != nil {
			mut(c)
		}
	})
	return cfg.Socket
}

func dialT(t *testing.T, sock string) *client.Client {
	t.Helper()
	c, err := client.Dial(sock, client.Options{Name: "directory-test", NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// memberRow returns the fields of the member table's row of id.
func memberRow(out, id string) []string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == id {
			return f
		}
	}
	return nil
}

// TestDirectoryEtcd: tcctl directory against daemons on a real etcd shows
// the backend, its state, the cache's hit rate, and both members with the
// epochs they run and the lease time they have left; with etcd stopped it
// answers at once, saying the store is down and the leases unknown.
func TestDirectoryEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tcctl directory test key")
	withEtcd := func(c *daemon.Config) {
		c.Directory, c.EtcdEndpoints, c.EtcdPrefix = "etcd", srv.Endpoints(), "/tcctl/"
		c.StalenessBudget = daemon.Duration(500 * time.Millisecond)
	}
	s1 := startDirDaemon(t, "d1", key, withEtcd)
	s2 := startDirDaemon(t, "d2", key, withEtcd)
	c1, c2 := dialT(t, s1), dialT(t, s2)
	d2, err := c2.Directory()
	if err != nil {
		t.Fatal(err)
	}
	if d2.Backend != "etcd" || d2.Self != "d2" || d2.Epoch == 0 {
		t.Fatalf("d2's own directory: %+v", d2)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		d, err := c1.Directory()
		return err == nil && len(d.Members) == 2
	}, "d1's directory listing both members")
	if _, err := c1.OpenRemote("d9/kv", client.RightRead); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("open of an unknown daemon: %v", err)
	}
	d1, err := c1.Directory()
	if err != nil {
		t.Fatal(err)
	}

	code, out, errs := tcctl(t, nil, "--socket", s1, "directory")
	if code != 0 {
		t.Fatalf("directory: %d %q", code, errs)
	}
	t.Logf("tcctl directory:\n%s", out)
	for _, want := range []string{
		"backend:  etcd " + srv.Endpoint() + " prefix /tcctl/\n",
		"state:    up since ",
		fmt.Sprintf("self:     d1 epoch %#x\n", d1.Epoch),
		"budget:   staleness 500ms, lease ttl 10s\n",
		"lookups:  1, hit rate 100.0 %, fallback rate 0.0 % (store 0, peer 0), failed closed 0, not found 1",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	row := memberRow(out, "d2")
	if len(row) != 6 || row[1] != fmt.Sprintf("%#x", d2.Epoch) || !strings.HasPrefix(row[2], "127.0.0.1:") || row[3] != "tcp,notify" {
		t.Fatalf("d2's row %q:\n%s", row, out)
	}
	if left, err := time.ParseDuration(row[5]); err != nil || left <= 0 || left > 10*time.Second {
		t.Fatalf("d2's lease left %q (%v), want within the 10s TTL", row[5], err)
	}
	if row := memberRow(out, "d1"); len(row) != 7 || row[1] != "(self)" || row[2] != fmt.Sprintf("%#x", d1.Epoch) {
		t.Fatalf("d1's row %q:\n%s", row, out)
	}

	srv.Stop()
	testutil.Eventually(t, 10*time.Second, func() bool {
		d, err := c1.Directory()
		return err == nil && d.State == "down"
	}, "d1 reporting etcd down")
	start := time.Now()
	code, out, errs = tcctl(t, nil, "--socket", s1, "directory")
	if took := time.Since(start); took > time.Second {
		t.Fatalf("tcctl directory with etcd down took %v: the report waited on the store", took)
	}
	if code != 0 || !strings.Contains(out, "state:    down since ") || !strings.Contains(out, "1 outages") {
		t.Fatalf("directory with etcd down: %d %q\n%s", code, errs, out)
	}
	if row := memberRow(out, "d2"); len(row) != 6 || row[5] != "-" {
		t.Fatalf("d2's row with etcd down %q, want its lease unknown:\n%s", row, out)
	}
}

// TestDirectoryEmbedded: with the embedded directory, tcctl directory
// says so and lists the configured peers, with the epoch a handshake
// told where there was one.
func TestDirectoryEmbedded(t *testing.T) {
	sock := startDirDaemon(t, "host-a", testutil.KeyFile(t, t.TempDir(), "cluster.key", "tcctl directory test key"), func(c *daemon.Config) {
		c.Peers = []daemon.PeerConfig{{ID: "decode-1", Addr: "10.0.0.2:7400"}, {ID: "decode-2"}}
	})
	d, err := dialT(t, sock).Directory()
	if err != nil {
		t.Fatal(err)
	}
	if d.Backend != "embedded" || d.State != "static" || d.Self != "host-a" || d.Epoch == 0 || len(d.Members) != 3 {
		t.Fatalf("embedded directory: %+v", d)
	}
	code, out, errs := tcctl(t, nil, "--socket", sock, "directory")
	if code != 0 {
		t.Fatalf("directory: %d %q", code, errs)
	}
	t.Logf("tcctl directory:\n%s", out)
	if !strings.HasPrefix(out, "backend:  embedded: the peers in this daemon's config") || strings.Contains(out, "lookups:") {
		t.Fatalf("output does not say the directory is embedded:\n%s", out)
	}
	if r := memberRow(out, "decode-1"); strings.Join(r, " ") != "decode-1 - 10.0.0.2:7400" {
		t.Fatalf("decode-1 row %q:\n%s", r, out)
	}
	if r := memberRow(out, "decode-2"); strings.Join(r, " ") != "decode-2 - -" {
		t.Fatalf("decode-2 row %q:\n%s", r, out)
	}
	if r := memberRow(out, "host-a"); len(r) != 4 || r[2] != fmt.Sprintf("%#x", d.Epoch) || !strings.HasPrefix(r[3], "127.0.0.1:") {
		t.Fatalf("host-a row %q:\n%s", r, out)
	}
	if code, _, _ := tcctl(t, nil, "--socket", sock, "directory", "extra"); code != 2 {
		t.Fatalf("directory with an argument: exit %d", code)
	}
}

// TestDirectoryFormat: the rates are computed from the counters, an age
// the store never confirmed reads "never", a cut listing says how many
// members it left out; a server without a directory is an error.
func TestDirectoryFormat(t *testing.T) {
	var b strings.Builder
	writeDirectory(&b, client.DirectoryInfo{Backend: "etcd", State: "up", Endpoints: []string{"http://a:2379", "http://b:2379"},
		Prefix: "/p/", Self: "d1", Epoch: 0xabc, BudgetMS: 2000, LeaseTTLMS: 10000,
		Cache: client.DirectoryCache{Lookups: 200, Hits: 190, FallbackStore: 6, FallbackPeer: 4, Unavailable: 2, AgeMS: client.AgeNever},
		Members: []client.DirectoryMember{{ID: "d2", Epoch: 0xdef, Addr: "h:1", Caps: []string{"tcp"}, AgeMS: client.AgeNever,
			LeaseLeftMS: 4000, LeaseKnown: true}},
		MembersTotal: 3})
	out := b.String()
	for _, want := range []string{
		"backend:  etcd http://a:2379,http://b:2379 prefix /p/\n",
		"state:    up, 0 outages\n",
		"cache:    age never,",
		"lookups:  200, hit rate 95.0 %, fallback rate 5.0 % (store 6, peer 4), failed closed 2,",
		"... and 2 more members",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	if r := memberRow(out, "d2"); strings.Join(r, " ") != "d2 0xdef h:1 tcp never 4s" {
		t.Fatalf("d2 row %q:\n%s", r, out)
	}
	code, _, errs := tcctl(t, nil, "--socket", startDaemon(t), "directory")
	if code != 1 || !strings.Contains(strings.ToLower(errs), "unavailable") {
		t.Fatalf("a server without a directory: %d %q", code, errs)
	}
}
