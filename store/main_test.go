package store

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine and no
// descriptor (pools and staging memory are memfds; rings are fds).
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	testutil.WarmFDs()
	before := testutil.OpenFDs()
	code := m.Run()
	if code == 0 {
		for _, l := range before.Leaked() {
			fmt.Fprintf(os.Stderr, "descriptor leak: %s\n", l)
			code = 1
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
