package session

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine (a queue's
// worker) and no descriptor.
func TestMain(m *testing.M) {
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
