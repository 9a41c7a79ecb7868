package testutil

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestClock: the clock moves only by Advance, keeps a monotonic reading,
// and runs the calls that came due, in the order they were set up, once;
// a stopped one never runs.
func TestClock(t *testing.T) {
	start := time.Now()
	c := NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now = %v, want %v", c.Now(), start)
	}
	var ran []string
	c.AfterFunc(2*time.Second, func() { ran = append(ran, "2s") })
	c.AfterFunc(time.Second, func() { ran = append(ran, "1s") })
	stopped := c.AfterFunc(time.Second, func() { ran = append(ran, "stopped") })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop of a pending call did not report it stopped it, or a second Stop did")
	}
	c.Advance(999 * time.Millisecond)
	if len(ran) != 0 {
		t.Fatalf("ran %v before their time", ran)
	}
	c.Advance(2 * time.Second)
	if !slices.Equal(ran, []string{"2s", "1s"}) {
		t.Fatalf("ran %v, want both due calls in the order they were set up", ran)
	}
	c.Advance(time.Hour)
	if len(ran) != 2 {
		t.Fatalf("a call ran twice: %v", ran)
	}
	if got := c.Now().Sub(start); got != time.Hour+2999*time.Millisecond {
		t.Fatalf("advanced by %v", got)
	}
	if !strings.Contains(c.Now().String(), " m=+") {
		t.Fatalf("%v: the monotonic reading of time.Now was lost", c.Now())
	}
}
