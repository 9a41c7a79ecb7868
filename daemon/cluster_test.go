package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// startTrio runs three daemons of one cluster on loopback ports: d1
// accepts the others dialing in, d2 knows d1, d3 knows both; it returns
// once every daemon knows the others' epochs (the store across hosts has
// greeted them).
func startTrio(t *testing.T) []*peerDaemon {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast store across hosts test key")
	noL2 := func(c *Config) { c.StoreL2Path = "off"; c.StoreShards = 64 }
	d1 := startPeerWith(t, "d1", key, "", noL2, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", noL2, d1.peer(), dialsIn("d3"))
	d3 := startPeerWith(t, "d3", key, "", noL2, d1.peer(), d2.peer())
	ds := []*peerDaemon{d1, d2, d3}
	waitMembers(t, ds, "d1", "d2", "d3")
	return ds
}

// waitMembers waits until every daemon of ds sees exactly the members ids
// up (and knows their epochs).
func waitMembers(t testing.TB, ds []*peerDaemon, ids ...string) {
	t.Helper()
	for _, d := range ds {
		if d.d.cluster == nil {
			t.Fatalf("%s runs no store across hosts", d.cfg.DaemonID)
		}
		p := nodePeers{d.d.peers.Node()}
		testutil.Eventually(t, 10*time.Second, func() bool {
			for _, id := range ids {
				if id != d.cfg.DaemonID && p.EpochOf(id) == 0 {
					return false
				}
			}
			return slices.Equal(d.d.cluster.Members(), ids)
		}, "%s seeing members %v (it sees %v)", d.cfg.DaemonID, ids, testutil.Lazy(d.d.cluster.Members))
	}
}

// putKnown puts key with a value of size bytes on d and waits until its
// home, asked from reader, knows d as its only holder; it returns the value.
func putKnown(t testing.TB, d, reader *peerDaemon, key []byte, size int) []byte {
	t.Helper()
	v := clusterValue(key, size)
	if err := d.dial(t, "putter").PutBytes(key, v, false); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, hs, err := reader.d.cluster.Locate(key)
		return err == nil && len(hs) == 1 && hs[0].ID == d.cfg.DaemonID
	}, "%s announced", key)
	return v
}

// clusterValue is key's value: size bytes from a generator seeded by the
// key, so that any daemon's reader can check it.
func clusterValue(key []byte, size int) []byte {
	rng := rand.New(rand.NewPCG(uint64(len(key)), uint64(castagnoliSum(key))))
	v := make([]byte, size)
	for i := range v {
		v[i] = byte(rng.Uint32())
	}
	return v
}

func castagnoliSum(b []byte) uint32 {
	h := uint32(0)
	for _, c := range b {
		h = h*31 + uint32(c)
	}
	return h
}

// TestStoreAcrossHosts puts keys on one daemon and reads them, byte-exact,
// on the two others: Exists, LookupPrefix and Get through a queue, the
// copying read through the socket; then a Remove on one removes every
// copy.
func TestStoreAcrossHosts(t *testing.T) {
	ds := startTrio(t)
	put := ds[0].dial(t, "putter")
	const n = 24
	keys := make([][]byte, n)
	sizes := []int{1, 4096, 65536 + 17, 256 << 10}
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "chain/%02d", i)
		if err := put.PutBytes(keys[i], clusterValue(keys[i], sizes[i%len(sizes)]), false); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	// The announcements are asynchronous: wait until every key's home
	// knows its holder.
	for _, k := range keys {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := ds[1].d.cluster.Locate(k)
			return err == nil && len(hs) == 1 && hs[0].ID == "d1"
		}, "%s announced to its home", k)
	}

	for _, d := range ds[1:] {
		c := d.dial(t, "reader")
		q, err := c.OpenQueue(16)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.NewResults(n + 1)
		if err != nil {
			t.Fatal(err)
		}
		call := func(ud uint64, submit func() (bool, error)) client.Completion {
			t.Helper()
			if ok, err := submit(); !ok || err != nil {
				t.Fatalf("%s: submit %d: %v %v", d.cfg.DaemonID, ud, ok, err)
			}
			cqes := make([]client.Completion, 1)
			if got, err := q.Reap(cqes, 1, 10*time.Second); got != 1 || err != nil || cqes[0].UserData != ud {
				t.Fatalf("%s: reap %d: %d %v %+v", d.cfg.DaemonID, ud, got, err, cqes[0])
			}
			return cqes[0]
		}
		// Exists answers for the whole cluster; an absent key stays absent.
		probe := append(append([][]byte(nil), keys[:4]...), []byte("chain/absent"))
		call(1, func() (bool, error) { return q.Exists(probe, res, 1) })
		for i := range probe {
			want := error(nil)
			if i == 4 {
				want = client.ErrNotFound
			}
			if err := res.Err(i); !errors.Is(err, want) && err != want {
				t.Fatalf("%s: exists %s: %v, want %v", d.cfg.DaemonID, probe[i], err, want)
			}
		}
		// LookupPrefix: the leading run, up to the absent key.
		chain := append(append([][]byte(nil), keys[:6]...), []byte("chain/absent"), keys[6])
		if cq := call(2, func() (bool, error) { return q.LookupPrefix(chain, false, 2) }); cq.N != 6 {
			t.Fatalf("%s: lookup_prefix %d, want 6 (%+v)", d.cfg.DaemonID, cq.N, cq)
		}
		// Get through the queue: read in place, byte-exact.
		half := keys[:n/2]
		if d == ds[2] {
			half = keys[n/2:]
		}
		cq := call(3, func() (bool, error) { return q.Get(half, res, 3) })
		if err := res.Check(cq); err != nil {
			t.Fatalf("%s: get: %v", d.cfg.DaemonID, err)
		}
		for i, k := range half {
			if err := res.Err(i); err != nil {
				t.Fatalf("%s: get %s: %v\n%s", d.cfg.DaemonID, k, err, d.log)
			}
			if want := clusterValue(k, len(res.Value(i))); !bytes.Equal(res.Value(i), want) || len(want) != sizeOf(keys, sizes, k) {
				t.Fatalf("%s: get %s: %d bytes, not the value put", d.cfg.DaemonID, k, len(res.Value(i)))
			}
		}
		call(4, func() (bool, error) { return q.Unpin(half, res, 4) })
		// The copying read through the socket, of the other half.
		other := keys[n/2:]
		if d == ds[2] {
			other = keys[:n/2]
		}
		for _, k := range other {
			v, err := c.GetBytes(k)
			if err != nil || !bytes.Equal(v, clusterValue(k, sizeOf(keys, sizes, k))) {
				t.Fatalf("%s: read %s: %d bytes, %v", d.cfg.DaemonID, k, len(v), err)
			}
		}
	}
	// d2 and d3 keep the values they read, announced as holders too.
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, hs, err := ds[0].d.cluster.Locate(keys[0])
		return err == nil && len(hs) == 3
	}, "three holders of %s", keys[0])

	// What d2 read shows in its metrics, by holder, and in its Stats.
	exp := scrapeMetrics(t, ds[1].d.MetricsAddr())
	for _, want := range []string{`tensorcast_cluster_remote_gets_total{peer="d1"} 24`, "tensorcast_cluster_members 3",
		"tensorcast_cluster_crc_mismatches_total 0"} {
		if !strings.Contains(exp, want+"\n") {
			t.Errorf("d2's scrape lacks %q", want)
		}
	}
	st, err := ds[1].dial(t, "stats").Stats()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, k := range st.Transports {
		m[k.Name] = k.Value
	}
	if m["cluster_remote_hits"] != n || m["cluster_members"] != 3 || m["cluster_home_cache_hits"] == 0 {
		// A copying read asks for the size, then for the holders: the
		// second is answered from the cache.
		t.Errorf("d2's cluster counters: hits %d, members %d, home answers from the cache %d",
			m["cluster_remote_hits"], m["cluster_members"], m["cluster_home_cache_hits"])
	}
	// The queue's get of several keys read them over tcp in one batch,
	// whose checksums the transport took as the bytes landed.
	if m["cluster_crc_on_landing"] == 0 {
		t.Errorf("d2's cluster counters: no value checked by the checksum taken as it landed (%d remote hits)", m["cluster_remote_hits"])
	}

	// A Remove on d3 removes every copy.
	rm := ds[2].dial(t, "remover")
	if err := rm.StoreRemove(keys[:1], make([]error, 1)); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		c := d.dial(t, "after-remove")
		if _, err := c.GetBytes(keys[0]); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("%s: %s after its removal: %v, want NOT_FOUND", d.cfg.DaemonID, keys[0], err)
		}
	}
}

func sizeOf(keys [][]byte, sizes []int, k []byte) int {
	for i, x := range keys {
		if bytes.Equal(x, k) {
			return sizes[i%len(sizes)]
		}
	}
	return -1
}

// clusterChildEnv carries the killed daemon's set-up to the child process:
// "dir|cluster key file|d1 address|d2 address", then options: "replicas"
// (an L2 and two copies), "etcd=ENDPOINT" (directory = etcd; the
// addresses are not used).
const clusterChildEnv = "TENSORCAST_TEST_CLUSTER_DAEMON"

// clusterConfig is a daemon of the kill test's cluster.
func clusterConfig(c *Config) { c.StoreL2Path = "off"; c.StoreShards = 64 }

// clusterChild is daemon d3 of TestStoreAcrossHostsKilled, in a process of
// its own so that the test can SIGKILL it.
func clusterChild(t *testing.T, spec string) {
	parts := strings.Split(spec, "|")
	if len(parts) < 4 {
		t.Fatalf("child spec %q", spec)
	}
	replicas, etcd := false, ""
	for _, o := range parts[4:] {
		switch {
		case o == "replicas":
			replicas = true
		case strings.HasPrefix(o, "etcd="):
			etcd = strings.TrimPrefix(o, "etcd=")
		default:
			t.Fatalf("child spec %q: option %q", spec, o)
		}
	}
	cfg := testConfig(parts[0])
	cfg.PoolSize = 32 << 20
	cfg.DaemonID = "d3"
	cfg.PeerListen = "127.0.0.1:0"
	cfg.ClusterKeyFile = parts[1]
	cfg.PeerSliceSize = 64 << 10
	cfg.Peers = []PeerConfig{{ID: "d1", Addr: parts[2]}, {ID: "d2", Addr: parts[3]}}
	clusterConfig(&cfg)
	if replicas { // TestStoreReplicasSurviveKill9's: an L2 and two copies
		cfg.StoreL2Path = ""
		replicaConfig(&cfg)
	}
	if etcd != "" { // the members and shard claims in etcd, no peers listed
		cfg.Peers = nil
		chaosEtcd(&cfg, etcd)
	}
	d, err := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)), env(nil))
	if err != nil {
		t.Fatalf("child daemon: %v", err)
	}
	ctx, cancel := contextUntil(nil)
	defer cancel()
	d.Run(ctx) //nolint:errcheck // killed while it runs
}

// TestStoreAcrossHostsKilled: d3, a holder and a home, is stopped with
// SIGSTOP (gets of what it holds end by their deadlines) and then killed
// with SIGKILL; on d2 every get then ends, well before its deadline, with the
// exact bytes (keys d1 holds whose home lives), a miss, or an error that
// names what failed (keys d3 held or was home of), never other bytes; and
// what d3 held is no longer pinned or claimed anywhere.
func TestStoreAcrossHostsKilled(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		clusterChild(t, spec)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast store across hosts kill test key")
	d1 := startPeerWith(t, "d1", key, "", clusterConfig, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", clusterConfig, d1.peer(), dialsIn("d3"))
	dir := t.TempDir()
	sock := testConfig(dir).Socket
	child := startChild(t, "TestStoreAcrossHostsKilled",
		clusterChildEnv+"="+strings.Join([]string{dir, key, d1.d.PeerAddr(), d2.d.PeerAddr()}, "|"), sock)
	cmd, exited := child.cmd, child.exited
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2", "d3")

	// Keys held by d3 and by d1, with every home among them.
	c3, err := client.Dial(sock, client.Options{Name: "putter-d3", CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	c1 := d1.dial(t, "putter-d1")
	const n = 32
	var keys [][]byte
	holder := map[string]string{}
	for i := range n {
		for _, h := range []struct {
			id string
			c  *client.Client
		}{{"d1", c1}, {"d3", c3}} {
			k := fmt.Appendf(nil, "kill/%s/%02d", h.id, i)
			if err := h.c.PutBytes(k, clusterValue(k, 4096+i*1000), false); err != nil {
				t.Fatalf("put %s: %v", k, err)
			}
			keys = append(keys, k)
			holder[string(k)] = h.id
		}
	}
	for _, k := range keys {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) == 1 && hs[0].ID == holder[string(k)]
		}, "%s announced to its home", k)
	}
	homes := map[string]string{}
	for _, k := range keys {
		homes[string(k)] = d2.d.cluster.Home(k)
	}
	// SIGSTOP first: d3 neither answers nor closes its connections. A get
	// of a key it holds ends by its deadlines (the size asked of the
	// home, then the read, each bounded by the cluster's timeout) with a
	// named error or a miss; once d3 is found unreachable it is down and
	// the gets that follow are quick.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c2 := d2.dial(t, "reader")
	stopped := 0
	for _, k := range keys {
		if holder[string(k)] != "d3" || stopped == 3 {
			continue
		}
		stopped++
		start := time.Now()
		v, err := c2.GetBytes(k)
		if took := time.Since(start); took > 2*2*time.Second+time.Second {
			t.Errorf("%s with d3 stopped: answered after %v", k, took)
		}
		if err == nil && !bytes.Equal(v, clusterValue(k, len(v))) || err != nil &&
			!errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrDeadlineExceeded) {
			t.Errorf("%s with d3 stopped: %d bytes, %v", k, len(v), err)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited

	deadline := 2*time.Second + time.Second // the cluster's timeout, and slack
	exact, lost := 0, 0
	for _, k := range keys {
		start := time.Now()
		v, err := c2.GetBytes(k)
		took := time.Since(start)
		if took > deadline {
			t.Errorf("%s: answered after %v", k, took)
		}
		home := homes[string(k)]
		switch {
		case err == nil:
			if !bytes.Equal(v, clusterValue(k, len(v))) || len(v) != 4096+int(k[len(k)-1]-'0'+10*(k[len(k)-2]-'0'))*1000 {
				t.Fatalf("%s: %d bytes that are not the value put", k, len(v))
			}
			exact++
		case errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrUnavailable):
			if holder[string(k)] == "d1" && home != "d3" {
				t.Errorf("%s: held by d1, home %s, both alive: %v", k, home, err)
			}
			lost++
		default:
			t.Errorf("%s: %v, want the bytes, NOT_FOUND or UNAVAILABLE", k, err)
		}
	}
	if exact == 0 || lost == 0 {
		t.Fatalf("%d exact, %d lost: the keys did not cover both cases", exact, lost)
	}
	// Nothing d3 claimed of d1 stays held; no pin stays on d1 or d2.
	testutil.Eventually(t, 5*time.Second, func() bool { return d1.d.cluster.Holds() == 0 && d2.d.cluster.Holds() == 0 },
		"claims released")
	// A hold that has just ended is no longer counted, and unpins its
	// values just after: wait for the pins, do not read them once.
	noPinsLeft(t, d1, d2)
}

// TestStoreAcrossHostsMembersChange: a member that leaves and comes back
// is a cache event, never an error. When d3 stops, d1 and d2 take its
// shards and d1, the holder, re-announces their keys to their new homes:
// every key d1 holds is read byte-exact on d2 again. When d3 comes back
// (a new run, empty) it takes its shards back and is told their keys: it
// reads them too.
func TestStoreAcrossHostsMembersChange(t *testing.T) {
	ds := startTrio(t)
	d1, d2, d3 := ds[0], ds[1], ds[2]
	c1 := d1.dial(t, "putter")
	var moved [][]byte
	for i := 0; len(moved) < 8; i++ {
		k := fmt.Appendf(nil, "members/%03d", i)
		if err := c1.PutBytes(k, clusterValue(k, 8192), false); err != nil {
			t.Fatal(err)
		}
		if d1.d.cluster.Home(k) == "d3" {
			moved = append(moved, k)
		}
	}
	for _, k := range moved {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) == 1
		}, "%s announced to d3", k)
	}
	if err := d3.stop(); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, ds[:2], "d1", "d2")
	c2 := d2.dial(t, "reader")
	for _, k := range moved {
		if h := d2.d.cluster.Home(k); h == "d3" {
			t.Fatalf("%s: home still %s", k, h)
		}
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) > 0
		}, "%s re-announced to its new home", k)
		v, err := c2.GetBytes(k)
		if err != nil || !bytes.Equal(v, clusterValue(k, 8192)) {
			t.Fatalf("%s after d3 left: %d bytes, %v", k, len(v), err)
		}
	}

	// d3 again, a new run under the same id at the same address (the
	// others listed it without one and learned the first run's).
	key, addr := d3.cfg.ClusterKeyFile, d3.d.PeerAddr()
	d3 = startPeerWith(t, "d3", key, addr, clusterConfig, d1.peer(), d2.peer())
	ds = []*peerDaemon{d1, d2, d3}
	waitMembers(t, ds, "d1", "d2", "d3")
	c3 := d3.dial(t, "reader")
	for _, k := range moved {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d3.d.cluster.Locate(k)
			return err == nil && len(hs) > 0
		}, "%s re-announced to d3, its home again:\n%s", k, d1.log)
		v, err := c3.GetBytes(k)
		if err != nil || !bytes.Equal(v, clusterValue(k, 8192)) {
			t.Fatalf("%s on d3 back: %d bytes, %v", k, len(v), err)
		}
	}
}

// TestStoreAcrossHostsBadBytes: a holder whose copy went bad (its pool
// bytes changed under the store) is never answered: the reader's crc32c
// check refuses them and it reads the next holder's copy, byte-exact; with
// no good copy left the get fails, naming why, and nothing wrong is kept.
func TestStoreAcrossHostsBadBytes(t *testing.T) {
	ds := startTrio(t)
	d1, d2, d3 := ds[0], ds[1], ds[2]
	k := []byte("bad/bytes")
	want := putKnown(t, d1, d2, k, 64<<10)
	// d3 reads it: a second holder.
	if v, err := d3.dial(t, "replica").GetBytes(k); err != nil || !bytes.Equal(v, want) {
		t.Fatalf("d3: %d bytes, %v", len(v), err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, hs, err := d2.d.cluster.Locate(k)
		return err == nil && len(hs) == 2 && hs[0].ID == "d1"
	}, "d3 announced as the second holder")
	// A copy goes bad in place (a second call puts it back).
	corrupt := func(d *peerDaemon) {
		ss := d.d.stores[0].NewSession()
		defer ss.Close()
		locs, codes := make([]store.Location, 1), make([]store.Code, 1)
		if err := ss.GetHere([][]byte{k}, locs, codes, nil); err != nil || codes[0] != store.OK {
			t.Fatalf("%s: %v %v", d.cfg.DaemonID, err, codes[0])
		}
		d.d.pools[0].Bytes()[locs[0].Offset+100] ^= 0xff
	}
	// The home sends a reader to the least loaded holder, ties broken by
	// a hash of the key and the holder (grant.Claims): d2 reads once with
	// both copies good to learn which one comes first, drops its copy,
	// and then that one goes bad.
	c2 := d2.dial(t, "reader")
	if v, err := c2.GetBytes(k); err != nil || !bytes.Equal(v, want) {
		t.Fatalf("d2: %d bytes, %v", len(v), err)
	}
	first, next := d1, d3
	if s := d2.d.cluster.Stats(); s.ByPeer["d3"].Gets == 1 {
		first, next = d3, d1
	}
	t.Logf("the home sends d2 to %s first", first.cfg.DaemonID)
	if err := d2.d.stores[0].RemoveHere([][]byte{k}, make([]store.Code, 1), nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, d := range ds {
			if d.d.cluster.ReadClaims().Outstanding != 0 {
				return false
			}
		}
		return true
	}, "d2's read claim released (the holders' load at the home as before)")
	before := d2.d.cluster.Stats()
	corrupt(first)
	if v, err := c2.GetBytes(k); err != nil || !bytes.Equal(v, want) {
		t.Fatalf("d2 with %s's copy bad: %d bytes, %v", first.cfg.DaemonID, len(v), err)
	}
	s := d2.d.cluster.Stats()
	if s.CRCMismatch-before.CRCMismatch != 1 || s.ByPeer[next.cfg.DaemonID].Gets-before.ByPeer[next.cfg.DaemonID].Gets != 1 ||
		s.ByPeer[first.cfg.DaemonID].Gets != before.ByPeer[first.cfg.DaemonID].Gets {
		t.Fatalf("d2's figures with %s's copy bad: %d mismatches, by peer %+v (before: %d, %+v)",
			first.cfg.DaemonID, s.CRCMismatch, s.ByPeer, before.CRCMismatch, before.ByPeer)
	}
	// Both copies bad: d2 drops its own and gets an error, never bytes.
	corrupt(next)
	if err := d2.d.stores[0].RemoveHere([][]byte{k}, make([]store.Code, 1), nil); err != nil {
		t.Fatal(err)
	}
	if v, err := c2.GetBytes(k); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("d2 with every copy bad: %d bytes, %v, want UNAVAILABLE", len(v), err)
	}
	if st := d2.d.stores[0].Stats(); st.Keys != 0 || st.Reserved != 0 {
		t.Fatalf("d2 holds %d keys, %d reserved: it kept what it could not check", st.Keys, st.Reserved)
	}
}

// TestStoreAcrossHostsEtcd: with directory = etcd and no configured
// peers, the members are those the directory lists: a key put on d1 is
// read byte-exact on d2; and the store calls put no request on etcd (the
// requests over 10,000 keys' lookups are the directory's own background
// ones: lease renewals, and progress requests when nothing else proved
// the cache current).
func TestStoreAcrossHostsEtcd(t *testing.T) {
	e := newEtcdCluster(t)
	d1 := e.start("d1", clusterConfig)
	d2 := e.start("d2", clusterConfig)
	sees(t, d2, "d1", epochOf(d1))
	sees(t, d1, "d2", epochOf(d2))
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	put := d1.dial(t, "putter")
	keys := make([][]byte, 100)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "etcd/%03d", i)
		if err := put.PutBytes(keys[i], clusterValue(keys[i], 4096), false); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(k)
			return err == nil && len(hs) == 1
		}, "%s announced", k)
	}
	c := d2.dial(t, "reader")
	if v, err := c.GetBytes(keys[0]); err != nil || !bytes.Equal(v, clusterValue(keys[0], 4096)) {
		t.Fatalf("get on d2: %d bytes, %v", len(v), err)
	}
	q, err := c.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.NewResults(len(keys))
	if err != nil {
		t.Fatal(err)
	}
	before, start := d2.d.dir.Requests()+d1.d.dir.Requests(), time.Now()
	cqes := make([]client.Completion, 1)
	for i := range 100 {
		if ok, err := q.Exists(keys, res, uint64(i)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if n, err := q.Reap(cqes, 1, 10*time.Second); n != 1 || err != nil || cqes[0].N != uint64(len(keys)) {
			t.Fatalf("exists: %d %v %+v", n, err, cqes[0])
		}
	}
	took := time.Since(start)
	got := d2.d.dir.Requests() + d1.d.dir.Requests() - before
	background := 2 * (uint64(took/(500*time.Millisecond)) + 2)
	t.Logf("etcd requests over 10,000 keys' lookups in %v: %d (the directories' background allows %d)", took, got, background)
	if got > background {
		t.Fatalf("%d etcd requests over 10,000 keys' lookups in %v: more than the directories' background (%d)", got, took, background)
	}
}

// TestStoreAcrossHostsHotKey: 32 readers on d2 of one key d1 holds, at
// once: every one gets its exact bytes, d2 reads the value from d1 once
// (the others join that read or find the copy it kept), and no claim stays
// on d1.
func TestStoreAcrossHostsHotKey(t *testing.T) {
	ds := startTrio(t)
	d1, d2 := ds[0], ds[1]
	k := []byte("hot/key")
	want := putKnown(t, d1, d2, k, 256<<10)
	const readers = 32
	clients := make([]*client.Client, readers)
	for i := range clients {
		clients[i] = d2.dial(t, fmt.Sprintf("reader-%d", i))
	}
	start := make(chan struct{})
	errs := make(chan error, readers)
	for _, c := range clients {
		go func() {
			<-start
			v, err := c.GetBytes(k)
			if err == nil && !bytes.Equal(v, want) {
				err = fmt.Errorf("%d bytes, not the value put", len(v))
			}
			errs <- err
		}()
	}
	close(start)
	for range readers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if s := d2.d.cluster.Stats(); s.ByPeer["d1"].Gets != 1 {
		t.Errorf("d2 read the value from d1 %d times, want once", s.ByPeer["d1"].Gets)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return d1.d.cluster.Holds() == 0 }, "d1's claims released")
}

// TestStoreAcrossHostsShardsDisagree: two daemons configured with other
// store_shards would ask each other about shards the other does not have:
// each keeps the other out (saying why in its log) and serves its own keys.
func TestStoreAcrossHostsShardsDisagree(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast shards test key")
	d1 := startPeerWith(t, "d1", key, "", clusterConfig, dialsIn("d2"))
	d2 := startPeerWith(t, "d2", key, "", func(c *Config) { clusterConfig(c); c.StoreShards = 32 }, d1.peer())
	waitMembers(t, []*peerDaemon{d1}, "d1")
	waitMembers(t, []*peerDaemon{d2}, "d2")
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(d2.log.String(), "store_shards must be the same") },
		"d2 saying why d1 is out")
	if err := d1.dial(t, "putter").PutBytes([]byte("mine"), []byte("value"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.dial(t, "reader").GetBytes([]byte("mine")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("d1's key on d2: %v, want NOT_FOUND", err)
	}
}
