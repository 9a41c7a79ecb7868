package xfer_test

import (
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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
	// The holder frees the rest and forgets its blocks (the session's
	// release); the held ones are still found by their drops.
	b.Reset()
	if b.Busy(4096) || !b.Busy(0) {
		t.Fatalf("after Reset: busy(4096)=%v busy(0)=%v, want false true", b.Busy(4096), b.Busy(0))
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

// TestBlocksTakeIdle: TakeIdle takes a block no transfer holds out of the
// list, after which no hold is taken on it; a held block stays (busy), and
// so does an unknown one (neither).
func TestBlocksTakeIdle(t *testing.T) {
	var b xfer.Blocks
	b.Add(0, 4096)
	b.Add(4096, 4096)
	if !b.HoldRange(0, 10) {
		t.Fatal("hold refused")
	}
	if size, taken, busy := b.TakeIdle(0); taken || !busy || size != 4096 {
		t.Fatalf("TakeIdle of a held block: size %d taken %v busy %v, want 4096 false true", size, taken, busy)
	}
	if size, taken, busy := b.TakeIdle(4096); !taken || busy || size != 4096 {
		t.Fatalf("TakeIdle of an idle block: size %d taken %v busy %v, want 4096 true false", size, taken, busy)
	}
	if b.HoldRange(4096, 10) || b.HoldRange(0, 8192) {
		t.Fatal("held a range in a block taken")
	}
	if _, taken, busy := b.TakeIdle(8192); taken || busy {
		t.Fatal("TakeIdle of an unknown block took it or found it busy")
	}
	b.DropRange(0, 10)
	if _, taken, _ := b.TakeIdle(0); !taken {
		t.Fatal("TakeIdle of a block whose last hold dropped did not take it")
	}
	if b.Len() != 0 {
		t.Fatalf("%d blocks left", b.Len())
	}
}

// TestBlocksDropAfterRemove: a drop of a range whose block the holder
// removed meanwhile (Remove, not TakeIdle) counts against no other block:
// the block before it stays held as it was.
func TestBlocksDropAfterRemove(t *testing.T) {
	var b xfer.Blocks
	b.Add(0, 4096)
	b.Add(4096, 4096)
	if !b.HoldRange(0, 10) || !b.HoldRange(4096, 10) {
		t.Fatal("hold refused")
	}
	b.Remove(4096)
	b.DropRange(4096, 10)
	if !b.Busy(0) {
		t.Fatal("a drop in a removed block dropped the hold of the block before it")
	}
	b.DropRange(0, 10)
	if b.Busy(0) {
		t.Fatal("block 0 busy after its own drop")
	}
}

// TestBlocksTakeIdleRacesHolds: holds taken and dropped on other
// goroutines while the owner takes the block out and adds it back, over
// and over (a client freeing a block its own requests race for). A hold
// that succeeds is never on a block taken out: TakeIdle and HoldRange
// exclude each other.
func TestBlocksTakeIdleRacesHolds(t *testing.T) {
	var b xfer.Blocks
	b.Add(0, 4096)
	var taken atomic.Bool
	var bad, holds atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if b.HoldRange(0, 512) {
					holds.Add(1)
					if taken.Load() {
						bad.Add(1)
					}
					b.DropRange(0, 512)
				}
				runtime.Gosched() // room for the owner's TakeIdle between holds
			}
		}()
	}
	takes := 0
	for takes < 300 || holds.Load() < 3000 {
		if _, ok, _ := b.TakeIdle(0); ok {
			takes++
			taken.Store(true)
			runtime.Gosched() // let the holders try while it is out
			taken.Store(false)
			b.Add(0, 4096)
		}
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d holds succeeded on a block taken out (of %d)", bad.Load(), holds.Load())
	}
	if b.Busy(0) {
		t.Fatal("block busy after every hold dropped")
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
