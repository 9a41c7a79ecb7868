package grant

import (
	"errors"
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{LocalFirst, BudgetedHybrid, GlobalGoverned} {
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("%v: %v, %v", m, got, err)
		}
	}
	if _, err := ParseMode("global"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown mode: %v", err)
	}
}

// Remote gets in flight are bounded by the mode's budget; ending one makes
// room; changing the mode changes the bound at once.
func TestAdmissionRemoteGets(t *testing.T) {
	b := DefaultBudgets
	b[BudgetedHybrid].RemoteGets, b[GlobalGoverned].RemoteGets = 2, 1
	a, err := NewAdmission(BudgetedHybrid, &b, newClock())
	if err != nil {
		t.Fatal(err)
	}
	if n, err := a.BeginRemoteGets(1); n != 1 || err != nil {
		t.Fatalf("1st of 2: %d admitted, %v", n, err)
	}
	if n, err := a.BeginRemoteGets(3); n != 1 || !errors.Is(err, ErrOverBudget) {
		t.Fatalf("3 more with 1 of 2 in flight: %d admitted, %v; want 1 and ErrOverBudget", n, err)
	}
	a.EndRemoteGets(1)
	if err := a.SetMode(GlobalGoverned); err != nil {
		t.Fatal(err)
	}
	if n, err := a.BeginRemoteGets(1); n != 0 || !errors.Is(err, ErrOverBudget) {
		t.Fatalf("global-governed admits 1, 1 in flight: %d admitted, %v", n, err)
	}
	a.EndRemoteGets(1)
	a.EndRemoteGets(1) // more than in flight: no room made beyond the budget
	if n, err := a.BeginRemoteGets(2); n != 1 || !errors.Is(err, ErrOverBudget) {
		t.Fatalf("global-governed, none in flight, 2 asked: %d admitted, %v; want 1", n, err)
	}
	st := a.Stats()
	if st.Mode != GlobalGoverned || st.RemoteGets != 1 || st.GetsRefused != 4 || st.ModeChanges != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// Serving other hosts' reads takes from a token bucket of one second at
// the mode's rate, refilled by the clock.
func TestAdmissionServeRate(t *testing.T) {
	clk := newClock()
	b := DefaultBudgets
	b[BudgetedHybrid].ServeBytesPerSec = 1000
	a, err := NewAdmission(BudgetedHybrid, &b, clk)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(600); err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(600); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("1200 bytes in a second at 1000/s: %v", err)
	}
	clk.Advance(200 * time.Millisecond) // 400 + 200
	if err := a.Serve(600); err != nil {
		t.Fatalf("after refill: %v", err)
	}
	// A read larger than the bucket goes when the bucket is full.
	clk.Advance(time.Second)
	if err := a.Serve(5000); err != nil {
		t.Fatalf("a large read on a full bucket: %v", err)
	}
	clk.Advance(time.Second)
	if err := a.Serve(1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("in debt: %v", err)
	}
	// local-first serves without a rate bound.
	if err := a.SetMode(LocalFirst); err != nil {
		t.Fatal(err)
	}
	if err := a.Serve(1 << 40); err != nil {
		t.Fatalf("local-first: %v", err)
	}
}
