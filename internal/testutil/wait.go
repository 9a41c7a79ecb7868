package testutil

import "time"

// WaitFor polls cond, a state another goroutine (or process) reaches after
// an event the test cannot wait on directly, until it holds or d passes;
// it reports whether it held.
func WaitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
