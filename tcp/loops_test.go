package tcp

import (
	"bytes"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestEventLoopsCounted checks that EventLoops, from which the daemon sizes
// its Go processors, is how many event-loop goroutines a Node runs.
func TestEventLoopsCounted(t *testing.T) {
	before := eventLoopGoroutines()
	kf := testutil.KeyFile(t, t.TempDir(), "k", "cluster-secret")
	startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf})
	want := before + EventLoops()
	testutil.Eventually(t, 5*time.Second, func() bool { return eventLoopGoroutines() == want },
		"want %d event-loop goroutines (%d before the node, EventLoops %d), have %d", want, before, EventLoops(),
		testutil.Lazy(eventLoopGoroutines))
}

// eventLoopGoroutines counts the goroutines in gnet's event loop.
func eventLoopGoroutines() int {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2) //nolint:errcheck // a bytes.Buffer does not fail
	return bytes.Count(b.Bytes(), []byte("gnet/v2.(*eventloop).run("))
}
