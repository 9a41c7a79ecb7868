package session

import (
	"fmt"
	"testing"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestPoolViewCarriesPoolRegs: a connection's view of the pool offers the
// pool's own registration slots, so that a queue request through the view
// uses the pool's io_uring fixed buffers.
func TestPoolViewCarriesPoolRegs(t *testing.T) {
	pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Size: 4 << 20, Hugepages: shm.HugepagesOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	v := &poolView{Pool: pool}
	if xfer.RegsOf(v) != pool.Regs() {
		t.Fatal("the pool view does not carry the pool's registrations")
	}
}

// BenchmarkPoolViewHoldDrop is what the engine's range holding costs a
// queue request through a connection's view of the pool: one HoldRange at
// submit and one DropRange at Done, with depth requests in flight over a
// connection holding 64 blocks of 1 MiB (a 4 KiB request each).
func BenchmarkPoolViewHoldDrop(b *testing.B) {
	for _, depth := range []int{1, 32} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			const blocks, block, req = 64, 1 << 20, 4 << 10
			v := &poolView{blocks: &blockSet{}}
			for i := range blocks {
				v.blocks.add(uint64(i)*block, block)
			}
			offs := make([]uint64, depth)
			for i := range offs {
				offs[i] = uint64(i%blocks)*block + uint64(i/blocks)*req
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := offs[i%depth]
				if !v.HoldRange(off, req) {
					b.Fatal("hold refused")
				}
				if i >= depth-1 {
					v.DropRange(offs[(i+1)%depth], req)
				}
			}
		})
	}
}
