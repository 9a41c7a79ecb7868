package testutil

import (
	"context"
	"testing"
)

// Run runs run in a goroutine of its own until t ends; then it cancels
// run's context and waits for run to return, an error failing t as what's.
func Run(t testing.TB, what string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}
