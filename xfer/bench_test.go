package xfer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// BenchmarkSubmitStatus measures the engine's own cost per request: one
// batch per iteration (AllocateBatch, Submit, Status of every task, Wait,
// Free) over a transport that ends each task inside Submit.
func BenchmarkSubmitStatus(b *testing.B) {
	for _, n := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			f := newFixture(b, xfer.Config{}, xfertest.RouteAll(syncTr()), withSize(n*64))
			reqs := f.reqs(n)
			res := make([]error, n)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				id, err := f.e.AllocateBatch(n)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
					b.Fatal(err)
				}
				for i := range n {
					if st, _ := f.e.Status(id, i); st.State != xfer.StateCompleted {
						b.Fatal(st.State)
					}
				}
				if _, err := f.e.Wait(id, time.Time{}); err != nil {
					b.Fatal(err)
				}
				if err := f.e.Free(id); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/request")
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}

// BenchmarkLocalCopy compares the local transport (through the engine:
// Submit of depth requests, then Wait) with a plain copy() of the same
// sizes between the same buffers. Compare MB/s of local/… with copy/….
func BenchmarkLocalCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, depth := range []int{1, 16} {
			name := fmt.Sprintf("size=%dKiB/depth=%d", size>>10, depth)
			b.Run("copy/"+name, func(b *testing.B) {
				src := make([]byte, size*depth)
				dst := make([]byte, size*depth)
				fill(src, 1)
				fill(dst, 2)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := i % depth
					copy(dst[k*size:(k+1)*size], src[k*size:(k+1)*size])
				}
			})
			b.Run("local/"+name, func(b *testing.B) {
				l := xfer.NewLocal(xfer.LocalConfig{}, nil)
				defer l.Close()
				f := newFixture(b, xfer.Config{}, xfertest.RouteAll(l), withSize(size*depth))
				fill(f.a.Bytes(), 1)
				fill(f.b.Bytes(), 2)
				reqs := make([]xfer.Request, depth)
				for k := range reqs {
					reqs[k] = xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: uint64(k * size), Target: 2, TargetOffset: uint64(k * size), Length: uint64(size)}
				}
				res := make([]error, depth)
				// One batch takes many submits; it is recycled when full.
				const capacity = 1024
				id, _ := f.e.AllocateBatch(capacity)
				used := 0
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i += depth {
					if used+depth > capacity {
						if err := f.e.Free(id); err != nil {
							b.Fatal(err)
						}
						id, _ = f.e.AllocateBatch(capacity)
						used = 0
					}
					if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
						b.Fatal(err)
					}
					used += depth
					if s, err := f.e.Wait(id, time.Time{}); err != nil || s.Failed != 0 {
						b.Fatal(s, err)
					}
				}
			})
		}
	}
}

// BenchmarkLocalVsCopy alternates, on the same buffers, one local-transport
// submit of depth requests (Submit, then Wait) with a plain copy() of the
// same requests, timing each, so that load from other processes hits both
// alike. It reports both throughputs and their ratio (local/copy).
func BenchmarkLocalVsCopy(b *testing.B) {
	// KV blocks that move are rarely in the CPU cache, so both sides walk a
	// working set larger than the last-level cache (slots of depth×size
	// bytes, 128 MiB per side), each iteration on a slot the other side did
	// not just touch, and the order alternates between iterations.
	const workingSet = 128 << 20
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, depth := range []int{1, 16} {
			b.Run(fmt.Sprintf("size=%dKiB/depth=%d", size>>10, depth), func(b *testing.B) {
				l := xfer.NewLocal(xfer.LocalConfig{}, nil)
				defer l.Close()
				slot := size * depth
				nslots := max(workingSet/slot, 4)
				f := newFixture(b, xfer.Config{}, xfertest.RouteAll(l), withSize(slot*nslots))
				fill(f.a.Bytes(), 1)
				fill(f.b.Bytes(), 2)
				reqs := make([]xfer.Request, depth)
				res := make([]error, depth)
				const capacity = 1024
				id, _ := f.e.AllocateBatch(capacity)
				used := 0
				var tLocal, tCopy time.Duration
				viaLocal := func(base int) {
					for k := range reqs {
						off := uint64(base + k*size)
						reqs[k] = xfer.Request{Op: xfer.OpWrite, Local: 1, LocalOffset: off, Target: 2, TargetOffset: off, Length: uint64(size)}
					}
					if used+depth > capacity {
						if err := f.e.Free(id); err != nil {
							b.Fatal(err)
						}
						id, _ = f.e.AllocateBatch(capacity)
						used = 0
					}
					t0 := time.Now()
					if err := f.e.Submit(id, reqs, f.opts, res); err != nil {
						b.Fatal(err)
					}
					used += depth
					if s, err := f.e.Wait(id, time.Time{}); err != nil || s.Failed != 0 {
						b.Fatal(s, err)
					}
					tLocal += time.Since(t0)
				}
				viaCopy := func(base int) {
					t0 := time.Now()
					for k := range depth {
						o := base + k*size
						copy(f.b.Bytes()[o:o+size], f.a.Bytes()[o:o+size])
					}
					tCopy += time.Since(t0)
				}
				b.SetBytes(int64(size * depth))
				b.ResetTimer()
				for i := range b.N {
					s1 := (2 * i) % nslots * slot
					s2 := (2*i + 1) % nslots * slot
					if i%2 == 0 {
						viaLocal(s1)
						viaCopy(s2)
					} else {
						viaCopy(s1)
						viaLocal(s2)
					}
				}
				bytes := float64(b.N) * float64(size*depth) / 1e6
				b.ReportMetric(bytes/tLocal.Seconds(), "local-MB/s")
				b.ReportMetric(bytes/tCopy.Seconds(), "copy-MB/s")
				b.ReportMetric(tCopy.Seconds()/tLocal.Seconds(), "local/copy")
			})
		}
	}
}
