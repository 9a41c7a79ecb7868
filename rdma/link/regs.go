package link

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/xfer"
)

// Registering a client buffer for RDMA pins and maps every page of it: a
// 4 GiB buffer took 17-28 s on Soft-RoCE. It never happens on the submit
// path. regQueue runs the registrations on a goroutine of its own, one
// buffer at a time, each buffer once however many requests want it:
//   - a request of an auto segment from an unregistered buffer goes to tcp
//     and asks for the registration (want); later ones move by RDMA;
//   - a request of a segment opened with transport rdma may not use tcp,
//     so the router hands it to the queue itself (an xfer.Transport): it
//     waits there for its buffer's registration, within its deadline, and
//     then goes where the router sends it now (the link, or the answer
//     that fails it UNAVAILABLE).
//
// A waiting task ends early when the engine cancels it (its deadline, or
// its client left), when the links' tick finds its deadline past, or
// when the links close; a buffer whose registration failed fails its
// waiters and is not tried again (its requests then fail UNAVAILABLE, or
// use tcp when their segment allows it).
//
// Ownership: Links creates the queue and starts run on a goroutine it
// counts in its WaitGroup; close stops it: refuse new work and fail the
// waiters (closed, under mu), then close(stop) and wait for run to return
// (after the registration in progress, which cannot be interrupted).
type regQueue struct {
	log *slog.Logger
	// register registers seg and reports whether it is registered
	// (Links.registerLocal); only run calls it.
	register func(seg xfer.Segment) bool
	// route is where a waiting task goes once its buffer's registration
	// ended (Links.routeRegistered).
	route func(t *xfer.Task) xfer.Transport

	wake chan struct{} // capacity 1: a job was queued
	stop chan struct{} // closed by close
	done chan struct{} // closed when run returns

	// mu guards the fields below.
	mu      sync.Mutex
	jobs    map[xfer.SegmentID]*regJob // queued or being registered
	queue   []*regJob                  // queued, oldest first
	waiting map[*xfer.Task]*regJob     // tasks waiting for a registration
	failed  map[xfer.SegmentID]struct{}
	closed  bool
}

// regJob is one buffer to register and the tasks waiting for it.
type regJob struct {
	seg     xfer.Segment
	waiters []*xfer.Task
}

// Bounds of the registration queue.
const (
	// maxRegWaiters bounds the tasks waiting for registrations; past it a
	// task fails at once (UNAVAILABLE).
	maxRegWaiters = 65536
	// maxRegJobs bounds the buffers queued for registration; a want past
	// it is dropped (a later request asks again).
	maxRegJobs = 1024
	// maxRegFailed bounds the buffers remembered as failed; past it the
	// memory is cleared and they may be tried once more.
	maxRegFailed = 4096
)

var _ xfer.Transport = (*regQueue)(nil)

func newRegQueue(log *slog.Logger, register func(xfer.Segment) bool, route func(*xfer.Task) xfer.Transport) *regQueue {
	return &regQueue{log: log, register: register, route: route,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		jobs: map[xfer.SegmentID]*regJob{}, waiting: map[*xfer.Task]*regJob{}, failed: map[xfer.SegmentID]struct{}{}}
}

// want queues seg's registration unless it is queued, failed before, or
// the queue is full or closed. It never blocks.
func (q *regQueue) want(seg xfer.Segment) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.jobLocked(seg)
}

// jobLocked returns seg's job, queueing a new one; nil when seg failed
// before or the queue cannot take it. q.mu is held.
func (q *regQueue) jobLocked(seg xfer.Segment) *regJob {
	id := seg.ID()
	if j := q.jobs[id]; j != nil {
		return j
	}
	if _, bad := q.failed[id]; bad || q.closed || len(q.jobs) >= maxRegJobs {
		return nil
	}
	j := &regJob{seg: seg}
	q.jobs[id] = j
	q.queue = append(q.queue, j)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return j
}

// hasFailed reports whether seg's registration failed before.
func (q *regQueue) hasFailed(id xfer.SegmentID) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, bad := q.failed[id]
	return bad
}

// Name implements xfer.Transport.
func (q *regQueue) Name() string { return "rdma" }

// Submit implements xfer.Transport: every task waits for its local
// buffer's registration (or fails at once: the buffer failed before, too
// many tasks wait). It never waits itself.
func (q *regQueue) Submit(tasks []*xfer.Task) (int, error) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, xfer.ErrClosed
	}
	var refused []*xfer.Task
	for _, t := range tasks {
		var j *regJob
		if len(q.waiting) < maxRegWaiters {
			j = q.jobLocked(t.Local)
		}
		if j == nil {
			refused = append(refused, t)
			continue
		}
		j.waiters = append(j.waiters, t)
		q.waiting[t] = j
	}
	q.mu.Unlock()
	for _, t := range refused {
		t.Done(0, errRDMAOnly(t, "its local segment cannot be registered for rdma now"))
	}
	return len(tasks), nil
}

// Cancel implements xfer.Transport: a task still waiting ends at once. One
// already handed on is its new transport's (whose Cancel the engine does
// not know; the rdma links' is a no-op anyway).
func (q *regQueue) Cancel(t *xfer.Task) {
	if q.drop(t) {
		t.Done(0, fmt.Errorf("%w: while its buffer was being registered for rdma", xfer.ErrCanceled))
	}
}

// drop takes t off its job's waiters and reports whether it was waiting.
func (q *regQueue) drop(t *xfer.Task) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.waiting[t]
	if j == nil {
		return false
	}
	delete(q.waiting, t)
	for i, w := range j.waiters {
		if w == t {
			j.waiters = append(j.waiters[:i], j.waiters[i+1:]...)
			break
		}
	}
	return true
}

// Close implements xfer.Transport; Links closes the queue itself.
func (q *regQueue) Close() error { return nil }

// expire ends the waiting tasks whose deadline passed (the links' tick;
// the engine's own deadline cancels them sooner).
func (q *regQueue) expire(now time.Time) {
	var late []*xfer.Task
	q.mu.Lock()
	for t := range q.waiting {
		if !t.Deadline.IsZero() && !now.Before(t.Deadline) {
			late = append(late, t)
		}
	}
	q.mu.Unlock()
	for _, t := range late {
		if q.drop(t) {
			t.Done(0, fmt.Errorf("%w: its buffer's rdma registration did not finish before the task's deadline", xfer.ErrTimeout))
		}
	}
}

// waiters is how many tasks wait for registrations.
func (q *regQueue) waiters() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

// run registers the queued buffers one at a time until close.
func (q *regQueue) run() {
	defer close(q.done)
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		for {
			q.mu.Lock()
			if q.closed || len(q.queue) == 0 {
				q.mu.Unlock()
				break
			}
			j := q.queue[0]
			q.queue[0] = nil
			q.queue = q.queue[1:]
			q.mu.Unlock()

			ok := q.register(j.seg)

			q.mu.Lock()
			id := j.seg.ID()
			delete(q.jobs, id)
			if !ok {
				if len(q.failed) >= maxRegFailed {
					clear(q.failed)
				}
				q.failed[id] = struct{}{}
			}
			waiters := j.waiters
			j.waiters = nil
			for _, t := range waiters {
				delete(q.waiting, t)
			}
			q.mu.Unlock()
			q.handOn(waiters)
		}
	}
}

// handOn sends the tasks whose registration ended where the router sends
// them now, grouped by transport in order; what a transport does not take
// ends with its error.
func (q *regQueue) handOn(ts []*xfer.Task) {
	for len(ts) > 0 {
		tr := q.route(ts[0])
		k := 1
		for k < len(ts) && q.route(ts[k]) == tr {
			k++
		}
		n, err := tr.Submit(ts[:k])
		if n < 0 || n > k {
			n = 0
		}
		if n < k && err == nil {
			err = fmt.Errorf("%w: %s took %d of %d tasks", peer.ErrUnavailable, tr.Name(), n, k)
		}
		for _, t := range ts[n:k] {
			t.Done(0, err)
		}
		ts = ts[k:]
	}
}

// close refuses new work, fails the waiting tasks with xfer.ErrClosed and
// waits for run (the registration in progress ends first).
func (q *regQueue) close() {
	q.mu.Lock()
	q.closed = true
	var out []*xfer.Task
	for t := range q.waiting {
		out = append(out, t)
	}
	clear(q.waiting)
	for _, j := range q.jobs {
		j.waiters = nil
	}
	q.queue = nil
	q.mu.Unlock()
	for _, t := range out {
		t.Done(0, fmt.Errorf("%w: the rdma plane closed while the task waited for its buffer's registration", xfer.ErrClosed))
	}
	close(q.stop)
	<-q.done
}
