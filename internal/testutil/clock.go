package testutil

import (
	"sync"
	"time"
)

// Clock is a clock that moves only when the test advances it: the time
// source a test injects where a package reads the time through a func()
// time.Time (pass c.Now) or through Now and AfterFunc. It is safe for
// concurrent use.
type Clock struct {
	mu     sync.Mutex // guards the fields below
	now    time.Time
	timers []*Timer
}

// Timer is a call AfterFunc set up on a Clock.
type Timer struct {
	c       *Clock
	at      time.Time
	f       func()
	stopped bool // guarded by c.mu
}

// NewClock returns a Clock reading start. A start taken from time.Now
// keeps its monotonic reading as the clock advances, for packages that
// require one.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc calls f once the clock has been advanced by d or more, in the
// goroutine of the Advance that moved it there.
func (c *Clock) AfterFunc(d time.Duration, f func()) *Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &Timer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop prevents t's call if it has not run yet, and reports whether it
// did so.
func (t *Timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// Advance moves the clock by d and then runs, in the order AfterFunc set
// them up, the calls that came due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*Timer
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}
