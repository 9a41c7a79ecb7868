package store

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
)

func keysN(prefix string, n int) [][]byte {
	ks := make([][]byte, n)
	for i := range ks {
		ks[i] = []byte(fmt.Sprintf("%s-%04d", prefix, i))
	}
	return ks
}

func valueFor(key []byte, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = key[i%len(key)] ^ byte(i*7)
	}
	return v
}

func valuesFor(keys [][]byte, n int) [][]byte {
	vs := make([][]byte, len(keys))
	for i, k := range keys {
		vs[i] = valueFor(k, n+i)
	}
	return vs
}

// mustCodes fails unless codes equals want, naming the first mismatch.
func mustCodes(t testing.TB, what string, codes []Code, want ...Code) {
	t.Helper()
	if len(want) == 1 && len(codes) != 1 {
		w := make([]Code, len(codes))
		fill(w, want[0])
		want = w
	}
	if !slices.Equal(codes, want) {
		t.Fatalf("%s: codes %v, want %v", what, codes, want)
	}
}

// put puts keys with vals, in calls of at most MaxKeysPerCall keys.
func (e *testEnv) put(ss *Session, keys, vals [][]byte, durable bool) []Code {
	e.t.Helper()
	codes := make([]Code, len(keys))
	errs := make([]error, len(keys))
	step := e.s.cfg.MaxKeysPerCall
	for i := 0; i < len(keys); i += step {
		j := min(i+step, len(keys))
		if _, err := ss.Put(keys[i:j], vals[i:j], durable, codes[i:j], errs[i:j], nil, 0); err != nil {
			e.t.Fatalf("Put: %v", err)
		}
	}
	return codes
}

func (e *testEnv) read(keys [][]byte, size int) ([][]byte, []Code) {
	e.t.Helper()
	dsts := make([][]byte, len(keys))
	for i := range dsts {
		dsts[i] = make([]byte, size)
	}
	lens := make([]uint64, len(keys))
	codes := make([]Code, len(keys))
	if _, err := e.s.Read(keys, dsts, lens, codes, nil, nil, 0); err != nil {
		e.t.Fatalf("Read: %v", err)
	}
	for i := range dsts {
		dsts[i] = dsts[i][:lens[i]]
	}
	return dsts, codes
}

func (e *testEnv) exists(keys [][]byte) []Code {
	e.t.Helper()
	codes := make([]Code, len(keys))
	if err := e.s.Exists(keys, codes); err != nil {
		e.t.Fatalf("Exists: %v", err)
	}
	return codes
}

// checkValues reads keys back and compares with vals.
func (e *testEnv) checkValues(keys, vals [][]byte) {
	e.t.Helper()
	got, codes := e.read(keys, 1<<20)
	for i := range keys {
		if codes[i] != OK {
			e.t.Fatalf("read %q: %v", keys[i], codes[i])
		}
		if !bytes.Equal(got[i], vals[i]) {
			e.t.Fatalf("read %q: %d bytes, not the %d put", keys[i], len(got[i]), len(vals[i]))
		}
	}
}

// TestL1Basics: put (copying), read, exists, get with pins, remove, all
// positional, with bad keys and duplicates in the batch as typed results.
func TestL1Basics(t *testing.T) {
	e := newEnv(t, 8<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("k", 5)
	vals := valuesFor(keys, 1000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	e.checkValues(keys, vals)
	mustCodes(t, "exists", e.exists(append(keysN("k", 6), nil, bytes.Repeat([]byte{'x'}, 257))),
		OK, OK, OK, OK, OK, NotFound, InvalidArgument, InvalidArgument)

	// The same key twice in one batch, and an existing key: the first new
	// one wins, the rest are typed results.
	dup := [][]byte{[]byte("new2"), []byte("new2"), keys[0], []byte("")}
	mustCodes(t, "put dup", e.put(ss, dup, [][]byte{{1}, {2}, {3}, {4}}, false), OK, AlreadyExists, AlreadyExists, InvalidArgument)

	// Get pins and returns locations; the bytes there are the value.
	locs := make([]Location, 3)
	codes := make([]Code, 3)
	get := [][]byte{keys[1], []byte("absent"), keys[2]}
	if _, err := ss.Get(get, locs, codes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "get", codes, OK, NotFound, OK)
	mem := e.pool.Bytes()
	if !bytes.Equal(mem[locs[0].Offset:locs[0].Offset+locs[0].Length], vals[1]) || locs[1] != (Location{}) {
		t.Fatal("get: locations do not hold the values")
	}
	if st := e.s.Stats(); st.Pins != 2 {
		t.Fatalf("pins = %d, want 2", st.Pins)
	}
	// A pinned key cannot be removed; an absent one is removed (idempotent).
	rm := [][]byte{keys[1], []byte("absent"), keys[3]}
	rc := make([]Code, 3)
	rerrs := make([]error, 3)
	if _, err := e.s.Remove(rm, rc, rerrs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", rc, FailedPrecondition, OK, OK)
	if !errors.Is(rerrs[0], ErrPinned) || rerrs[1] != nil {
		t.Fatalf("remove errs %v", rerrs)
	}
	mustCodes(t, "unpin", func() []Code {
		c := make([]Code, 2)
		if err := ss.Unpin([][]byte{keys[1], keys[2]}, c); err != nil {
			t.Fatal(err)
		}
		return c
	}(), OK, OK)
	if _, err := e.s.Remove(rm, rc, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove after unpin", rc, OK, OK, OK)
	mustCodes(t, "exists after remove", e.exists(keys), OK, NotFound, OK, NotFound, OK)
	if st := e.s.Stats(); st.Keys != 4 || st.Pins != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBadCalls: a malformed call changes nothing and sets every code; a
// closed store or session refuses with UNAVAILABLE.
func TestBadCalls(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.MaxKeysPerCall = 4 }))
	ss := e.s.NewSession()
	keys := keysN("k", 3)
	codes := make([]Code, 3)
	if _, err := ss.Put(keys, valuesFor(keys[:2], 10), false, codes, nil, nil, 0); !errors.Is(err, ErrBadCall) {
		t.Fatalf("short vals: %v", err)
	}
	mustCodes(t, "short vals", codes, InvalidArgument)
	if err := e.s.Exists(keys, codes[:2]); !errors.Is(err, ErrBadCall) {
		t.Fatalf("short codes: %v", err)
	}
	five := keysN("f", 5)
	c5 := make([]Code, 5)
	if err := e.s.Exists(five, c5); !errors.Is(err, ErrBadCall) {
		t.Fatalf("too many keys: %v", err)
	}
	mustCodes(t, "too many", c5, InvalidArgument)
	if e.s.Stats().Keys != 0 {
		t.Fatal("a refused call stored something")
	}
	big := [][]byte{make([]byte, 256<<10+1)}
	bc := make([]Code, 1)
	if _, err := ss.Put([][]byte{[]byte("big")}, big, false, bc, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "too big", bc, InvalidArgument)
	ss.Close()
	if _, err := ss.Put(keys, valuesFor(keys, 10), false, codes, nil, nil, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed session: %v", err)
	}
	mustCodes(t, "closed session", codes, Unavailable)
	e.s.Close()
	if err := e.s.Exists(keys, codes); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed store: %v", err)
	}
	mustCodes(t, "closed store", codes, Unavailable)
}

// TestReserveCommit: the zero-copy put. Reserved keys are invisible until
// committed; only the reserving session commits; a session that closes
// drops its reservations.
func TestReserveCommit(t *testing.T) {
	e := newEnv(t, 8<<20)
	a, b := e.s.NewSession(), e.s.NewSession()
	defer a.Close()
	keys := keysN("z", 3)
	locs := make([]Location, 3)
	codes := make([]Code, 3)
	if err := a.Reserve(keys, []uint64{100, 5000, 1}, locs, codes, nil); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "reserve", codes, OK)
	mem := e.pool.Bytes()
	vals := valuesFor(keys, 0)
	vals[0], vals[1], vals[2] = valueFor(keys[0], 100), valueFor(keys[1], 5000), valueFor(keys[2], 1)
	for i, l := range locs {
		if l.Length != uint64(len(vals[i])) {
			t.Fatalf("loc %d length %d", i, l.Length)
		}
		copy(mem[l.Offset:], vals[i])
	}
	mustCodes(t, "invisible", e.exists(keys), NotFound)
	if err := b.Reserve(keys[:1], []uint64{10}, locs[:1], codes[:1], nil); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "reserve again", codes[:1], Busy)
	if _, err := b.Commit(keys, false, codes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit by another session", codes, Busy)
	if _, err := a.Commit(append(keys, []byte("never")), false, append(codes, 0), nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	codes = codes[:3]
	e.checkValues(keys, vals)
	if _, err := a.Commit(keys[:1], false, codes[:1], nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit twice", codes[:1], AlreadyExists)

	before := e.pool.Stats().Blocks
	if err := b.Reserve([][]byte{[]byte("gone")}, []uint64{10}, locs[:1], codes[:1], nil); err != nil {
		t.Fatal(err)
	}
	if e.pool.Stats().Blocks != before+1 {
		t.Fatal("reserve took no block")
	}
	b.Close()
	if e.pool.Stats().Blocks != before {
		t.Fatal("closing the session left its reservation's block allocated")
	}
	if st := e.s.Stats(); st.Reserved != 0 || st.Keys != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestStatList: the operator's view of keys: size, tier, pins, in key
// order, bounded.
func TestStatList(t *testing.T) {
	e := newEnv(t, 8<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("ls", 30)
	mustCodes(t, "put", e.put(ss, keys[:20], valuesFor(keys[:20], 100), true), OK)
	mustCodes(t, "put", e.put(ss, keys[20:], valuesFor(keys[20:], 100), false), OK)
	mustCodes(t, "other", e.put(ss, keysN("zz", 3), valuesFor(keysN("zz", 3), 10), false), OK)
	if err := ss.Pin(keys[3:4], 0, make([]Code, 1)); err != nil {
		t.Fatal(err)
	}
	in, err := e.s.Stat(keys[3])
	if err != nil || in.Size != 103 || !in.InL1 || !in.InL2 || in.Pins != 1 || in.Dirty {
		t.Fatalf("stat durable: %+v %v", in, err)
	}
	// A plain put is in L1, dirty until the background writeback (which may
	// already have run) puts it on L2 too.
	in, err = e.s.Stat(keys[25])
	if err != nil || !in.InL1 || in.Dirty == in.InL2 {
		t.Fatalf("stat plain: %+v %v", in, err)
	}
	if _, err := e.s.Stat([]byte("absent")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("stat absent: %v", err)
	}
	got, more, err := e.s.List([]byte("ls-"), 25)
	if err != nil || !more || len(got) != 25 {
		t.Fatalf("list: %d keys, more %v, %v", len(got), more, err)
	}
	for i, ki := range got {
		if !bytes.Equal(ki.Key, keys[i]) {
			t.Fatalf("list[%d] = %s, want %s", i, ki.Key, keys[i])
		}
	}
	if all, more, _ := e.s.List(nil, 1000); len(all) != 33 || more {
		t.Fatalf("list all: %d, more %v", len(all), more)
	}
	// Paging on from the last key of an answer: the rest, in order.
	rest, more, err := e.s.ListAfter([]byte("ls-"), got[len(got)-1].Key, 25)
	if err != nil || more || len(rest) != 5 || !bytes.Equal(rest[0].Key, keys[25]) || !bytes.Equal(rest[4].Key, keys[29]) {
		t.Fatalf("list after %s: %d keys, more %v, %v", got[len(got)-1].Key, len(rest), more, err)
	}
	if _, _, err := e.s.List(nil, 0); !errors.Is(err, ErrBadCall) {
		t.Fatalf("list max 0: %v", err)
	}
}

// TestL1SlabsHeldByOtherSizes: under its capacity, with every slab of the
// pool held by other block sizes, a put of a new size evicts cold values
// until a slab comes free, instead of answering L1 full.
func TestL1SlabsHeldByOtherSizes(t *testing.T) {
	// Four slabs of 256 KiB: three full of 4 KiB values, one held by an
	// 8 KiB value.
	e := newEnv(t, 1<<20, withCfg(func(c *Config) { c.L1Capacity = 1 << 20 }))
	ss := e.s.NewSession()
	defer ss.Close()
	small := keysN("small", 192)
	vals := make([][]byte, len(small))
	for i := range vals {
		vals[i] = valueFor(small[i], 4096)
	}
	mustCodes(t, "fill", e.put(ss, small, vals, false), OK)
	mustCodes(t, "8 KiB", e.put(ss, keysN("mid", 1), [][]byte{make([]byte, 8192)}, false), OK)
	if st := e.pool.Stats(); st.FreeSlabs != 0 {
		t.Fatalf("%d slabs free after the fill", st.FreeSlabs)
	}
	big := keysN("big", 1)
	mustCodes(t, "64 KiB with no slab free", e.put(ss, big, [][]byte{valueFor(big[0], 64<<10)}, false), OK)
	if st := e.s.Stats(); st.L1Full != 0 || st.EvictionsL1 == 0 {
		t.Fatalf("stats %+v", st)
	}
	e.checkValues(big, [][]byte{valueFor(big[0], 64<<10)})
}

// TestEvictColdestFirst: eviction takes the coldest values of the whole
// store, not all of one shard's: after evicting a tenth of the values, the
// newest ones are all there and those evicted are the oldest.
func TestEvictColdestFirst(t *testing.T) {
	e := newEnv(t, 64<<20, withCfg(func(c *Config) { c.L1Capacity = 64 << 20 }))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("lru", 1000)
	for i := range keys {
		mustCodes(t, "put", e.put(ss, keys[i:i+1], [][]byte{valueFor(keys[i], 4096)}, false), OK)
	}
	if freed := e.s.evict(100*4096, 64); freed < 100*4096 {
		t.Fatalf("freed %d bytes", freed)
	}
	codes := e.exists(keys)
	old := 0
	for i, c := range codes {
		switch {
		case c == OK:
		case i >= 900:
			t.Fatalf("key %d of the newest hundred was evicted", i)
		case i < 300:
			old++
		}
	}
	if gone := 1000 - e.s.Stats().Keys; gone < 100 || old < int(gone)*9/10 {
		t.Fatalf("%d evicted, %d of them among the oldest 300", gone, old)
	}
}

// TestEvictSparesFreshValues: a store at its capacity, with a few entries
// per shard, takes room for each new batch from the oldest values, never
// from the batch just put (a prefill's blocks are read right after).
func TestEvictSparesFreshValues(t *testing.T) {
	e := newEnv(t, 64<<20, withCfg(func(c *Config) { c.L1Capacity = 48 << 20 }))
	ss := e.s.NewSession()
	defer ss.Close()
	val := make([]byte, 256<<10-4096)
	vals := [][]byte{val, val, val, val, val, val, val, val, val, val, val, val, val, val, val, val}
	for round := 0; round < 400; round++ {
		keys := keysN(fmt.Sprintf("r%d", round), 16)
		mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
		mustCodes(t, fmt.Sprintf("round %d read back at once", round), e.exists(keys), OK)
	}
	if st := e.s.Stats(); st.EvictionsL1 < 16*300 || st.L1Full != 0 {
		t.Fatalf("stats %+v", st)
	}
}
