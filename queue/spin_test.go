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
		s.end(true, w)
		return true
	}
	spun := s.budget
	s.end(false, spun)
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

// The tail's early wake-up is for completions that come fast only; a tail
// spin that runs out backs it off for 1, 2, 4, ... waits, up to
// maxTailSkip, and one that finds its completions ends the back-off.
func TestTailEarlyWakeUp(t *testing.T) {
	var tl tail
	if tl.fast() || tl.ahead(16, true, true) != 0 || tl.covers(2, false) {
		t.Fatal("early wake-ups with no gap learnt")
	}
	tl.observe(3*time.Microsecond, 16)
	if !tl.fast() {
		t.Fatalf("gap %v not fast", tl.gap)
	}
	if k := tl.ahead(64, false, false); k != int(tailSpin/2/(3*time.Microsecond)) {
		t.Errorf("ahead(64) = %d at a 3µs gap", k)
	}
	if k := tl.ahead(5, false, false); k != 4 {
		t.Errorf("ahead(5) = %d, want 4 (the sleep waits for one at least)", k)
	}
	if !tl.covers(16, false) || tl.covers(64, false) {
		t.Errorf("covers(16) %v, covers(64) %v at a 3µs gap (tail spin %v)", tl.covers(16, false), tl.covers(64, false), tailSpin)
	}
	tl.observe(time.Millisecond, 2) // a sleep over too few arrivals says nothing of the gap
	if tl.gap != 3*time.Microsecond {
		t.Errorf("gap %v after a 2-arrival sleep", tl.gap)
	}

	for want := 1; want <= maxTailSkip; want *= 2 {
		tl.spun(false)
		for i := 0; i < want; i++ {
			if tl.fast() {
				t.Fatalf("back-off of %d: early wake-ups on after %d waits", want, i)
			}
			tl.begin()
		}
		if !tl.fast() {
			t.Fatalf("back-off of %d: early wake-ups still off after %d waits", want, want)
		}
	}
	tl.spun(false)
	if tl.skip != maxTailSkip {
		t.Errorf("back-off %d, want at most %d", tl.skip, maxTailSkip)
	}
	tl.skip = 0
	tl.spun(true)
	tl.spun(false)
	if tl.skip != 1 {
		t.Errorf("back-off %d after a found tail spin and a miss, want 1", tl.skip)
	}

	for range 20 { // a stream of 4 KiB file reads at QD32: 11 µs apart
		tl.observe(11*time.Microsecond, 8)
	}
	tl.skip = 0
	if tl.fast() || tl.ahead(16, false, true) != 0 {
		t.Errorf("early wake-ups at a %v gap", tl.gap)
	}
	// Slower completions: one early, for a drained wait whose last the
	// spin would catch only.
	for _, c := range []struct {
		drained, spinning bool
		want              int
	}{{true, true, 1}, {false, true, 0}, {true, false, 0}} {
		if k := tl.ahead(8, c.drained, c.spinning); k != c.want {
			t.Errorf("gap %v, drained %v, spinning %v: ahead %d, want %d", tl.gap, c.drained, c.spinning, k, c.want)
		}
	}
	if k := tl.ahead(1, true, true); k != 0 {
		t.Errorf("ahead(1) = %d on a drained wait", k)
	}
	for range 20 {
		tl.observe(tailSpin, 8)
	}
	if k := tl.ahead(8, true, true); k != 0 {
		t.Errorf("ahead %d at a %v gap, beyond the spin", k, tl.gap)
	}
}

// TestTailLead: a drained wait on a slower stream learns how early to be
// woken from where its wake-ups land. Late ones (the last completion was
// there) add one, up to half a tailSpin's worth; one that finds all of
// its lead still missing takes one off; a tail spin that runs out sets it
// back to one. A wait that is not drained is never woken early.
func TestTailLead(t *testing.T) {
	tl := tail{gap: 30 * time.Microsecond}
	if k := tl.ahead(8, true, true); k != 1 {
		t.Fatalf("first ahead %d, want 1", k)
	}
	most := int(tailSpin / 2 / tl.gap)
	for i := 0; i < 10; i++ {
		tl.woke(0)
	}
	if k := tl.ahead(8, true, true); k != most {
		t.Errorf("after 10 late wake-ups ahead %d, want %d (half a tail spin of %v gaps)", k, most, tl.gap)
	}
	if k := tl.ahead(2, true, true); k != 1 {
		t.Errorf("ahead(2) = %d, want 1: the sleep waits for one at least", k)
	}
	if !tl.covers(most, true) || tl.covers(most+1, true) || tl.covers(most, false) {
		t.Errorf("covers: %d drained %v, %d drained %v, %d not drained %v (lead %d)",
			most, tl.covers(most, true), most+1, tl.covers(most+1, true), most, tl.covers(most, false), tl.lead)
	}
	tl.woke(1) // one of the lead still missing: about right
	if tl.leads() != most {
		t.Errorf("lead %d after a wake-up that found one missing, want %d", tl.leads(), most)
	}
	tl.woke(most) // none of it came: too early by one at least
	if tl.leads() != most-1 {
		t.Errorf("lead %d after a wake-up that found all %d missing, want %d", tl.leads(), most, most-1)
	}
	tl.spun(false)
	if tl.leads() != 1 || tl.ahead(8, true, true) != 0 {
		t.Errorf("after a tail spin that ran out: lead %d, ahead %d; want 1 and none during the back-off", tl.leads(), tl.ahead(8, true, true))
	}
	tl.skip = 0
	if k := tl.ahead(8, false, true); k != 0 {
		t.Errorf("ahead %d on a wait that is not drained", k)
	}
}
