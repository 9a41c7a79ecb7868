package store

import (
	"testing"

	"github.com/tensorcast/tensorcast/status"
)

// TestKeyMovingOnEveryLookupIsBusy: a key that moved on each of maxAgain
// lookups answers BUSY (its own state, which a retry may find settled),
// never INTERNAL.
func TestKeyMovingOnEveryLookupIsBusy(t *testing.T) {
	if got := status.CodeOf(errAgain); got != status.CodeOf(ErrBusy) {
		t.Fatalf("errAgain answers %v, want %v (BUSY)", got, status.CodeOf(ErrBusy))
	}
}
