//go:build !linux

package reactor

import (
	"sync/atomic"
	"time"
)

// Elsewhere there are no queues to serve (they need Linux), so an
// own-thread worker only waits for its stop, looking every threadPoll.

type waitv struct{}

func waitvOf(*atomic.Uint32, uint32) waitv { return waitv{} }

func waitAny(ws []waitv, timeout time.Duration) { time.Sleep(threadPoll) }

func futexWake(*atomic.Uint32) {}
