package control

import (
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// helperEnv makes the test binary run a helper client instead of the tests
// (see env_test.go), so a test can run a client in another process: as
// another uid, or to kill it with SIGKILL.
const helperEnv = "TENSORCAST_CONTROL_TEST_HELPER"

func TestMain(m *testing.M) { testutil.Main(m, testutil.Child(helperEnv, runHelper)) }
