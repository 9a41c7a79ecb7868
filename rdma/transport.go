package rdma

// The Transport: its queue pairs and their send-queue bookkeeping, the
// regions it exposes to its peer, and Close.

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
	t    *Transport
	v    QueuePair
	cq   CompletionQueue // q's own: its send completions, and nothing else
	chfd int             // cq's channel (CompletionQueue.Channel), -1: none
	errs *completionErrors

	pollErrs atomic.Uint32 // ibv_poll_cq failures (the first is logged)

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
	// owner reaps cq: a Home's id (the reactor worker that posted q's
	// work), or noHome for the transport's goroutine for q. It changes
	// only while q has nothing posted (postTo), or when the transport
	// takes q back (adopt).
	owner uint32
	// armedFor: an owning Home armed cq for its sleep and no completion
	// was reaped since.
	armedFor  bool
	destroyed bool
	// idle, made by a drain that finds work posted, is closed (and
	// cleared) by whatever retires the last of it (retireLocked,
	// forceRetire): the drain waits on it.
	idle chan struct{}
}

// seqBits is how much of a wr_id is sequence number; the rest is the queue
// pair's index.
const seqBits = 48

// Transport is an xfer.Transport over a set of RC queue pairs to one peer,
// each with its own completion queue, reaped by whoever posted its work
// (see the package doc, "Who reaps").
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
// Goroutines: one per queue pair, which reaps its completion queue when no
// reactor owns it, wakes the owner on a completion event when the owner
// cannot poll the channel on its ring, and otherwise only waits to be
// woken (the owner's worker watches the channel itself), and
// the reconnector (owns recovery); all start in newTransport and are
// stopped by Close, which takes every queue pair back from the reactors,
// fails it, waits for its work to drain, then wakes and joins them.
type Transport struct {
	name  string
	cfg   Config
	log   *slog.Logger
	homes *Homes // the reactors that may post and reap (Config.Homes)
	qps   []*queuePair
	addr  Addr
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
}

type doneTask struct {
	t   *xfer.Task
	n   uint64
	err error
}

var _ xfer.Transport = (*Transport)(nil)

// newTransport assembles a transport over queue pairs and their completion
// queues (cqs[i] is qps[i]'s) the verbs layer created, and starts its
// goroutines.
func newTransport(name string, cfg Config, log *slog.Logger, addr Addr, cqs []CompletionQueue, qps []QueuePair, release func()) *Transport {
	t := &Transport{
		name: name, cfg: cfg, log: log, addr: addr, release: release, homes: cfg.Homes,
		room:      make(chan struct{}, 1),
		reconnect: make(chan int, len(qps)),
		stop:      make(chan struct{}),
	}
	for i, v := range qps {
		t.qps = append(t.qps, &queuePair{
			idx: i, t: t, v: v, cq: cqs[i], chfd: cqs[i].Channel(), errs: newCompletionErrors(i),
			slots: make([]slot, cfg.SendDepth), mask: uint64(cfg.SendDepth - 1),
			plan: make([]WorkRequest, 0, cfg.SendDepth),
		})
	}
	t.wg.Add(1 + len(t.qps))
	for _, q := range t.qps {
		go t.pollLoop(q)
	}
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

// Close stops dispatch, takes every queue pair back from the reactors that
// reap it (its goroutine reaps what is left, so a stopped reactor holds
// nothing up), fails it so its posted work flushes, waits for that
// (bounded by ConnectTimeout, after which what is left ends with
// xfer.ErrClosed), stops the goroutines and frees the queue pairs and
// their completion queues. It is safe to call more than once.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		for _, q := range t.qps {
			q.mu.Lock()
			q.state = qpClosed
			q.mu.Unlock()
			t.adopt(q)
			_ = q.v.Fail()
		}
		deadline := time.Now().Add(t.cfg.ConnectTimeout)
		for _, q := range t.qps {
			t.drain(q, deadline)
		}
		close(t.stop)
		for _, q := range t.qps {
			q.cq.Wake()
		}
		t.wg.Wait()
		var errs []error
		for _, q := range t.qps {
			errs = append(errs, q.v.Reset())
			t.forceRetire(q, fmt.Errorf("rdma: %w", xfer.ErrClosed))
			errs = append(errs, q.v.Destroy())
		}
		for _, q := range t.qps {
			q.mu.Lock()
			q.destroyed = true
			q.mu.Unlock()
			errs = append(errs, q.cq.Destroy())
		}
		if t.release != nil {
			t.release()
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}
