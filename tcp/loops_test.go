package tcp

import (
	"bytes"
	"runtime"
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
		"want %d event-loop goroutines (%d before the node, EventLoops %d), have %d", want, before, EventLoops(), eventLoopGoroutines())
}

// eventLoopGoroutines counts the goroutines in gnet's event loop.
func eventLoopGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("gnet/v2.(*eventloop).run("))
		}
		buf = make([]byte, 2*len(buf))
	}
}
