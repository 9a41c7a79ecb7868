package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Eventually waits for cond, a state another goroutine (or process)
// reaches after an event the test cannot wait on directly: it polls cond
// until it holds, and fails t if it does not within d, with the message
// format and args say (what was waited for). The message is formatted when
// the wait fails, so an argument that is a fmt.Stringer (a log buffer) or
// a Lazy shows the state then, not the state when the wait began.
//
// cond runs on t's goroutine, at first every millisecond, then less often
// (every 16 ms at most) as the wait goes on.
func Eventually(t testing.TB, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("not within %v: "+format, append([]any{d}, args...)...)
	}
}

// Poll is Eventually for code that has no testing.TB, such as a test's
// child process: it polls cond the same way and reports whether cond held
// within d.
func Poll(d time.Duration, cond func() bool) bool {
	pause := time.Millisecond
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 16*time.Millisecond)
	}
	return true
}

// Lazy is a value that prints as what f returns when it is printed, with
// any verb: an argument of Eventually's message that shows a count or a
// state at the time the wait failed.
func Lazy[T any](f func() T) fmt.Formatter { return lazy[T](f) }

type lazy[T any] func() T

func (f lazy[T]) Format(s fmt.State, verb rune) { fmt.Fprintf(s, fmt.FormatString(s, verb), f()) }
