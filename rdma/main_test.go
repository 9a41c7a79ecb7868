package rdma

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine and no
// descriptor (the channel's sockets and event loops; with a device, its
// context, completion channels and memory registrations).
func TestMain(m *testing.M) { testutil.Main(m) }
