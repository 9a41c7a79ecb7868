package daemon

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestPoolFileRoundTrip moves bytes pool → file (O_DIRECT, io_uring) → pool
// through the real socket and checks every byte, then checks that a file
// outside the allowed directories is refused.
func TestPoolFileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	_, c := startClient(t, cfg, discardLogger(), "e2e")
	pool, ok := c.Pool()
	if !ok {
		t.Fatal("pool not mapped")
	}

	const blk = 256 << 10
	fileID, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "l2.bin"), true, 8<<20)
	if errors.Is(err, client.ErrUnavailable) {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier (see the daemon log): %v", err)
	}
	if err != nil {
		t.Fatalf("RegisterFile under data_dir: %v", err)
	}
	offs, err := c.AllocBlocks(nil, 2, blk)
	if err != nil {
		t.Fatal(err)
	}
	mem := c.PoolBytes()
	src := mem[offs[0] : offs[0]+blk]
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	clear(mem[offs[1] : offs[1]+blk])

	results := make([]error, 1)
	for _, r := range []xfer.Request{
		{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[0], Target: fileID, TargetOffset: 3 * blk, Length: blk},
		{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[1], Target: fileID, TargetOffset: 3 * blk, Length: blk},
	} {
		sum, err := c.Transfer([]xfer.Request{r}, 10*time.Second, results)
		if err != nil || results[0] != nil || sum.Completed != 1 {
			t.Fatalf("%v: err %v, result %v, summary %+v", r.Op, err, results[0], sum)
		}
	}
	if !bytes.Equal(mem[offs[0]:offs[0]+blk], mem[offs[1]:offs[1]+blk]) {
		t.Fatal("bytes read back from the file differ from those written")
	}

	// A misaligned O_DIRECT request fails that item, positionally.
	res := make([]error, 2)
	sum, err := c.Transfer([]xfer.Request{
		{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[1], Target: fileID, TargetOffset: 0, Length: 4096},
		{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[1], Target: fileID, TargetOffset: 7, Length: 4096},
	}, 10*time.Second, res)
	if err != nil {
		t.Fatalf("transfer with one misaligned request: %v", err)
	}
	if sum.Completed != 1 || sum.Failed != 1 {
		t.Fatalf("misaligned request not failed alone: %+v", sum)
	}
	// At its own position: the aligned item before it completed.
	if res[0] != nil || !errors.Is(res[1], client.ErrInvalidArgument) {
		t.Fatalf("results %v, want [nil, INVALID_ARGUMENT]", res)
	}

	// Stats shows the ring features in use and each ring's queue depth.
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, ct := range st.Transports {
		got[ct.Name] = ct.Value
	}
	if got["uring.ring0.entries"] == 0 || got["uring.ring0.completed"] < 3 || got["uring.ring0.in_flight"] != 0 {
		t.Fatalf("ring counters missing or wrong in Stats: %v", got)
	}
	if _, ok := got["uring.single_issuer"]; !ok {
		t.Fatalf("ring features missing in Stats: %v", got)
	}

	if _, _, err := c.RegisterFile("/etc/passwd", false, 0); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("RegisterFile outside the allowed directories: %v, want PERMISSION_DENIED", err)
	}
}
