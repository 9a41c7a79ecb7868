package rdma

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The channel tests run tcp nodes: gnet's package-level worker pool
	// starts two goroutines at program init that live as long as the
	// process; everything else must be gone.
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"))
}
