package grant

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func newLeaseTable(t *testing.T, clk testClock, p Pinner, mod func(*LeasesConfig)) *Leases {
	t.Helper()
	cfg := LeasesConfig{Pinner: p, Clock: clk}
	if mod != nil {
		mod(&cfg)
	}
	l, err := NewLeases(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// A create retried with the same operation id and keys joins the first
// lease: one pin; with other keys it is refused and the first stands.
func TestLeaseRetriedCreatePinsOnce(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	l := newLeaseTable(t, clk, p, nil)
	ks := keys("k1", "k2")
	first, err := l.Create("op-1", ks, time.Minute)
	if err != nil || first.Joined {
		t.Fatalf("first create: %+v, %v", first, err)
	}
	clk.Advance(10 * time.Second)
	for i := 0; i < 3; i++ {
		again, err := l.Create("op-1", keys("k1", "k2"), time.Minute)
		if err != nil || !again.Joined || !again.Expiry.Equal(first.Expiry) {
			t.Fatalf("retry %d: %+v, %v; want the first lease joined", i, again, err)
		}
	}
	if p.calls() != 1 || p.count("k1") != 1 {
		t.Fatalf("pinned %d times, k1 has %d pins: want once", p.calls(), p.count("k1"))
	}
	for _, other := range [][][]byte{keys("k1"), keys("k2", "k1"), keys("k1", "k2", "k3")} {
		if _, err := l.Create("op-1", other, time.Minute); !errors.Is(err, ErrLeaseConflict) {
			t.Fatalf("op-1 with keys %q: %v, want ErrLeaseConflict", other, err)
		}
	}
	if p.calls() != 1 {
		t.Fatal("a refused create pinned")
	}
	st := l.Stats()
	if st.Created != 1 || st.Joined != 3 || st.Refused != 3 || st.Live != 1 || st.Keys != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// Expiry gives the pins back, and then the operation id is free again.
func TestLeaseExpiry(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	l := newLeaseTable(t, clk, p, nil)
	if _, err := l.Create("op", keys("k"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second)
	if p.count("k") != 1 {
		t.Fatal("lease ended early")
	}
	clk.Advance(time.Second)
	if p.count("k") != 0 {
		t.Fatal("expired lease still pins")
	}
	if st := l.Stats(); st.Expired != 1 || st.Live != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := l.Create("op", keys("k"), 10*time.Second); err != nil || p.calls() != 2 {
		t.Fatalf("create after expiry: %v, %d pins", err, p.calls())
	}
}

// Release gives the pins back at once; a late retry of the create is
// refused until the lease's time is up; release is idempotent; an unknown
// operation id is not found.
func TestLeaseRelease(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	l := newLeaseTable(t, clk, p, nil)
	if _, err := l.Create("op", keys("k"), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if was, err := l.Release("op"); err != nil || was.OpID != "op" || was.Keys != 1 {
		t.Fatalf("release: %+v, %v", was, err)
	}
	if p.count("k") != 0 {
		t.Fatal("released lease still pins")
	}
	if _, err := l.Release("op"); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, err := l.Create("op", keys("k"), 10*time.Second); !errors.Is(err, ErrLeaseEnded) {
		t.Fatalf("late retry: %v, want ErrLeaseEnded", err)
	}
	if p.calls() != 1 {
		t.Fatal("a late retry pinned again")
	}
	if _, err := l.Release("nope"); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("unknown op: %v, want ErrLeaseNotFound", err)
	}
	clk.Advance(10 * time.Second)
	if _, err := l.Create("op", keys("k"), 10*time.Second); err != nil {
		t.Fatalf("create once the ended lease is forgotten: %v", err)
	}
}

func TestLeaseLimits(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	l := newLeaseTable(t, clk, p, func(c *LeasesConfig) { c.MaxLeases, c.MaxKeys, c.MaxOpIDLen = 2, 2, 8 })
	for name, f := range map[string]func() error{
		"no op":     func() error { _, err := l.Create("", keys("k"), time.Minute); return err },
		"long op":   func() error { _, err := l.Create("123456789", keys("k"), time.Minute); return err },
		"no keys":   func() error { _, err := l.Create("op", nil, time.Minute); return err },
		"zero ttl":  func() error { _, err := l.Create("op", keys("k"), 0); return err },
		"long ttl":  func() error { _, err := l.Create("op", keys("k"), 2*time.Hour); return err },
		"too many":  func() error { _, err := l.Create("op", keys("a", "b", "c"), time.Minute); return err },
		"empty key": func() error { _, err := l.Create("op", keys(""), time.Minute); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooManyKeys) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := l.Create("a", keys("k"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Create("b", keys("k"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Create("c", keys("k"), time.Minute); !errors.Is(err, ErrLeaseLimit) {
		t.Fatalf("3rd lease, limit 2: %v", err)
	}
	// An ended lease makes room: its memory goes first.
	if _, err := l.Release("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Create("c", keys("k"), time.Minute); err != nil {
		t.Fatalf("3rd lease after a release: %v", err)
	}
	p.missing["gone"] = true
	if _, err := l.Create("d", keys("gone"), time.Minute); err == nil {
		t.Fatal("lease of a missing key created")
	}
	if _, err := l.Release("d"); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("a failed create left its op id: %v", err)
	}
}

// A table at its limit of leases forgets an ended one for each create, and
// the deadline it scheduled for it goes too: a client that creates and
// releases in a loop (a new operation id each time, a long TTL) does not
// grow the table's deadlines by one per create until those TTLs end.
func TestLeaseDeadlinesStayBounded(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	l := newLeaseTable(t, clk, p, func(c *LeasesConfig) { c.MaxLeases = 4 })
	if _, err := l.Create("kept", keys("k"), time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		op := fmt.Sprintf("op-%d", i)
		if _, err := l.Create(op, keys("k"), time.Hour); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if _, err := l.Release(op); err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	n := len(l.sched.heap)
	l.mu.Unlock()
	if n > 2*4+64 {
		t.Fatalf("%d deadlines kept for 4 leases", n)
	}
	clk.Advance(time.Minute)
	if p.count("k") != 0 || l.Stats().Expired != 1 {
		t.Fatalf("the lease kept through the tidying did not expire: %d pins, %+v", p.count("k"), l.Stats())
	}
}
