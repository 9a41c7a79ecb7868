package store

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// lruOrder lists the L1 LRU list of every shard, most recent first.
func (s *Store) lruOrder() []string {
	var out []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for idx := sh.lru.head; idx != nilIdx; idx = sh.ent(idx).next {
			out = append(out, string(sh.keyOf(sh.ent(idx))))
		}
		sh.mu.Unlock()
	}
	return out
}

// pinsOf returns the entry pin count of key (-1 when absent).
func (s *Store) pinsOf(key string) int {
	h, sh, _ := s.hash([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx, ok := sh.find(h, []byte(key))
	if !ok {
		return -1
	}
	return int(sh.ent(idx).pins)
}

func oneShard(c *Config) { c.Shards = 1 }

// TestPinAllOrNothing: a Pin batch with an absent key or a key at its pin
// limit changes nothing: no pin, no lease, no LRU position.
func TestPinAllOrNothing(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard), withCfg(func(c *Config) { c.MaxPins = 3 }))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("p", 4)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 10), false), OK)
	order := e.s.lruOrder()

	codes := make([]Code, 3)
	err := ss.Pin([][]byte{keys[0], []byte("absent"), keys[1]}, 0, codes)
	if !errors.Is(err, ErrNotApplied) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("pin with an absent key: %v", err)
	}
	mustCodes(t, "pin with absent", codes, FailedPrecondition, NotFound, FailedPrecondition)
	if e.s.pinsOf(string(keys[0])) != 0 || e.s.Stats().Pins != 0 || !slices.Equal(e.s.lruOrder(), order) {
		t.Fatal("a refused pin batch changed something")
	}

	// Up to MaxPins is fine, counted (the same key twice in a batch is two pins).
	c2 := make([]Code, 2)
	if err := ss.Pin([][]byte{keys[2], keys[2]}, 0, c2); err != nil {
		t.Fatal(err)
	}
	if err := ss.Pin(keys[2:3], time.Minute, c2[:1]); err != nil {
		t.Fatal(err)
	}
	if e.s.pinsOf(string(keys[2])) != 3 {
		t.Fatalf("pins %d, want 3", e.s.pinsOf(string(keys[2])))
	}
	order = e.s.lruOrder()
	err = ss.Pin([][]byte{keys[3], keys[2]}, 0, c2)
	if !errors.Is(err, ErrOverflow) {
		t.Fatalf("overflow: %v", err)
	}
	mustCodes(t, "overflow", c2, FailedPrecondition, ResourceExhausted)
	if e.s.pinsOf(string(keys[3])) != 0 || e.s.pinsOf(string(keys[2])) != 3 || !slices.Equal(e.s.lruOrder(), order) {
		t.Fatal("a refused pin batch changed something")
	}
	if slices.Contains(order, string(keys[2])) {
		t.Fatal("a pinned key is on the LRU list")
	}
}

// TestUnpinUnderflow: unpinning below zero is an error, and a batch that
// contains one changes nothing, duplicates counted.
func TestUnpinUnderflow(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard))
	ss, other := e.s.NewSession(), e.s.NewSession()
	defer ss.Close()
	defer other.Close()
	keys := keysN("u", 3)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 10), false), OK)
	codes := make([]Code, 2)
	if err := ss.Pin(keys[:2], 0, codes); err != nil {
		t.Fatal(err)
	}
	order := e.s.lruOrder()
	// keys[0] twice: the second would go below zero.
	err := ss.Unpin([][]byte{keys[1], keys[0], keys[0]}, make([]Code, 3))
	if !errors.Is(err, ErrUnderflow) {
		t.Fatalf("underflow: %v", err)
	}
	if e.s.pinsOf(string(keys[0])) != 1 || e.s.pinsOf(string(keys[1])) != 1 || !slices.Equal(e.s.lruOrder(), order) {
		t.Fatal("a refused unpin batch changed something")
	}
	// Another session's pins are not this one's to drop.
	c := make([]Code, 1)
	if err := other.Unpin(keys[:1], c); !errors.Is(err, ErrUnderflow) {
		t.Fatalf("unpin of another session's pin: %v", err)
	}
	mustCodes(t, "other session", c, FailedPrecondition)
	if err := ss.Unpin(keys[:2], codes); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "unpin", codes, OK)
	// Unpinned keys go back to the LRU list, most recent first.
	if got := e.s.lruOrder(); got[0] != string(keys[1]) || got[1] != string(keys[0]) || len(got) != 3 {
		t.Fatalf("LRU after unpin: %v", got)
	}
	if err := ss.Unpin(keys[:1], c); !errors.Is(err, ErrUnderflow) {
		t.Fatalf("unpin at zero: %v", err)
	}
}

// TestLeaseExpires: a timed pin holds its key until its TTL passes on the
// store's clock, a second timed pin extends it, and Exists renews nothing.
func TestLeaseExpires(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("l", 2)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 10), false), OK)
	c := make([]Code, 1)
	if err := ss.Pin(keys[:1], 10*time.Second, c); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(5 * time.Second)
	if e.s.pinsOf(string(keys[0])) != 1 {
		t.Fatal("lease ended early")
	}
	if err := ss.Pin(keys[:1], 10*time.Second, c); err != nil { // now until t=15
		t.Fatal(err)
	}
	if e.s.pinsOf(string(keys[0])) != 1 {
		t.Fatal("renewing a lease took a second pin")
	}
	for range 100 {
		mustCodes(t, "exists", e.exists(keys[:1]), OK)
	}
	e.clk.Advance(7 * time.Second) // t=12
	if e.s.pinsOf(string(keys[0])) != 1 {
		t.Fatal("the renewed lease ended at its first expiry")
	}
	e.s.evict(1<<62, 1<<20)
	if st := e.s.Stats(); st.L1Keys != 1 {
		t.Fatalf("eviction took a leased key: %+v", st)
	}
	e.clk.Advance(3 * time.Second) // t=15
	if e.s.pinsOf(string(keys[0])) != 0 || e.s.Stats().LeasesExpired != 1 || e.s.Stats().Pins != 0 {
		t.Fatalf("lease did not end at its TTL: pins %d, stats %+v", e.s.pinsOf(string(keys[0])), e.s.Stats())
	}
	if err := ss.Unpin(keys[:1], c); !errors.Is(err, ErrUnderflow) {
		t.Fatalf("unpin after expiry: %v", err)
	}
	// An untimed pin and a lease on one key: the lease's end leaves the pin.
	// (The eviction above dropped keys[1]: there is no L2.)
	mustCodes(t, "put again", e.put(ss, keys[1:], valuesFor(keys[1:], 10), false), OK)
	if err := ss.Pin(keys[1:], 0, c); err != nil {
		t.Fatal(err)
	}
	if err := ss.Pin(keys[1:], time.Second, c); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(2 * time.Second)
	if e.s.pinsOf(string(keys[1])) != 1 {
		t.Fatalf("pins %d after the lease ended, want the untimed 1", e.s.pinsOf(string(keys[1])))
	}
	if err := ss.Pin(keys[1:], 25*time.Hour, c); !errors.Is(err, ErrBadCall) {
		t.Fatalf("TTL over MaxLeaseTTL: %v", err)
	}
}

// TestExistsChangesNothing: probing keys moves nothing on the LRU list and
// renews no lease (Mooncake #2187: probes that renewed leases made
// everything unevictable).
func TestExistsChangesNothing(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("e", 8)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 10), false), OK)
	order := e.s.lruOrder()
	if order[len(order)-1] != string(keys[0]) {
		t.Fatalf("oldest is %s", order[len(order)-1])
	}
	for range 50 {
		mustCodes(t, "exists", e.exists(keys), OK)
		if n, err := ss.LookupPrefix(keys, false); n != 8 || err != nil {
			t.Fatalf("lookup %d %v", n, err)
		}
	}
	if !slices.Equal(e.s.lruOrder(), order) {
		t.Fatalf("probes moved keys: %v, was %v", e.s.lruOrder(), order)
	}
	// The oldest is the first to go, probes or not.
	e.s.evict(1, 1<<20)
	if e.exists(keys[:1])[0] != NotFound {
		t.Fatal("the probed oldest key was not the one evicted")
	}
}

// TestLookupPrefixPin: how many leading keys are stored, pinning them in
// the same call when asked, so that a Get that follows cannot miss.
func TestLookupPrefixPin(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.MaxPins = 2 }))
	ss := e.s.NewSession()
	defer ss.Close()
	chain := keysN("c", 10)
	mustCodes(t, "put", e.put(ss, chain[:6], valuesFor(chain[:6], 100), false), OK)
	mustCodes(t, "put tail", e.put(ss, chain[7:], valuesFor(chain[7:], 100), false), OK)
	n, err := ss.LookupPrefix(chain, false)
	if n != 6 || err != nil {
		t.Fatalf("lookup %d %v, want 6", n, err)
	}
	if e.s.Stats().Pins != 0 {
		t.Fatal("lookup without pin pinned")
	}
	n, err = ss.LookupPrefix(chain, true)
	if n != 6 || err != nil {
		t.Fatalf("lookup+pin %d %v", n, err)
	}
	if st := e.s.Stats(); st.Pins != 6 {
		t.Fatalf("pins %d, want 6", st.Pins)
	}
	// Pinned: eviction cannot take them, so the Get that follows hits.
	e.s.evict(1<<62, 1<<20)
	_, codes, _ := e.get(ss, chain[:6])
	mustCodes(t, "get after lookup+pin", codes, OK)
	// Each key now carries 2 pins, the limit: the prefix stops at the
	// first key it cannot pin.
	if n, _ := ss.LookupPrefix(chain, true); n != 0 || e.s.Stats().PrefixCut != 1 {
		t.Fatalf("lookup at the pin limit: %d, cut %d", n, e.s.Stats().PrefixCut)
	}
	c := make([]Code, 6)
	for range 2 {
		if err := ss.Unpin(chain[:6], c); err != nil {
			t.Fatal(err)
		}
	}
	if e.s.Stats().Pins != 0 {
		t.Fatal("pins left")
	}
	if n, err := ss.LookupPrefix(keysN("x", 2000), false); err == nil || n != 0 {
		t.Fatalf("too many keys: %d %v", n, err)
	}
}

// TestSessionCloseReleases: closing a session releases every pin and lease
// it holds and drops its reservations (LMCache #1034: pins never released).
func TestSessionCloseReleases(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard))
	ss, keep := e.s.NewSession(), e.s.NewSession()
	defer keep.Close()
	keys := keysN("s", 6)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 10), false), OK)
	c := make([]Code, 2)
	if err := ss.Pin(keys[:2], 0, c); err != nil {
		t.Fatal(err)
	}
	if err := ss.Pin(keys[1:3], time.Hour, c); err != nil {
		t.Fatal(err)
	}
	if n, _ := ss.LookupPrefix(keys, true); n != 6 {
		t.Fatal("lookup")
	}
	e.get(ss, keys[3:5])
	if err := keep.Pin(keys[5:], 0, c[:1]); err != nil {
		t.Fatal(err)
	}
	if err := ss.Reserve([][]byte{[]byte("r1")}, []uint64{10}, make([]Location, 1), c[:1], nil); err != nil {
		t.Fatal(err)
	}
	blocks := e.pool.Stats().Blocks
	ss.Close()
	if st := e.s.Stats(); st.Pins != 1 || st.Reserved != 0 {
		t.Fatalf("after close: %+v", st)
	}
	if e.pool.Stats().Blocks != blocks-1 {
		t.Fatal("the reservation's block was not freed")
	}
	for _, k := range keys[:5] {
		if e.s.pinsOf(string(k)) != 0 {
			t.Fatalf("%s still pinned", k)
		}
	}
	if len(e.s.lruOrder()) != 5 {
		t.Fatalf("LRU holds %d, want the 5 unpinned", len(e.s.lruOrder()))
	}
	// The closed session's leases expiring later touch nothing.
	e.clk.Advance(2 * time.Hour)
	if e.s.pinsOf(string(keys[5])) != 1 || e.s.Stats().LeasesExpired != 0 {
		t.Fatal("an expiry of a closed session's lease changed pins")
	}
	ss.Close() // idempotent
}

// TestLeaseHeapOrder: leases end in expiry order whatever order they were
// taken in.
func TestLeaseHeapOrder(t *testing.T) {
	var h leaseHeap
	at := []int64{50, 10, 40, 10, 90, 20, 70, 30, 60, 80}
	for _, a := range at {
		h.push(leaseRec{at: a})
	}
	slices.Sort(at)
	for _, want := range at {
		if got := h.pop().at; got != want {
			t.Fatalf("popped %d, want %d", got, want)
		}
	}
	if len(h) != 0 {
		t.Fatal("heap not empty")
	}
}

// TestPinUndoneAfterAnotherSessionsPin: a Pin batch that does not apply
// gives back its tentative pin; if another session pinned and unpinned the
// key in between (its pin took the entry off the LRU list, and its unpin,
// seeing the tentative pin, left it off), the entry goes back on the list,
// as an unpin of the last pin puts it. Before, it stayed off the list for
// good, unpinned: never evicted (TestStress's check, once in CI).
func TestPinUndoneAfterAnotherSessionsPin(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(oneShard))
	a, b := e.s.NewSession(), e.s.NewSession()
	defer a.Close()
	defer b.Close()
	keys := keysN("u", 2)
	mustCodes(t, "put", e.put(a, keys, valuesFor(keys, 10), false), OK)
	h, sh, si := e.s.hash(keys[0])
	sh.mu.Lock()
	idx, _ := sh.find(h, keys[0])
	r := ref{si, idx, sh.ent(idx).gen}
	sh.ent(idx).pins++ // b's Pin batch takes its tentative pin
	sh.mu.Unlock()
	// a pins and unpins the key meanwhile.
	codes := make([]Code, 1)
	if err := a.Pin(keys[:1], 0, codes); err != nil {
		t.Fatal(err)
	}
	if err := a.Unpin(keys[:1], codes); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(e.s.lruOrder(), string(keys[0])) {
		t.Fatal("the key is on the LRU list while b's tentative pin holds it")
	}
	// b's batch does not apply: its pin is given back.
	e.s.untakePin(r, false)
	if !slices.Contains(e.s.lruOrder(), string(keys[0])) || e.s.pinsOf(string(keys[0])) != 0 {
		t.Fatalf("after the undo: pins %d, LRU %q; want 0 pins and the key on the list", e.s.pinsOf(string(keys[0])), e.s.lruOrder())
	}
	e.s.check(t)
}
