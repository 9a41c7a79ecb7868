package queue_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/queue/queuetest"
)

// TestLostWakeupStress runs many submissions and completions, with random
// batch sizes and pauses on both sides and the client's spinning on or
// off, so every sleep and wake path runs (the daemon's worker sleeps
// through Doorbell and Awake, as a reactor does). A lost wake-up shows as
// a Wait that runs out of its (generous) time.
func TestLostWakeupStress(t *testing.T) {
	total := 1 << 21
	if invariants.RaceEnabled {
		total = 1 << 20
	}
	if testing.Short() {
		total = 1 << 16
	}
	for _, mode := range []struct {
		name   string
		clSpin bool
	}{{"client-spins", true}, {"nospin", false}} {
		t.Run(mode.name, func(t *testing.T) {
			d, c := queue.Pair(t, 64, 128, 0)
			if !mode.clSpin {
				c.NoSpin()
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); queue.Echo(d, true, &stop) }()
			defer func() { stop.Store(true); d.Close(); wg.Wait() }()
			if err := queuetest.RoundTrips(c, 3, total, 48); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d round trips: client doorbells %d+%d, sleeps %d", total, c.SubmitDoorbells.Load(), c.ReapDoorbells, c.Sleeps)
		})
	}
}
