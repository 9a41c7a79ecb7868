package rdma

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Config tunes a device and the transports opened on it. The zero value
// means the defaults.
type Config struct {
	// Device is the RDMA device name ("" = the first one with an active port).
	Device string
	// Port is the device port (0 = 1).
	Port int
	// GID overrides the automatic choice of the RoCE v2 GID of Netdev's
	// address: a GID table index ("3") or an address ("10.0.2.15",
	// "::ffff:10.0.2.15"). "" = automatic.
	GID string
	// Netdev is the network device whose address the GID must carry
	// ("" = whichever the GID table names).
	Netdev string
	// QPs is how many RC queue pairs a transport spreads work over (2).
	QPs int
	// SendDepth is each queue pair's send queue size, a power of two (256).
	SendDepth int
	// SignalEvery asks for a completion on every nth work request of a
	// posted list, and always on its last (16).
	SignalEvery int
	// PollBatch is how many completions one ibv_poll_cq call takes (32).
	PollBatch int
	// PollSpin is how long the poller keeps polling an empty completion
	// queue before it arms the channel and sleeps (50 µs; negative: never
	// spin). Spinning saves the interrupt and wake-up per completion at
	// light load, at the price of that much CPU after each burst.
	PollSpin time.Duration
	// ChunkSize is what one MR covers when a segment is registered, a power
	// of two (1 GiB); RegisterWorkers chunks are registered at once (4).
	ChunkSize       uint64
	RegisterWorkers int
	// MaxMessage caps one work request's length (1 GiB).
	MaxMessage uint64
	// SubmitWait bounds how long Submit waits for send-queue room (1 s).
	SubmitWait time.Duration
	// ConnectTimeout bounds bringing one queue pair up, including the probe
	// that checks the peer answers (5 s).
	ConnectTimeout time.Duration
	// Timeout and RetryCount are the RC transport's ack timeout exponent
	// (4.096 µs × 2^Timeout) and retry count (14 and 7).
	Timeout    uint8
	RetryCount uint8
}

// DefaultConfig is the configuration the zero values of Config stand for.
func DefaultConfig() Config {
	return Config{
		Port: 1, QPs: 2, SendDepth: 256, SignalEvery: 16, PollBatch: 32, PollSpin: 50 * time.Microsecond,
		ChunkSize: DefaultChunkSize, RegisterWorkers: 4, MaxMessage: 1 << 30,
		SubmitWait: time.Second, ConnectTimeout: 5 * time.Second, Timeout: 14, RetryCount: 7,
	}
}

// withDefaults fills zero fields from DefaultConfig and checks the rest.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.Port == 0 {
		c.Port = d.Port
	}
	if c.QPs == 0 {
		c.QPs = d.QPs
	}
	if c.SendDepth == 0 {
		c.SendDepth = d.SendDepth
	}
	if c.SignalEvery == 0 {
		c.SignalEvery = d.SignalEvery
	}
	if c.PollBatch == 0 {
		c.PollBatch = d.PollBatch
	}
	if c.PollSpin == 0 {
		c.PollSpin = d.PollSpin
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = d.ChunkSize
	}
	if c.RegisterWorkers == 0 {
		c.RegisterWorkers = d.RegisterWorkers
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = d.MaxMessage
	}
	if c.SubmitWait == 0 {
		c.SubmitWait = d.SubmitWait
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.RetryCount == 0 {
		c.RetryCount = d.RetryCount
	}
	switch {
	case c.QPs < 1 || c.QPs > 256:
		return c, fmt.Errorf("rdma: config QPs %d: want 1..256", c.QPs)
	case c.SendDepth < 4 || c.SendDepth > 1<<15 || c.SendDepth&(c.SendDepth-1) != 0:
		return c, fmt.Errorf("rdma: config SendDepth %d: want a power of two in 4..32768", c.SendDepth)
	case c.ChunkSize&(c.ChunkSize-1) != 0 || c.ChunkSize < 4096:
		return c, fmt.Errorf("rdma: config ChunkSize %d: want a power of two >= 4096", c.ChunkSize)
	case c.MaxMessage > 1<<31:
		return c, fmt.Errorf("rdma: config MaxMessage %d: want <= 2 GiB", c.MaxMessage)
	case c.Timeout > 31 || c.RetryCount > 7:
		return c, fmt.Errorf("rdma: config Timeout %d / RetryCount %d: want <= 31 / <= 7", c.Timeout, c.RetryCount)
	}
	return c, nil
}

// Peer carries connection data to the other side of a queue pair: it
// hands the local ConnInfo over, the other side brings its queue pair of
// the same QPIndex up against it (Transport.Accept) and answers with its
// own. The tcp peer channel implements it between daemons; Loopback
// implements it inside one process.
type Peer interface {
	Exchange(local ConnInfo) (ConnInfo, error)
}

// Loopback is a Peer that is another transport in this process.
type Loopback struct{ T *Transport }

// Exchange brings up l.T's queue pair against local.
func (l Loopback) Exchange(local ConnInfo) (ConnInfo, error) { return l.T.Accept(local) }

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
// Requests: Local must be a segment registered with AddLocal, Target a
// remote segment added with AddRemote. A task becomes one or more RDMA
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

	locals  atomic.Pointer[map[xfer.SegmentID]*keyTable] // copy on write
	remotes atomic.Pointer[map[xfer.SegmentID]*keyTable] // copy on write

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
	empty := map[xfer.SegmentID]*keyTable{}
	t.locals.Store(&empty)
	t.remotes.Store(&empty)
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

// AddLocal makes a registered region usable as the local side of requests
// naming segment id.
func (t *Transport) AddLocal(id xfer.SegmentID, r *Region) {
	t.swapTable(&t.locals, id, &r.keys)
}

// AddRemote makes a peer's region usable as the target of requests naming
// segment id.
func (t *Transport) AddRemote(id xfer.SegmentID, r RemoteRegion) error {
	kt, err := r.table()
	if err != nil {
		return err
	}
	t.swapTable(&t.remotes, id, &kt)
	return nil
}

// AddRemoteRange makes [off, off+n) of a peer's region usable as the
// target of requests naming segment id, at target offsets 0..n (a segment
// the peer exported from inside a larger registration).
func (t *Transport) AddRemoteRange(id xfer.SegmentID, r RemoteRegion, off, n uint64) error {
	kt, err := r.table()
	if err != nil {
		return err
	}
	if n == 0 || off >= kt.size || n > kt.size-off {
		return fmt.Errorf("%w: range %d+%d outside a region of %d bytes", ErrNotRegistered, off, n, kt.size)
	}
	kt.base, kt.limit = off, n
	t.swapTable(&t.remotes, id, &kt)
	return nil
}

// RemoveRemote forgets segment id as a target; later requests naming it
// fail with ErrNotRegistered.
func (t *Transport) RemoveRemote(id xfer.SegmentID) { t.swapTable(&t.remotes, id, nil) }

// RemoveLocal forgets segment id as the local side of requests; later
// requests naming it fail with ErrNotRegistered. Call it before the region
// it was added with is deregistered.
func (t *Transport) RemoveLocal(id xfer.SegmentID) { t.swapTable(&t.locals, id, nil) }

// swapTable publishes a copy of *p with id's table set to kt, or removed
// when kt is nil.
func (t *Transport) swapTable(p *atomic.Pointer[map[xfer.SegmentID]*keyTable], id xfer.SegmentID, kt *keyTable) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := maps.Clone(*p.Load())
	if kt == nil {
		delete(m, id)
	} else {
		m[id] = kt
	}
	p.Store(&m)
}

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

// Connect brings every queue pair up against peer (which is kept for
// reconnecting after errors). Each queue pair is checked with a
// zero-length RDMA WRITE that must complete within ConnectTimeout.
func (t *Transport) Connect(peer Peer) error {
	t.mu.Lock()
	t.peer = peer
	t.mu.Unlock()
	for _, q := range t.qps {
		if err := t.bringUp(q, peer.Exchange, true); err != nil {
			return err
		}
	}
	return nil
}

// Accept brings up the queue pair remote.QPIndex against remote (the
// passive side of Peer.Exchange) and returns this side's connection data.
func (t *Transport) Accept(remote ConnInfo) (ConnInfo, error) {
	if int(remote.QPIndex) >= len(t.qps) {
		return ConnInfo{}, fmt.Errorf("%w: queue pair %d of %d", ErrConnInfo, remote.QPIndex, len(t.qps))
	}
	var local ConnInfo
	err := t.bringUp(t.qps[remote.QPIndex], func(l ConnInfo) (ConnInfo, error) {
		local = l
		return remote, nil
	}, false)
	return local, err
}

// bringUp (re)connects q: it drains whatever q still has posted, resets
// it, exchanges connection data and moves it to RTS; with probe it then
// checks the path with a zero-length WRITE.
func (t *Transport) bringUp(q *queuePair, exchange func(ConnInfo) (ConnInfo, error), probe bool) error {
	q.mu.Lock()
	switch q.state {
	case qpClosed:
		q.mu.Unlock()
		return fmt.Errorf("rdma: %w", xfer.ErrClosed)
	case qpBusy:
		q.mu.Unlock()
		return fmt.Errorf("%w: qp %d is being connected already", ErrConnect, q.idx)
	}
	wasUp := q.state == qpUp
	q.state = qpBusy
	inflight := q.head != q.tail
	q.mu.Unlock()
	if wasUp && inflight {
		_ = q.v.Fail()
	}
	t.drain(q, t.cfg.ConnectTimeout)
	if err := q.v.Reset(); err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: reset qp %d: %v", ErrConnect, q.idx, err)
	}
	t.forceRetire(q, ErrQPDown)

	t.mu.Lock()
	local := ConnInfo{
		QPIndex: uint16(q.idx), QPN: q.v.QPN(), PSN: rand.Uint32() & 0xffffff,
		LID: t.addr.LID, MTU: t.addr.MTU, GID: t.addr.GID, Regions: append([]RemoteRegion(nil), t.exposed...),
	}
	t.mu.Unlock()
	remote, err := exchange(local)
	if err == nil {
		err = remote.validate()
	}
	if err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: exchange for qp %d: %w", ErrConnect, q.idx, err)
	}
	if err := q.v.Connect(&local, &remote); err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: qp %d to %s qpn %#x: %v", ErrConnect, q.idx, remote.GID, remote.QPN, err)
	}
	t.mu.Lock()
	t.learned = remote.Regions
	t.mu.Unlock()
	q.mu.Lock()
	q.local, q.remote = local, remote
	q.mu.Unlock()
	if probe {
		if err := t.probe(q); err != nil {
			_ = q.v.Fail()
			t.setState(q, qpDown)
			return fmt.Errorf("%w: qp %d to %s: %v", ErrConnect, q.idx, remote.GID, err)
		}
	}
	t.setState(q, qpUp)
	t.pokeRoom()
	return nil
}

// probe posts a zero-length RDMA WRITE on q and waits for its completion.
func (t *Transport) probe(q *queuePair) error {
	ch := make(chan error, 1)
	q.mu.Lock()
	if q.head-q.tail >= uint64(len(q.slots)) {
		q.mu.Unlock()
		return ErrQueueFull
	}
	buf := q.v.WorkRequests()
	buf[0] = WorkRequest{id: uint64(q.idx)<<seqBits | q.head&(1<<seqBits-1), op: opWrite, signaled: 1}
	q.slots[q.head&q.mask] = slot{probe: ch, first: true, last: true}
	_, err := q.v.Post(1)
	if err == nil {
		q.head++
	}
	q.mu.Unlock()
	if err != nil {
		return err
	}
	timer := time.NewTimer(t.cfg.ConnectTimeout)
	defer timer.Stop()
	select {
	case err := <-ch:
		return err
	case <-timer.C:
		return fmt.Errorf("no answer within %v", t.cfg.ConnectTimeout)
	}
}

func (t *Transport) setState(q *queuePair, s int) {
	q.mu.Lock()
	if q.state != qpClosed {
		q.state = s
	}
	q.mu.Unlock()
}

// drain waits up to d for q's posted work to retire.
func (t *Transport) drain(q *queuePair, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		q.mu.Lock()
		empty := q.head == q.tail
		q.mu.Unlock()
		if empty {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// forceRetire ends whatever q still has posted with err. Only called with
// q in RESET (or destroyed), when the device no longer touches its work.
func (t *Transport) forceRetire(q *queuePair, err error) {
	var done []doneTask
	q.mu.Lock()
	for ; q.tail != q.head; q.tail++ {
		s := &q.slots[q.tail&q.mask]
		if s.first {
			q.curErr = nil
		}
		if s.probe != nil {
			s.probe <- err
		} else if s.last {
			done = append(done, doneTask{t: s.task, err: err})
		}
		*s = slot{}
	}
	q.mu.Unlock()
	for _, d := range done {
		d.t.Done(0, d.err)
	}
}

// Submit posts tasks in order, spreading them over the queue pairs that
// are up, and returns how many it dispatched (see xfer.Transport). A task
// that fails validation is dispatched and ended at once with an error
// wrapping xfer.ErrInvalid or ErrNotRegistered, one that carries a
// notification with xfer.ErrNoNotify (the caller sends notifications on
// its peer channel). When every queue pair is
// full or down it waits up to SubmitWait, then returns ErrQueueFull (or
// ErrQPDown). Called from a completion callback (on the poller), it can
// only take what fits at once: the room it would wait for is freed by
// that same poller.
func (t *Transport) Submit(tasks []*xfer.Task) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("rdma: %w", xfer.ErrClosed)
	}
	locals, remotes := *t.locals.Load(), *t.remotes.Load()
	n := 0
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for n < len(tasks) {
		progress, anyUp := false, false
		for range t.qps {
			q := t.qps[t.rr.Add(1)%uint32(len(t.qps))]
			k, up, err := t.postTo(q, tasks[n:], locals, remotes)
			n += k
			anyUp = anyUp || up
			if err != nil {
				return n, err
			}
			if k > 0 {
				progress = true
				break
			}
		}
		if progress || n == len(tasks) {
			continue
		}
		if t.closed.Load() {
			return n, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		}
		if timer == nil {
			timer = time.NewTimer(t.cfg.SubmitWait)
		}
		select {
		case <-t.room:
		case <-t.stop:
			return n, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		case <-timer.C:
			if !anyUp {
				return n, ErrQPDown
			}
			return n, ErrQueueFull
		}
	}
	return n, nil
}

// postTo posts a prefix of tasks on q as one linked list. It returns how
// many tasks it dispatched and whether q was up.
func (t *Transport) postTo(q *queuePair, tasks []*xfer.Task, locals, remotes map[xfer.SegmentID]*keyTable) (int, bool, error) {
	var invalid []doneTask
	q.mu.Lock()
	if q.state != qpUp {
		closed := q.state == qpClosed
		q.mu.Unlock()
		if closed {
			return 0, false, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		}
		return 0, false, nil
	}
	buf := q.v.WorkRequests()
	free := len(q.slots) - int(q.head-q.tail)
	nw, taken := 0, 0
	for _, tk := range tasks {
		lt, rt := locals[tk.Req.Local], remotes[tk.Req.Target]
		var err error
		plan := q.plan[:0]
		switch {
		case tk.Notify != nil:
			// Notifications travel on the peer channel (the daemon's
			// link sends them once the WRITE completed), never here.
			err = xfer.ErrNoNotify
		case lt == nil || rt == nil:
			err = fmt.Errorf("%w: segment %d or %d", ErrNotRegistered, tk.Req.Local, tk.Req.Target)
		default:
			plan, err = planTask(plan, tk, lt, rt, t.cfg.MaxMessage)
			if err == nil && len(plan) > len(q.slots) {
				err = fmt.Errorf("%w: %d bytes need %d work requests; a send queue holds %d",
					xfer.ErrInvalid, tk.Req.Length, len(plan), len(q.slots))
			}
		}
		if err != nil {
			invalid = append(invalid, doneTask{t: tk, err: err})
			taken++
			continue
		}
		if len(plan) > free-nw {
			break // no room: the rest stays with the caller or another queue pair
		}
		for i := range plan {
			seq := q.head + uint64(nw+i)
			plan[i].id = uint64(q.idx)<<seqBits | seq&(1<<seqBits-1)
			q.slots[seq&q.mask] = slot{task: tk, first: i == 0, last: i == len(plan)-1}
		}
		copy(buf[nw:], plan)
		nw += len(plan)
		taken++
	}
	if nw > 0 {
		markSignals(buf[:nw], t.cfg.SignalEvery)
		posted, err := q.v.Post(nw)
		if err != nil {
			// The provider took buf[:posted]. Fail the queue pair so those
			// flush; end the rest here: the task cut in two ends with its
			// last posted piece, the ones not posted at all right away.
			_ = q.v.Fail()
			q.state = qpDown
			perr := fmt.Errorf("%w: ibv_post_send: %v", ErrQPDown, err)
			for i := posted; i < nw; i++ {
				s := &q.slots[(q.head+uint64(i))&q.mask]
				if s.first && s.task != nil {
					invalid = append(invalid, doneTask{t: s.task, err: perr})
				}
				if i == posted && !s.first && posted > 0 {
					p := &q.slots[(q.head+uint64(i-1))&q.mask]
					p.last, p.err = true, perr
				}
				*s = slot{}
			}
			nw = posted
		}
		q.head += uint64(nw)
	}
	q.mu.Unlock()
	for _, d := range invalid {
		d.t.Done(0, d.err)
	}
	return taken, true, nil
}

// pollLoop is the poller: it takes completions in batches, retires the
// work they cover and ends tasks; when the queue is empty it arms the
// completion channel and sleeps on it.
func (t *Transport) pollLoop() {
	defer t.wg.Done()
	var idle time.Time // when the queue was first seen empty; zero while busy
	for {
		n, err := t.cq.Poll(t.wcs)
		if err != nil {
			t.log.Error("rdma: ibv_poll_cq failed; stopping the poller", "err", err)
			return
		}
		if n > 0 {
			t.handle(t.wcs[:n])
			idle = time.Time{}
			continue
		}
		if t.cfg.PollSpin > 0 {
			now := time.Now()
			if idle.IsZero() {
				idle = now
			}
			if now.Sub(idle) < t.cfg.PollSpin {
				runtime.Gosched()
				continue
			}
			idle = time.Time{}
		}
		if err := t.cq.Arm(); err != nil {
			t.log.Error("rdma: ibv_req_notify_cq failed; stopping the poller", "err", err)
			return
		}
		// A completion that arrived before arming raised no event.
		if n, _ = t.cq.Poll(t.wcs); n > 0 {
			t.handle(t.wcs[:n])
			continue
		}
		ok, err := t.cq.Wait()
		if err != nil {
			t.log.Error("rdma: completion channel failed; stopping the poller", "err", err)
			return
		}
		if !ok {
			return
		}
	}
}

// handle retires what a batch of completions covers and ends the tasks
// whose last work request it retired.
func (t *Transport) handle(wcs []WorkCompletion) {
	done := t.done[:0]
	for i := range wcs {
		c := &wcs[i]
		qi := int(c.id >> seqBits)
		if qi >= len(t.qps) {
			continue
		}
		q := t.qps[qi]
		q.mu.Lock()
		seq := q.tail + ((c.id&(1<<seqBits-1) - q.tail) & (1<<seqBits - 1))
		if seq >= q.head {
			q.mu.Unlock() // already retired (forced): stale
			continue
		}
		st := WCStatus(c.status)
		var werr error
		if st != WCSuccess {
			werr = q.errs.get(st, c.vendor)
			if q.state == qpUp {
				q.state = qpDown
			}
		}
		// RC completes in order: everything before seq finished without
		// error (errors always complete, signalled or not).
		for ; q.tail <= seq; q.tail++ {
			s := &q.slots[q.tail&q.mask]
			if s.first {
				q.curErr = nil
			}
			if q.tail == seq && werr != nil && q.curErr == nil {
				q.curErr = werr
			}
			if s.err != nil && q.curErr == nil {
				q.curErr = s.err
			}
			if s.probe != nil {
				s.probe <- q.curErr
			} else if s.last {
				var n uint64
				if q.curErr == nil {
					n = s.task.Req.Length
				}
				done = append(done, doneTask{t: s.task, n: n, err: q.curErr})
			}
			*s = slot{}
		}
		if q.state == qpDown && q.tail == q.head {
			select {
			case t.reconnect <- q.idx:
			default:
			}
		}
		q.mu.Unlock()
	}
	for i := range done {
		done[i].t.Done(done[i].n, done[i].err)
		done[i] = doneTask{}
	}
	t.done = done[:0]
	t.pokeRoom()
}

func (t *Transport) pokeRoom() {
	select {
	case t.room <- struct{}{}:
	default:
	}
}

// reconnectLoop is the reconnector: it brings queue pairs that went down
// back up through the peer, retrying with a growing pause until Close.
func (t *Transport) reconnectLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case idx := <-t.reconnect:
			t.mu.Lock()
			peer := t.peer
			t.mu.Unlock()
			if peer == nil {
				continue // the passive side: the peer reconnects through Accept
			}
			q := t.qps[idx]
			for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
				q.mu.Lock()
				down := q.state == qpDown
				q.mu.Unlock()
				if !down {
					break
				}
				err := t.bringUp(q, peer.Exchange, true)
				if err == nil {
					t.log.Info("rdma: queue pair re-established", "qp", idx)
					break
				}
				t.log.Warn("rdma: reconnecting queue pair failed", "qp", idx, "err", err)
				select {
				case <-t.stop:
					return
				case <-time.After(pause):
				}
			}
		}
	}
}

// failQP moves queue pair i to the error state, as a fatal device error
// would: its posted work flushes and it is reconnected.
func (t *Transport) failQP(i int) error { return t.qps[i].v.Fail() }

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
