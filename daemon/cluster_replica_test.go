package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// replicaConfig: an L2 (durable puts) and two copies of every value.
func replicaConfig(c *Config) {
	c.StoreShards = 64
	c.StoreL2Size = 512 << 20
	c.StoreReplicas = 2
}

// TestStoreReplicasSurviveKill: with store_replicas = 2, every durable put
// acknowledged (from d1 and from d2) is still read, byte-exact, on both
// survivors after any one of the three daemons is stopped: the putter,
// the other putter, or the third; and nothing stays claimed or held.
func TestStoreReplicasSurviveKill(t *testing.T) {
	for _, victim := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("d%d", victim+1), func(t *testing.T) {
			key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast replicas test key")
			d1 := startPeerWith(t, "d1", key, "", replicaConfig, dialsIn("d2"), dialsIn("d3"))
			d2 := startPeerWith(t, "d2", key, "", replicaConfig, d1.peer(), dialsIn("d3"))
			d3 := startPeerWith(t, "d3", key, "", replicaConfig, d1.peer(), d2.peer())
			ds := []*peerDaemon{d1, d2, d3}
			waitMembers(t, ds, "d1", "d2", "d3")

			sizes := []int{1, 4096, 65536 + 17, 256 << 10}
			var keys [][]byte
			for pi, p := range ds[:2] {
				c := p.dial(t, "putter")
				for i := range 12 {
					k := fmt.Appendf(nil, "replica/%s/%02d", p.cfg.DaemonID, i)
					if err := c.PutBytes(k, clusterValue(k, sizes[(i+pi)%len(sizes)]), true); err != nil {
						t.Fatalf("durable put %s on %s: %v\n%s", k, p.cfg.DaemonID, err, p.log)
					}
					keys = append(keys, k)
				}
			}
			for _, p := range ds[:2] {
				if s := p.d.cluster.Stats(); s.ReplicasMade != 12 || s.ReplicaFailures != 0 {
					t.Fatalf("%s: %d copies made, %d failed; want 12, 0", p.cfg.DaemonID, s.ReplicasMade, s.ReplicaFailures)
				}
			}

			gone := ds[victim]
			if err := gone.stop(); err != nil {
				t.Fatalf("stopping %s: %v", gone.cfg.DaemonID, err)
			}
			var alive []*peerDaemon
			var ids []string
			for _, p := range ds {
				if p != gone {
					alive = append(alive, p)
					ids = append(ids, p.cfg.DaemonID)
				}
			}
			waitMembers(t, alive, ids...)
			for _, p := range alive {
				readsBack(t, p, keys, sizes, gone.cfg.DaemonID+" gone")
			}
			for _, p := range alive {
				testutil.Eventually(t, 5*time.Second, func() bool {
					return p.d.cluster.Holds() == 0 && p.d.cluster.ReadClaims().Outstanding == 0
				}, "%s: claims and holds released", p.cfg.DaemonID)
			}
		})
	}
}

func isMissOrUnavailable(err error) bool {
	return errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrUnavailable)
}

// TestStoreReplicasSurviveKill9: d3, in a process of its own, puts values
// durably with store_replicas = 2 and is killed with SIGKILL once they are
// acknowledged; every one is then read, byte-exact, on d1 and on d2 (from
// the copy d3 made on one of them), and nothing stays claimed or held.
func TestStoreReplicasSurviveKill9(t *testing.T) {
	if spec := os.Getenv(clusterChildEnv); spec != "" {
		clusterChild(t, spec)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast replicas kill test key")
	d1 := startPeerWith(t, "d1", key, "", replicaConfig, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", replicaConfig, d1.peer(), dialsIn("d3"))
	dir := t.TempDir()
	sock := testConfig(dir).Socket
	child := startChild(t, "TestStoreReplicasSurviveKill9",
		clusterChildEnv+"="+strings.Join([]string{dir, key, d1.d.PeerAddr(), d2.d.PeerAddr(), "replicas"}, "|"), sock)
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2", "d3")
	c3, err := client.Dial(sock, client.Options{Name: "putter-d3", CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{1, 4096, 65536 + 17, 256 << 10}
	var keys [][]byte
	for i := range 16 {
		k := fmt.Appendf(nil, "kill9/%02d", i)
		if err := c3.PutBytes(k, clusterValue(k, sizes[i%len(sizes)]), true); err != nil {
			t.Fatalf("durable put %s on d3: %v\n%s", k, err, child.out.String())
		}
		keys = append(keys, k)
	}
	c3.Close()
	if err := child.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-child.exited
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	for _, p := range []*peerDaemon{d1, d2} {
		readsBack(t, p, keys, sizes, "d3 killed")
	}
	for _, p := range []*peerDaemon{d1, d2} {
		testutil.Eventually(t, 5*time.Second, func() bool {
			return p.d.cluster.Holds() == 0 && p.d.cluster.ReadClaims().Outstanding == 0
		}, "%s: claims and holds released", p.cfg.DaemonID)
	}
	// A hold that has just ended is no longer counted, and unpins its
	// values just after: wait for the pins, do not read them once.
	noPinsLeft(t, d1, d2)
}

// TestStoreReplicasPerCall: with store_replicas = 1, a durable put with
// client.WithReplicas(2) is copied to another daemon before it answers (its
// home knows both holders), a put without it is not copied, and a count
// out of range is refused as an invalid argument.
func TestStoreReplicasPerCall(t *testing.T) {
	one := func(c *Config) { replicaConfig(c); c.StoreReplicas = 1 }
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast replicas per call test key")
	d1 := startPeerWith(t, "d1", key, "", one, dialsIn("d2"))
	d2 := startPeerWith(t, "d2", key, "", one, d1.peer())
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	c := d1.dial(t, "putter")
	k := []byte("percall/two")
	if err := c.PutBytes(k, clusterValue(k, 8192), true, client.WithReplicas(2)); err != nil {
		t.Fatal(err)
	}
	if s := d1.d.cluster.Stats(); s.ReplicasMade != 1 || s.ReplicaFailures != 0 {
		t.Fatalf("after a put with 2 replicas: %d copies made, %d failed; want 1, 0", s.ReplicasMade, s.ReplicaFailures)
	}
	if st, err := d2.d.stores[0].Stat(k); err != nil || !st.InL2 || st.Size != 8192 {
		t.Fatalf("d2's copy: %+v, %v; want 8192 bytes on its L2", st, err)
	}
	k1 := []byte("percall/one")
	if err := c.PutBytes(k1, clusterValue(k1, 4096), true); err != nil {
		t.Fatal(err)
	}
	if s := d1.d.cluster.Stats(); s.ReplicasMade != 1 {
		t.Errorf("a put with the daemon's 1 replica made a copy (%d made)", s.ReplicasMade)
	}
	bad := []byte("percall/bad")
	if err := c.PutBytes(bad, []byte("x"), false, client.WithReplicas(9)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("a put with 9 replicas: %v, want INVALID_ARGUMENT", err)
	}
}

// readsBack waits until every key reads on p byte-exact as put (a value of
// one of sizes), with misses and UNAVAILABLE meanwhile and nothing else;
// what says which daemon went how.
func readsBack(t *testing.T, p *peerDaemon, keys [][]byte, sizes []int, what string) {
	t.Helper()
	c := p.dial(t, "reader")
	for _, k := range keys {
		testutil.Eventually(t, 15*time.Second, func() bool {
			v, err := c.GetBytes(k)
			if err != nil {
				if !isMissOrUnavailable(err) {
					t.Fatalf("%s on %s: %v, want the bytes, a miss or UNAVAILABLE", k, p.cfg.DaemonID, err)
				}
				return false
			}
			if !bytes.Equal(v, clusterValue(k, len(v))) || !slices.Contains(sizes, len(v)) {
				t.Fatalf("%s on %s: %d bytes that are not the value put", k, p.cfg.DaemonID, len(v))
			}
			return true
		}, "%s read on %s with %s", k, p.cfg.DaemonID, what)
	}
}
