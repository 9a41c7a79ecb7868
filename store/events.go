package store

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// events wakes goroutines waiting for the store's background work (Flush,
// tests): fire is called whenever an L2 operation ends or a retry is
// scheduled, and costs one atomic load when nobody waits.
type events struct {
	waiting atomic.Int32
	mu      sync.Mutex // guards ch
	ch      chan struct{}
}

func (ev *events) fire() {
	if ev.waiting.Load() == 0 {
		return
	}
	ev.mu.Lock()
	if ev.ch != nil {
		close(ev.ch)
		ev.ch = nil
	}
	ev.mu.Unlock()
}

// waitUntil waits until cond holds, re-checking it after every event, at
// most timeout. It reports whether cond held.
func (ev *events) waitUntil(cond func() bool, timeout time.Duration) bool {
	ev.waiting.Add(1)
	defer ev.waiting.Add(-1)
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		ev.mu.Lock()
		if ev.ch == nil {
			ev.ch = make(chan struct{})
		}
		ch := ev.ch
		ev.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-tm.C:
			return cond()
		}
	}
}

// Flush writes back every value that is in L1 only and waits until none is
// owed a writeback any more (each is on L2, or has become a tombstone), at
// most timeout (then an error matching xfer.ErrTimeout). Writebacks
// waiting for a retry delay wait for it.
func (s *Store) Flush(timeout time.Duration) error {
	if !s.enter() {
		return ErrClosed
	}
	defer s.exit()
	if s.l2 == nil {
		return nil
	}
	s.kick()
	if !s.ev.waitUntil(func() bool { return s.c.dirtyOwed.Load() == 0 }, timeout) {
		return fmt.Errorf("store: flush: %w: %d values still owed a writeback after %v", xfer.ErrTimeout, s.c.dirtyOwed.Load(), timeout)
	}
	return nil
}
