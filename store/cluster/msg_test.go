package cluster

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/store"
)

func TestMessagesRoundTrip(t *testing.T) {
	keys := [][]byte{[]byte("a"), bytes.Repeat([]byte("k"), 256)}
	got, err := decodeKeys(encodeKeys(keys))
	if err != nil || len(got) != 2 || !bytes.Equal(got[1], keys[1]) {
		t.Fatalf("keys: %q, %v", got, err)
	}
	es := []entry{{key: []byte("x"), tier: TierL2, size: 1 << 20, crc: 0xdeadbeef}}
	ge, err := decodeAnnounce(encodeAnnounce(es))
	if err != nil || len(ge) != 1 || ge[0].size != 1<<20 || ge[0].crc != 0xdeadbeef || ge[0].tier != TierL2 {
		t.Fatalf("announce: %+v, %v", ge, err)
	}
	as := []lookupAnswer{{code: codeNotHome}, {holders: []Holder{{ID: "d1", Epoch: 7, Tier: TierL1, Size: 3, CRC: 9}}}}
	ga, err := decodeLookupAnswer(encodeLookupAnswer(as), 2)
	if err != nil || ga[0].code != codeNotHome || ga[1].holders[0] != as[1].holders[0] {
		t.Fatalf("lookup answer: %+v, %v", ga, err)
	}
	if _, err := decodeLookupAnswer(encodeLookupAnswer(as), 3); !errors.Is(err, ErrMessage) {
		t.Fatalf("an answer of 2 for 3 keys: %v, want ErrMessage", err)
	}
	ttl, gk, err := decodeHold(encodeHold(1500, keys))
	if err != nil || ttl != 1500 || len(gk) != 2 {
		t.Fatalf("hold: %d %q %v", ttl, gk, err)
	}
	claim, hs, err := decodeHeld(encodeHeld(42, []held{{code: 0, offset: 4096, size: 8}}), 1)
	if err != nil || claim != 42 || hs[0].offset != 4096 || hs[0].size != 8 {
		t.Fatalf("held: %d %+v %v", claim, hs, err)
	}
	if c, err := decodeClaim(encodeClaim(5)); err != nil || c != 5 {
		t.Fatalf("claim: %d %v", c, err)
	}
	for name, b := range map[string][]byte{
		"empty":         nil,
		"version":       {2, 0, 0, 0, 0},
		"trailing":      append(encodeKeys(keys), 0),
		"short key":     {1, 1, 0, 0, 0, 9, 0, 'a'},
		"empty key":     {1, 1, 0, 0, 0, 0, 0},
		"too long key":  append([]byte{1, 1, 0, 0, 0, 1, 1}, make([]byte, 257)...),
		"huge count":    {1, 0xff, 0xff, 0xff, 0xff},
		"no holder id":  {1, 1, 0, 0, 0, 0, 1, 0},
		"many holders":  {1, 1, 0, 0, 0, 0, 5},
		"ttl, no count": {1, 1, 0, 0, 0},
	} {
		_, e1 := decodeKeys(b)
		_, e2 := decodeAnnounce(b)
		_, e3 := decodeLookupAnswer(b, 1)
		_, _, e4 := decodeHold(b)
		_, _, e5 := decodeHeld(b, 1)
		for i, err := range []error{e1, e2, e3, e4, e5} {
			if err != nil && !errors.Is(err, ErrMessage) {
				t.Errorf("%s, decoder %d: %v, not ErrMessage", name, i, err)
			}
		}
		if e1 == nil && e2 == nil && e3 == nil && e4 == nil && e5 == nil {
			t.Errorf("%s: every decoder took it", name)
		}
	}
}

// TestDropMessage: a drop carries its keys, and a tombstone's drop the age
// of each removal; its answer names the keys kept. A drop without ages
// (a live removal's, or an older daemon's) decodes with none, except as a
// tombstone's drop (kindDropAges), which must have them.
func TestDropMessage(t *testing.T) {
	keys := [][]byte{[]byte("a"), []byte("bc")}
	for _, aged := range []bool{false, true} {
		got, ages, err := decodeDrop(encodeDrop(keys, []uint32{0, 1234}), aged)
		if err != nil || len(got) != 2 || string(got[1]) != "bc" || !slices.Equal(ages, []uint32{0, 1234}) {
			t.Fatalf("drop with ages (aged %v): %q %v %v", aged, got, ages, err)
		}
	}
	if got, ages, err := decodeDrop(encodeKeys(keys), false); err != nil || len(got) != 2 || ages != nil {
		t.Fatalf("drop without ages: %q %v %v", got, ages, err)
	}
	if _, _, err := decodeDrop(encodeKeys(keys), true); !errors.Is(err, ErrMessage) {
		t.Fatalf("a tombstone's drop without ages: %v, want ErrMessage", err)
	}
	for name, b := range map[string][]byte{
		"one age short":  encodeDrop(keys, []uint32{1}),
		"half an age":    append(encodeKeys(keys), 1, 2),
		"ages, no keys":  append(encodeKeys(nil), 1, 0, 0, 0),
		"position out":   encodePositions([]int{9}),
		"positions over": {msgVersion, 0xff, 0xff, 0xff, 0xff},
	} {
		_, _, e1 := decodeDrop(b, false)
		_, e2 := decodePositions(b, 2)
		if e1 == nil && e2 == nil || e1 != nil && !errors.Is(e1, ErrMessage) || e2 != nil && !errors.Is(e2, ErrMessage) {
			t.Errorf("%s: drop %v, positions %v; want ErrMessage from one at least", name, e1, e2)
		}
	}
	if ps, err := decodePositions(encodePositions([]int{1, 0}), 2); err != nil || !slices.Equal(ps, []int{1, 0}) {
		t.Fatalf("positions: %v %v", ps, err)
	}
	for _, b := range [][]byte{encodePositions(nil), {msgVersion, 0, 0, 0, 0}} {
		if ps, err := decodePositions(b, 2); err != nil || len(ps) != 0 {
			t.Fatalf("no positions (% x): %v %v", b, ps, err)
		}
	}
	// A removal's answer: with no key kept it is encodePositions' (what
	// older daemons send and read); with some, an older daemon's decode
	// fails (the removal reported not taken, never taken).
	for _, c := range []struct{ notHome, kept []int }{{nil, nil}, {[]int{1}, nil}, {nil, []int{0}}, {[]int{1}, []int{0}}} {
		b := encodeRemoveAnswer(c.notHome, c.kept)
		nh, kept, err := decodeRemoveAnswer(b, 2)
		if err != nil || !slices.Equal(nh, c.notHome) || !slices.Equal(kept, c.kept) {
			t.Fatalf("remove answer %v %v: decoded %v %v %v", c.notHome, c.kept, nh, kept, err)
		}
		old, err := decodePositions(b, 2)
		if len(c.kept) == 0 && (err != nil || !slices.Equal(old, c.notHome)) || len(c.kept) > 0 && !errors.Is(err, ErrMessage) {
			t.Fatalf("remove answer %v %v read as positions: %v %v", c.notHome, c.kept, old, err)
		}
	}
	if _, _, err := decodeRemoveAnswer(encodeRemoveAnswer([]int{0}, []int{5}), 2); !errors.Is(err, ErrMessage) {
		t.Fatalf("a kept position out of range: %v, want ErrMessage", err)
	}
	if ageMS(-time.Second) != 0 || ageMS(1500*time.Microsecond) != 1 || ageMS(100*24*time.Hour) != math.MaxUint32 {
		t.Fatal("ageMS does not clamp and round down")
	}
}

// FuzzDecode: no input makes a decoder panic, and what decodes encodes
// back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(encodeKeys([][]byte{[]byte("a"), []byte("bc")}))
	f.Add(encodeAnnounce([]entry{{key: []byte("x"), tier: 1, size: 2, crc: 3}}))
	f.Add(encodeLookupAnswer([]lookupAnswer{{holders: []Holder{{ID: "d", Epoch: 1}}}}))
	f.Add(encodeHold(10, [][]byte{[]byte("k")}))
	f.Add(encodeHeld(1, []held{{offset: 1, size: 2}}))
	now := time.Unix(1_700_000_000, 0)
	f.Add(encodeTombs([]tomb{{key: "k", holder: "d", size: 4096, crc: 7, at: now.Add(-time.Second)}}, now))
	f.Add(encodeRead([]byte("k"), 4096))
	f.Add(encodeReadAnswer(store.Busy, 0))
	f.Add(encodeDrop([][]byte{[]byte("k"), []byte("j")}, []uint32{5, 70000}))
	f.Add(encodePositions([]int{0, 3}))
	f.Add(encodeRemoveAnswer([]int{1}, []int{0, 3}))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, aged := range []bool{false, true} {
			if keys, ages, err := decodeDrop(b, aged); err == nil && !bytes.Equal(encodeDrop(keys, ages), b) {
				t.Fatalf("drop %q %v (aged %v) re-encodes differently", keys, ages, aged)
			}
		}
		// No positions encode as the version byte alone; a count of 0
		// (as older daemons sent) decodes the same.
		if ps, err := decodePositions(b, 8); err == nil && !bytes.Equal(encodePositions(ps), b) && len(ps) > 0 {
			t.Fatalf("positions %v re-encode differently", ps)
		}
		if nh, kept, err := decodeRemoveAnswer(b, 8); err == nil && len(kept) > 0 && !bytes.Equal(encodeRemoveAnswer(nh, kept), b) {
			t.Fatalf("remove answer %v %v re-encodes differently", nh, kept)
		}
		if keys, err := decodeKeys(b); err == nil && !bytes.Equal(encodeKeys(keys), b) {
			t.Fatalf("keys %q re-encode differently", keys)
		}
		if es, err := decodeAnnounce(b); err == nil && !bytes.Equal(encodeAnnounce(es), b) {
			t.Fatal("announce re-encodes differently")
		}
		if as, err := decodeLookupAnswer(b, 1); err == nil && !bytes.Equal(encodeLookupAnswer(as), b) {
			t.Fatal("lookup answer re-encodes differently")
		}
		if ttl, keys, err := decodeHold(b); err == nil && !bytes.Equal(encodeHold(ttl, keys), b) {
			t.Fatal("hold re-encodes differently")
		}
		if c, hs, err := decodeHeld(b, 1); err == nil && !bytes.Equal(encodeHeld(c, hs), b) {
			t.Fatal("held re-encodes differently")
		}
		if ts, err := decodeTombs(b, now); err == nil && !bytes.Equal(encodeTombs(ts, now), b) {
			t.Fatal("tombstones re-encode differently")
		}
		if k, size, err := decodeRead(b); err == nil && !bytes.Equal(encodeRead(k, size), b) {
			t.Fatal("read re-encodes differently")
		}
		if code, size, err := decodeReadAnswer(b); err == nil && !bytes.Equal(encodeReadAnswer(code, size), b) {
			t.Fatal("read answer re-encodes differently")
		}
	})
}

// TestReplicaClaimMessages: the claim, unclaim and replicate messages and
// answers round-trip, and bad ones are ErrMessage.
func TestReplicaClaimMessages(t *testing.T) {
	as := []lookupAnswer{{code: codeBusy, holders: []Holder{{ID: "h", Epoch: 2}}}, {claim: 77, holders: []Holder{{ID: "d1", Epoch: 7, Tier: TierL1, Size: 3, CRC: 9}}}}
	ga, err := decodeClaimAnswer(encodeClaimAnswer(as), 2)
	if err != nil || ga[0].code != codeBusy || ga[1].claim != 77 || ga[1].holders[0] != as[1].holders[0] {
		t.Fatalf("claim answer: %+v, %v", ga, err)
	}
	if _, err := decodeClaimAnswer([]byte{msgVersion, 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 1); !errors.Is(err, ErrMessage) {
		t.Fatalf("a claim answer with code 3: %v, want ErrMessage", err)
	}
	ids, err := decodeClaims(encodeClaims([]uint64{1, 1 << 40}))
	if err != nil || len(ids) != 2 || ids[1] != 1<<40 {
		t.Fatalf("claims: %v, %v", ids, err)
	}
	es := []entry{{key: []byte("k"), size: 256 << 10, crc: 0xabcd}}
	d, ge, err := decodeReplicate(encodeReplicate(true, es))
	if err != nil || !d || len(ge) != 1 || ge[0].size != 256<<10 || ge[0].crc != 0xabcd {
		t.Fatalf("replicate: %v %+v %v", d, ge, err)
	}
	for name, b := range map[string][]byte{
		"no keys":       encodeReplicate(false, nil),
		"durable flag2": {msgVersion, 2, 0, 0, 0, 0},
		"truncated":     encodeReplicate(true, es)[:8],
	} {
		if _, _, err := decodeReplicate(b); !errors.Is(err, ErrMessage) {
			t.Errorf("replicate %s: %v, want ErrMessage", name, err)
		}
	}
	codes, err := decodeReplicated([]byte{msgVersion, 2, 0, 0, 0, 0, 5}, 2)
	if err != nil || codes[1] != 5 {
		t.Fatalf("replicated: %v %v", codes, err)
	}
	if _, err := decodeReplicated([]byte{msgVersion, 2, 0, 0, 0, 0, 5}, 3); !errors.Is(err, ErrMessage) {
		t.Fatalf("2 codes for 3 keys: %v, want ErrMessage", err)
	}
}

// FuzzDecodeReplicaClaim: the claim and replica decoders never panic, and
// what decodes encodes back to the same bytes.
func FuzzDecodeReplicaClaim(f *testing.F) {
	f.Add(encodeClaimAnswer([]lookupAnswer{{claim: 3, holders: []Holder{{ID: "d", Epoch: 1}}}}))
	f.Add(encodeClaims([]uint64{9}))
	f.Add(encodeReplicate(true, []entry{{key: []byte("k"), size: 1, crc: 2}}))
	f.Add(encodeRead([]byte("k"), 4096))
	f.Add(encodeReadAnswer(store.OK, 4096))
	f.Fuzz(func(t *testing.T, b []byte) {
		if k, size, err := decodeRead(b); err == nil && !bytes.Equal(encodeRead(k, size), b) {
			t.Fatal("read re-encodes differently")
		}
		if code, size, err := decodeReadAnswer(b); err == nil && !bytes.Equal(encodeReadAnswer(code, size), b) {
			t.Fatal("read answer re-encodes differently")
		}
		if as, err := decodeClaimAnswer(b, 1); err == nil && !bytes.Equal(encodeClaimAnswer(as), b) {
			t.Fatal("claim answer re-encodes differently")
		}
		if ids, err := decodeClaims(b); err == nil && !bytes.Equal(encodeClaims(ids), b) {
			t.Fatal("claims re-encode differently")
		}
		if d, es, err := decodeReplicate(b); err == nil && !bytes.Equal(encodeReplicate(d, es), b) {
			t.Fatal("replicate re-encodes differently")
		}
		_, _ = decodeReplicated(b, 1)
	})
}

// TestTombsMessage: tombstones handed to a new home keep their key,
// holder, size, crc32c and age; a bad holder id is ErrMessage.
func TestTombsMessage(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ts := []tomb{{key: "a", holder: "d1", size: 9, crc: 3, at: now.Add(-1500 * time.Millisecond)}, {key: "bb", holder: "d2", at: now}}
	later := now.Add(time.Minute)
	got, err := decodeTombs(encodeTombs(ts, now), later)
	if err != nil || len(got) != 2 {
		t.Fatalf("%+v, %v", got, err)
	}
	for i := range ts {
		if got[i].key != ts[i].key || got[i].holder != ts[i].holder || got[i].size != ts[i].size || got[i].crc != ts[i].crc ||
			later.Sub(got[i].at) != now.Sub(ts[i].at) {
			t.Errorf("tombstone %d: %+v, want %+v (same age)", i, got[i], ts[i])
		}
	}
	bad := encodeTombs([]tomb{{key: "a", holder: "", at: now}}, now)
	if _, err := decodeTombs(bad, now); !errors.Is(err, ErrMessage) {
		t.Fatalf("empty holder id: %v, want ErrMessage", err)
	}
}
