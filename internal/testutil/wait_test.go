package testutil

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitFor(t *testing.T) {
	var set atomic.Bool
	go set.Store(true)
	if !WaitFor(10*time.Second, set.Load) {
		t.Fatal("a condition another goroutine sets was not seen")
	}
	start := time.Now()
	if WaitFor(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported held")
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("gave up before its time")
	}
}
