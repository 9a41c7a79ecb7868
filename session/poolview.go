package session

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"

	"github.com/tensorcast/tensorcast/xfer"
)

// poolView is one connection's view of the pool: the pool segment itself
// (same id, memory and references), plus the blocks of this connection that
// transfers are moving bytes in. The engine holds a request's range for as
// long as a transport may touch it (xfer.RangeHolder), which is past a
// task's Timeout until the transport's Done. So:
//   - FreeBlocks of a block with a hold answers BUSY instead of handing
//     memory that is still being written to another client;
//   - a connection that closes while holds remain leaves those blocks
//     allocated and frees each one when its last hold drops.
type poolView struct {
	Pool
	// blocks is the connection's blockSet. HoldRange reads it under its
	// lock: the engine calls HoldRange from Submit, on the serving goroutine
	// (batch calls) or on a queue's worker.
	blocks *blockSet
	log    *slog.Logger

	// mu guards the fields below; DropRange runs on transports' goroutines.
	mu     sync.Mutex
	holds  []blockHold // sorted by off: blocks with transfers in flight
	closed bool        // the connection is gone: free blocks at their last drop
}

// Regs are the pool's registrations (its io_uring fixed buffers), which
// the view's requests use: it shares the pool's memory.
func (v *poolView) Regs() *xfer.Regs { return xfer.RegsOf(v.Pool) }

// blockHold counts the transfers in flight in one block.
type blockHold struct {
	off, size uint64
	n         int32
	// freeAtDrop: the connection is gone and the block is to be freed when
	// its last hold drops.
	freeAtDrop bool
}

// HoldRange implements xfer.RangeHolder: every block [off, off+n) touches
// gets one more hold. It refuses a range not inside this connection's
// blocks (checked before submit too) and any hold after the connection
// closed.
func (v *poolView) HoldRange(off, n uint64) bool {
	// Lock order: the block set (shared), then v.mu.
	v.blocks.mu.RLock()
	defer v.blocks.mu.RUnlock()
	if !v.blocks.coversRangeLocked(off, n) {
		return false
	}
	end := off + n
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return false
	}
	i, found := slices.BinarySearch(v.blocks.offs, off)
	if !found {
		i--
	}
	for ; i < len(v.blocks.offs) && v.blocks.offs[i] < end; i++ {
		b := v.blocks.offs[i]
		j, ok := v.holdIndex(b)
		if !ok {
			v.holds = slices.Insert(v.holds, j, blockHold{off: b, size: v.blocks.sizes[i]})
		}
		v.holds[j].n++
	}
	return true
}

// DropRange implements xfer.RangeHolder: the blocks [off, off+n) touches
// lose one hold each; a block of a closed connection is freed when its
// last hold drops.
func (v *poolView) DropRange(off, n uint64) {
	end := off + n
	var free []uint64
	v.mu.Lock()
	i, _ := v.holdIndex(off)
	if i == len(v.holds) || v.holds[i].off > off {
		i--
	}
	for i >= 0 && i < len(v.holds) && v.holds[i].off < end {
		if v.holds[i].n--; v.holds[i].n > 0 {
			i++
			continue
		}
		if v.holds[i].freeAtDrop {
			free = append(free, v.holds[i].off)
		}
		v.holds = slices.Delete(v.holds, i, i+1)
	}
	v.mu.Unlock()
	for _, b := range free {
		if err := v.Pool.Free(b); err != nil {
			v.log.Warn("freeing a pool block of a closed connection after its last transfer failed", "offset", b, "err", err)
		}
	}
}

// busy reports whether transfers are still moving bytes in the block at off.
func (v *poolView) busy(off uint64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.holdIndex(off)
	return ok
}

// close marks the connection gone: no new holds. It returns the blocks
// that still have holds; the caller must not free those now. Those for
// which freeLater says true are freed by DropRange at their last drop.
func (v *poolView) close(freeLater func(off uint64) bool) map[uint64]bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed = true
	held := make(map[uint64]bool, len(v.holds))
	for i := range v.holds {
		held[v.holds[i].off] = true
		v.holds[i].freeAtDrop = freeLater(v.holds[i].off)
	}
	return held
}

// holdIndex finds the hold of the block at off in v.holds (v.mu held):
// its index and true, or where it would go and false.
func (v *poolView) holdIndex(off uint64) (int, bool) {
	return slices.BinarySearchFunc(v.holds, off, func(h blockHold, o uint64) int { return cmp.Compare(h.off, o) })
}
