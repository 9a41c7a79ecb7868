package session

import (
	"testing"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestPoolViewCarriesPoolRegs: a session's view of the pool offers the
// pool's own registration slots, so that a queue request through the view
// uses the pool's io_uring fixed buffers, and holds its ranges in the
// session's blocks.
func TestPoolViewCarriesPoolRegs(t *testing.T) {
	pool, err := shm.NewPool(shm.PoolConfig{ID: 1, Size: 4 << 20, Hugepages: shm.HugepagesOff}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := New(&Host{}, 1, nil)
	c.SetTenant("", pool, nil, nil)
	seg, ok := c.Resolve(pool.ID())
	if !ok {
		t.Fatal("the session does not resolve its pool")
	}
	if xfer.RegsOf(seg) != pool.Regs() {
		t.Fatal("the pool view does not carry the pool's registrations")
	}
	h, ok := seg.(xfer.RangeHolder)
	if !ok {
		t.Fatal("the pool view holds no ranges")
	}
	if h.HoldRange(0, 4096) {
		t.Fatal("the view held a range in a block the session does not own")
	}
	c.blocks.Add(0, 1<<20)
	if !h.HoldRange(0, 4096) || !c.blocks.Busy(0) {
		t.Fatal("a range of the session's block was not held")
	}
	h.DropRange(0, 4096)
	if c.blocks.Busy(0) {
		t.Fatal("the block is busy after its only hold dropped")
	}
}
