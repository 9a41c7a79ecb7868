package etcd

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that every directory stops all it started: the feed,
// the prober, the keeper and the etcd client's own goroutines.
func TestMain(m *testing.M) { testutil.Main(m) }
