//go:build linux

package uring

import (
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// BenchmarkRandRead4K reads 4 KiB blocks at queue depth 32 from an O_DIRECT
// file in a temporary directory (scripts/bench-uring.sh compares with fio
// on a laid-out 4 GiB file; this keeps the path compiling and comparable
// with benchstat).
func BenchmarkRandRead4K(b *testing.B) {
	for _, fixed := range []bool{false, true} {
		name := "plain"
		if fixed {
			name = "fixed"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			tr := newTransport(b, Config{AllowedDirs: []string{dir}, Entries: 32, NoFixedBuffers: !fixed, NoFixedFiles: !fixed})
			f, err := tr.OpenFile(1, dir+"/f", FileOptions{Direct: true, Create: true, Size: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			pool := newMemSeg(b, 2, 32*4096)
			if fixed {
				if err := tr.RegisterBuffers(pool); err != nil {
					b.Fatal(err)
				}
			}
			free := make(chan *xfer.Task, 32)
			rec := xfertest.Func(func(t *xfer.Task, _ uint64, _ error) { free <- t })
			for i := 0; i < cap(free); i++ {
				free <- newTask(rec, xfer.OpRead, pool, uint64(i)*4096, f, uint64(i*97%16384)*4096, 4096)
			}
			one := make([]*xfer.Task, 1)
			b.SetBytes(4096)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				one[0] = <-free
				one[0].Req.TargetOffset = uint64(i*7919%16384) * 4096
				if n, err := tr.Submit(one); n != 1 {
					b.Fatal(err)
				}
			}
			for i := 0; i < cap(free); i++ {
				<-free
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}
