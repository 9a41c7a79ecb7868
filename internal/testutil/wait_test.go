package testutil

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatal is a testing.TB whose Fatalf records the message and ends the
// goroutine, as a failing test's does.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

// run runs Eventually against f and reports whether it failed.
func (f *fatal) run(d time.Duration, cond func() bool, format string, args ...any) (failed bool) {
	defer func() {
		if r := recover(); r != nil {
			if r != f {
				panic(r)
			}
			failed = true
		}
	}()
	Eventually(f, d, cond, format, args...)
	return false
}

// TestEventually: a state another goroutine sets is seen; one that never
// holds fails, not before its time, with a message naming it and the
// state when the wait gave up.
func TestEventually(t *testing.T) {
	var set atomic.Bool
	go set.Store(true)
	f := &fatal{TB: t}
	if f.run(10*time.Second, set.Load, "the flag set") {
		t.Fatalf("a condition another goroutine sets was not seen: %s", f.msg)
	}
	var polls atomic.Int64
	start := time.Now()
	if !f.run(20*time.Millisecond, func() bool { polls.Add(1); return false }, "the impossible after %d polls", Lazy(polls.Load)) {
		t.Fatal("a condition that never holds was reported held")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("gave up before its time")
	}
	want := fmt.Sprintf("not within 20ms: the impossible after %d polls", polls.Load())
	if f.msg != want || !strings.Contains(f.msg, "impossible") {
		t.Fatalf("message %q, want %q", f.msg, want)
	}
}

// TestPoll: Poll, for code without a testing.TB, sees a state another
// goroutine sets and reports false, not before its time, for one that
// never holds.
func TestPoll(t *testing.T) {
	var set atomic.Bool
	go set.Store(true)
	if !Poll(10*time.Second, set.Load) {
		t.Fatal("a condition another goroutine sets was not seen")
	}
	start := time.Now()
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported held")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("gave up before its time")
	}
}
