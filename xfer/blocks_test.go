package xfer_test

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

// freed records the blocks Abandon's pool frees.
type freed struct {
	mu   sync.Mutex
	offs []uint64
}

func (f *freed) Free(off uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offs = append(f.offs, off)
	return nil
}

func (f *freed) got() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.offs)
}

// TestBlocksHoldDrop: a hold covers only owned blocks, each block it
// touches stays busy until its last hold drops, and after Abandon no hold
// is taken and the blocks it named are freed at their last drop, the
// others left to the holder.
func TestBlocksHoldDrop(t *testing.T) {
	var b xfer.Blocks
	b.Add(0, 4096)
	b.Add(4096, 4096)
	b.Add(16384, 4096) // a gap at [8192, 16384)
	if b.HoldRange(8192, 4096) || b.HoldRange(4096, 12288) {
		t.Fatal("held a range outside the blocks")
	}
	if !b.HoldRange(2048, 4096) { // spans blocks 0 and 4096
		t.Fatal("refused a range over two adjacent blocks")
	}
	if !b.HoldRange(0, 100) || !b.HoldRange(16384, 4096) {
		t.Fatal("refused a range inside a block")
	}
	if !b.Busy(0) || !b.Busy(4096) || !b.Busy(16384) {
		t.Fatal("a held block is not busy")
	}
	b.DropRange(2048, 4096)
	if !b.Busy(0) || b.Busy(4096) {
		t.Fatalf("after one of two holds on block 0 dropped: busy(0)=%v busy(4096)=%v, want true false", b.Busy(0), b.Busy(4096))
	}
	var pool freed
	held := b.Abandon(func(off, size uint64) bool { return off != 16384 }, &pool, slog.New(slog.DiscardHandler))
	if len(held) != 2 || !held[0] || !held[16384] {
		t.Fatalf("Abandon reported %v held, want blocks 0 and 16384", held)
	}
	if b.HoldRange(4096, 10) {
		t.Fatal("held a range after Abandon")
	}
	b.DropRange(0, 100)
	b.DropRange(16384, 4096)
	if got := pool.got(); !slices.Equal(got, []uint64{0}) {
		t.Fatalf("freed %v at the last drops, want [0] (16384 is the holder's to keep)", got)
	}
	if b.Busy(0) || b.Busy(16384) {
		t.Fatal("a block is busy after its last drop")
	}
}

// BenchmarkBlocksHoldDrop is what range holding costs a queue request on a
// client's view of the pool: one HoldRange at submit and one DropRange at
// Done, with depth requests in flight over 64 blocks of 1 MiB (a 4 KiB
// request each).
func BenchmarkBlocksHoldDrop(b *testing.B) {
	for _, depth := range []int{1, 32} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			const blocks, block, req = 64, 1 << 20, 4 << 10
			var s xfer.Blocks
			for i := range blocks {
				s.Add(uint64(i)*block, block)
			}
			offs := make([]uint64, depth)
			for i := range offs {
				offs[i] = uint64(i%blocks)*block + uint64(i/blocks)*req
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !s.HoldRange(offs[i%depth], req) {
					b.Fatal("hold refused")
				}
				if i >= depth-1 {
					s.DropRange(offs[(i+1)%depth], req)
				}
			}
		})
	}
}
