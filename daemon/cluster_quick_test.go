package daemon

import (
	"bytes"
	"fmt"
	"os"
	"strings"
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
	get := queueGetter(t, d2)
	for _, size := range []int{4 << 10, 256 << 10} {
		k := keyHomedAt(d2, "d1", "quick", size)
		v := putKnown(t, d1, d2, k, size)
		const n = 5
		served, quick, fallbacks := cachedGets(t, d1, d2, get, k, v, n)
		for _, kind := range []string{"tc.store.hold", "tc.store.release", "tc.store.claim", "tc.store.unclaim", "tc.store.lookup"} {
			if served[kind] != 0 {
				t.Errorf("%d KiB: the holder served %d %q for %d cached gets, want 0", size>>10, served[kind], kind, n)
			}
		}
		if d := served["tc.store.read"]; d != n {
			t.Errorf("%d KiB: the holder served %d one-round-trip reads for %d cached gets, want %d", size>>10, d, n, n)
		}
		if quick != n || fallbacks != 0 {
			t.Errorf("%d KiB: %d one-round-trip reads and %d fallbacks for %d cached gets", size>>10, quick, fallbacks, n)
		}
	}
	// An operator sees them: tcctl stats on the reader, metrics on both.
	st, err := d2.dial(t, "stats").Stats()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, k := range st.Transports {
		m[k.Name] = k.Value
	}
	if want := d2.d.cluster.Stats().QuickReads; want < 10 || m["cluster_one_round_trip_reads"] != want || m["cluster_one_round_trip_fallbacks"] != 0 {
		t.Errorf("d2's stats: %d one-round-trip reads, %d fallbacks; its cluster counted %d reads", m["cluster_one_round_trip_reads"], m["cluster_one_round_trip_fallbacks"], want)
	}
	reads := sample(t, scrapeMetrics(t, d2.d.MetricsAddr()), "tensorcast_cluster_one_round_trip_reads_total")
	served := sample(t, scrapeMetrics(t, d1.d.MetricsAddr()), "tensorcast_cluster_one_round_trip_served_total")
	if reads < 10 || served != reads {
		t.Errorf("metrics: d2 read %v values in one exchange, d1 served %v", reads, served)
	}
}

// TestVerbsCachedRemoteGetInline: between daemons linked by rdma, a
// cached remote get of a value up to rdma_inline_read is the one round
// trip of the tcp link (the bytes in the holder's answer); a larger one
// is a hold and an RDMA READ, whose bytes do not cross tcp.
func TestVerbsCachedRemoteGetInline(t *testing.T) {
	testutil.Require(t, testutil.RDMA)
	const inline = 16 << 10
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast inline read test key")
	cfg := func(c *Config) {
		c.StoreL2Path = "off"
		c.StoreShards = 64
		c.RDMA = "on"
		c.RDMADevice = os.Getenv("RXE_DEV")
		c.RDMAInlineRead = inline
	}
	d1 := startPeerWith(t, "d1", key, "", cfg, dialsIn("d2"))
	d2 := startPeerWith(t, "d2", key, "", cfg, d1.peer())
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	if !strings.Contains(d2.log.String(), "read in one peer exchange") || !strings.Contains(d2.log.String(), "rdma_inline_read=16KiB") {
		t.Errorf("d2's log does not say which values it reads in one exchange:\n%s", d2.log)
	}
	get := queueGetter(t, d2)
	big := keyHomedAt(d2, "d1", "warm", 4*inline)
	vBig := putKnown(t, d1, d2, big, 4*inline)
	// The first reads from d1 go over tcp and have the rdma link set up
	// behind them.
	testutil.Eventually(t, 30*time.Second, func() bool {
		before := tcpBytes(d2)
		get(big, vBig)
		return tcpBytes(d2)-before < 4*inline
	}, "remote gets off tcp:\n%s", d2.log)
	const n = 5
	for _, size := range []int{4 << 10, inline, 4 * inline} {
		k := keyHomedAt(d2, "d1", "inline", size)
		v := putKnown(t, d1, d2, k, size)
		before := tcpBytes(d2)
		served, quick, fallbacks := cachedGets(t, d1, d2, get, k, v, n)
		moved := tcpBytes(d2) - before
		if fallbacks != 0 {
			t.Errorf("%d KiB: %d one-round-trip reads fell back", size>>10, fallbacks)
		}
		if size <= inline {
			if served["tc.store.read"] != n || quick != n || served["tc.store.hold"] != 0 {
				t.Errorf("%d KiB (rdma_inline_read %d KiB): %d reads served, %d one-round-trip, %d holds, for %d cached gets; want all one round trip",
					size>>10, inline>>10, served["tc.store.read"], quick, served["tc.store.hold"], n)
			}
			continue
		}
		if served["tc.store.read"] != 0 || quick != 0 || served["tc.store.hold"] != n {
			t.Errorf("%d KiB (rdma_inline_read %d KiB): %d reads served, %d one-round-trip, %d holds, for %d cached gets; want a hold each",
				size>>10, inline>>10, served["tc.store.read"], quick, served["tc.store.hold"], n)
		}
		if moved >= uint64(n*size)/2 {
			t.Errorf("%d KiB: %d cached gets moved %d bytes over tcp, want the values by rdma", size>>10, n, moved)
		}
	}
}

// keyHomedAt is a key of prefix and size whose home, as reader places
// it, is home.
func keyHomedAt(reader *peerDaemon, home, prefix string, size int) []byte {
	for i := 0; ; i++ {
		k := fmt.Appendf(nil, "%s/%d/%d", prefix, size, i)
		if reader.d.cluster.Placement(k).Home == home {
			return k
		}
	}
}

// queueGetter gets a key through a client queue of d: byte-exact or the
// test fails; then the client unpins it and d's copy is removed (d's
// cache of home answers stays as it is).
func queueGetter(t *testing.T, d *peerDaemon) func(k, want []byte) {
	c := d.dial(t, "reader")
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
	return func(k, want []byte) {
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
		if err := d.d.stores[0].RemoveHere(keys, codes, nil); err != nil || codes[0] != store.OK {
			t.Fatalf("remove here: %v %v", err, codes[0])
		}
	}
}

// cachedGets gets k, held by d1 with value v, n times by get (a reader
// of d2), after a first get that fills d2's cache of home answers, and
// says what d1 served for the n, by kind, and how many of them d2 read in
// one round trip or began so and fell back. After every get, d1 is done
// with the reader: nothing claimed, no hold to expire.
func cachedGets(t *testing.T, d1, d2 *peerDaemon, get func(k, v []byte), k, v []byte, n int) (served map[string]uint64, quick, fallbacks uint64) {
	t.Helper()
	done := func() bool { return d1.d.cluster.HoldReaders(k) == 0 && d1.d.cluster.Holds() == 0 }
	get(k, v) // asks the home: d2 caches its answer
	// That get's hold and claim are released in the background.
	testutil.Eventually(t, 10*time.Second, func() bool {
		return done() && d1.d.cluster.ReadClaims().Outstanding == 0
	}, "the first get's hold and claim released")
	before, st := d1.d.cluster.Served(), d2.d.cluster.Stats()
	for range n {
		get(k, v)
		testutil.Eventually(t, 10*time.Second, done, "%s: the holder done with the reader", k)
	}
	after, st2 := d1.d.cluster.Served(), d2.d.cluster.Stats()
	served = map[string]uint64{}
	for kind, c := range after {
		served[kind] = c - before[kind]
	}
	return served, st2.QuickReads - st.QuickReads, st2.QuickFallbacks - st.QuickFallbacks
}
