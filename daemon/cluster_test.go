package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// startTrio runs three daemons of one cluster on loopback ports: d1
// accepts the others dialing in, d2 knows d1, d3 knows both; it returns
// once every daemon knows the others' epochs (the store across hosts has
// greeted them).
func startTrio(t *testing.T) []*peerDaemon {
	t.Helper()
	key := writeKey(t, t.TempDir(), "cluster.key", "tensorcast store across hosts test key")
	noL2 := func(c *Config) { c.StoreL2Path = "off"; c.StoreShards = 64 }
	d1 := startPeerWith(t, "d1", key, "", noL2, dialsIn("d2"), dialsIn("d3"))
	d2 := startPeerWith(t, "d2", key, "", noL2, d1.peer(), dialsIn("d3"))
	d3 := startPeerWith(t, "d3", key, "", noL2, d1.peer(), d2.peer())
	ds := []*peerDaemon{d1, d2, d3}
	for _, d := range ds {
		if d.d.cluster == nil {
			t.Fatalf("%s runs no store across hosts", d.cfg.DaemonID)
		}
		p := nodePeers{d.d.peers.Node()}
		for _, o := range ds {
			if o != d {
				testutil.Eventually(t, 10*time.Second, func() bool { return p.EpochOf(o.cfg.DaemonID) != 0 },
					"%s knowing %s's epoch", d.cfg.DaemonID, o.cfg.DaemonID)
			}
		}
	}
	return ds
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
