package store

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// pinned returns the session's pinned bytes, and an error unless they are
// the sum over the values it holds pinned and within its bound.
func (ss *Session) pinned() (uint64, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var sum uint64
	for _, h := range ss.holds {
		sum += h.bytes
	}
	if sum != ss.pinnedBytes || sum > ss.s.cfg.MaxSessionPinned {
		return ss.pinnedBytes, fmt.Errorf("the session counts %d bytes pinned, its holds %d, its bound %d",
			ss.pinnedBytes, sum, ss.s.cfg.MaxSessionPinned)
	}
	return sum, nil
}

// checkPinned fails unless the session holds want values of block bytes
// pinned, counted right.
func checkPinned(t *testing.T, what string, ss *Session, want, block uint64) {
	t.Helper()
	got, err := ss.pinned()
	if err != nil || got != want*block {
		t.Fatalf("%s: %d bytes pinned (%v), want %d values of %d", what, got, err, want, block)
	}
}

// TestSessionPinLimit: a session that pins every value it can (here with
// one Get of all of L1) holds at most MaxSessionPinned bytes pinned; the
// keys past it get RESOURCE_EXHAUSTED, counted, and the rest of L1 stays
// evictable, so another session's puts and pins still succeed. Before
// the bound, the greedy session pinned all of L1 and every other put
// failed with ErrL1Full.
func TestSessionPinLimit(t *testing.T) {
	const (
		block  = 4096 // a value of 1000 bytes takes one 4 KiB block
		bound  = 16   // values the bound lets one session pin
		stored = 64   // values stored: all of L1
	)
	e := newEnv(t, 8<<20, withCfg(oneShard), withCfg(func(c *Config) {
		c.L1Capacity = stored * block
		c.MaxSessionPinned = bound * block
		// Only the puts' own evictions make room: nothing is evicted
		// before the greedy session's Get.
		c.HighWatermark, c.LowWatermark = 1, 0.9
	}))
	greedy, other := e.s.NewSession(), e.s.NewSession()
	defer greedy.Close()
	defer other.Close()
	keys := keysN("g", stored)
	mustCodes(t, "put", e.put(greedy, keys, valuesFor(keys, 1000), false), OK)

	locs, codes, errs := e.get(greedy, keys)
	for i := range keys {
		want := OK
		if i >= bound {
			want = ResourceExhausted
		}
		if codes[i] != want {
			t.Fatalf("get %d: %v (%v), want %v", i, codes[i], errs[i], want)
		}
		if want == ResourceExhausted && (!errors.Is(errs[i], ErrPinLimit) || locs[i] != (Location{})) {
			t.Fatalf("get %d past the bound: %v at %+v", i, errs[i], locs[i])
		}
	}
	if st := e.s.Stats(); st.Pins != bound || st.PinLimit != stored-bound {
		t.Fatalf("pins %d, refused %d: want %d and %d", st.Pins, st.PinLimit, bound, stored-bound)
	}
	checkPinned(t, "after the get", greedy, bound, block)

	// A value the session holds pinned counts once, however often pinned.
	c := make([]Code, 2)
	if err := greedy.Pin(keys[:1], 0, c[:1]); err != nil {
		t.Fatalf("a second pin of a pinned value: %v", err)
	}
	if err := greedy.Pin(keys[1:2], time.Hour, c[:1]); err != nil {
		t.Fatalf("a lease on a pinned value: %v", err)
	}
	_, codes, _ = e.get(greedy, keys[:bound])
	mustCodes(t, "get of the values pinned already", codes, OK)
	checkPinned(t, "after pinning them again", greedy, bound, block)

	// Pin is all or nothing: a key past the bound fails the batch.
	err := greedy.Pin([][]byte{keys[0], keys[bound]}, 0, c)
	if !errors.Is(err, ErrNotApplied) || !errors.Is(err, ErrPinLimit) {
		t.Fatalf("pin past the bound: %v", err)
	}
	mustCodes(t, "pin past the bound", c, FailedPrecondition, ResourceExhausted)
	if e.s.pinsOf(string(keys[0])) != 3 || e.s.pinsOf(string(keys[bound])) != 0 {
		t.Fatalf("a refused pin batch changed pins: %d, %d", e.s.pinsOf(string(keys[0])), e.s.pinsOf(string(keys[bound])))
	}
	checkPinned(t, "after a refused pin", greedy, bound, block)
	// LookupPrefix stops at the first value it may not pin.
	if n, err := greedy.LookupPrefix(keys, true); n != bound || err != nil {
		t.Fatalf("lookup+pin: %d %v, want %d", n, err, bound)
	}
	if st := e.s.Stats(); st.PrefixCut != 1 {
		t.Fatalf("prefix cut %d", st.PrefixCut)
	}

	// The other session's puts evict what the greedy one could not pin,
	// and its own pins are bounded on their own.
	more := keysN("o", stored)
	mustCodes(t, "the other session's puts", e.put(other, more, valuesFor(more, 1000), false), OK)
	if st := e.s.Stats(); st.L1Full != 0 {
		t.Fatalf("%d allocations refused", st.L1Full)
	}
	if err := other.Pin(more[stored-bound:], 0, make([]Code, bound)); err != nil {
		t.Fatalf("the other session's pins: %v", err)
	}
	_, codes, _ = e.get(greedy, keys[:bound])
	mustCodes(t, "the greedy session's pinned values", codes, OK)
	checkPinned(t, "the other session", other, bound, block)
}

// TestSessionPinLimitReleased: every way a session's pin goes gives its
// value's bytes back to the session's bound: Unpin of its last pin, the
// end of a lease, Close; a pin batch that does not apply counts nothing.
func TestSessionPinLimitReleased(t *testing.T) {
	const block = 4096
	e := newEnv(t, 8<<20, withCfg(oneShard), withCfg(func(c *Config) { c.MaxSessionPinned = 2 * block }))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("r", 4)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 1000), false), OK)
	c := make([]Code, 2)
	pin := func(what string, ttl time.Duration, ks ...[]byte) error {
		t.Helper()
		err := ss.Pin(ks, ttl, c[:len(ks)])
		if err != nil && !errors.Is(err, ErrPinLimit) {
			t.Fatalf("%s: %v", what, err)
		}
		return err
	}
	unpin := func(ks ...[]byte) {
		t.Helper()
		if err := ss.Unpin(ks, c[:len(ks)]); err != nil {
			t.Fatalf("unpin: %v", err)
		}
	}

	if pin("two values", 0, keys[0], keys[1]) != nil || pin("a third", 0, keys[2]) == nil {
		t.Fatal("the bound of two values does not hold")
	}
	// Unpin of a value's only pin.
	unpin(keys[0])
	if pin("after an unpin", 0, keys[2]) != nil {
		t.Fatal("an unpin did not give its value's bytes back")
	}
	// A value pinned twice goes from the count with its last pin only.
	if pin("a second pin", 0, keys[1]) != nil {
		t.Fatal("a second pin of a pinned value refused")
	}
	unpin(keys[1])
	if pin("one pin left", 0, keys[0]) == nil {
		t.Fatal("a value still pinned once was not counted")
	}
	unpin(keys[1])
	if pin("after the last unpin", time.Second, keys[0]) != nil {
		t.Fatal("the last unpin did not give its value's bytes back")
	}
	checkPinned(t, "a lease and a pin", ss, 2, block)
	// The end of a lease.
	if pin("a lease held", 0, keys[1]) == nil {
		t.Fatal("a lease was not counted")
	}
	e.clk.Advance(2 * time.Second)
	if e.s.Stats().LeasesExpired != 1 || pin("after the lease", 0, keys[1]) != nil {
		t.Fatal("a lease's end did not give its value's bytes back")
	}
	checkPinned(t, "after the lease", ss, 2, block)
	// A batch that does not apply (an absent key) counts nothing.
	unpin(keys[1], keys[2])
	if err := ss.Pin([][]byte{keys[3], []byte("absent")}, 0, c); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pin with an absent key: %v", err)
	}
	checkPinned(t, "after a batch that did not apply", ss, 0, block)
	// An Unpin batch that does not apply restores the count.
	if pin("two again", 0, keys[0], keys[1]) != nil {
		t.Fatal("pin of two values")
	}
	if err := ss.Unpin([][]byte{keys[0], keys[3]}, c); !errors.Is(err, ErrUnderflow) {
		t.Fatalf("unpin of a key not pinned: %v", err)
	}
	checkPinned(t, "after an unpin that did not apply", ss, 2, block)
	// Get's and LookupPrefix's pins are counted and released the same way.
	unpin(keys[0], keys[1])
	_, codes, _ := e.get(ss, keys[:3])
	mustCodes(t, "get", codes, OK, OK, ResourceExhausted)
	unpin(keys[0], keys[1])
	if n, err := ss.LookupPrefix(keys, true); n != 2 || err != nil {
		t.Fatalf("lookup+pin after the unpins: %d %v", n, err)
	}
	checkPinned(t, "after lookup+pin", ss, 2, block)
	// Close drops the count with the pins.
	if err := ss.Close(); err != nil {
		t.Fatal(err)
	}
	checkPinned(t, "after close", ss, 0, block)
	if st := e.s.Stats(); st.Pins != 0 {
		t.Fatalf("pins %d after close", st.Pins)
	}
}

// TestGetPromotionsPastSessionPinLimit: Gets of values on L2 pass the
// session's bound when they join a promotion, and are pinned only as far
// as it still allows when the promotions end: of two values that each fit
// the bound alone, one is pinned, the other gets RESOURCE_EXHAUSTED.
func TestGetPromotionsPastSessionPinLimit(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withCfg(func(c *Config) { c.MaxSessionPinned = 16 << 10 }))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("hot", 2)
	mustCodes(t, "durable put", e.put(ss, keys, valuesFor(keys, 9000), true), OK) // 16 KiB blocks
	e.dropL1()
	a := e.getPromoted(t, ss, keys)
	ok := 0
	for i, c := range a.codes {
		switch {
		case c == OK:
			ok++
		case c == ResourceExhausted && errors.Is(a.errs[i], ErrPinLimit):
		default:
			t.Fatalf("get %d: %v (%v)", i, c, a.errs[i])
		}
	}
	if st := e.s.Stats(); ok != 1 || st.Pins != 1 || st.PinLimit != 1 {
		t.Fatalf("%d gets pinned, %d pins held, %d refused: want 1 of each (codes %v)", ok, st.Pins, st.PinLimit, a.codes)
	}
	checkPinned(t, "after the promotions", ss, 1, 16<<10)
}

// TestSessionPinLimitConfig: the bound defaults to a quarter of the L1
// capacity, as MaxSessionReserved does, and may not pass the L1 capacity.
func TestSessionPinLimitConfig(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.L1Capacity = 4 << 20 }))
	if got := e.s.cfg.MaxSessionPinned; got != 1<<20 || got != e.s.cfg.MaxSessionReserved {
		t.Fatalf("default MaxSessionPinned %d, want a quarter of L1Capacity", got)
	}
	cfg := Config{L1Capacity: 4 << 20, MaxSessionPinned: 4<<20 + 1}
	if s, err := New(cfg, e.pool, nil); !errors.Is(err, ErrConfig) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("MaxSessionPinned over L1Capacity: %v", err)
	}
}

// TestPinBytes: PinBytes tells, before a pin, what the pin of keys will
// count in a new session (absent keys nothing, a key named twice once),
// which is what the session's PinnedBytes says after it.
func TestPinBytes(t *testing.T) {
	const block = 4096
	e := newEnv(t, 8<<20, withCfg(oneShard))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("b", 3)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 1000), false), OK)
	ask := [][]byte{keys[0], keys[1], keys[0], []byte("absent")}
	if n := e.s.PinBytes(ask); n != 2*block {
		t.Fatalf("PinBytes %d, want %d", n, 2*block)
	}
	if n := e.s.PinBytes(keys[2:]); n != block {
		t.Fatalf("PinBytes of one key %d, want %d", n, block)
	}
	hold := e.s.NewSession()
	defer hold.Close()
	if err := hold.Pin(ask[:3], time.Minute, make([]Code, 3)); err != nil {
		t.Fatal(err)
	}
	if n := hold.PinnedBytes(); n != 2*block {
		t.Fatalf("PinnedBytes %d after the pin, want %d", n, 2*block)
	}
	if e.s.pinsOf(string(keys[0])) != 1 {
		t.Fatal("PinBytes pinned")
	}
}
