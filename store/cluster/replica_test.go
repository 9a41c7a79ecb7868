package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
)

// TestClaimsHotKey: 64 daemons read one hot key at once that two daemons
// hold. The key's home sends no holder more readers of it than the claims
// admit (4 each): while the reads are held, exactly 8 are in flight, 4
// at each holder, and the other readers are answered busy and ask again;
// once the reads go on, every reader gets the exact bytes (from the two
// holders, or from a reader that kept its copy and announced it: the hot
// key spreads), no holder ever had more than 4 readers of it, and no claim
// or hold is left.
func TestClaimsHotKey(t *testing.T) {
	const readers, perKey = 64, 4
	ids := []string{"h0", "h1"}
	for i := range readers {
		ids = append(ids, fmt.Sprintf("r%02d", i))
	}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 20 * time.Second, ProbeEvery: time.Hour, ClaimsPerKey: perKey})
	const key = "hot/key"
	v := value(key, 16<<10)
	f.node("h0").put(t, key, v)
	f.node("h1").put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h0", "h1"}) },
		"both holders announced (home knows %v)", testutil.Lazy(func() []string { return f.holders(key) }))
	home := f.node(f.node("h0").c.Home([]byte(key)))

	f.holdReads()
	errs := make(chan error, readers)
	for _, id := range ids[2:] {
		n := f.node(id)
		go func() {
			got, err := n.read(key, len(v))
			if err == nil && !bytes.Equal(got, v) {
				err = fmt.Errorf("%s: %d bytes that are not the value", n.id, len(got))
			}
			if err != nil {
				err = fmt.Errorf("%s: %w", n.id, err)
			}
			errs <- err
		}()
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		cs := home.c.ReadClaims()
		return cs.Outstanding == 2*perKey && f.inflightNow() == 2*perKey && cs.Refused > 0
	}, "both holders at their limit, the other readers refused (claims %+v, reads in flight %d)",
		testutil.Lazy(home.c.ReadClaims), testutil.Lazy(f.inflightNow))
	f.releaseReads()
	for range readers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	f.gateMu.Lock()
	most, reads := f.most, f.reads
	f.gateMu.Unlock()
	total := 0
	for h, n := range reads {
		total += n
		if most[h] > perKey {
			t.Errorf("%s had %d readers of the key at once, its limit is %d", h, most[h], perKey)
		}
	}
	for _, h := range []string{"h0", "h1"} {
		if reads[h] < perKey {
			t.Errorf("%s served %d readers, want at least %d: the hot key did not spread", h, reads[h], perKey)
		}
	}
	if total != readers {
		t.Errorf("%d reads from holders (%v), want one per reader (%d)", total, reads, readers)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		return home.c.ReadClaims().Outstanding == 0 && f.node("h0").c.Holds() == 0 && f.node("h1").c.Holds() == 0
	}, "claims and holds released (claims %+v)", testutil.Lazy(home.c.ReadClaims))
	if cs := home.c.ReadClaims(); cs.Expired != 0 {
		t.Errorf("%d claims ended by their deadline, want every one released by its reader", cs.Expired)
	}
}

// TestLocateKeepsNoAnswer: Locate asks the key's home and keeps nothing
// of its answer, so that a later read on that daemon still asks the home
// (and takes a claim) instead of reading the holders from the cache of
// home answers, which takes none.
func TestLocateKeepsNoAnswer(t *testing.T) {
	ids := []string{"a", "b", "c"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	const key = "locate/key"
	f.node("a").put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a"}) },
		"the holder announced (home knows %v)", testutil.Lazy(func() []string { return f.holders(key) }))
	home := f.node("a").c.Home([]byte(key))
	var r *fakeNode // neither the holder nor the home: its Locate asks another daemon
	for _, id := range ids[1:] {
		if id != home {
			r = f.node(id)
			break
		}
	}
	_, hs, err := r.c.Locate([]byte(key))
	if err != nil || len(hs) != 1 || hs[0].ID != "a" {
		t.Fatalf("Locate on %s: holders %v, %v; want a", r.id, hs, err)
	}
	before := r.c.Stats().CacheHits
	found := make([]bool, 1)
	r.c.Present([][]byte{[]byte(key)}, found)
	if !found[0] {
		t.Fatalf("Present on %s: not found, its home knows %v", r.id, f.holders(key))
	}
	if hits := r.c.Stats().CacheHits - before; hits != 0 {
		t.Errorf("Present after Locate on %s: %d answers from the cache, want 0 (Locate kept its answer)", r.id, hits)
	}
}

// TestReplicasCopied: with 2 replicas a value put on one daemon is copied
// to another (the one rendezvous over the key picks), whose copy its home
// knows; once the putter is gone, every other daemon reads the copy,
// byte-exact.
func TestReplicasCopied(t *testing.T) {
	ids := []string{"a", "b", "c", "d"}
	// The prober finds the putter gone, so its shards' new homes learn
	// the copies from their holders.
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: 50 * time.Millisecond, Replicas: 2})
	a := f.node("a")
	var keys []string
	for i := range 16 {
		k := fmt.Sprintf("rep/%02d", i)
		keys = append(keys, k)
		a.put(t, k, value(k, 4096+i*100))
	}
	for _, k := range keys {
		target := a.c.replicaTargets(a.c.view.Load(), []byte(k), 1)
		if len(target) != 1 {
			t.Fatalf("%s: targets %v", k, target)
		}
		want := []string{"a", target[0]}
		slices.Sort(want)
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), want) },
			"%s held by %v (home knows %v)", k, want, testutil.Lazy(func() []string { return f.holders(k) }))
	}
	// The target announces its copy before it answers: the putter counts
	// it made just after.
	testutil.Eventually(t, 5*time.Second, func() bool { return a.c.Stats().ReplicasMade == uint64(len(keys)) },
		"every copy counted made (stats %+v)", testutil.Lazy(a.c.Stats))
	if s := a.c.Stats(); s.ReplicaFailures != 0 || s.ReplicasShort != 0 {
		t.Errorf("copies failed %d, short %d; want none", s.ReplicaFailures, s.ReplicasShort)
	}
	// The putter goes: every key is read from its copy.
	a.down.Store(true)
	for _, id := range ids[1:] {
		n := f.node(id)
		for _, k := range keys {
			var got []byte
			testutil.Eventually(t, 10*time.Second, func() bool {
				var err error
				got, err = n.read(k, 8192)
				if err == nil && !bytes.Equal(got, value(k, len(got))) {
					t.Fatalf("%s on %s: %d bytes that are not the value", k, id, len(got))
				}
				return err == nil
			}, "%s read on %s", k, id)
			if len(got) != 4096+100*int((k[4]-'0')*10+k[5]-'0') {
				t.Fatalf("%s on %s: %d bytes", k, id, len(got))
			}
		}
	}
}

// TestReadTriesNextReplica: a key two daemons hold, one of whose copies
// is corrupt: every read answers the exact bytes (the corrupt copy, when
// read first, fails its crc32c and the next replica is read), never the
// corrupt ones.
func TestReadTriesNextReplica(t *testing.T) {
	const n = 24
	f := twoHolders(t, nil, "crc", n)
	h0, r := f.node("h0"), f.node("r")
	for i := range n {
		k := fmt.Sprintf("crc/%02d", i)
		// Corrupt h0's copy in its pool (its crc is known already).
		ss := h0.st.NewSession()
		locs := make([]store.Location, 1)
		codes := make([]store.Code, 1)
		if err := ss.GetHere([][]byte{[]byte(k)}, locs, codes, nil); err != nil || codes[0] != store.OK {
			t.Fatalf("%s on h0: %v %v", k, err, codes[0])
		}
		h0.pool.Bytes()[locs[0].Offset] ^= 0xff
		ss.Close()
	}
	readExact(t, r, "crc", n)
	if s := r.c.Stats(); s.CRCMismatch == 0 || s.RemoteHits != n {
		t.Errorf("%d crc mismatches, %d remote hits; want some (h0 read first for about half the keys), %d", s.CRCMismatch, s.RemoteHits, n)
	}
}

// TestReadUsesTransportSums: a span the mover's transport summed as it
// landed is checked by that sum, not read again: reads from a holder whose
// transport sums wrong fail their check (and the next replica is read),
// though the bytes in the pool are right; reads summed right pass.
func TestReadUsesTransportSums(t *testing.T) {
	const n = 24
	f := twoHolders(t, map[string]bool{"h0": true, "h1": false}, "sum", n)
	r := f.node("r")
	readExact(t, r, "sum", n)
	f.gateMu.Lock()
	fromH0, fromH1 := f.reads["h0"], f.reads["h1"]
	f.gateMu.Unlock()
	s := r.c.Stats()
	if fromH0 == 0 || s.CRCMismatch != uint64(fromH0) || fromH1 != n || s.RemoteHits != n || s.CRCLanded != uint64(fromH0+n) {
		t.Errorf("reads h0 %d, h1 %d; %d crc mismatches, %d remote hits, %d summed as they landed; want every read of h0 refused by its sum, all %d from h1, every read summed",
			fromH0, fromH1, s.CRCMismatch, s.RemoteHits, s.CRCLanded, n)
	}
}

// twoHolders makes a net of h0, h1 and r (sums as fakeNet.sums) and puts n
// values of 4 KiB, keys prefix/00 on, on both holders, each announced by
// both.
func twoHolders(t *testing.T, sums map[string]bool, prefix string, n int) *fakeNet {
	t.Helper()
	f := newNet(t, []string{"h0", "h1", "r"}, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour, Staleness: -1})
	f.sums = sums
	h0, h1 := f.node("h0"), f.node("h1")
	for i := range n {
		k := fmt.Sprintf("%s/%02d", prefix, i)
		v := value(k, 4096)
		h0.put(t, k, v)
		h1.put(t, k, v)
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h0", "h1"}) }, "%s announced", k)
	}
	return f
}

// readExact has r read the n values twoHolders put, each byte-exact.
func readExact(t *testing.T, r *fakeNode, prefix string, n int) {
	t.Helper()
	for i := range n {
		k := fmt.Sprintf("%s/%02d", prefix, i)
		got, err := r.read(k, 4096)
		if err != nil || !bytes.Equal(got, value(k, 4096)) {
			t.Fatalf("%s: %d bytes, %v; want the value", k, len(got), err)
		}
	}
}

// TestModeBudgetsRemoteGets: a reader in a mode that admits one remote get
// in flight refuses a second while the first is held (RESOURCE_EXHAUSTED,
// never a miss or other bytes); changed at run time to a mode with room,
// the same get goes on; both answer the exact bytes, and the reader keeps
// each as a copy its home knows (hybrid-cache-first).
func TestModeBudgetsRemoteGets(t *testing.T) {
	budgets := grant.DefaultBudgets
	budgets[grant.GlobalGoverned].RemoteGets = 1
	adm, err := grant.NewAdmission(grant.GlobalGoverned, &budgets, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newNetWith(t, []string{"h", "r"}, Config{Shards: 16, Timeout: 10 * time.Second, ProbeEvery: time.Hour},
		func(id string, c *Config) {
			if id == "r" {
				c.Admission = adm
			}
		})
	h, r := f.node("h"), f.node("r")
	for _, k := range []string{"mode/a", "mode/b"} {
		h.put(t, k, value(k, 8192))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h"}) }, "%s announced", k)
	}
	f.holdReads()
	first := make(chan error, 1)
	go func() {
		got, err := r.read("mode/a", 8192)
		if err == nil && !bytes.Equal(got, value("mode/a", 8192)) {
			err = fmt.Errorf("mode/a: %d bytes that are not the value", len(got))
		}
		first <- err
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return f.inflightNow() == 1 }, "the first get in flight")
	_, err = r.read("mode/b", 8192)
	if err == nil || !errors.Is(err, grant.ErrOverBudget) && !strings.Contains(err.Error(), "RESOURCE_EXHAUSTED") {
		t.Fatalf("second remote get with one admitted and one in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	if st := adm.Stats(); st.GetsRefused != 1 || st.RemoteGets != 1 {
		t.Errorf("admission %+v: want 1 refused, 1 in flight", st)
	}
	if err := adm.SetMode(grant.LocalFirst); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		got, err := r.read("mode/b", 8192)
		if err == nil && !bytes.Equal(got, value("mode/b", 8192)) {
			err = fmt.Errorf("mode/b: %d bytes that are not the value", len(got))
		}
		second <- err
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return f.inflightNow() == 2 }, "the second get admitted in local-first")
	f.releaseReads()
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Error(err)
		}
	}
	for _, k := range []string{"mode/a", "mode/b"} {
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h", "r"}) },
			"%s kept on the reader and announced (home knows %v)", k, testutil.Lazy(func() []string { return f.holders(k) }))
	}
	if st := adm.Stats(); st.RemoteGets != 0 {
		t.Errorf("%d remote gets still counted in flight", st.RemoteGets)
	}

	// One call of two keys in a mode that admits one: the first is read,
	// the second refused, and the place taken is given back.
	if err := adm.SetMode(grant.GlobalGoverned); err != nil {
		t.Fatal(err)
	}
	two := []string{"mode/c", "mode/d"}
	for _, k := range two {
		h.put(t, k, value(k, 8192))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h"}) }, "%s announced", k)
	}
	dsts := [][]byte{make([]byte, 8192), make([]byte, 8192)}
	lens, codes, errs := make([]uint64, 2), make([]store.Code, 2), make([]error, 2)
	if _, err := r.st.Read([][]byte{[]byte(two[0]), []byte(two[1])}, dsts, lens, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	if codes[0] != store.OK || !bytes.Equal(dsts[0][:lens[0]], value(two[0], 8192)) {
		t.Errorf("%s, admitted: code %v (%v), %d bytes; want the value", two[0], codes[0], errs[0], lens[0])
	}
	if codes[1] == store.OK || !errors.Is(errs[1], grant.ErrOverBudget) && !strings.Contains(fmt.Sprint(errs[1]), "RESOURCE_EXHAUSTED") {
		t.Errorf("%s, past the budget of one: code %v (%v); want RESOURCE_EXHAUSTED", two[1], codes[1], errs[1])
	}
	if st := adm.Stats(); st.RemoteGets != 0 || st.GetsRefused != 2 {
		t.Errorf("admission %+v: want none in flight, 2 refused in all", st)
	}
}

// TestReplicaFoundHere: a replicate whose target already has the key
// stands for the copy asked only when the target's value is the same
// (size and crc32c) and, for a durable replicate, on L2; anything else
// fails the copy, and the key's home is told nothing the target does not
// hold: not a durable copy of a value that is only in the target's
// memory, not the sender's crc32c for another value, not a copy of a put
// still in flight there that may yet abort. The target here has no L2.
func TestReplicaFoundHere(t *testing.T) {
	f := newNet(t, []string{"a", "b", "c"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour})
	a := f.node("a")
	// replicate has a copy of key made on its target (returned) and
	// answers how it went.
	replicate := func(key string, durable bool) (string, error) {
		tgt := a.c.replicaTargets(a.c.view.Load(), []byte(key), 1)[0]
		ch := make(chan error, 1)
		a.c.Replicate([][]byte{[]byte(key)}, 2, durable, func(_ int, err error) { ch <- err })
		return tgt, <-ch
	}
	// indexed is the target's copy of key as the home knows it.
	indexed := func(key, tgt string) (Holder, bool) {
		_, hs, err := a.c.Locate([]byte(key))
		if err != nil {
			t.Fatalf("locating %s: %v", key, err)
		}
		for _, h := range hs {
			if h.ID == tgt {
				return h, true
			}
		}
		return Holder{}, false
	}
	// putBoth puts key on a and other on key's target, and waits until
	// the home knows the target's copy.
	putBoth := func(key string, v, other []byte) (string, Holder) {
		a.put(t, key, v)
		tgt := a.c.replicaTargets(a.c.view.Load(), []byte(key), 1)[0]
		f.node(tgt).put(t, key, other)
		var h Holder
		testutil.Eventually(t, 10*time.Second, func() bool {
			var ok bool
			h, ok = indexed(key, tgt)
			return ok && h.Size == uint64(len(other))
		}, "%s's copy on %s indexed", key, tgt)
		return tgt, h
	}

	t.Run("absent durable", func(t *testing.T) {
		// The control: a durable copy on a daemon without L2 fails.
		a.put(t, "found/absent", value("found/absent", 4096))
		if tgt, err := replicate("found/absent", true); err == nil {
			t.Errorf("a durable copy on %s, which has no L2, answered OK", tgt)
		}
	})
	t.Run("same value in memory, durable", func(t *testing.T) {
		k := "found/l1"
		v := value(k, 4096)
		tgt, before := putBoth(k, v, v)
		if _, err := replicate(k, true); !errors.Is(err, ErrReplicaFailed) {
			t.Errorf("a durable copy found in %s's memory only: %v, want ErrReplicaFailed", tgt, err)
		}
		if h, _ := indexed(k, tgt); h != before {
			t.Errorf("the home knows %s's copy as %+v, want %+v as before", tgt, h, before)
		}
	})
	t.Run("same value in memory", func(t *testing.T) {
		k := "found/same"
		v := value(k, 4096)
		tgt, _ := putBoth(k, v, v)
		if _, err := replicate(k, false); err != nil {
			t.Errorf("a copy found in %s, the same value: %v, want OK", tgt, err)
		}
		if h, _ := indexed(k, tgt); h.Tier != TierL1 || h.Size != 4096 {
			t.Errorf("the home knows %s's copy as %+v, want 4096 bytes on L1", tgt, h)
		}
	})
	t.Run("another value", func(t *testing.T) {
		k := "found/other"
		tgt, before := putBoth(k, value(k, 4096), value("another", 4096))
		if _, err := replicate(k, false); !errors.Is(err, ErrReplicaFailed) {
			t.Errorf("a copy found in %s as another value: %v, want ErrReplicaFailed", tgt, err)
		}
		if h, _ := indexed(k, tgt); h != before {
			t.Errorf("the home knows %s's copy as %+v, want %+v, the value it holds", tgt, h, before)
		}
	})
	t.Run("put in flight", func(t *testing.T) {
		k := "found/busy"
		a.put(t, k, value(k, 4096))
		tgt := a.c.replicaTargets(a.c.view.Load(), []byte(k), 1)[0]
		ss := f.node(tgt).st.NewSession()
		codes := make([]store.Code, 1)
		if err := ss.Reserve([][]byte{[]byte(k)}, []uint64{4096}, make([]store.Location, 1), codes, nil); err != nil || codes[0] != store.OK {
			t.Fatalf("reserving %s on %s: %v, %v", k, tgt, err, codes[0])
		}
		_, err := replicate(k, false)
		// The put in flight aborts: no copy is on the target.
		if err := ss.Close(); err != nil {
			t.Fatal(err)
		}
		if err == nil {
			t.Errorf("a copy on %s, where a put of the key was in flight, answered OK", tgt)
		}
		if h, ok := indexed(k, tgt); ok {
			t.Errorf("the home knows a copy on %s (%+v) that is not there", tgt, h)
		}
	})
}

// TestReplicaFoundOnL2: a replicate, durable or not, whose target already
// has the same value on L2 stands for the copy, and the key's home knows
// it on the target's L2, as the target's own announcement said before.
func TestReplicaFoundOnL2(t *testing.T) {
	f := newNetWith(t, []string{"a", "b", "c"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour}, nil, withL2("b", "c"))
	a := f.node("a")
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			k := fmt.Sprintf("found/l2/%v", durable)
			v := value(k, 4096)
			a.put(t, k, v)
			tgt := f.node(a.c.replicaTargets(a.c.view.Load(), []byte(k), 1)[0])
			ss := tgt.st.NewSession()
			codes := make([]store.Code, 1)
			if _, err := ss.Put([][]byte{[]byte(k)}, [][]byte{v}, true, codes, nil, nil, 0); err != nil || codes[0] != store.OK {
				t.Fatalf("durable put of %s on %s: %v, %v", k, tgt.id, err, codes[0])
			}
			ss.Close()
			// Its own announcement first: the replicate's comes after it.
			testutil.Eventually(t, 10*time.Second, func() bool { return slices.Contains(f.holders(k), tgt.id) },
				"%s's copy on %s indexed", k, tgt.id)
			ch := make(chan error, 1)
			a.c.Replicate([][]byte{[]byte(k)}, 2, durable, func(_ int, err error) { ch <- err })
			if err := <-ch; err != nil {
				t.Fatalf("a copy found on %s's L2: %v, want OK", tgt.id, err)
			}
			_, hs, err := a.c.Locate([]byte(k))
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				if h.ID == tgt.id && h.Tier == TierL2 {
					return
				}
			}
			t.Errorf("the home knows %s's copies as %+v, want one on %s's L2", k, hs, tgt.id)
		})
	}
}

// TestFetchOverMaxKeysPerCall: a holder and a reader whose stores take
// fewer keys per call (64) than a peer's message carries (maxMsgKeys)
// still serve and keep a read of 100 keys from one holder: the hold, the
// reservations and the commits go to the stores in parts.
func TestFetchOverMaxKeysPerCall(t *testing.T) {
	f := newNetWith(t, []string{"h", "r", "x"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour, Staleness: -1},
		nil, withMaxKeysPerCall(64, "h", "r"))
	fetchKeepsAll(t, f, "parts/%03d", 100, 1024)
}

// TestFetchOverSessionReserve: a reader fetching from one holder more
// bytes than one of its store's sessions may hold reserved (a quarter of
// its L1, 256 KiB here: 20 values of 32 KiB) lands them in parts each
// within that bound, and keeps every one.
func TestFetchOverSessionReserve(t *testing.T) {
	f := newNet(t, []string{"h", "r", "x"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour, Staleness: -1})
	fetchKeepsAll(t, f, "big/%02d", 20, 32<<10)
}

// fetchKeepsAll puts n values of size bytes on h (keys named by format
// and their number), waits until their home knows them, has r fetch them
// all at once, and checks that each fetch ended well and r keeps each.
func fetchKeepsAll(t *testing.T, f *fakeNet, format string, n, size int) {
	t.Helper()
	h, r := f.node("h"), f.node("r")
	var keys [][]byte
	for i := range n {
		k := fmt.Sprintf(format, i)
		h.put(t, k, value(k, size))
		keys = append(keys, []byte(k))
	}
	for _, k := range keys {
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(string(k)), []string{"h"}) },
			"%s announced", k)
	}
	everyKeyOK(t, keys, func(done func(int, error)) { r.c.Fetch(keys, done) })
	for _, k := range keys {
		// Kept here (unseen by readers until its home takes it).
		if !r.st.HeldHere(k) {
			t.Errorf("%s not kept on r after its fetch", k)
		}
	}
}

// everyKeyOK runs call, which ends each of keys once through done, and
// fails t for each that ended with an error.
func everyKeyOK(t *testing.T, keys [][]byte, call func(done func(i int, err error))) {
	t.Helper()
	errs := make(chan error, len(keys))
	call(func(i int, err error) {
		if err != nil {
			err = fmt.Errorf("%s: %w", keys[i], err)
		}
		errs <- err
	})
	for range keys {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestReplicateOverMaxKeysPerCall: a target whose store takes fewer keys
// per call (64) than a replicate carries makes every copy of a batch of
// 100.
func TestReplicateOverMaxKeysPerCall(t *testing.T) {
	f := newNetWith(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour},
		nil, withMaxKeysPerCall(64, "b"))
	a := f.node("a")
	var keys [][]byte
	for i := range 100 {
		k := fmt.Sprintf("parts/%03d", i)
		a.put(t, k, value(k, 1024))
		keys = append(keys, []byte(k))
	}
	everyKeyOK(t, keys, func(done func(int, error)) { a.c.Replicate(keys, 2, false, done) })
	for _, k := range keys {
		if code := f.node("b").here(t, string(k)); code != store.OK {
			t.Errorf("%s on b after its copy: %v, want OK", k, code)
		}
	}
}

// TestDurableReplicaStaysOnL2: a durable copy's target announces it twice,
// once as a value its store committed (its announcer, in the background)
// and once before it answers the replicate. Whichever reaches the key's
// home last, the home knows the copy on the target's L2. Here the store's
// comes last: the target's announcer is held in an announcement to a
// silent daemon (the home of another key it holds) until the replicate
// has answered.
func TestDurableReplicaStaysOnL2(t *testing.T) {
	f := newNetWith(t, []string{"a", "b", "c", "d"}, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour},
		nil, withL2("b", "c", "d"))
	a := f.node("a")
	const k = "durable/l2"
	tgt := f.node(a.c.replicaTargets(a.c.view.Load(), []byte(k), 1)[0])
	home := a.c.Home([]byte(k))
	// other is a key whose home is neither a, the target nor k's home.
	other := ""
	for i := 0; other == ""; i++ {
		o := fmt.Sprintf("other/%d", i)
		if h := a.c.Home([]byte(o)); h != a.id && h != tgt.id && h != home {
			other = o
		}
	}
	a.put(t, k, value(k, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"a"}) },
		"%s announced by a", k)
	tgt.announcedAll(t)
	release := f.silence(t, a.c.Home([]byte(other)))
	tgt.put(t, other, value(other, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool {
		tgt.c.mu.Lock()
		defer tgt.c.mu.Unlock()
		return len(tgt.c.pending) == 0 && tgt.c.sending
	}, "%s's announcer held in the announcement of %s", tgt.id, other)

	ch := make(chan error, 1)
	a.c.Replicate([][]byte{[]byte(k)}, 2, true, func(_ int, err error) { ch <- err })
	if err := <-ch; err != nil {
		t.Fatalf("a durable copy on %s: %v, want OK", tgt.id, err)
	}
	// tier is the target's copy of k as the home knows it.
	tier := func() uint8 {
		_, hs, err := a.c.Locate([]byte(k))
		if err != nil {
			t.Fatalf("locating %s: %v", k, err)
		}
		for _, h := range hs {
			if h.ID == tgt.id {
				return h.Tier
			}
		}
		return tierGone
	}
	if got := tier(); got != TierL2 {
		t.Fatalf("once the durable copy is made, the home knows it on %s's tier %d, want L2 (%d)", tgt.id, got, TierL2)
	}
	release()
	tgt.announcedAll(t)
	if got := tier(); got != TierL2 {
		t.Errorf("after %s's store announced the copy too, the home knows it on tier %d, want L2 (%d)", tgt.id, got, TierL2)
	}
}
