package store

import "time"

// Clock is the store's source of time: lease expiry and writeback retry
// delays read it. Tests inject a clock they advance by hand.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not run yet and reports whether it
	// did so.
	Stop() bool
}

// realClock is the wall clock (with its monotonic reading).
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

func durationNS(ns int64) time.Duration { return time.Duration(ns) }
