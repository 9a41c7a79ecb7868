package queue

import (
	"testing"
	"time"
)

// wait runs one wait of length w through s as a side does: a spin of at
// most the budget (taken as spent in full when it finds nothing), then,
// if the spin missed, a sleep until w.
func (s *spinner) wait(t *testing.T, w time.Duration) (caught bool) {
	t.Helper()
	if !s.begin() {
		s.slept(w)
		return false
	}
	if w <= s.budget {
		s.end(true)
		return true
	}
	spun := s.budget
	s.start = time.Now().Add(-spun) // as if the spin began spun ago
	s.end(false)
	s.slept(w - spun)
	return false
}

// Waits a little longer than the budget, each ended by a wake-up soon
// after the sleep began, teach the spinner their length: from the next
// one on, the spin catches them. (Growing the budget by doubling on a
// short sleep and halving it on a miss never got there.)
func TestSpinnerLearnsWaitsWithinTheCeiling(t *testing.T) {
	s := newSpinner(spinCeiling)
	const w = spinCeiling * 7 / 10 // above the start budget (half the ceiling)
	if s.wait(t, w) {
		t.Fatalf("a %v wait caught by a %v budget", w, spinCeiling/2)
	}
	if s.budget < w || s.budget > spinCeiling {
		t.Fatalf("budget %v after a %v wait, want at least the wait and at most %v", s.budget, w, spinCeiling)
	}
	for i := range 20 {
		if !s.wait(t, w) {
			t.Fatalf("wait %d of %v not caught with budget %v", i, w, s.budget)
		}
	}
}

// Waits longer than the ceiling halve the budget each time until the side
// sleeps at once; a short wait after that brings spinning back.
func TestSpinnerStopsOnLongWaits(t *testing.T) {
	s := newSpinner(spinCeiling)
	for range 20 {
		s.wait(t, 5*spinCeiling)
	}
	if s.begin() {
		t.Fatalf("still spinning (budget %v) after 20 waits of %v", s.budget, 5*spinCeiling)
	}
	s.slept(10 * time.Microsecond)
	if !s.wait(t, 10*time.Microsecond) {
		t.Fatalf("a 10µs wait after a 10µs sleep not caught (budget %v)", s.budget)
	}
}
