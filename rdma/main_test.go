package rdma

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestMain checks that the package's tests leak no goroutine and no
// descriptor (the channel's sockets and event loops; with a device, its
// context, completion channels and memory registrations).
func TestMain(m *testing.M) {
	testutil.WarmFDs()
	before := testutil.OpenFDs()
	code := m.Run()
	if code == 0 {
		for _, l := range before.Leaked() {
			fmt.Fprintf(os.Stderr, "descriptor leak: %s\n", l)
			code = 1
		}
		// The channel tests run tcp nodes: gnet's package-level worker
		// pool starts two goroutines at program init that live as long as
		// the process; everything else must be gone.
		if err := goleak.Find(
			goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
			goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock")); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
