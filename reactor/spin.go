package reactor

import "time"

// A worker whose ring has no I/O of its own in flight polls its queues for
// a short, learned while before it announces its sleep. A client at depth
// 1 submits its next request a microsecond or two after it reaped the last
// one; a worker that sleeps at once makes each such request pay a doorbell
// (the client's FUTEX_WAKE) and the worker's wake-up, which is what made
// the local 4 KiB depth-1 row slower with reactors than with the workers
// before them, which spun. The budget learns the worker's sleeps as the
// client's spinner does (queue/spin.go): a sleep that ended within
// spinCeiling sets it a little above that sleep; a spin that found
// nothing halves it, so a worker whose queues are idle or slow (a tcp
// round trip) soon sleeps at once. A worker with I/O in its ring never
// spins: its completions end the sleep, and its CPU is the I/O's.
const (
	spinCeiling = 10 * time.Microsecond
	spinMin     = 500 * time.Nanosecond
)

// spinner is a worker's spin budget (owned by the worker's thread).
type spinner struct {
	budget  time.Duration
	spun    time.Duration // this sleep's spin, when it found nothing
	sleepAt time.Time     // when the sleep Sleep agreed to began
}

// spinFor polls w's queues until one has work or the budget runs out; it
// reports whether work (or an attach or detach) came.
func (w *Worker) spinFor() bool {
	s := &w.spin
	s.spun = 0
	if s.budget < spinMin {
		return false
	}
	start := time.Now()
	for i := 1; ; i++ {
		for _, q := range w.queues {
			if q.q.Pending() {
				s.budget = min(s.budget+s.budget/2+spinMin, spinCeiling)
				w.spins.Add(1)
				return true
			}
		}
		if w.changed.Load() {
			return true
		}
		if i&15 == 0 {
			if d := time.Since(start); d >= s.budget {
				s.spun = d
				s.budget /= 2
				return false
			}
		}
	}
}

// slept learns from a sleep of d that followed a spin of s.spun.
func (s *spinner) slept(d time.Duration) {
	if t := s.spun + d; t <= spinCeiling {
		s.budget = min(t+t/4+spinMin, spinCeiling)
	}
}
