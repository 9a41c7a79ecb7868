package control

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// helperEnv makes the test binary run a helper client instead of the tests
// (see env_test.go), so a test can run a client in another process: as
// another uid, or to kill it with SIGKILL.
const helperEnv = "TENSORCAST_CONTROL_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h))
	}
	before, err := testutil.HandleFDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "listing fds:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	if code == 0 {
		after, err := testutil.HandleFDs()
		if err == nil && len(after) > len(before) {
			fmt.Fprintf(os.Stderr, "fd leak: sockets and memfds open before the tests %v, after %v\n", before, after)
			code = 1
		}
	}
	os.Exit(code)
}
