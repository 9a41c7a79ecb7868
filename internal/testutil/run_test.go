package testutil

import (
	"context"
	"testing"
)

// TestRunStopsAtCleanup: what Run starts is running during the test and
// has returned, its context cancelled, once the test's cleanups are done.
func TestRunStopsAtCleanup(t *testing.T) {
	started, returned := make(chan struct{}), make(chan error, 1)
	t.Run("inner", func(t *testing.T) {
		Run(t, "waiter", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			returned <- ctx.Err()
			return nil
		})
		<-started
		select {
		case <-returned:
			t.Fatal("returned before the test ended")
		default:
		}
	})
	select {
	case err := <-returned:
		if err != context.Canceled {
			t.Fatalf("context ended with %v, want it cancelled", err)
		}
	default:
		t.Fatal("still running after the test's cleanups")
	}
}
