package daemon

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestUnsealedHostPoolFaultCounted: through the whole daemon, a client's
// memfd that cannot be sealed registers; once the client truncates it, a
// transfer from it fails FAILED_PRECONDITION, the scrape counts the
// fault, and the daemon serves the same client's next request.
func TestUnsealedHostPoolFaultCounted(t *testing.T) {
	cfg := testConfig(t.TempDir())
	d, c := startClient(t, cfg, discardLogger(), "engine")
	const size = 256 << 10
	fd := testutil.UnsealableMemfd(t, size)
	defer unix.Close(fd)
	seg, err := c.RegisterFD(fd, size)
	if err != nil {
		t.Fatalf("registering an unsealable memfd: %v", err)
	}
	pool, _ := c.Pool()
	offs := allocBlocks(t, c, 1, size)
	req := []xfer.Request{{Op: xfer.OpWrite, Local: seg, Target: pool.Segment, TargetOffset: offs[0], Length: size}}
	res := make([]error, 1)
	if _, err := c.Transfer(req, 5*time.Second, res); err != nil || res[0] != nil {
		t.Fatalf("transfer from the whole host pool: %v %v", err, res[0])
	}
	before := sample(t, scrapeMetrics(t, d.MetricsAddr()), "tensorcast_memory_faults_total")
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Transfer(req, 5*time.Second, res); !errors.Is(res[0], client.ErrFailedPrecondition) {
		t.Fatalf("transfer from the truncated host pool: %v, %v; want FAILED_PRECONDITION", err, res[0])
	}
	if got := sample(t, scrapeMetrics(t, d.MetricsAddr()), "tensorcast_memory_faults_total"); got < before+1 {
		t.Fatalf("tensorcast_memory_faults_total %v, want at least %v", got, before+1)
	}
	if err := c.Ping(nil); err != nil {
		t.Fatalf("the daemon after the fault: %v", err)
	}
	if err := c.PutBytes([]byte("k"), []byte("v"), false); err != nil {
		t.Fatalf("a put after the fault: %v", err)
	}
}
