package etcd

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every directory stops all it started: the feed,
// the prober, the keeper and the etcd client's own goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
