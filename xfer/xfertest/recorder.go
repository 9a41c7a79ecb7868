package xfertest

import (
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Recorder is a Completer that records how each task ended and checks that
// every task ends exactly once.
type Recorder struct {
	mu    sync.Mutex // guards the fields below
	ends  map[*xfer.Task]int
	n     map[*xfer.Task]uint64
	errs  map[*xfer.Task]error
	count int
	ch    chan struct{}
}

// NewRecorder returns an empty Recorder (up to 65,536 ends not yet waited
// for).
func NewRecorder() *Recorder {
	return &Recorder{ends: map[*xfer.Task]int{}, n: map[*xfer.Task]uint64{}, errs: map[*xfer.Task]error{},
		ch: make(chan struct{}, 1<<16)}
}

// TaskDone implements xfer.Completer.
func (r *Recorder) TaskDone(t *xfer.Task, n uint64, err error) {
	r.mu.Lock()
	r.ends[t]++
	r.n[t], r.errs[t] = n, err
	r.count++
	r.mu.Unlock()
	r.ch <- struct{}{}
}

// Wait waits for k more ends, at most 10 s.
func (r *Recorder) Wait(t testing.TB, k int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for range k {
		select {
		case <-r.ch:
		case <-timeout:
			t.Fatalf("timed out waiting for task ends")
		}
	}
}

// Result is how tk ended.
func (r *Recorder) Result(tk *xfer.Task) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[tk], r.errs[tk]
}

// Err is the error tk ended with.
func (r *Recorder) Err(tk *xfer.Task) error {
	_, err := r.Result(tk)
	return err
}

// N is how many bytes tk ended with.
func (r *Recorder) N(tk *xfer.Task) uint64 {
	n, _ := r.Result(tk)
	return n
}

// Ends is how many times tk ended.
func (r *Recorder) Ends(tk *xfer.Task) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ends[tk]
}

// Count is how many ends were recorded.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// Check fails t for each of tasks that did not end exactly once.
func (r *Recorder) Check(t testing.TB, tasks []*xfer.Task) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, tk := range tasks {
		if r.ends[tk] != 1 {
			t.Errorf("task %d ended %d times", i, r.ends[tk])
		}
	}
}
