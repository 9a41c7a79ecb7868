package client

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// TestConcurrentClientsRelease runs clients that take and drop buffers,
// blocks and batches at random, some sharing a Client across goroutines,
// and close mid-way; the daemon must end holding nothing.
func TestConcurrentClientsRelease(t *testing.T) {
	d := startDaemon(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			for round := 0; round < 3; round++ {
				c, err := Dial(d.sock, Options{})
				if err != nil {
					errs <- err
					return
				}
				var bufs []*Buffer
				var offs []uint64
				var batches []xfer.BatchID
				res := make([]error, 1)
				for op := 0; op < 60; op++ {
					switch rng.IntN(6) {
					case 0:
						if b, err := c.RegisterBuffer(64 << 10); err == nil {
							bufs = append(bufs, b)
						}
					case 1:
						offs, _ = c.AllocBlocks(offs, 1+rng.IntN(4), 4096<<rng.IntN(3))
					case 2:
						if b, err := c.AllocBatch(8); err == nil {
							batches = append(batches, b)
						}
					case 3:
						if len(bufs) > 0 && len(offs) > 0 && len(batches) > 0 {
							r := []xfer.Request{{Op: xfer.OpWrite, Local: bufs[rng.IntN(len(bufs))].ID, Target: poolID,
								TargetOffset: offs[rng.IntN(len(offs))], Length: 4096}}
							c.Submit(batches[rng.IntN(len(batches))], r, res)
						}
					case 4:
						if len(offs) > 0 {
							i := rng.IntN(len(offs))
							c.FreeBlocks(offs[i:i+1], res)
							offs = append(offs[:i], offs[i+1:]...)
						}
					case 5:
						if len(bufs) > 0 && len(offs) > 0 {
							r := []xfer.Request{{Op: xfer.OpRead, Local: bufs[0].ID, Target: poolID, TargetOffset: offs[0], Length: 4096}}
							if _, err := c.Transfer(r, time.Second, res); err != nil {
								errs <- err
							}
						}
					}
				}
				if err := c.Close(); err != nil {
					errs <- err
				}
			}
		}(uint64(w))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d.waitReleased(t)
}
