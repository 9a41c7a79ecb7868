package store

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine and no
// descriptor (pools and staging memory are memfds; rings are fds).
func TestMain(m *testing.M) {
	testutil.Main(m, testutil.Child(crashChildEnv, func(string) int { crashChild(); return 0 })) // crashChild never returns
}
