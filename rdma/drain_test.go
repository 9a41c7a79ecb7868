package rdma

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestDrainEndsWithTheLastRetirement: a drain (a reconnect's, Close's)
// waits for what its queue pair has posted, and the retirement of the
// last of it ends the wait; with work left it ends at its deadline. It
// runs in a synctest bubble, where time moves only while every goroutine
// waits: a drain that looked again after a pause, rather than being woken,
// would still be in that pause when the last completion is retired, and
// would not have returned at the moment the test looks.
func TestDrainEndsWithTheLastRetirement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &Transport{reconnect: make(chan int, 1)}
		q := &queuePair{t: tr, slots: make([]slot, 4), mask: 3, state: qpBusy}
		post := func() uint64 {
			seq := q.head
			q.slots[seq&q.mask] = slot{probe: make(chan error, 1), first: true, last: true}
			q.head++
			return seq
		}
		retire := func(seq uint64) {
			wc := NewWorkCompletion(uint64(q.idx)<<seqBits|seq, WCSuccess, 0)
			q.mu.Lock()
			tr.retireLocked(q, &wc, nil)
			q.mu.Unlock()
		}
		drain := func(d time.Duration) <-chan bool {
			res := make(chan bool, 1)
			deadline := time.Now().Add(d)
			go func() { res <- tr.drain(q, deadline) }()
			return res
		}
		returned := func(res <-chan bool) (bool, bool) {
			synctest.Wait() // the drain waits, durably, or it returned
			select {
			case ok := <-res:
				return ok, true
			default:
				return false, false
			}
		}

		start := time.Now()
		first, second := post(), post()
		res := drain(time.Minute)
		if _, done := returned(res); done {
			t.Fatal("drain returned with two work requests posted")
		}
		retire(first)
		if _, done := returned(res); done {
			t.Fatal("drain returned with one work request still posted")
		}
		retire(second)
		ok, done := returned(res)
		if !done {
			t.Fatal("drain still waits once the last posted work request retired")
		}
		if !ok || time.Since(start) != 0 {
			t.Fatalf("drain reported %v after %v, want true at once", ok, time.Since(start))
		}

		// Nothing retires: the deadline ends the drain, then forceRetire
		// (the queue pair reset) empties it and a drain returns at once.
		post()
		start = time.Now()
		if ok := <-drain(time.Second); ok || time.Since(start) != time.Second {
			t.Fatalf("drain of work that never retires reported %v after %v, want false after 1s", ok, time.Since(start))
		}
		res = drain(time.Minute)
		if _, done := returned(res); done {
			t.Fatal("drain returned with a work request posted")
		}
		tr.forceRetire(q, errors.New("reset"))
		if ok, done := returned(res); !done || !ok {
			t.Fatalf("drain after forceRetire: returned %v, reported %v; want true at once", done, ok)
		}
	})
}
