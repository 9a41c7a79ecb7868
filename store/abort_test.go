package store

import (
	"errors"
	"sync"
	"testing"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// reserveN reserves keys of size bytes each for ss and fails the test
// unless every one is reserved.
func (e *testEnv) reserveN(ss *Session, keys [][]byte, size uint64) []Location {
	e.t.Helper()
	sizes := make([]uint64, len(keys))
	for i := range sizes {
		sizes[i] = size
	}
	locs := make([]Location, len(keys))
	codes := make([]Code, len(keys))
	if err := ss.Reserve(keys, sizes, locs, codes, nil); err != nil {
		e.t.Fatal(err)
	}
	mustCodes(e.t, "reserve", codes, OK)
	return locs
}

// abort aborts keys for ss and returns their codes and errors.
func (e *testEnv) abort(ss *Session, keys [][]byte) ([]Code, []error) {
	e.t.Helper()
	codes := make([]Code, len(keys))
	errs := make([]error, len(keys))
	if err := ss.Abort(keys, codes, errs); err != nil {
		e.t.Fatal(err)
	}
	return codes, errs
}

// poolUse is what the pool and the store hold: pool blocks, the store's
// L1 bytes and its reservations.
type poolUse struct{ blocks, l1Bytes, reserved uint64 }

func (e *testEnv) poolUse() poolUse {
	st := e.s.Stats()
	return poolUse{uint64(e.pool.Stats().Blocks), st.L1Bytes, st.Reserved}
}

// TestAbortGivesTheBlocksBack: aborted reservations free their pool blocks
// at once (the pool and the store's figures are as before the Reserve),
// are counted, and leave their keys free to be reserved and committed
// again; a second abort, or a commit after the abort, finds nothing.
func TestAbortGivesTheBlocksBack(t *testing.T) {
	e := newEnv(t, 8<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	before := e.poolUse()
	keys := keysN("a", 3)
	e.reserveN(ss, keys, 5000)
	if u := e.poolUse(); u.blocks != before.blocks+3 || u.reserved != 3 {
		t.Fatalf("after reserve %+v (before %+v)", u, before)
	}
	codes, errs := e.abort(ss, keys)
	mustCodes(t, "abort", codes, OK)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("abort key %d: %v", i, err)
		}
	}
	if u := e.poolUse(); u != before {
		t.Fatalf("after abort %+v, want %+v", u, before)
	}
	if st := e.s.Stats(); st.Aborted != 3 || st.Keys != 0 || st.FreeErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	e.s.check(t)
	mustCodes(t, "invisible", e.exists(keys), NotFound)

	codes, errs = e.abort(ss, keys)
	mustCodes(t, "abort again", codes, FailedPrecondition)
	if !errors.Is(errs[0], ErrNotReserved) {
		t.Fatalf("abort again: %v", errs[0])
	}
	if _, err := ss.Commit(keys, false, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit after abort", codes, FailedPrecondition)
	if st := e.s.Stats(); st.Aborted != 3 || st.Keys != 0 {
		t.Fatalf("stats after the refused calls %+v", st)
	}

	// The keys are free: reserved, written and committed again.
	locs := e.reserveN(ss, keys, 100)
	vals := make([][]byte, len(keys))
	for i, l := range locs {
		vals[i] = valueFor(keys[i], 100)
		copy(e.pool.Bytes()[l.Offset:], vals[i])
	}
	if _, err := ss.Commit(keys, false, codes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit after reserving again", codes, OK)
	e.checkValues(keys, vals)
	e.s.check(t)
}

// TestAbortOnlyOwnReservations: a key never reserved, one committed, one
// reserved by another session all get FAILED_PRECONDITION, and Abort
// changes none of them (the other session commits its reservation after);
// a key of this session in the same batch is aborted all the same.
func TestAbortOnlyOwnReservations(t *testing.T) {
	e := newEnv(t, 8<<20)
	a, b := e.s.NewSession(), e.s.NewSession()
	defer a.Close()
	defer b.Close()
	stored := keysN("stored", 1)
	mustCodes(t, "put", e.put(a, stored, valuesFor(stored, 10), false), OK)
	theirs := []byte("theirs")
	mine := []byte("mine")
	locs := e.reserveN(b, [][]byte{theirs}, 10)
	e.reserveN(a, [][]byte{mine}, 10)
	copy(e.pool.Bytes()[locs[0].Offset:], valueFor(theirs, 10))
	before := e.poolUse()

	codes, errs := e.abort(a, [][]byte{[]byte("never"), stored[0], theirs, mine})
	mustCodes(t, "abort", codes, FailedPrecondition, FailedPrecondition, FailedPrecondition, OK)
	for i, err := range errs[:3] {
		if !errors.Is(err, ErrNotReserved) {
			t.Fatalf("key %d: %v, want ErrNotReserved", i, err)
		}
	}
	if u := e.poolUse(); u.blocks != before.blocks-1 || u.reserved != 1 {
		t.Fatalf("after abort %+v (before %+v): only this session's reservation goes", u, before)
	}
	e.checkValues(stored, valuesFor(stored, 10))
	c := make([]Code, 1)
	if _, err := b.Commit([][]byte{theirs}, false, c, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "the other session's commit", c, OK)
	e.checkValues([][]byte{theirs}, [][]byte{valueFor(theirs, 10)})
	if st := e.s.Stats(); st.Aborted != 1 || st.Keys != 2 || st.Reserved != 0 {
		t.Fatalf("stats %+v", st)
	}
	e.s.check(t)
}

// TestAbortBadCalls: a batch with an invalid key, or too many keys, is
// refused as a whole (every code INVALID_ARGUMENT, its valid reservations
// kept); a closed session refuses with UNAVAILABLE.
func TestAbortBadCalls(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.MaxKeysPerCall = 4 }))
	ss := e.s.NewSession()
	keys := keysN("r", 2)
	e.reserveN(ss, keys, 10)
	for name, bad := range map[string][][]byte{
		"empty key":    {keys[0], {}},
		"long key":     {keys[0], make([]byte, 257)},
		"too many":     {keys[0], keys[1], []byte("x"), []byte("y"), []byte("z")},
		"short result": nil,
	} {
		codes := make([]Code, len(bad))
		if bad == nil {
			bad, codes = keys, make([]Code, 1)
		}
		if err := ss.Abort(bad, codes, nil); !errors.Is(err, ErrBadCall) {
			t.Fatalf("%s: %v, want ErrBadCall", name, err)
		}
		mustCodes(t, name, codes, InvalidArgument)
		if st := e.s.Stats(); st.Reserved != 2 || st.Aborted != 0 {
			t.Fatalf("%s: stats %+v", name, st)
		}
	}
	ss.Close()
	codes := make([]Code, 2)
	if err := ss.Abort(keys, codes, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed session: %v", err)
	}
	mustCodes(t, "closed session", codes, Unavailable)
	if st := e.s.Stats(); st.Reserved != 0 || st.Aborted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAbortDurableCommitInFlight: a key whose durable commit is on its
// way to L2 gets BUSY; the commit goes on and the key is stored.
func TestAbortDurableCommitInFlight(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	key := keysN("d", 1)
	locs := e.reserveN(ss, key, 4096)
	val := valueFor(key[0], 4096)
	copy(e.pool.Bytes()[locs[0].Offset:], val)
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	rec := newRecorder()
	codes := make([]Code, 1)
	if p, err := ss.Commit(key, true, codes, nil, rec, 0); !p || err != nil {
		t.Fatalf("durable commit: pending %v, %v", p, err)
	}
	ac, aerrs := e.abort(ss, key)
	mustCodes(t, "abort in flight", ac, Busy)
	if !errors.Is(aerrs[0], ErrBusy) {
		t.Fatalf("abort in flight: %v", aerrs[0])
	}
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	<-rec.done
	mustCodes(t, "durable commit", codes, OK)
	e.checkValues(key, [][]byte{val})
	ac, _ = e.abort(ss, key)
	mustCodes(t, "abort after the commit", ac, FailedPrecondition)
	if st := e.s.Stats(); st.Aborted != 0 || st.Reserved != 0 || st.DurablePuts != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReserveAbortLoopLeaksNothing: many rounds of reserve and abort, of
// several sizes, leave the pool, the store's figures and its tables as
// before, and the loop allocates nothing once warm.
func TestReserveAbortLoopLeaksNothing(t *testing.T) {
	e := newEnv(t, 16<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	const n = 16
	keys := keysN("l", n)
	sizes := make([]uint64, n)
	for i := range sizes {
		sizes[i] = uint64(1+i) * 3000
	}
	locs := make([]Location, n)
	codes := make([]Code, n)
	errs := make([]error, n)
	round := func() {
		if err := ss.Reserve(keys, sizes, locs, codes, errs); err != nil || codes[n-1] != OK {
			t.Fatal(err, codes[n-1])
		}
		if err := ss.Abort(keys, codes, errs); err != nil || codes[n-1] != OK {
			t.Fatal(err, codes[n-1])
		}
	}
	round() // warm up the tables and the session's map
	before := e.poolUse()
	for range 500 {
		round()
	}
	if u := e.poolUse(); u != before {
		t.Fatalf("after 500 rounds %+v, want %+v", u, before)
	}
	if st := e.s.Stats(); st.Aborted != 501*n || st.FreeErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	e.s.check(t)
	if !invariants.RaceEnabled {
		if a := testing.AllocsPerRun(50, round); a != 0 {
			t.Errorf("Reserve+Abort: %.1f allocations per round, want 0", a)
		}
	}
}

// TestAbortRacesClose: Abort and Close of one session at once, and another
// session's reservations beside them. Whichever runs first, every block is
// freed exactly once (no free error, the pool as before), the other
// session's reservations are untouched, and an Abort after Close is
// refused.
func TestAbortRacesClose(t *testing.T) {
	e := newEnv(t, 32<<20)
	other := e.s.NewSession()
	defer other.Close()
	otherKeys := keysN("o", 8)
	e.reserveN(other, otherKeys, 4096)
	before := e.poolUse()
	const n = 32
	for round := range 50 {
		ss := e.s.NewSession()
		keys := keysN("x", n)
		e.reserveN(ss, keys, 4096)
		codes := make([]Code, n)
		var abortErr, closeErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			abortErr = ss.Abort(keys, codes, nil)
		}()
		go func() {
			defer wg.Done()
			<-start
			closeErr = ss.Close()
		}()
		close(start)
		wg.Wait()
		if closeErr != nil {
			t.Fatalf("round %d: close: %v", round, closeErr)
		}
		switch {
		case abortErr == nil:
			mustCodes(t, "abort before close", codes, OK)
		case errors.Is(abortErr, ErrClosed):
			mustCodes(t, "abort after close", codes, Unavailable)
		default:
			t.Fatalf("round %d: abort: %v", round, abortErr)
		}
		if u := e.poolUse(); u != before {
			t.Fatalf("round %d: %+v, want %+v", round, u, before)
		}
	}
	if st := e.s.Stats(); st.FreeErrors != 0 || st.Reserved != uint64(len(otherKeys)) {
		t.Fatalf("stats %+v", st)
	}
	c := make([]Code, len(otherKeys))
	if _, err := other.Commit(otherKeys, false, c, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "the other session's commit", c, OK)
	e.s.check(t)
}

// TestSessionReserveLimit: a session holds at most MaxSessionReserved
// bytes of reservations (at block size); the key past it is refused
// RESOURCE_EXHAUSTED with ErrReserveLimit and nothing else changes; a
// commit, an abort and the session's close each give the budget back;
// another session's budget is its own.
func TestSessionReserveLimit(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.MaxSessionReserved = 3 * 8192 }))
	ss := e.s.NewSession()
	defer ss.Close()
	reserve := func(ss *Session, keys [][]byte, size uint64) ([]Code, []error) {
		t.Helper()
		sizes := make([]uint64, len(keys))
		for i := range sizes {
			sizes[i] = size
		}
		codes, errs := make([]Code, len(keys)), make([]error, len(keys))
		if err := ss.Reserve(keys, sizes, make([]Location, len(keys)), codes, errs); err != nil {
			t.Fatal(err)
		}
		return codes, errs
	}
	// 5000 bytes take an 8 KiB block: three fit, the fourth does not.
	keys := keysN("r", 4)
	codes, errs := reserve(ss, keys, 5000)
	mustCodes(t, "reserve past the limit", codes, OK, OK, OK, ResourceExhausted)
	if !errors.Is(errs[3], ErrReserveLimit) {
		t.Fatalf("the refused key's error: %v", errs[3])
	}
	if st := e.s.Stats(); st.Reserved != 3 {
		t.Fatalf("%d reservations after the refusal, want 3", st.Reserved)
	}
	// Another session is not held back by this one's reservations.
	other := e.s.NewSession()
	mustCodes(t, "another session", first(reserve(other, keysN("o", 3), 5000)), OK, OK, OK)
	other.Close()
	// A commit gives one back.
	cc := make([]Code, 1)
	if _, err := ss.Commit(keys[:1], false, cc, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit", cc, OK)
	mustCodes(t, "reserve after a commit", first(reserve(ss, keys[3:4], 5000)), OK)
	mustCodes(t, "reserve at the limit again", first(reserve(ss, keysN("s", 1), 5000)), ResourceExhausted)
	// An abort gives one back.
	ac, _ := e.abort(ss, keys[1:2])
	mustCodes(t, "abort", ac, OK)
	mustCodes(t, "reserve after an abort", first(reserve(ss, keysN("s", 1), 5000)), OK)
	// Close gives all back: a new session of the same client starts empty.
	ss.Close()
	ss2 := e.s.NewSession()
	defer ss2.Close()
	mustCodes(t, "a new session", first(reserve(ss2, keysN("n", 3), 5000)), OK, OK, OK)
}

func first[A, B any](a A, _ B) A { return a }
