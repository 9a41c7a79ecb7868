package store

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// TestHotCallsAllocateNothing: Get (L1 hits) and its Unpin, Reserve and
// Commit, Exists, LookupPrefix with and without pin, the copying Read and
// Put, and Remove allocate nothing per call once the store has grown to its
// working set (testing.AllocsPerRun).
func TestHotCallsAllocateNothing(t *testing.T) {
	if invariants.RaceEnabled {
		t.Skip("skipped: the race detector allocates on its own")
	}
	e := newEnv(t, 64<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	const n = 128
	keys := keysN("h", n)
	vals := valuesFor(keys, 1000)
	codes := make([]Code, n)
	errs := make([]error, n)
	locs := make([]Location, n)
	sizes := make([]uint64, n)
	for i := range sizes {
		sizes[i] = 4096
	}
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, 4096)
	}
	lens := make([]uint64, n)
	cycle := keysN("y", n)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)

	check := func(name string, f func()) {
		t.Helper()
		f() // warm up: maps, tables and scratch reach their size
		if a := testing.AllocsPerRun(50, f); a != 0 {
			t.Errorf("%s: %.1f allocations per call, want 0", name, a)
		}
	}
	check("Get+Unpin", func() {
		if _, err := ss.Get(keys, locs, codes, errs, nil, 0); err != nil || codes[n-1] != OK {
			t.Fatal(err, codes[n-1])
		}
		if err := ss.Unpin(keys, codes); err != nil {
			t.Fatal(err)
		}
	})
	check("Exists", func() {
		if err := e.s.Exists(keys, codes); err != nil || codes[0] != OK {
			t.Fatal(err)
		}
	})
	check("LookupPrefix", func() {
		if k, err := ss.LookupPrefix(keys, false); err != nil || k != n {
			t.Fatal(err, k)
		}
	})
	check("LookupPrefix+pin, Unpin", func() {
		if k, err := ss.LookupPrefix(keys, true); err != nil || k != n {
			t.Fatal(err, k)
		}
		if err := ss.Unpin(keys, codes); err != nil {
			t.Fatal(err)
		}
	})
	check("Read", func() {
		if _, err := e.s.Read(keys, dsts, lens, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatal(err)
		}
	})
	check("Reserve+Commit+Remove", func() {
		if err := ss.Reserve(cycle, sizes, locs, codes, errs); err != nil || codes[0] != OK {
			t.Fatal(err, codes[0])
		}
		if _, err := ss.Commit(cycle, false, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatal(err, codes[0])
		}
		if _, err := e.s.Remove(cycle, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatal(err, codes[0])
		}
	})
	check("Put+Remove", func() {
		if _, err := ss.Put(cycle, vals, false, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatal(err, codes[0])
		}
		if _, err := e.s.Remove(cycle, codes, errs, nil, 0); err != nil || codes[0] != OK {
			t.Fatal(err, codes[0])
		}
	})
}

// TestL2PathsAllocateNothing: a durable put, a promotion and a removal from
// L2 allocate nothing per call in the steady state either (the transport
// here is a synchronous fake, which allocates nothing itself).
func TestL2PathsAllocateNothing(t *testing.T) {
	if invariants.RaceEnabled {
		t.Skip("skipped: the race detector allocates on its own")
	}
	e := newEnv(t, 64<<20, withL2(64<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	const n = 32
	keys := keysN("l", n)
	vals := valuesFor(keys, 3000)
	codes := make([]Code, n)
	errs := make([]error, n)
	locs := make([]Location, n)
	rec := newRecorder()
	check := func(name string, f func()) {
		t.Helper()
		f()
		if a := testing.AllocsPerRun(20, f); a != 0 {
			t.Errorf("%s: %.1f allocations per call, want 0", name, a)
		}
	}
	check("durable Put, Remove", func() {
		if p, err := ss.Put(keys, vals, true, codes, errs, rec, 0); p || err != nil || codes[0] != OK {
			t.Fatal(p, err, codes[0], errs[0])
		}
		if p, err := e.s.Remove(keys, codes, errs, rec, 0); p || err != nil || codes[0] != OK {
			t.Fatal(p, err, codes[0])
		}
	})
	mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
	check("promoting Get, Unpin, evict", func() {
		e.s.evict(1<<62, 1<<20)
		if p, err := ss.Get(keys, locs, codes, errs, rec, 0); p || err != nil || codes[0] != OK {
			t.Fatal(p, err, codes[0], errs[0])
		}
		if err := ss.Unpin(keys, codes); err != nil {
			t.Fatal(err)
		}
	})
}
