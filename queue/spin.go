package queue

import "time"

// spinner is an adaptive spin budget: how long a side polls for work before
// it sleeps. It learns how long the side's waits last: a wait that ended
// within the spin ceiling, whether by the spin or by a wake-up soon after
// the sleep began, sets the budget to a little more than that wait, so the
// next one like it is caught without a system call on either side; a wait
// longer than the ceiling halves the budget, so an idle or slow queue soon
// sleeps at once. (Only growing or halving the budget would not settle:
// waits a little longer than the budget halve it, and the short sleeps
// that follow only double it back, so such waits would pay both a spin
// and a wake-up each time.) On a small host a spinning thread takes a
// whole core from the daemon, so the ceiling is short (spinCeiling). Only
// the client spins: the daemon's reactors sleep in one wait instead.
type spinner struct {
	budget time.Duration
	max    time.Duration
	spun   time.Duration // how long this wait's spin lasted when it found nothing (begin zeroes it)
}

const spinMin = time.Microsecond

// spinClock is the spinners' clock (a test's, to drive a spin).
var spinClock = time.Now

// spinCeiling bounds every spin of a ring's side: about one 1 MiB copy
// (30-50 µs at copy() rates of 20-35 GiB/s), so a side waiting on a stream
// of such copies catches most. It is no longer because a wait for work
// that needs a CPU (a tcp read's round trip through two daemons, 70-100 µs
// here) is only made longer by a spin on a host of two cores: with a 100
// µs ceiling, tcp 4 KiB reads at depth 1 gave 5.0k IOPS in the bench
// table, against 10.4k for the build before in an A/B run just after. A
// wait longer than the ceiling halves the budget instead of feeding it.
const spinCeiling = 50 * time.Microsecond

// yieldEvery is how often a client's Wait passes through the Go
// scheduler (runtime.Gosched) before it sleeps. A goroutine that only
// spins and makes system calls never does, and the runtime's monitor
// reads that as a goroutine running for 10 ms: it takes its processor
// away during its next system call and then polls every 20 µs for a
// millisecond or more, each 10 ms, which a profile of tcbench at QD32
// found to be a quarter of the client's CPU. One yield every few
// milliseconds keeps the monitor asleep.
const yieldEvery = 5 * time.Millisecond

func newSpinner(max time.Duration) spinner { return spinner{budget: max / 2, max: max} }

// begin starts a spin; false means spinning is off for now (no budget)
// and the caller should sleep at once.
func (s *spinner) begin() bool {
	s.spun = 0
	return s.budget >= spinMin
}

// end finishes a spin begun with begin: found says whether work came,
// spun how long the spin lasted.
func (s *spinner) end(found bool, spun time.Duration) {
	if found {
		s.budget = min(s.budget+s.budget/2+spinMin, s.max)
		return
	}
	s.spun = spun
	s.budget /= 2
}

// slept tells the spinner how long a sleep lasted before work woke it.
// With the spin before it, that is how long the wait was: one the spin
// ceiling covers sets the budget a quarter above it, so that a spin would
// catch the next like it.
func (s *spinner) slept(d time.Duration) {
	if w := s.spun + d; w <= s.max {
		s.budget = min(w+w/4+spinMin, s.max)
	}
}

// tail decides how many of a wait's last completions the client spins for
// instead of sleeping until the last one. A client waiting for a batch the
// daemon completes at memory speed (a 64 KiB copy every few microseconds)
// sleeps for less time than its own wake-up takes on a small virtual host
// (tens of microseconds), and the daemon idles through that wake-up when
// the batch was all it had. When completions come at most fastGap apart,
// the client asks to be woken as many before the last as come in half a
// tailSpin, then spins for them (at most tailSpin): the wake-up overlaps
// the last copies. That is for a drained wait, after which the daemon
// idles until the client submits again; in a wait for part of what is in
// flight, half a behindSpin and at most behindSpin (see there). A stream
// slower than that (file I/O, a network round trip) sleeps for the whole
// wait, as before, and a tail spin that runs out (the daemon slowed down)
// backs the early wake-up off for twice as many waits as the last time,
// up to maxTailSkip.
//
// A drained wait on a slower stream (the local engine's 1 MiB copies,
// 30-70 µs apart here; up to half a tailSpin) is woken lead completions
// before the last, and the client spins for them (a tail spin, whatever
// the spin budget for a last completion). lead starts at one and is learnt from where
// the wake-ups land: one that finds the last completion there already
// came too late for the daemon, which idled meanwhile, and adds one (up
// to as many as come in half a tailSpin); one that finds none of them
// come yet could have begun later and takes one off; one whose spin runs
// out was too early and sets it back to one, with the back-off above.
type tail struct {
	gap     time.Duration // the learned time between two completions of one wait (0: none yet)
	backoff               // of the early wake-ups: skip is the waits left before one is tried again
	lead    int           // a drained slow wait's early wake-up, in completions (0: one)
	ngap    time.Duration // the gap naps are planned on, learnt from naps (0: gap; see nap)
	late    time.Duration // how late a nap ends, learnt (0: none yet: the timer slack)
}

// backoff is a doubling back-off counted in waits: a miss skips the next
// back waits, back doubling at each miss up to maxTailSkip; a hit starts
// it over. The tail's early wake-ups and the naps (napBack) use one each.
type backoff struct {
	skip int // waits left to skip
	back int // the next back-off, in waits
}

func (b *backoff) miss() {
	b.back = min(max(1, 2*b.back), maxTailSkip)
	b.skip = b.back
}

func (b *backoff) hit() { b.back = 0 }

// tick counts one wait off the skip.
func (b *backoff) tick() {
	if b.skip > 0 {
		b.skip--
	}
}

// fastGap is the slowest completion rate an early wake-up is used for:
// eight completions within spinCeiling at least. The local engine's 64
// KiB copies come 3-5 µs apart here; 4 KiB random reads from a file at
// QD32 measure about 11 µs, and a tail spin there mostly runs out, so
// file I/O and network round trips stay out. tailSpin bounds a tail spin;
// maxTailSkip the back-off.
const (
	fastGap     = spinCeiling / 8
	maxTailSkip = 256
	tailSpin    = 4 * spinCeiling
)

// behindSpin bounds a spin in a wait that is not drained (the client has
// more in flight than it waits for): a tail spin, or the spin after a nap.
// The daemon keeps working through such a wait whether the client spins
// or sleeps, so a prompt client gains no rate there, and a spin saves only
// a sleep and its wake-up, whose futex wake costs the waker 2-10 µs on a
// two-CPU virtual host (BenchmarkFutexWakeSleeper: about 2 µs where the
// idle vCPU polls before it halts, 9-10 µs where it halts at once). Spun
// for when due within half of it, a spin costs at most about 25 µs. With tailSpin there, tcbench's 4 KiB
// file reads at QD32 (bursts of completions from the disk, which a gap
// learnt per completion does not foresee) found their completions after 78
// µs of tail spin and 146 µs of spin after a nap on average, half of the
// client's CPU.
const behindSpin = spinCeiling

// tailLimit bounds a tail spin: tailSpin for a drained wait, behindSpin
// for one that is not.
func tailLimit(drained bool) time.Duration {
	if drained {
		return tailSpin
	}
	return behindSpin
}

// begin starts a wait.
func (t *tail) begin() { t.tick() }

// fast reports whether early wake-ups are in use now.
func (t *tail) fast() bool { return t.gap > 0 && t.gap <= fastGap && t.skip == 0 }

// covers reports whether missing completions are expected within half
// the wait's tail spin (tailLimit), so the client spins for them instead
// of sleeping: fast ones, or those a drained wait was woken early for.
func (t *tail) covers(missing int, drained bool) bool {
	switch {
	case t.fast():
		return time.Duration(missing)*t.gap <= tailLimit(drained)/2
	case drained && t.slow() && t.skip == 0:
		return missing <= t.leads()
	}
	return false
}

// slow reports whether the gap is one a drained wait's early wake-up is
// for: above fastGap, within half a tailSpin.
func (t *tail) slow() bool { return t.gap > fastGap && t.gap <= tailSpin/2 }

// leads is a drained slow wait's early wake-up, in completions.
func (t *tail) leads() int { return max(1, t.lead) }

// maxLead bounds lead: as many completions as come in half a tailSpin.
func (t *tail) maxLead() int { return max(1, int(tailSpin/2/t.gap)) }

// woke records where a drained slow wait's early wake-up landed, by the
// completions still missing then: none (late) adds one to lead; all of
// lead (none came during the wake-up, which could have begun later) takes
// one off.
func (t *tail) woke(missing int) {
	switch l := t.leads(); {
	case missing <= 0:
		t.lead = min(l+1, t.maxLead())
	case missing >= l && l > 1:
		t.lead = l - 1
	}
}

// ahead is how many completions before the last of missing the client
// asks to be woken (0: at the last). Fast completions: as many as come in
// half the wait's tail spin (tailLimit). Slower ones, up to half a
// tailSpin apart (the local engine's 1 MiB copies), when the wait is
// drained (for everything the client has in flight, so the daemon idles
// from the last completion until the client submits again) and the
// client's spin for a last completion is on (spinning): lead, which the
// tail spin covers.
func (t *tail) ahead(missing int, drained, spinning bool) int {
	switch {
	case t.gap <= 0 || t.skip > 0:
		return 0
	case t.gap <= fastGap:
		return max(0, min(int(tailLimit(drained)/2/t.gap), missing-1))
	case t.slow() && drained && spinning && missing > 1:
		return min(t.leads(), missing-1)
	}
	return 0
}

// observe learns the gap: d a wait's time per completion over n arrivals.
// A sleep's time includes the client's wake-up, so only a sleep over
// several arrivals (or a spin) says much about the gap between them.
func (t *tail) observe(d time.Duration, n int) {
	if n < 4 && t.gap != 0 {
		return
	}
	if t.gap == 0 {
		t.gap = d
		return
	}
	t.gap += (d - t.gap) / 4
}

// spun records a tail spin: found, or it ran out of its limit.
func (t *tail) spun(found bool) {
	if found {
		t.hit()
		return
	}
	t.lead = 0
	t.miss()
}

// A nap: a wait for several completions that are not all the client has
// in flight, while the daemon's worker is busy, first sleeps on the clock
// without asking the daemon to wake it, until about when the last of them
// is due at the nap's gap; if some are still missing and due within half
// a behindSpin it spins for them, and only what is missing then is waited
// for with a wake-up. A futex wake of a thread that sleeps costs its waker
// 9-10 µs on a two-CPU virtual host whose idle vCPU halts (it is woken
// through the hypervisor), about 2 µs where it polls before it halts
// (BenchmarkFutexWakeSleeper), and when the
// daemon's worker is busy copying, that is time off its data path. A nap
// that ends a little after the wait's last completion costs nothing of
// the rate: the requests beyond the wait keep the worker busy meanwhile.
// It costs that wait's latency, which a wait for part of what is in
// flight trades for the rate. The block layer's hybrid polling sleeps for
// a part of the expected time and polls for the rest in the same way.
// Where the nap does not pay:
//   - a drained wait: the daemon would idle through an oversleep;
//   - a worker that sleeps (it waits on the kernel, as for file I/O, and
//     a Submit found it asleep since the last wait, or it sleeps now): it
//     is not short of CPU, and a late client makes it sleep more. With
//     naps there, 4 KiB reads from a file at QD32 lost a fifth;
//   - after a nap that the next Submit found the worker asleep (the nap
//     let it run dry): naps stop for 1, 2, 4, ... waits, up to
//     maxTailSkip (napBack). A worker woken for each wait is awake when
//     the client submits after it; a client back from a nap may find it
//     asleep between two kernel completions and must ring. For 4 KiB
//     file reads at QD32, naps without this back-off made 4.7x the
//     doorbells and 4x the client's CPU per I/O.
//
// The nap's gap starts at the learnt one and is learnt apart from it, from
// the naps themselves (see napped), so that a nap does not make the early
// wake-ups above think completions come faster than they do. A timed
// sleep ends late (the thread's timer slack, then the wake-up of an idle
// CPU): how late is learnt too, starting at the slack, and a nap is
// shorter by that much (70-110 µs here: 50 µs of slack, the rest the
// wake-up). napMin is the shortest nap worth a system call, napMax bounds
// what a wrong gap can cost. Where the lateness or the nap's gap leaves no
// nap, both creep back (to the slack, to the learnt gap), so that one
// outlier does not turn naps off for good.
const (
	napMin = 10 * time.Microsecond
	napMax = time.Millisecond
)

// napGap is the gap a nap is planned on: the nap's own, or the learnt one
// until a nap has taught it.
func (t *tail) napGap() time.Duration {
	if t.ngap > 0 {
		return t.ngap
	}
	return t.gap
}

// nap is how long a wait with missing completions, not drained, sleeps
// before it looks again (0: no nap), given the thread's timer slack. When
// no nap is taken, a nap gap below the learnt gap and a lateness above the
// slack creep back, one eighth of the way per wait that asks.
func (t *tail) nap(missing int, slack time.Duration) time.Duration {
	g := t.napGap()
	if g <= 0 || missing < 2 {
		return 0
	}
	late := t.late
	if late <= 0 {
		late = slack
	}
	d := time.Duration(missing)*g - late
	if d < napMin {
		if t.ngap > 0 && t.ngap < t.gap {
			t.ngap += max(1, (t.gap-t.ngap)/8)
		}
		if t.late > slack {
			t.late -= max(1, (t.late-slack)/8)
		}
		return 0
	}
	return min(d, napMax)
}

// maxLate bounds one nap's lateness as learnt: a nap that ended later
// than that was preempted, which says nothing of the next.
const maxLate = napMax / 4

// napped learns from a nap asked to last asked that lasted d, over which
// n completions came; reached says the wait's last had come, emptied that
// everything in flight had. How late the nap ended, up to maxLate, moves
// the learnt lateness a quarter of the way. The nap's gap:
//   - not reached: d/n is the gap, and the nap's moves halfway to it;
//   - reached: d/n is only a bound, which the nap's gap is kept within;
//   - emptied: the nap overslept past the daemon's work, which then
//     idled: the nap's gap is set to 3/4 of that bound.
func (t *tail) napped(asked, d time.Duration, n int, reached, emptied bool) {
	late := min(max(0, d-asked), maxLate)
	if t.late <= 0 {
		t.late = max(1, late) // learnt from now on, even if on time
	} else {
		t.late += (late - t.late) / 4
	}
	if n <= 0 {
		return // nothing came: a stall, which the sleep after the nap measures
	}
	g, cur := d/time.Duration(n), t.napGap()
	switch {
	case emptied:
		t.ngap = min(cur, g) * 3 / 4
	case reached:
		t.ngap = min(cur, g)
	default:
		t.ngap = cur + (g-cur)/2
	}
}

// spinsAfterNap reports whether the missing completions left after a nap
// are expected within half a behindSpin (a nap's wait is never drained),
// and tail spins are not backed off: the client spins for them, up to a
// behindSpin.
func (t *tail) spinsAfterNap(missing int) bool {
	return t.skip == 0 && time.Duration(missing)*t.napGap() <= behindSpin/2
}

// napBack backs naps off when they let the worker run dry: a doorbell
// rung after a wait that napped skips naps for a number of waits that
// doubles at each such doorbell, up to maxTailSkip, and a nap followed by
// no doorbell ends the back-off.
type napBack struct {
	napped  bool // the last wait napped
	backoff      // skip: waits left without a nap
}

// busy starts a wait: whether it may nap, given whether a Submit rang
// the doorbell since the last wait and whether the worker sleeps now.
func (b *napBack) busy(rang, asleep bool) bool {
	if b.napped {
		if rang {
			b.miss()
		} else {
			b.hit()
		}
	}
	b.napped = false
	if b.skip > 0 {
		b.tick()
		return false
	}
	return !rang && !asleep
}
