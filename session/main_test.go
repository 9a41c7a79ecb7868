package session

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine (a queue's
// worker) and no descriptor.
func TestMain(m *testing.M) { testutil.Main(m) }
