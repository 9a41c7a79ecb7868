package daemon

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// TestCachedRemoteGetOneRoundTrip: a remote get whose home answer the
// reader has cached is one request to the holder and its answer (the
// value in it): the holder serves no hold, no release, no claim or lookup
// for it, and keeps no claim once it has answered, so a reader that dies
// after asking leaves nothing claimed. Every value is byte-exact, 4 KiB
// and 256 KiB.
func TestCachedRemoteGetOneRoundTrip(t *testing.T) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast one round trip test key")
	cfg := func(c *Config) { c.StoreL2Path = "off"; c.StoreShards = 64; c.PeerSliceSize = 1 << 20 }
	d1 := startPeerWith(t, "d1", key, "", cfg, dialsIn("d2"))
	d2 := startPeerWith(t, "d2", key, "", cfg, d1.peer())
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	c := d2.dial(t, "reader")
	q, err := c.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.NewResults(1)
	if err != nil {
		t.Fatal(err)
	}
	ud := uint64(0)
	call := func(submit func() (bool, error)) client.Completion {
		t.Helper()
		if ok, err := submit(); !ok || err != nil {
			t.Fatalf("submit: %v %v", ok, err)
		}
		cqes := make([]client.Completion, 1)
		if got, err := q.Reap(cqes, 1, 10*time.Second); got != 1 || err != nil {
			t.Fatalf("reap: %d %v", got, err)
		}
		return cqes[0]
	}
	codes := make([]store.Code, 1)
	get := func(k, want []byte) {
		t.Helper()
		keys := [][]byte{k}
		ud++
		cqe := call(func() (bool, error) { return q.Get(keys, res, ud) })
		if err := res.Check(cqe); err != nil || cqe.N != 1 {
			t.Fatalf("get %s: %v, %d", k, err, cqe.N)
		}
		if got := res.Value(0); !bytes.Equal(got, want) {
			t.Fatalf("get %s: %d bytes, not the value put (%d bytes)", k, len(got), len(want))
		}
		ud++
		call(func() (bool, error) { return q.Unpin(keys, res, ud) })
		if err := d2.d.stores[0].RemoveHere(keys, codes, nil); err != nil || codes[0] != store.OK {
			t.Fatalf("remove here: %v %v", err, codes[0])
		}
	}
	for _, size := range []int{4 << 10, 256 << 10} {
		// A key whose home is d1, as the holder.
		var k []byte
		for i := 0; ; i++ {
			k = fmt.Appendf(nil, "quick/%d/%d", size, i)
			if d2.d.cluster.Placement(k).Home == "d1" {
				break
			}
		}
		v := putKnown(t, d1, d2, k, size)
		get(k, v) // asks the home: d2 caches its answer
		// That get's hold and claim are released in the background.
		testutil.Eventually(t, 10*time.Second, func() bool {
			return d1.d.cluster.Holds() == 0 && d1.d.cluster.ReadClaims().Outstanding == 0
		}, "the first get's hold and claim released")
		before, st := d1.d.cluster.Served(), d2.d.cluster.Stats()
		const n = 5
		for range n {
			get(k, v)
			// The holder is done with the reader once its answer is
			// written: nothing claimed, no hold to expire.
			testutil.Eventually(t, 10*time.Second, func() bool {
				return d1.d.cluster.HoldReaders(k) == 0 && d1.d.cluster.Holds() == 0
			}, "%d KiB: the holder done with the reader", size>>10)
		}
		after, st2 := d1.d.cluster.Served(), d2.d.cluster.Stats()
		for _, kind := range []string{"tc.store.hold", "tc.store.release", "tc.store.claim", "tc.store.unclaim", "tc.store.lookup"} {
			if d := after[kind] - before[kind]; d != 0 {
				t.Errorf("%d KiB: the holder served %d %q for %d cached gets, want 0", size>>10, d, kind, n)
			}
		}
		if d := after["tc.store.read"] - before["tc.store.read"]; d != n {
			t.Errorf("%d KiB: the holder served %d one-round-trip reads for %d cached gets, want %d", size>>10, d, n, n)
		}
		if d, f := st2.QuickReads-st.QuickReads, st2.QuickFallbacks-st.QuickFallbacks; d != n || f != 0 {
			t.Errorf("%d KiB: %d one-round-trip reads and %d fallbacks for %d cached gets", size>>10, d, f, n)
		}
	}
}
