package xfer_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// chaosTr is a transport that, per Submit call, picks at random: how many
// tasks it takes, whether it ends them inside Submit or later (with success
// or an error), and now and then breaks the count contract in one of the
// ways the engine must survive. Its own lock guards everything.
type chaosTr struct {
	mu     sync.Mutex
	rng    *rand.Rand
	held   []*xfer.Task
	closed bool
}

func (c *chaosTr) Name() string { return "chaos" }

func (c *chaosTr) Submit(ts []*xfer.Task) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, xfer.ErrClosed
	}
	k := c.rng.IntN(len(ts) + 1)
	mode := c.rng.IntN(20)
	if mode == 2 {
		k = len(ts) // took them all, and then claims one more
	}
	inline := c.rng.IntN(2) == 0
	if !inline {
		c.held = append(c.held, ts[:k]...)
	}
	c.mu.Unlock()
	if inline {
		for _, t := range ts[:k] {
			if t.Req.Length%3 == 0 {
				t.Done(0, xfertest.ErrInjected)
			} else {
				t.Done(t.Req.Length, nil)
			}
			if mode == 0 {
				t.Done(1, nil) // second Done
			}
		}
	}
	switch mode {
	case 1:
		return -1, nil
	case 2:
		return len(ts) + 1, nil
	case 3:
		if k < len(ts) {
			return k, nil // short count, no error
		}
	case 4:
		if k < len(ts) {
			// Done for a task it did not take, then an honest count.
			ts[k].Done(0, nil)
			return k, xfertest.ErrInjected
		}
	}
	if k < len(ts) {
		return k, xfertest.ErrInjected
	}
	return k, nil
}

func (c *chaosTr) Cancel(t *xfer.Task) {
	c.mu.Lock()
	found := false
	if c.rng.IntN(2) == 0 {
		for i, h := range c.held {
			if h == t {
				c.held = append(c.held[:i], c.held[i+1:]...)
				found = true
				break
			}
		}
	}
	c.mu.Unlock()
	if found {
		t.Done(0, xfer.ErrCanceled)
	}
}

// endSome ends a random part of the held tasks.
func (c *chaosTr) endSome() {
	c.mu.Lock()
	var end []*xfer.Task
	keep := c.held[:0]
	for _, t := range c.held {
		if c.rng.IntN(2) == 0 {
			end = append(end, t)
		} else {
			keep = append(keep, t)
		}
	}
	c.held = keep
	c.mu.Unlock()
	for _, t := range end {
		t.Done(t.Req.Length, nil)
	}
}

func (c *chaosTr) Close() error {
	c.mu.Lock()
	c.closed = true
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for _, t := range held {
		t.Done(0, xfer.ErrClosed)
	}
	return nil
}

// TestChaos drives the engine with random clients over a transport that
// misbehaves at random, then checks the invariants: every ref comes back,
// every task ends in exactly one terminal state, the counters agree, and
// Close returns promptly.
func TestChaos(t *testing.T) {
	rounds := 6
	if testing.Short() {
		rounds = 2
	}
	violations := uint64(0)
	for seed := uint64(1); seed <= uint64(rounds); seed++ {
		tr := &chaosTr{rng: rand.New(rand.NewPCG(seed, 99))}
		f := newFixture(t, xfer.Config{MaxBatches: 6, DefaultTimeout: 15 * time.Millisecond}, xfertest.RouteAll(tr))
		stop := make(chan struct{})
		var ender sync.WaitGroup
		ender.Add(1)
		go func() {
			defer ender.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Microsecond):
					tr.endSome()
				}
			}
		}()
		var clients sync.WaitGroup
		for c := 0; c < 4; c++ {
			clients.Add(1)
			go func() {
				defer clients.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(c)))
				res := make([]error, 8)
				for i := 0; i < 40; i++ {
					id, err := f.e.AllocateBatch(32)
					if errors.Is(err, xfer.ErrClosed) {
						return
					}
					if err != nil {
						time.Sleep(200 * time.Microsecond)
						continue
					}
					total := 0
					for j := rng.IntN(4); j >= 0; j-- {
						n := 1 + rng.IntN(8)
						reqs := f.reqs(n)
						for k := range reqs {
							reqs[k].Length = uint64(1 + rng.IntN(64))
						}
						opts := f.opts
						if rng.IntN(3) == 0 {
							opts.Deadline = time.Now().Add(time.Duration(1+rng.IntN(5)) * time.Millisecond)
						}
						if err := f.e.Submit(id, reqs, opts, res[:n]); err == nil || err == xfer.ErrTransport {
							total += n
						} else if !errors.Is(err, xfer.ErrClosed) && !errors.Is(err, xfer.ErrTimeout) {
							t.Errorf("Submit: %v", err)
						}
					}
					if rng.IntN(4) == 0 {
						f.e.Abandon(id)
						continue
					}
					sum, err := f.e.Wait(id, time.Now().Add(5*time.Second))
					if err != nil {
						t.Errorf("Wait: %v", err)
						f.e.Abandon(id)
						continue
					}
					if sum.Total != total || sum.Completed+sum.Failed+sum.Timeout+sum.Canceled != total {
						t.Errorf("summary %+v, %d submitted", sum, total)
					}
					if err := f.e.Free(id); err != nil {
						t.Errorf("Free: %v", err)
					}
				}
			}()
		}
		// Every other round closes the engine while the clients run.
		var closeTook time.Duration
		if seed%2 == 0 {
			time.Sleep(time.Duration(seed) * time.Millisecond)
			start := time.Now()
			f.e.Close()
			closeTook = time.Since(start)
		}
		clients.Wait()
		close(stop)
		if closeTook > time.Second {
			t.Fatalf("Close took %v", closeTook)
		}
		ender.Wait()
		start := time.Now()
		f.e.Close()
		if el := time.Since(start); el > time.Second {
			t.Fatalf("Close took %v", el)
		}
		tr.Close()
		xfertest.CheckRefs(t, f.a, f.b)
		st := f.e.Stats()
		if st.BatchesLive != 0 || st.BatchesRetiring != 0 || st.Waiting != 0 || st.Pending != 0 {
			t.Fatalf("seed %d: stats %+v", seed, st)
		}
		violations += st.Violations
	}
	if violations == 0 {
		t.Fatal("no contract violation exercised")
	}
}
