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
	if k := tl.ahead(64, false, false); k != int(behindSpin/2/(3*time.Microsecond)) {
		t.Errorf("ahead(64) = %d at a 3µs gap, in a wait that is not drained", k)
	}
	if k := tl.ahead(64, true, false); k != int(tailSpin/2/(3*time.Microsecond)) {
		t.Errorf("ahead(64) = %d at a 3µs gap, in a drained wait", k)
	}
	if k := tl.ahead(5, false, false); k != 4 {
		t.Errorf("ahead(5) = %d, want 4 (the sleep waits for one at least)", k)
	}
	if !tl.covers(8, false) || tl.covers(9, false) {
		t.Errorf("not drained: covers(8) %v, covers(9) %v at a 3µs gap (spin %v)", tl.covers(8, false), tl.covers(9, false), behindSpin)
	}
	if !tl.covers(16, true) || tl.covers(64, true) {
		t.Errorf("drained: covers(16) %v, covers(64) %v at a 3µs gap (tail spin %v)", tl.covers(16, true), tl.covers(64, true), tailSpin)
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

// TestTailNap: a nap lasts until the last missing completion is due at
// the nap's gap, less how late naps end (the timer slack until one has
// ended), between napMin and napMax; none without a gap or for one
// completion. A nap that ended before the wait's last completion moves
// the nap's gap halfway to what it saw; one that did not keeps it within
// what it saw; one that found everything in flight done (overslept) sets
// it below. The learnt gap, which the early wake-ups use, is not touched;
// a nap gap or lateness that leaves no nap creeps back. The rest after a
// nap is spun for when it is due within half a behindSpin.
func TestTailNap(t *testing.T) {
	var tl tail
	if d := tl.nap(16, 0); d != 0 {
		t.Errorf("nap %v with no gap learnt", d)
	}
	tl.gap = 10 * time.Microsecond
	for _, c := range []struct {
		missing int
		slack   time.Duration
		want    time.Duration
	}{
		{1, 0, 0},
		{16, 0, 160 * time.Microsecond},
		{16, 50 * time.Microsecond, 110 * time.Microsecond},
		{3, 25 * time.Microsecond, 0}, // 30 µs less 25 is below napMin
		{1000, 0, napMax},
	} {
		if d := tl.nap(c.missing, c.slack); d != c.want {
			t.Errorf("nap(%d, slack %v) at a %v gap = %v, want %v", c.missing, c.slack, tl.gap, d, c.want)
		}
	}

	tl.napped(80*time.Microsecond, 100*time.Microsecond, 0, false, false)
	if tl.napGap() != 10*time.Microsecond || tl.late != 20*time.Microsecond {
		t.Errorf("nap gap %v, lateness %v after an 80µs nap that took 100 and saw nothing come; want 10µs and 20µs",
			tl.napGap(), tl.late)
	}
	if d := tl.nap(16, 50*time.Microsecond); d != 140*time.Microsecond {
		t.Errorf("nap %v once naps end 20µs late, whatever the slack; want 140µs", d)
	}
	tl.napped(140*time.Microsecond, 140*time.Microsecond, 10, false, false) // 14 µs apart, on time, not reached
	if tl.napGap() != 12*time.Microsecond || tl.late != 15*time.Microsecond {
		t.Errorf("nap gap %v, lateness %v after 10 completions in 140µs from 10µs; want halfway (12µs), 15µs",
			tl.napGap(), tl.late)
	}
	tl.napped(160*time.Microsecond, 160*time.Microsecond, 16, true, false) // reached: at most 10 µs apart
	if tl.napGap() != 10*time.Microsecond {
		t.Errorf("nap gap %v after a nap the wait's last completion came in, want within what it saw: 10µs", tl.napGap())
	}
	tl.napped(320*time.Microsecond, 320*time.Microsecond, 16, true, false) // reached, slower: still a bound
	if tl.napGap() != 10*time.Microsecond {
		t.Errorf("nap gap %v after a nap that saw 20µs apart, reached; want it kept at 10µs", tl.napGap())
	}
	tl.napped(160*time.Microsecond, 160*time.Microsecond, 32, true, true) // everything done: overslept
	if tl.napGap() != 5*time.Microsecond*3/4 {
		t.Errorf("nap gap %v after a nap that found nothing left in flight, want 3/4 of 5µs", tl.napGap())
	}
	if tl.gap != 10*time.Microsecond {
		t.Errorf("learnt gap %v after naps, want it untouched (10µs)", tl.gap)
	}
	if most := int(behindSpin / 2 / tl.napGap()); !tl.spinsAfterNap(most) || tl.spinsAfterNap(most+1) {
		t.Errorf("spins after a nap for %d: %v, for %d: %v, at a %v nap gap", most, tl.spinsAfterNap(most),
			most+1, tl.spinsAfterNap(most+1), tl.napGap())
	}

	tl.ngap, tl.late = time.Microsecond, 0 // too low for any nap of 4
	for i := 0; tl.nap(4, 0) == 0; i++ {
		if i == 100 {
			t.Fatalf("no nap after 100 waits: nap gap %v, learnt %v", tl.ngap, tl.gap)
		}
	}
	if tl.ngap > tl.gap {
		t.Errorf("nap gap %v crept past the learnt %v", tl.ngap, tl.gap)
	}

	// A preempted nap teaches at most maxLate; a lateness that leaves no
	// nap creeps back to the slack.
	tl.late = 0
	tl.napped(100*time.Microsecond, 100*time.Millisecond, 10, false, false)
	if tl.late != maxLate {
		t.Errorf("lateness %v after a nap 100ms late, want at most %v", tl.late, maxLate)
	}
	const slack = 50 * time.Microsecond
	for i := 0; tl.nap(16, slack) == 0; i++ {
		if i == 100 {
			t.Fatalf("no nap after 100 waits: lateness %v", tl.late)
		}
	}
	if tl.late < slack {
		t.Errorf("lateness %v crept below the slack %v", tl.late, slack)
	}
}

// TestNapBack: a doorbell after a wait that napped stops naps for 1, 2,
// 4, ... waits, up to maxTailSkip; a nap with no doorbell after it ends
// the back-off. A doorbell after a wait that did not nap, and a worker
// asleep now, only stop that wait's nap.
func TestNapBack(t *testing.T) {
	var b napBack
	if !b.busy(false, false) || b.busy(true, false) || b.busy(false, true) {
		t.Fatal("busy: want a nap only with no doorbell and the worker awake")
	}
	for want := 1; want <= maxTailSkip; want *= 2 {
		b.napped = true
		if b.busy(true, false) {
			t.Fatalf("back-off of %d: a nap right after a doorbell that followed a nap", want)
		}
		for i := 1; i < want; i++ {
			if b.busy(false, false) {
				t.Fatalf("back-off of %d: a nap after %d waits", want, i)
			}
		}
		if !b.busy(false, false) {
			t.Fatalf("back-off of %d: no nap after %d waits", want, want)
		}
	}
	b.napped = true
	b.busy(true, false)
	if b.skip != maxTailSkip-1 {
		t.Errorf("back-off %d, want at most %d", b.skip+1, maxTailSkip)
	}
	b.skip, b.napped = 0, true
	b.busy(false, false) // a nap with no doorbell after it
	b.napped = true
	b.busy(true, false)
	if b.back != 1 {
		t.Errorf("back-off %d after a nap that let the worker be, then one that did not; want 1", b.back)
	}
}
