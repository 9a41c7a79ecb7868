package grant

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// openStore opens a DRAM-only store of capacity bytes: values evicted from
// L1 are gone, so what survives pressure is what is pinned.
func openStore(t *testing.T, capacity uint64, clock ...Clock) *store.Store {
	t.Helper()
	pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Size: capacity, Hugepages: shm.HugepagesOff, MinBlock: 4096, MaxBlock: 64 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.Config{L1Capacity: capacity}
	if len(clock) > 0 {
		cfg.Clock = clock[0]
	}
	s, err := store.New(cfg, pool, nil)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		pool.Close()
	})
	return s
}

func put(t *testing.T, ss *store.Session, key string, size int) {
	t.Helper()
	codes := make([]store.Code, 1)
	if _, err := ss.Put(keys(key), [][]byte{make([]byte, size)}, false, codes, nil, nil, 0); err != nil || codes[0] != store.OK {
		t.Fatalf("put %s: %v, %v", key, err, codes[0])
	}
}

func present(s *store.Store, key string) bool {
	codes := make([]store.Code, 1)
	return s.Exists(keys(key), codes) == nil && codes[0] == store.OK
}

// fill puts n new values under prefix: more than the pool holds, so the
// store evicts what is unpinned.
func fill(t *testing.T, ss *store.Session, prefix string, n int) {
	for i := 0; i < n; i++ {
		put(t, ss, fmt.Sprintf("%s/%d", prefix, i), 16<<10)
	}
}

// A retention handle keeps its key in the store under pool pressure that
// evicts its neighbour; once released, pressure takes it too. A placement
// lease does the same until it expires.
func TestHandleKeepsKeyFromEviction(t *testing.T) {
	s := openStore(t, 1<<20)
	ss := s.NewSession()
	defer ss.Close()
	clk := newClock()
	h := newIssuer(t, "a", 7, clk, StorePinner{Store: s}, nil)
	l := newLeaseTable(t, clk, StorePinner{Store: s}, nil)

	put(t, ss, "held", 16<<10)
	put(t, ss, "leased", 16<<10)
	put(t, ss, "free", 16<<10)
	hd, err := h.Issue(keys("held"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Create("op", keys("leased"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	fill(t, ss, "a", 256) // 4 MiB through a 1 MiB pool
	if present(s, "free") {
		t.Fatal("no pressure: the unheld key survived")
	}
	if !present(s, "held") || !present(s, "leased") {
		t.Fatalf("held %v, leased %v: evicted under a handle or lease", present(s, "held"), present(s, "leased"))
	}
	if _, err := h.Release(hd.Token); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	fill(t, ss, "b", 256)
	if present(s, "held") || present(s, "leased") {
		t.Fatalf("held %v, leased %v: kept after release and expiry", present(s, "held"), present(s, "leased"))
	}
	// A handle on a key that is not stored holds nothing and says so.
	if _, err := h.Issue(keys("b/255", "absent"), time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("handle on an absent key: %v, want store.ErrNotFound", err)
	}
	if info, err := s.Stat([]byte("b/255")); err != nil || info.Pins != 0 {
		t.Fatalf("b/255 after a refused handle: %+v, %v", info, err)
	}
}

// A handle's store pins are timed: a renewal extends them in the store
// too, so they outlast the first TTL, and they end at the renewed expiry
// even without the handle's own timer (the store's clock is the same
// here).
func TestHandleStorePinsFollowRenewals(t *testing.T) {
	clk := newClock()
	s := openStore(t, 1<<20, clk)
	ss := s.NewSession()
	defer ss.Close()
	put(t, ss, "k", 4096)
	h := newIssuer(t, "a", 7, clk, StorePinner{Store: s}, nil)
	hd, err := h.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pins := func() uint32 {
		info, err := s.Stat([]byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		return info.Pins
	}
	clk.Advance(5 * time.Second)
	if _, err := h.Renew(hd.Token, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second) // past the first TTL
	if pins() != 1 {
		t.Fatalf("%d pins after the first TTL of a renewed handle", pins())
	}
	clk.Advance(10 * time.Second) // past the renewed expiry
	if pins() != 0 {
		t.Fatalf("%d pins after the renewed expiry", pins())
	}
}

// slowPinner pins through StorePinner and then lets lag pass on the clock
// before Pin (or Extend) returns: the time a pin takes when the store's
// shards are busy, or when the keys' holders are other hosts.
type slowPinner struct {
	p   StorePinner
	clk testClock
	lag time.Duration
}

func (s slowPinner) Pin(keys [][]byte, ttl time.Duration) (Hold, error) {
	h, err := s.p.Pin(keys, ttl)
	s.clk.Advance(s.lag)
	if err != nil {
		return nil, err
	}
	return slowHold{h, s}, nil
}

type slowHold struct {
	Hold
	s slowPinner
}

func (h slowHold) Extend(ttl time.Duration) error {
	err := h.Hold.Extend(ttl)
	h.s.clk.Advance(h.s.lag)
	return err
}

// A handle or lease never outlives its pins: its expiry counts from
// before its pins were taken (or extended), so a pin that took a while
// does not leave the handle valid, and the lease live, over keys the store
// may evict already.
func TestExpiryNotPastPins(t *testing.T) {
	clk := newClock()
	s := openStore(t, 1<<20, clk)
	ss := s.NewSession()
	defer ss.Close()
	put(t, ss, "held", 4096)
	put(t, ss, "leased", 4096)
	p := slowPinner{StorePinner{Store: s}, clk, time.Second}
	h := newIssuer(t, "a", 7, clk, p, nil)
	l := newLeaseTable(t, clk, p, nil)
	pins := func(k string) uint32 {
		info, err := s.Stat([]byte(k))
		if err != nil {
			t.Fatal(err)
		}
		return info.Pins
	}
	// What a handle or lease says while its store pins are gone.
	check := func(what string, valid bool, key string) {
		t.Helper()
		if valid && pins(key) == 0 {
			t.Fatalf("%s: still valid at %v, its store pins on %s are gone", what, clk.Now(), key)
		}
	}

	hd, err := h.Issue(keys("held"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := l.Create("op", keys("leased"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The handle's pins were taken 2 s ago, the lease's 1 s ago: half a
	// second past each one's TTL from then.
	clk.Advance(8*time.Second + 500*time.Millisecond)
	_, err = h.Verify(hd.Token, keys("held"))
	check("issued handle", err == nil, "held")
	clk.Advance(time.Second)
	check("created lease", clk.Now().Before(ls.Expiry) && l.Stats().Live == 1, "leased")

	put(t, ss, "renewed", 4096)
	hd, err = h.Issue(keys("renewed"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if hd, err = h.Renew(hd.Token, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9*time.Second + 500*time.Millisecond) // the pins were extended 1 s ago
	_, err = h.Verify(hd.Token, keys("renewed"))
	check("renewed handle", err == nil, "renewed")
}

// A tenant's handles and leases pin each in a store session of its own,
// which store_max_session_pinned bounds alone; their PinBudget bounds them
// together. Handles on all of L1, each well within its session's bound,
// are refused past the budget with RESOURCE_EXHAUSTED and pin nothing, so
// the rest of L1 stays evictable and puts go on; a lease shares the
// budget; a release and an expiry give the bytes back.
func TestPinBudgetBoundsHandlesAndLeases(t *testing.T) {
	const (
		val   = 16 << 10 // a value takes a 16 KiB block
		group = 4        // values per handle: 64 KiB, a quarter of a session's bound
	)
	clk := newClock()
	s := openStore(t, 1<<20, clk)
	ss := s.NewSession()
	defer ss.Close()
	budget := NewPinBudget(1 << 19) // half of L1: 8 handles
	p := StorePinner{Store: s, Budget: budget}
	h := newIssuer(t, "a", 7, clk, p, nil)
	l := newLeaseTable(t, clk, p, nil)

	var held [][]byte
	refused := 0
	for i := 0; i < (1<<20)/val; i += group { // as many values as L1 holds
		ks := make([][]byte, group)
		for j := range ks {
			ks[j] = []byte(fmt.Sprintf("v/%d", i+j))
			put(t, ss, string(ks[j]), val)
		}
		hd, err := h.Issue(ks, time.Minute)
		switch {
		case err == nil:
			held = append(held, hd.Token)
		case errors.Is(err, ErrPinLimit) && errors.Is(err, xfer.ErrBackpressure):
			refused++
			// Unpinned, the value may be evicted already as the puts go on
			// (the store's loop runs on its own): gone is not pinned.
			if info, err := s.Stat(ks[0]); err != nil && !errors.Is(err, store.ErrNotFound) || err == nil && info.Pins != 0 {
				t.Fatalf("a handle refused for the budget pinned: %+v, %v", info, err)
			}
		default:
			t.Fatalf("handle %d: %v", i/group, err)
		}
	}
	if len(held) != 8 || refused != 8 {
		t.Fatalf("%d handles issued, %d refused: want 8 and 8", len(held), refused)
	}
	fill(t, ss, "after", 128) // 2 MiB of puts through the half of L1 left
	put(t, ss, "leased", val)
	if _, err := l.Create("op", keys("leased"), 10*time.Second); !errors.Is(err, ErrPinLimit) {
		t.Fatalf("a lease past the budget: %v, want ErrPinLimit", err)
	}
	if st := budget.Stats(); st.Pinned != 1<<19 || st.Refused != 9 || st.Limit != 1<<19 {
		t.Fatalf("budget %+v", st)
	}
	if _, err := h.Release(held[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Create("op", keys("leased"), 10*time.Second); err != nil {
		t.Fatalf("a lease after a release made room: %v", err)
	}
	clk.Advance(time.Minute)
	if st := budget.Stats(); st.Pinned != 0 {
		t.Fatalf("%d bytes counted after every handle and lease expired", st.Pinned)
	}
}
