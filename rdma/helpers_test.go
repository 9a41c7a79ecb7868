//go:build linux && cgo

package rdma

// Helpers of the real-verbs tests (verbs_linux_test.go and the other
// _linux_test.go files); the transport's logic runs over rdmatest in
// fabric_test.go.

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// recorder is a Completer that checks every task ends exactly once.
type recorder struct {
	mu    sync.Mutex // guards the fields below
	ends  map[*xfer.Task]int
	n     map[*xfer.Task]uint64
	errs  map[*xfer.Task]error
	count int
	ch    chan struct{}
}

func newRecorder() *recorder {
	return &recorder{ends: map[*xfer.Task]int{}, n: map[*xfer.Task]uint64{}, errs: map[*xfer.Task]error{}, ch: make(chan struct{}, 1<<16)}
}

func (r *recorder) TaskDone(t *xfer.Task, n uint64, err error) {
	r.mu.Lock()
	r.ends[t]++
	r.n[t], r.errs[t] = n, err
	r.count++
	r.mu.Unlock()
	r.ch <- struct{}{}
}

// wait waits for k more ends.
func (r *recorder) wait(t *testing.T, k int) {
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

func (r *recorder) check(t *testing.T, tasks []*xfer.Task) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, tk := range tasks {
		if r.ends[tk] != 1 {
			t.Errorf("task %d ended %d times", i, r.ends[tk])
		}
	}
}

const (
	segLocal  xfer.SegmentID = 1
	segRemote xfer.SegmentID = 2
)

func tasksOf(r *recorder, reqs ...xfer.Request) []*xfer.Task {
	out := make([]*xfer.Task, len(reqs))
	for i, q := range reqs {
		out[i] = &xfer.Task{Req: q}
		out[i].SetCompleter(r)
	}
	return out
}

type chanCompleter chan struct{}

func (c chanCompleter) TaskDone(*xfer.Task, uint64, error) { c <- struct{}{} }

// noExports is a tcp.Exporter with nothing exported.
type noExports struct{}

func (noExports) Lookup(name string) (xfer.MemSegment, error) {
	return nil, fmt.Errorf("%q not exported", name)
}
func (noExports) Deliver(string, []byte) error { return errors.New("nothing exported") }
