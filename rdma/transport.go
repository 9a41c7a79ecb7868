package rdma

// The Transport: its queue pairs and their send-queue bookkeeping, the
// regions it exposes to its peer, and Close.

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/xfer"
)

// Addr is how a port is addressed on the fabric.
type Addr struct {
	GID      GID
	GIDIndex int
	LID      uint16
	// MTU is the port's active MTU.
	MTU MTU
}

// Queue-pair states (queuePair.state).
const (
	qpIdle   = iota // created, never connected
	qpUp            // RTS: takes work
	qpDown          // in error; waiting for its posted work to drain
	qpBusy          // being (re)connected
	qpClosed        // transport closing
)

// slot is the send queue's record of one posted work request.
type slot struct {
	task  *xfer.Task
	err   error      // set when posting failed part-way through the task
	probe chan error // a connection probe's result goes here
	first bool
	last  bool
}

// queuePair is one RC queue pair with its send-queue bookkeeping.
type queuePair struct {
	idx  int
	v    QueuePair
	errs *completionErrors

	mu sync.Mutex // guards every field below
	// slots is a ring indexed by sequence number & mask; [tail, head) are
	// posted and not yet retired.
	slots      []slot
	mask       uint64
	head, tail uint64
	state      int
	curErr     error         // error of the task being retired (tasks retire in order)
	plan       []WorkRequest // scratch for planning one task
	local      ConnInfo
	remote     ConnInfo
}

// seqBits is how much of a wr_id is sequence number; the rest is the queue
// pair's index.
const seqBits = 48

// Transport is an xfer.Transport over a set of RC queue pairs to one peer,
// sharing one completion queue polled by one goroutine.
//
// Requests: a task's Local segment must carry LocalKeys in its RDMA slot
// and its Target RemoteKeys (KeysOf); the transport keeps no table of
// segments and reads both with one atomic load each. A task becomes one or more RDMA
// WRITE (OpWrite) or READ (OpRead) work requests, split at registration
// chunks and MaxMessage; the task ends when its last work request has
// completed. Cancel is a no-op: posted RDMA work cannot be taken back, and
// ends quickly or with the queue pair's error.
//
// When a work request fails, its queue pair is drained (the rest of its
// work flushes), every task on it fails with the ibv_wc_status name, and
// the queue pair is reconnected through the Peer in the background; the
// other queue pairs keep working meanwhile. A transport that only accepts
// (no Connect, so no Peer) is the passive end: its dialer re-establishes
// it through Accept. Between two daemons each side dials its own set for
// the work it submits and accepts the other's.
//
// Goroutines: the poller (owns completion handling) and the reconnector
// (owns recovery); both start in newTransport and are stopped by Close,
// which fails every queue pair, waits for their work to drain, then wakes
// and joins both.
type Transport struct {
	name string
	cfg  Config
	log  *slog.Logger
	cq   CompletionQueue
	qps  []*queuePair
	addr Addr
	// release frees what the verbs layer allocated for the transport, after
	// the queue pairs and the completion queue are destroyed.
	release func()

	// mu guards the fields below (configuration, not the hot path).
	mu      sync.Mutex
	peer    Peer
	exposed []RemoteRegion
	learned []RemoteRegion

	rr        atomic.Uint32
	closed    atomic.Bool
	room      chan struct{} // poked by the poller when send slots free up
	reconnect chan int      // queue pairs to bring back up
	stop      chan struct{} // closed by Close to stop the reconnector
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Poller-owned scratch, preallocated.
	wcs  []WorkCompletion
	done []doneTask
}

type doneTask struct {
	t   *xfer.Task
	n   uint64
	err error
}

var _ xfer.Transport = (*Transport)(nil)

// newTransport assembles a transport over queue pairs and a completion
// queue the verbs layer created, and starts its goroutines.
func newTransport(name string, cfg Config, log *slog.Logger, addr Addr, cq CompletionQueue, qps []QueuePair, release func()) *Transport {
	t := &Transport{
		name: name, cfg: cfg, log: log, addr: addr, cq: cq, release: release,
		room:      make(chan struct{}, 1),
		reconnect: make(chan int, len(qps)),
		stop:      make(chan struct{}),
		wcs:       make([]WorkCompletion, cfg.PollBatch),
		done:      make([]doneTask, 0, cfg.PollBatch*cfg.SendDepth),
	}
	for i, v := range qps {
		t.qps = append(t.qps, &queuePair{
			idx: i, v: v, errs: newCompletionErrors(i),
			slots: make([]slot, cfg.SendDepth), mask: uint64(cfg.SendDepth - 1),
			plan: make([]WorkRequest, 0, cfg.SendDepth),
		})
	}
	t.wg.Add(2)
	go t.pollLoop()
	go t.reconnectLoop()
	return t
}

// Name is "rdma".
func (t *Transport) Name() string { return t.name }

// Expose lists a local region in the connection data sent to the peer (as
// name), so that the peer can address it. Call it before Connect.
func (t *Transport) Expose(name uint64, r *Region) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.exposed = append(t.exposed, r.Remote(name))
}

// PeerRegions is what the peer exposed in its latest connection data.
func (t *Transport) PeerRegions() []RemoteRegion {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]RemoteRegion(nil), t.learned...)
}

// Cancel does nothing: posted RDMA work cannot be withdrawn; the task ends
// when its work completes or its queue pair fails.
func (t *Transport) Cancel(*xfer.Task) {}

// Close stops dispatch, fails every queue pair so its posted work flushes,
// waits for that (bounded by ConnectTimeout, after which what is left ends
// with xfer.ErrClosed), stops the poller and the reconnector and frees the
// queue pairs and the completion queue. It is safe to call more than once.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		for _, q := range t.qps {
			q.mu.Lock()
			q.state = qpClosed
			q.mu.Unlock()
			_ = q.v.Fail()
		}
		for _, q := range t.qps {
			t.drain(q, t.cfg.ConnectTimeout)
		}
		close(t.stop)
		t.cq.Wake()
		t.wg.Wait()
		var errs []error
		for _, q := range t.qps {
			errs = append(errs, q.v.Reset())
			t.forceRetire(q, fmt.Errorf("rdma: %w", xfer.ErrClosed))
			errs = append(errs, q.v.Destroy())
		}
		errs = append(errs, t.cq.Destroy())
		if t.release != nil {
			t.release()
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}
