package client

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// QueueOption sets a property of a queue at OpenQueue.
type QueueOption func(*queueConfig)

type queueConfig struct {
	cqEntries, dataSize uint32
	timeout             time.Duration
}

// WithCompletionEntries sizes the completion ring (at least twice the
// submission ring, which is also the default).
func WithCompletionEntries(n int) QueueOption {
	return func(c *queueConfig) { c.cqEntries = uint32(min(max(n, 0), 1<<30)) }
}

// WithDataSize sizes the queue's data area, where notification payloads
// travel (default 256 KiB).
func WithDataSize(n int) QueueOption {
	return func(c *queueConfig) { c.dataSize = uint32(min(max(n, 0), 1<<30)) }
}

// WithRequestTimeout sets the deadline of every request submitted on the
// queue, counted from when the daemon takes it (default: the daemon's,
// 30 s). At most about 71 minutes.
func WithRequestTimeout(d time.Duration) QueueOption {
	return func(c *queueConfig) { c.timeout = d }
}

// Completion is the end of one request submitted on a Queue.
type Completion struct {
	UserData uint64
	N        uint64     // bytes moved
	Code     wire.Code  // OK, or why the request failed (Err is ErrProtocol for a code the protocol does not name)
	State    xfer.State // the task's terminal state; 0 when the daemon refused it before it ran
}

// Err is nil for a completed request, else the sentinel of its code
// (ErrDeadlineExceeded, ErrPermissionDenied, ...). It allocates nothing.
func (c Completion) Err() error {
	if c.Code == tcproto.CodeOK {
		return nil
	}
	return codeErr(c.Code)
}

// Queue is a shared-memory queue pair to the daemon: the data path for
// many requests in flight on one connection. Submit never blocks and makes
// no system call while the daemon is busy; Reap waits for completions by
// spinning briefly, then sleeping on a futex. Submit and Reap may be
// called from two goroutines at once (one submitting, one reaping); calls
// of one kind are serialized.
type Queue struct {
	c       *Client
	id      uint64
	ring    *queue.ClientRing
	timeout uint32 // microseconds, 0: the daemon's default

	// sqMu serializes the submission side and guards sqe; cqMu the
	// completion side and cqes.
	sqMu sync.Mutex
	sqe  queue.SQE
	cqMu sync.Mutex
	cqes []queue.CQE

	closeOnce sync.Once
	closeErr  error
	closed    bool // guarded by both sqMu and cqMu: the ring is unmapped
}

// OpenQueue opens a queue of entries submission slots (rounded up to a
// power of two; the completion ring holds twice as many unless set). The
// queue is released by Close, or with the client.
func (c *Client) OpenQueue(entries int, opts ...QueueOption) (*Queue, error) {
	var cfg queueConfig
	for _, o := range opts {
		o(&cfg)
	}
	if entries <= 0 || entries > queue.MaxSQEntries {
		return nil, fmt.Errorf("%w: queue of %d entries (want 1..%d)", ErrInvalidArgument, entries, queue.MaxSQEntries)
	}
	if cfg.timeout < 0 || cfg.timeout/time.Microsecond > 1<<32-1 {
		return nil, fmt.Errorf("%w: request timeout %v", ErrInvalidArgument, cfg.timeout)
	}
	entries = max(entries, queue.MinEntries)
	if !sharedMemory {
		return nil, fmt.Errorf("%w: queues need Linux", ErrNotSupported)
	}
	c.mu.Lock()
	*wire.SetRequest[wire.OpenQueueRequest](c.start(nil)) = wire.OpenQueueRequest{SQEntries: uint32(entries),
		CQEntries: cfg.cqEntries, DataSize: cfg.dataSize}
	fd := noFD
	r, err := call[wire.OpenQueueResponse](c, noFD, &fd)
	bell := c.fd2 // the eventfd doorbell, when the daemon's workers wait on those
	c.fd2 = noFD
	var resp wire.OpenQueueResponse
	if err == nil {
		resp = *r
		if fd < 0 {
			err = c.fail(fmt.Errorf("%w: OpenQueue came without the queue's fd", ErrProtocol))
		}
	}
	c.mu.Unlock()
	if err != nil {
		closeFD(fd) // a refused answer that came with one anyway
		closeFD(bell)
		return nil, err
	}
	ring, err := queue.Map(fd, resp.Size)
	unix.Close(fd)
	if err == nil {
		if g := ring.Geometry(); ring.ID() != resp.Queue || g.SQEntries != resp.SQEntries || g.CQEntries != resp.CQEntries {
			ring.Unmap()
			err = fmt.Errorf("%w: queue %d's mapping does not match OpenQueue's answer", ErrProtocol, resp.Queue)
		}
	}
	if err == nil {
		err = takeDoorbell(ring, bell, resp.Queue)
		bell = noFD
	}
	closeFD(bell)
	if err != nil {
		// Tell the daemon; the queue goes with the connection otherwise.
		c.mu.Lock()
		wire.SetRequest[wire.CloseQueueRequest](c.start(nil)).Queue = resp.Queue
		call[wire.CloseQueueResponse](c, noFD, nil) //nolint:errcheck // the mapping error is the one to report
		c.mu.Unlock()
		return nil, fmt.Errorf("tensorcast: mapping queue %d: %w", resp.Queue, err)
	}
	q := &Queue{c: c, id: resp.Queue, ring: ring, timeout: uint32(cfg.timeout / time.Microsecond),
		cqes: make([]queue.CQE, resp.CQEntries)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		q.release()
		return nil, ErrClosed
	}
	c.queues[q] = struct{}{}
	return q, nil
}

// takeDoorbell gives ring the eventfd doorbell bell (noFD: none came)
// when its header asks for one; it fails when the header and the fds that
// came disagree. It owns bell, and unmaps ring on failure.
func takeDoorbell(ring *queue.ClientRing, bell int, id uint64) error {
	want := ring.Doorbell() == queue.DoorbellEventfd
	var err error
	switch {
	case want && bell == noFD:
		err = fmt.Errorf("%w: queue %d asks for an eventfd doorbell and none came with it", ErrProtocol, id)
	case !want && bell != noFD:
		err = fmt.Errorf("%w: queue %d came with a second fd its header does not ask for", ErrProtocol, id)
	case want:
		if err = ring.SetDoorbellFD(bell); err == nil {
			return nil
		}
	default:
		return nil
	}
	closeFD(bell)
	ring.Unmap()
	return err
}

// ID is the queue's id.
func (q *Queue) ID() uint64 { return q.id }

// Entries is the submission ring's size: the most requests submitted and
// not yet taken by the daemon.
func (q *Queue) Entries() int { return int(q.ring.Geometry().SQEntries) }

// Submit queues reqs[i] with userData[i] and returns how many it queued, in
// order: fewer than len(reqs) when the submission ring is full (reap and
// submit the rest). Each queued request gets exactly one Completion. It
// fails with ErrClosed once the queue or the daemon closed it.
func (q *Queue) Submit(reqs []xfer.Request, userData []uint64) (int, error) {
	return q.SubmitNotify(reqs, nil, userData)
}

// SubmitNotify is Submit with notify[i] (nil: none) carried by the WRITE
// reqs[i] to a peer's subscribed client; its Completion comes only after
// the peer acknowledged it. notify is empty or positional with reqs.
func (q *Queue) SubmitNotify(reqs []xfer.Request, notify [][]byte, userData []uint64) (int, error) {
	if len(userData) != len(reqs) || len(notify) != 0 && len(notify) != len(reqs) {
		return 0, fmt.Errorf("%w: %d requests, %d user data, %d notifications", ErrInvalidArgument, len(reqs), len(userData), len(notify))
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("%w: queue %d closed", ErrClosed, q.id)
	}
	if err := q.ringErr(); err != nil {
		return 0, err
	}
	n := 0
	for i := range reqs {
		r := &reqs[i]
		q.sqe = queue.SQE{Op: uint8(r.Op), TimeoutUS: q.timeout, UserData: userData[i], Local: uint64(r.Local),
			LocalOff: r.LocalOffset, Target: uint64(r.Target), TargetOff: r.TargetOffset, Length: r.Length}
		var p []byte
		if len(notify) > 0 {
			if p = notify[i]; len(p) > wire.MaxNotify {
				q.ring.Submit()
				return n, fmt.Errorf("%w: notification of %d bytes (max %d)", ErrInvalidArgument, len(p), wire.MaxNotify)
			}
		}
		ok, err := q.ring.Stage(&q.sqe, p)
		if err != nil {
			if n == 0 && !errors.Is(err, queue.ErrDataFull) {
				return 0, err
			}
			break // the data area frees as the daemon takes what is staged
		}
		if !ok {
			break
		}
		n++
	}
	q.ring.Submit()
	return n, nil
}

// Nop queues a request that moves nothing and completes at once: a round
// trip through the queue itself. It reports false when the ring is full.
func (q *Queue) Nop(userData uint64) (bool, error) {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	if q.closed {
		return false, fmt.Errorf("%w: queue %d closed", ErrClosed, q.id)
	}
	if err := q.ringErr(); err != nil {
		return false, err
	}
	q.sqe = queue.SQE{Op: queue.OpNop, UserData: userData}
	ok, err := q.ring.Stage(&q.sqe, nil)
	q.ring.Submit()
	return ok, err
}

// Reap fills out with completions and returns how many: it waits until at
// least min are ready (0: it does not wait), or timeout passes (negative:
// no limit), and returns what is ready then, with ErrDeadlineExceeded if
// fewer than min. Once the queue is closed it returns the completions still
// ready, then ErrClosed.
func (q *Queue) Reap(out []Completion, atLeast int, timeout time.Duration) (int, error) {
	q.cqMu.Lock()
	defer q.cqMu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("%w: queue %d closed", ErrClosed, q.id)
	}
	atLeast = max(0, atLeast)
	if atLeast > len(out) {
		return 0, fmt.Errorf("%w: waiting for %d completions with room for %d", ErrInvalidArgument, atLeast, len(out))
	}
	var werr error
	if q.ring.Ready() < atLeast {
		werr = q.wait(atLeast, timeout)
	}
	n := q.ring.Reap(q.cqes[:min(len(out), len(q.cqes))])
	for i, e := range q.cqes[:n] {
		out[i] = Completion{UserData: e.UserData, N: e.Result, Code: completionCode(e.Code)}
		var ok bool
		if out[i].State, ok = completionState(uint32(e.State)); !ok {
			out[i].Code = 0xff // ErrProtocol
		}
	}
	switch {
	case werr == nil && n >= atLeast:
		return n, nil
	case errors.Is(werr, queue.ErrTimeout), werr == nil:
		return n, fmt.Errorf("%w: %d of %d completions within %v", ErrDeadlineExceeded, n, atLeast, timeout)
	case errors.Is(werr, ErrClosed):
		return n, werr
	}
	if err := q.ringErr(); err != nil {
		return n, err
	}
	return n, werr
}

// waitSlice bounds one sleep of Reap, so that a daemon that died (and so
// can no longer wake the queue) is noticed.
const waitSlice = 500 * time.Millisecond

// wait waits for n completions within timeout (negative: no limit), in
// slices; between slices it checks that the daemon's connection is still
// up.
func (q *Queue) wait(n int, timeout time.Duration) error {
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		step := waitSlice
		if !deadline.IsZero() {
			step = min(step, time.Until(deadline))
			if step <= 0 {
				return queue.ErrTimeout
			}
		}
		err := q.ring.Wait(n, step)
		if !errors.Is(err, queue.ErrTimeout) {
			return err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return err
		}
		if q.c.peerGone() {
			return fmt.Errorf("%w: the daemon's connection is gone", ErrClosed)
		}
	}
}

// ringErr is the error a closed or broken queue answers with.
func (q *Queue) ringErr() error {
	switch err := q.ring.Err(); {
	case errors.Is(err, queue.ErrBroken):
		return fmt.Errorf("%w: queue %d was broken by an invalid index", ErrClosed, q.id)
	case err != nil:
		return fmt.Errorf("%w: queue %d closed", ErrClosed, q.id)
	}
	return nil
}

// Close closes the queue: the daemon ends what is in flight (Canceled) and
// the mapping is released; completions not yet reaped are lost. A Reap
// waiting on another goroutine returns ErrClosed.
func (q *Queue) Close() error {
	q.closeOnce.Do(func() {
		q.c.mu.Lock()
		delete(q.c.queues, q)
		var err error
		if !q.c.closed {
			wire.SetRequest[wire.CloseQueueRequest](q.c.start(nil)).Queue = q.id
			_, err = call[wire.CloseQueueResponse](q.c, noFD, nil)
		}
		q.c.mu.Unlock()
		q.closeErr = errors.Join(err, q.release())
	})
	return q.closeErr
}

// release stops both sides of q here and unmaps it. A Reap sleeping on
// the completion word is woken through the shared word itself.
func (q *Queue) release() error {
	q.ring.Interrupt()
	q.sqMu.Lock()
	q.cqMu.Lock()
	defer q.cqMu.Unlock()
	defer q.sqMu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	return q.ring.Unmap()
}
