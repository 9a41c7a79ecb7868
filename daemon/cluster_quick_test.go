package daemon

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster"
)

// TestCachedRemoteGetOneRoundTrip: a remote get whose home answer the
// reader has cached is one request to the holder and its answer (the
// value in it): the holder serves no hold, no release, no claim or lookup
// for it, and keeps no claim once it has answered, so a reader that dies
// after asking leaves nothing claimed. Every value is byte-exact, 4 KiB
// and 256 KiB.
func TestCachedRemoteGetOneRoundTrip(t *testing.T) {
	d1, d2 := quickPair(t, "one round trip")
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

// TestCachedRemoteBatchGet: a get of many keys whose cached home answers
// come to at most 4 MiB reads each of those keys in one exchange, and the
// others (those the reader is home of: their reads take a claim there) by
// a hold at the same time; a larger get takes the hold whole. A key whose
// one-round-trip read fell back (its cached answer older than the holder's
// value) is read the two-step way once the others are in. Every value is
// byte-exact, every key is answered once, and the holder keeps nothing
// held or claimed.
func TestCachedRemoteBatchGet(t *testing.T) {
	d1, d2 := quickPair(t, "batch get")
	// A first get from d1 opens its pool here (a one-round-trip read
	// needs it open).
	warm := keyHomedAt(d2, "d1", "warm", 4<<10)
	queueGetter(t, d2)(warm, putKnown(t, d1, d2, warm, 4<<10))
	get := queueBatchGetter(t, d2, 32)
	var keys, vals [][]byte
	add := func(home, prefix string, n, size int) {
		for i := range n {
			k := keyHomedAt(d2, home, fmt.Sprintf("%s/%d", prefix, i), size)
			keys, vals = append(keys, k), append(vals, putKnown(t, d1, d2, k, size))
		}
	}
	add("d1", "small", 6, 4<<10)    // cached after the first get
	add("d2", "own", 2, 64<<10)     // homed at d2: a claim there and a hold, always
	add("d1", "large", 12, 256<<10) // 3 MiB
	add("d1", "more", 4, 256<<10)   // the whole past 4 MiB
	// served gets n keys once and says what d1 served for it, by kind,
	// and how many values d2 read in one round trip or began so and fell
	// back.
	served := func(n int) (map[string]uint64, uint64, uint64) {
		t.Helper()
		before, st := d1.d.cluster.Served(), d2.d.cluster.Stats()
		get(keys[:n], vals[:n])
		testutil.Eventually(t, 10*time.Second, func() bool {
			return d1.d.cluster.Holds() == 0 && d1.d.cluster.ReadClaims().Outstanding == 0
		}, "the holder done with the reader")
		after, st2 := d1.d.cluster.Served(), d2.d.cluster.Stats()
		m := map[string]uint64{}
		for kind, c := range after {
			m[kind] = c - before[kind]
		}
		return m, st2.QuickReads - st.QuickReads, st2.QuickFallbacks - st.QuickFallbacks
	}
	// First get: nothing cached, one hold for them all.
	if m, quick, fallbacks := served(len(keys)); quick != 0 || fallbacks != 0 || m["tc.store.hold"] != 1 {
		t.Errorf("first batch get: %d values in one exchange, %d fell back, %d holds; want 0, 0 and 1",
			quick, fallbacks, m["tc.store.hold"])
	}
	// The 20 first keys, 18 of them cached (3 MiB and 24 KiB): those in
	// one exchange each, d2's own 2 in one hold.
	m, quick, fallbacks := served(20)
	if quick != 18 || fallbacks != 0 || m["tc.store.read"] != 18 || m["tc.store.hold"] != 1 {
		t.Errorf("cached batch get: %d one-round-trip reads (%d served), %d fell back, %d holds; want 18, 0 and 1",
			quick, m["tc.store.read"], fallbacks, m["tc.store.hold"])
	}
	for _, kind := range []string{"tc.store.claim", "tc.store.lookup"} {
		if m[kind] != 0 {
			t.Errorf("cached batch get: the holder served %d %q, want 0 (d2 is home of the keys it did not cache)", m[kind], kind)
		}
	}
	// All 24, the cached ones 4 MiB and 24 KiB: one hold for them all.
	if m, quick, _ := served(len(keys)); quick != 0 || m["tc.store.read"] != 0 || m["tc.store.hold"] != 1 {
		t.Errorf("cached batch get past 4 MiB: %d one-round-trip reads (%d served), %d holds; want 0, 0 and 1",
			quick, m["tc.store.read"], m["tc.store.hold"])
	}
	// The holder's value of a key changes under d2's cached answer (its
	// copy removed there alone, then put again with another size): the
	// one-round-trip read finds another size and falls back; the two-step
	// way asks the home and reads the new value.
	codes := make([]store.Code, 1)
	if err := d1.d.stores[0].RemoveHere(keys[1:2], codes, nil); err != nil || codes[0] != store.OK {
		t.Fatalf("remove here: %v %v", err, codes[0])
	}
	vals[1] = clusterValue(append([]byte("again/"), keys[1]...), 12<<10)
	if err := d1.dial(t, "putter").PutBytes(keys[1], vals[1], false); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		// (The home may still name d2, whose copies the getter removed
		// there alone: d2 reads from the others.)
		_, hs, err := d2.d.cluster.Locate(keys[1])
		return err == nil && slices.ContainsFunc(hs, func(h cluster.Holder) bool { return h.ID == "d1" && h.Size == 12<<10 })
	}, "%s put again announced", keys[1])
	if _, quick, fallbacks := served(20); quick != 17 || fallbacks != 1 {
		t.Errorf("batch get with a stale cached answer: %d one-round-trip reads, %d fell back; want 17 and 1", quick, fallbacks)
	}
}

// TestHomeAnswersKeptForStalenessBudget: a reader keeps a home's answer
// as long as a cached directory answer may be used (staleness_budget).
func TestHomeAnswersKeptForStalenessBudget(t *testing.T) {
	d1, d2 := quickPair(t, "staleness", func(c *Config) { c.StalenessBudget = Duration(750 * time.Millisecond) })
	if got := d1.d.cluster.Staleness(); got != 2*time.Second {
		t.Errorf("d1 keeps home answers for %v, want the default staleness_budget, 2s", got)
	}
	if got := d2.d.cluster.Staleness(); got != 750*time.Millisecond {
		t.Errorf("d2 keeps home answers for %v, want its staleness_budget, 750ms", got)
	}
}

// TestVerbsCachedRemoteGetInline: between daemons linked by rdma, a
// cached remote get of a value up to rdma_inline_read is the one round
// trip of the tcp link (the bytes in the holder's answer); a larger one
// is a hold and an RDMA READ, whose bytes do not cross tcp, and so is a
// get of several keys, whatever their sizes.
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
	// A get of several keys: one hold for them all, whatever their
	// sizes, and their bytes by rdma (an exchange per value costs more
	// than one hold and a batch of READs).
	var keys, vals [][]byte
	inlined := 0
	for i, size := range []int{4 << 10, 4 * inline, 4 << 10, inline, 4 * inline} {
		k := keyHomedAt(d2, "d1", fmt.Sprintf("batch/%d", i), size)
		keys, vals = append(keys, k), append(vals, putKnown(t, d1, d2, k, size))
		if size <= inline {
			inlined += size
		}
	}
	batch := queueBatchGetter(t, d2, len(keys))
	batch(keys, vals) // asks the home: d2 caches its answers
	done := func() bool { return d1.d.cluster.Holds() == 0 && d1.d.cluster.ReadClaims().Outstanding == 0 }
	testutil.Eventually(t, 10*time.Second, done, "the first batch get's holds and claims released")
	before, st, tcp0 := d1.d.cluster.Served(), d2.d.cluster.Stats(), tcpBytes(d2)
	batch(keys, vals)
	testutil.Eventually(t, 10*time.Second, done, "the holder done with the batch get")
	after, st2 := d1.d.cluster.Served(), d2.d.cluster.Stats()
	reads, holds := after["tc.store.read"]-before["tc.store.read"], after["tc.store.hold"]-before["tc.store.hold"]
	if quick := st2.QuickReads - st.QuickReads; reads != 0 || quick != 0 || holds != 1 {
		t.Errorf("cached batch get of 3 values up to %d KiB and 2 above: %d reads served, %d one-round-trip, %d holds; want 0, 0 and 1",
			inline>>10, reads, quick, holds)
	}
	if moved := tcpBytes(d2) - tcp0; moved >= uint64(inlined)/2 {
		t.Errorf("cached batch get: %d bytes over tcp, want the values' %d bytes by rdma", moved, inlined+8*inline)
	}
}

// quickPair starts d1 and d2 linked over tcp with the store across hosts
// (64 shards, L2 off, 1 MiB peer slices); more also set d2's config.
func quickPair(t *testing.T, name string, more ...func(*Config)) (d1, d2 *peerDaemon) {
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast "+name+" test key")
	cfg := func(c *Config) { c.StoreL2Path = "off"; c.StoreShards = 64; c.PeerSliceSize = 1 << 20 }
	d1 = startPeerWith(t, "d1", key, "", cfg, dialsIn("d2"))
	d2 = startPeerWith(t, "d2", key, "", func(c *Config) {
		cfg(c)
		for _, m := range more {
			m(c)
		}
	}, d1.peer())
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	return d1, d2
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
	get := queueBatchGetter(t, d, 1)
	return func(k, want []byte) {
		t.Helper()
		get([][]byte{k}, [][]byte{want})
	}
}

// queueBatchGetter is queueGetter of up to most keys in one get.
func queueBatchGetter(t *testing.T, d *peerDaemon, most int) func(keys, wants [][]byte) {
	c := d.dial(t, "reader")
	q, err := c.OpenQueue(16)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.NewResults(most)
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
	codes := make([]store.Code, most)
	return func(keys, wants [][]byte) {
		t.Helper()
		ud++
		cqe := call(func() (bool, error) { return q.Get(keys, res, ud) })
		if err := res.Check(cqe); err != nil || cqe.N != uint64(len(keys)) {
			t.Fatalf("get of %d keys: %v, %d", len(keys), err, cqe.N)
		}
		for i, k := range keys {
			if got := res.Value(i); !bytes.Equal(got, wants[i]) {
				t.Fatalf("get %s: %d bytes, not the value put (%d bytes)", k, len(got), len(wants[i]))
			}
		}
		ud++
		call(func() (bool, error) { return q.Unpin(keys, res, ud) })
		if err := d.d.stores[0].RemoveHere(keys, codes[:len(keys)], nil); err != nil {
			t.Fatalf("remove here: %v", err)
		}
		for i, code := range codes[:len(keys)] {
			if code != store.OK {
				t.Fatalf("remove here %s: %v", keys[i], code)
			}
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
