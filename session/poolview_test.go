package session

import (
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
