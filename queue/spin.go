package queue

import (
	"runtime"
	"sync/atomic"
	"time"
)

// spinner is an adaptive spin budget: how long a side polls for work before
// it sleeps. It grows when polling pays (work came while spinning, or a
// sleep was woken soon after it began) and shrinks when it does not, so an
// idle or slow queue sleeps at once and a busy one makes no system call.
// On a small host a spinning thread takes a whole core from the
// transports, so budgets are short (tens of microseconds) and the daemon
// lets only a few of its queues spin at once (spinSlots).
type spinner struct {
	budget time.Duration
	max    time.Duration

	// Owned by the spinning goroutine during one spin.
	start time.Time
	iter  int
	slot  bool
}

const spinMin = time.Microsecond

func newSpinner(max time.Duration) spinner { return spinner{budget: max / 2, max: max} }

// spinSlots bounds the daemon's queues that spin at one time; the others
// go to sleep without spinning.
type spinSlots struct{ n, max atomic.Int32 }

func (s *spinSlots) take() bool {
	if s.n.Add(1) > s.max.Load() {
		s.n.Add(-1)
		return false
	}
	return true
}

func (s *spinSlots) give() { s.n.Add(-1) }

// daemonSpin are the daemon process's spin slots: half the CPUs, at least
// one.
var daemonSpin = func() *spinSlots {
	s := &spinSlots{}
	s.max.Store(int32(max(1, runtime.GOMAXPROCS(0)/2)))
	return s
}()

// begin starts a spin; false means spinning is off for now (no budget, or
// no slot) and the caller should sleep at once.
func (s *spinner) begin(slots *spinSlots) bool {
	if s.budget < spinMin {
		return false
	}
	if slots != nil {
		if !slots.take() {
			return false
		}
		s.slot = true
	}
	s.start, s.iter = time.Time{}, 0
	return true
}

// more reports whether the spin may go on. It reads the clock and yields
// the processor once every 32 calls, so a spin costs little when work is
// about to come and lets the process's other goroutines run.
func (s *spinner) more() bool {
	s.iter++
	if s.iter&31 != 0 {
		return true
	}
	runtime.Gosched()
	now := time.Now()
	if s.start.IsZero() {
		s.start = now
		return true
	}
	return now.Sub(s.start) < s.budget
}

// end finishes a spin begun with begin; found says whether work came.
func (s *spinner) end(slots *spinSlots, found bool) {
	if s.slot {
		slots.give()
		s.slot = false
	}
	if found {
		s.budget = min(s.budget+s.budget/2+spinMin, s.max)
	} else {
		s.budget /= 2
	}
}

// slept tells the spinner how long a sleep lasted before work woke it: a
// wake that came within the spin ceiling means spinning would have caught
// it, so the budget grows back.
func (s *spinner) slept(d time.Duration) {
	if d < s.max {
		s.budget = min(max(2*s.budget, spinMin*4), s.max)
	}
}
