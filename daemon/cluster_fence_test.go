package daemon

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store/cluster"
)

// fencedMsg is a message to a home as the store across hosts sends it
// (store/cluster/fence.go): version 2, one shard's generation, then the
// body (a lookup or an announce of key).
func fencedMsg(shard int, gen uint64, kind string, key []byte) []byte {
	b := []byte{2}
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = binary.LittleEndian.AppendUint32(b, uint32(shard))
	b = binary.LittleEndian.AppendUint64(b, gen)
	b = append(b, 2)
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(key)))
	b = append(b, key...)
	if kind == "tc.store.announce" {
		b = append(b, 1)                                  // tier L1
		b = binary.LittleEndian.AppendUint64(b, 4096)     // size
		b = binary.LittleEndian.AppendUint32(b, 0xc0ffee) // crc
	}
	return b
}

// staleGen sends from one daemon to home a fenced message for shard at gen
// and reports whether home refused it as stale (and the generation it
// holds then), failing on anything else.
func staleGen(t *testing.T, from *peerDaemon, home string, shard int, gen uint64, kind string, key []byte) (bool, uint64) {
	t.Helper()
	resp, err := from.d.peers.Node().ExchangeAt(home, 0, kind, fencedMsg(shard, gen, kind, key), 5*time.Second)
	if err != nil {
		t.Fatalf("%s to %s: %v", kind, home, err)
	}
	if len(resp) < 2 || resp[0] != 2 {
		t.Fatalf("%s to %s: answer % x", kind, home, resp)
	}
	switch resp[1] {
	case 0:
		return false, 0
	case 1:
		if len(resp) != 2+2+12 || binary.LittleEndian.Uint16(resp[2:]) != 1 || int(binary.LittleEndian.Uint32(resp[4:])) != shard {
			t.Fatalf("%s to %s: stale answer % x", kind, home, resp)
		}
		return true, binary.LittleEndian.Uint64(resp[8:])
	}
	t.Fatalf("%s to %s: fence status %d", kind, home, resp[1])
	return false, 0
}

// claimedAll waits until every daemon of ds knows a claim of every shard,
// by a member of ds, and they all agree; it returns the claims.
func claimedAll(t *testing.T, ds ...*peerDaemon) []cluster.ShardClaim {
	t.Helper()
	ids := map[string]bool{}
	for _, d := range ds {
		ids[d.cfg.DaemonID] = true
	}
	var got []cluster.ShardClaim
	testutil.Eventually(t, 20*time.Second, func() bool {
		got = ds[0].d.cluster.ShardClaims()
		for _, c := range got {
			if !ids[c.Home] || c.Gen == 0 {
				return false
			}
		}
		for _, d := range ds[1:] {
			other := d.d.cluster.ShardClaims()
			for s := range got {
				if other[s].Home != got[s].Home || other[s].Gen != got[s].Gen {
					return false
				}
			}
		}
		// And each claim is held by the member rendezvous names.
		for s := range got {
			for _, d := range ds {
				if w := d.d.cluster.Placement(shardKey(d, s)); w.Rendezvous != got[s].Home {
					return false
				}
			}
		}
		return true
	}, "every shard claimed and the claims agreed on by %d daemons", len(ds))
	return got
}

// shardKey is a key of shard s (under d's store_shards).
func shardKey(d *peerDaemon, s int) []byte {
	for i := 0; ; i++ {
		k := fmt.Appendf(nil, "shard/%d/%d", s, i)
		if cluster.ShardOf(k, d.cfg.StoreShards) == s {
			return k
		}
	}
}

// TestStoreAcrossHostsFenced: with directory = etcd, the homes claim their
// shards in etcd with fenced generations, and a message to a home carries
// the generation it was sent for. A home answers only messages for the
// generation it holds: a lookup or an announcement for an older one (or
// none) is refused and changes nothing. When d3 joins, the shards it is
// to be home of are released by their homes and claimed by d3 at higher
// generations; messages for the old generations are refused by both the
// old home and d3, and the keys d1 holds are read byte-exact on d2 again.
func TestStoreAcrossHostsFenced(t *testing.T) {
	e := newEtcdCluster(t)
	d1 := e.start("d1", clusterConfig)
	d2 := e.start("d2", clusterConfig)
	sees(t, d2, "d1", epochOf(d1))
	sees(t, d1, "d2", epochOf(d2))
	waitMembers(t, []*peerDaemon{d1, d2}, "d1", "d2")
	before := claimedAll(t, d1, d2)

	put := d1.dial(t, "putter")
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "fence/%03d", i)
		if err := put.PutBytes(keys[i], clusterValue(keys[i], 4096), false); err != nil {
			t.Fatal(err)
		}
	}
	announced := func(d *peerDaemon) {
		for _, k := range keys {
			testutil.Eventually(t, 10*time.Second, func() bool {
				_, hs, err := d.d.cluster.Locate(k)
				return err == nil && len(hs) >= 1
			}, "%s announced", k)
		}
	}
	announced(d2)

	// A key whose home is d1: d2 asks with the generation d1 holds, an
	// older one and none.
	var k []byte
	for _, kk := range keys {
		if d2.d.cluster.Home(kk) == "d1" {
			k = kk
			break
		}
	}
	if k == nil {
		t.Fatal("no key homed on d1")
	}
	s := cluster.ShardOf(k, d1.cfg.StoreShards)
	g := before[s].Gen
	if stale, _ := staleGen(t, d2, "d1", s, g, "tc.store.lookup", k); stale {
		t.Fatalf("d1 refused a lookup for the generation it holds (%#x)", g)
	}
	for _, old := range []uint64{g - 1, 0, g + 1} {
		stale, held := staleGen(t, d2, "d1", s, old, "tc.store.lookup", k)
		if !stale || held != g {
			t.Fatalf("lookup for generation %#x: stale %v, held %#x (want refused, %#x)", old, stale, held, g)
		}
	}
	// An announcement for a stale generation is not obeyed: the key it
	// names is not indexed.
	forged := shardKey(d1, s)
	if stale, _ := staleGen(t, d2, "d1", s, g-1, "tc.store.announce", forged); !stale {
		t.Fatal("d1 took an announcement for a stale generation")
	}
	if _, hs, err := d1.d.cluster.Locate(forged); err != nil || len(hs) != 0 {
		t.Fatalf("forged key after a stale announcement: holders %+v, %v", hs, err)
	}
	if st := d1.d.cluster.Stats(); st.StaleRefused < 4 {
		t.Fatalf("d1 counted %d stale refusals, want at least 4", st.StaleRefused)
	}

	// d3 joins: the shards rendezvous gives it move, at new generations.
	d3 := e.start("d3", clusterConfig)
	for _, d := range []*peerDaemon{d1, d2} {
		sees(t, d, "d3", epochOf(d3))
	}
	waitMembers(t, []*peerDaemon{d1, d2, d3}, "d1", "d2", "d3")
	after := claimedAll(t, d1, d2, d3)
	moved := 0
	for sh := range after {
		if after[sh].Home == before[sh].Home {
			continue
		}
		moved++
		if after[sh].Home != "d3" || after[sh].Gen <= before[sh].Gen {
			t.Fatalf("shard %d moved from %s@%#x to %s@%#x", sh, before[sh].Home, before[sh].Gen, after[sh].Home, after[sh].Gen)
		}
		kk := shardKey(d1, sh)
		old := before[sh]
		// The old home released it: it refuses its old generation.
		from := d2
		if old.Home == "d2" {
			from = d1
		}
		if stale, _ := staleGen(t, from, old.Home, sh, old.Gen, "tc.store.lookup", kk); !stale {
			t.Fatalf("shard %d: %s still obeys generation %#x after d3 claimed it", sh, old.Home, old.Gen)
		}
		if stale, held := staleGen(t, from, "d3", sh, old.Gen, "tc.store.lookup", kk); !stale || held != after[sh].Gen {
			t.Fatalf("shard %d: d3 obeyed the old generation %#x (stale %v, held %#x)", sh, old.Gen, stale, held)
		}
		if stale, _ := staleGen(t, from, "d3", sh, after[sh].Gen, "tc.store.lookup", kk); stale {
			t.Fatalf("shard %d: d3 refused its own generation %#x", sh, after[sh].Gen)
		}
	}
	if moved == 0 {
		t.Fatal("no shard moved to d3")
	}
	// The keys d1 holds reach their new homes; d2 reads them byte-exact.
	for _, kk := range keys {
		testutil.Eventually(t, 10*time.Second, func() bool {
			_, hs, err := d2.d.cluster.Locate(kk)
			for _, h := range hs {
				if h.ID == "d1" {
					return err == nil
				}
			}
			return false
		}, "%s held by d1 as its home (%s) says", kk, testutil.Lazy(func() any { return d2.d.cluster.Home(kk) }))
	}
	c := d2.dial(t, "reader")
	for _, kk := range keys {
		if v, err := c.GetBytes(kk); err != nil || !bytes.Equal(v, clusterValue(kk, 4096)) {
			t.Fatalf("get %s on d2: %d bytes, %v", kk, len(v), err)
		}
	}
	t.Logf("%d of %d shards moved to d3", moved, len(after))
}
