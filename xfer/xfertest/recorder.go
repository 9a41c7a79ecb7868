package xfertest

import (
	"slices"
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
	log   []End // every end, in the order they came
	next  int   // log[:next] were returned by Next or Wait
	ch    chan struct{}
}

var _ xfer.Completer = (*Recorder)(nil)

// End is one end of a task: Done(N, Err) of Task.
type End struct {
	Task *xfer.Task
	N    uint64
	Err  error
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
	r.log = append(r.log, End{t, n, err})
	r.mu.Unlock()
	r.ch <- struct{}{}
}

// Wait waits for k more ends, at most 10 s.
func (r *Recorder) Wait(t testing.TB, k int) {
	t.Helper()
	r.Next(t, k, 10*time.Second)
}

// Next waits, at most d, for the next k ends (those after the ones Next
// and Wait returned before) and returns them in the order they came.
func (r *Recorder) Next(t testing.TB, k int, d time.Duration) []End {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for i := range k {
		select {
		case <-r.ch:
		case <-timer.C:
			t.Fatalf("only %d of %d tasks ended within %v", i, k, d)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.log[r.next : r.next+k])
	r.next += k
	return out
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
