//go:build !linux

package queue

import (
	"sync/atomic"
	"time"
)

// Queues need futexes on a shared mapping: Linux only. Elsewhere a client
// cannot open one (OpenQueue's mapping fails first with ErrNotSupported).

func futexWait(*atomic.Uint32, uint32, time.Duration) error { return ErrNotSupported }

func futexWake(*atomic.Uint32) {}

var napSleep = time.Sleep

func timerSlack() time.Duration { return 0 }
