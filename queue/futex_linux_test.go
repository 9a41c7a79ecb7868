package queue

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFutexWakeSleeper measures what a futex wake costs its waker
// when the woken thread sleeps (the daemon's worker waking a client that
// sleeps for completions), beside the same call with nobody asleep. The
// waker first works for 100 µs, as a worker between two wake-ups does, so
// that the sleeper's CPU has gone idle. On a two-CPU virtual host the
// first is 9-10 µs where the idle vCPU halts at once, about 2 µs where it
// polls before it halts (guest_halt_poll_ns); the second 0.2-0.4 µs (see
// tail.nap).
//
//	go test ./queue -run '^$' -bench FutexWake -benchtime 5000x
func BenchmarkFutexWakeSleeper(b *testing.B) {
	for _, c := range []struct {
		name   string
		asleep bool
	}{{"asleep", true}, {"nobody", false}} {
		asleep := c.asleep
		b.Run(c.name, func(b *testing.B) {
			var word, seen atomic.Uint32
			done := make(chan struct{})
			if asleep {
				go func() {
					defer close(done)
					runtime.LockOSThread()
					for v := uint32(0); ; {
						for word.Load() == v {
							futexWait(&word, v, -1) //nolint:errcheck
						}
						v = word.Load()
						seen.Store(v)
						if v == ^uint32(0) {
							return
						}
					}
				}()
			} else {
				close(done)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var woke time.Duration
			b.ResetTimer()
			for i := 1; i <= b.N; i++ {
				for start := time.Now(); time.Since(start) < 100*time.Microsecond; {
				}
				word.Store(uint32(i))
				t0 := time.Now()
				futexWake(&word)
				woke += time.Since(t0)
				for asleep && seen.Load() != uint32(i) {
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(woke.Nanoseconds())/float64(b.N), "wake-ns/op")
			word.Store(^uint32(0))
			futexWake(&word)
			<-done
		})
	}
}
