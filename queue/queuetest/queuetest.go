// Package queuetest drives the client side of a queue in tests of the
// daemon side: the queue package's own, and the reactors'.
package queuetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/tensorcast/tensorcast/queue"
)

// RoundTrips has c submit total no-ops (Length = user data % 977, which a
// test's daemon side echoes as the result) in random batches of up to
// maxBatch, and wait for random counts of them with random pauses, so
// that every sleep and wake path of both sides runs. It checks that each
// completes exactly once with its result. A lost wake-up shows as a Wait
// that runs out of its (generous) time.
func RoundTrips(c *queue.ClientRing, seed uint64, total, maxBatch int) error {
	rng := rand.New(rand.NewPCG(seed, 4))
	seen := make([]bool, total)
	var cqes [256]queue.CQE
	next, done, inflight := 0, 0, 0
	for done < total {
		for k := rng.IntN(maxBatch) + 1; k > 0 && next < total; k-- {
			ok, err := c.Stage(&queue.SQE{Op: queue.OpNop, UserData: uint64(next), Length: uint64(next % 977)}, nil)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			next++
			inflight++
		}
		c.Submit()
		if rng.IntN(16) == 0 {
			runtime.Gosched()
		}
		min := 1 + rng.IntN(inflight)
		if err := c.Wait(min, 20*time.Second); err != nil {
			return fmt.Errorf("wait for %d of %d in flight after %d done (lost wake-up?): %w", min, inflight, done, err)
		}
		n := c.Reap(cqes[:])
		for _, e := range cqes[:n] {
			if e.UserData >= uint64(total) || seen[e.UserData] || e.Result != e.UserData%977 {
				return errors.New("a bad or repeated completion")
			}
			seen[e.UserData] = true
		}
		done += n
		inflight -= n
	}
	return nil
}
