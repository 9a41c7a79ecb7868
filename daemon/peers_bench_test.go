package daemon

import (
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// BenchmarkPeerTransfer measures the whole peer path on loopback: a client
// of d2 moves 16 × 1 MiB per Transfer call between its registered buffer
// and a buffer a client of d1 exported (control socket → engine → tcp
// node → peer → exported memory, and the answer back).
func BenchmarkPeerTransfer(b *testing.B) {
	for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
		b.Run(op.String(), func(b *testing.B) {
			key := testutil.KeyFile(b, b.TempDir(), "cluster.key", "bench cluster key")
			slices := func(c *Config) { c.PeerSliceSize = 1 << 20; c.PoolSize = 64 << 20 }
			d1 := startPeerWith(b, "d1", key, "", slices, dialsIn("d2"))
			d2 := startPeerWith(b, "d2", key, "", slices, d1.peer())
			const chunk, n = 1 << 20, 16
			a := d1.dial(b, "exporter")
			abuf, err := a.RegisterBuffer(chunk * n)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := a.ExportSegment("kv", abuf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
				b.Fatal(err)
			}
			c := d2.dial(b, "bench")
			rs, err := c.OpenRemote("d1/kv", client.RightRead|client.RightWrite)
			if err != nil {
				b.Fatal(err)
			}
			buf, err := c.RegisterBuffer(chunk * n)
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]xfer.Request, n)
			for i := range reqs {
				reqs[i] = xfer.Request{Op: op, Local: buf.ID, LocalOffset: uint64(i) * chunk, Target: rs.ID,
					TargetOffset: uint64(i) * chunk, Length: chunk}
			}
			res := make([]error, n)
			b.SetBytes(chunk * n)
			b.ResetTimer()
			for range b.N {
				sum, err := c.Transfer(reqs, 30*time.Second, res)
				if err != nil || sum.Completed != n {
					b.Fatalf("transfer: %v %+v", err, sum)
				}
			}
		})
	}
}
