package session

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testhook"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// takeMax bounds the entries one Take copies.
const takeMax = 256

// cqueue is one queue a connection opened: the shared rings and the
// engine stream its requests run on, served by one reactor worker
// (reactor.Queue) that moves entries from one to the other on its own
// thread.
//
// Stop order (close): close the ring (Take finds nothing more, and the
// worker's armed wait on the doorbell fires), detach it from its worker
// (which returns once the worker no longer touches it), answer what the
// worker had taken and not given to the stream, close the stream (what is
// in flight ends Canceled, each with its CQE). The mapping is released once
// the stream is idle (no transport holds a task, so nothing can post), by a
// goroutine that gives up at server close, leaving the mapping to the
// process's exit rather than unmapping memory a stalled transport might
// still complete into.
type cqueue struct {
	c      *Session
	id     uint64
	ring   *queue.DaemonRing
	st     *xfer.Stream
	worker int // the reactor worker serving it
	once   sync.Once

	// Owned by the worker (until close's Detach returns).
	brokenSeen bool // the broken queue was logged
	// seen caches the connection's segments this queue's requests named
	// (Resolve), valid while the connection's segGen is seenGen.
	seen     [4]resolved
	seenGen  uint64
	seenNext int
	sqes     []queue.SQE
	answers  []queue.CQE // CQEs of entries prepare answered itself
	reqs     []xfer.StreamRequest
	pend     []xfer.StreamRequest // accepted by the checks, waiting for their pass or a stream slot
	res      []error
	notes    [][]byte
	store    *qstore // the store ops' side, made at the first (queue_store.go)
}

var _ reactor.Queue = (*cqueue)(nil)

type resolved struct {
	id  xfer.SegmentID
	seg xfer.Segment
}

// resolve is the connection's Resolve for the queue's requests, before
// they go to the stream, with the last few segments kept so that a request
// naming the same buffer or file as the ones before it takes no lock. The
// worker calls it.
func (q *cqueue) resolve(id xfer.SegmentID) (xfer.Segment, bool) {
	c := q.c
	if c.pool != nil && id == c.pool.ID() {
		return &c.pview, true
	}
	if g := c.segGen.Load(); g != q.seenGen {
		q.seen, q.seenGen = [4]resolved{}, g
	}
	for i := range q.seen {
		if q.seen[i].id == id && q.seen[i].seg != nil {
			return q.seen[i].seg, true
		}
	}
	seg, ok := c.Resolve(id)
	if ok {
		q.seen[q.seenNext] = resolved{id, seg}
		q.seenNext = (q.seenNext + 1) % len(q.seen)
	}
	return seg, ok
}

// refuse posts the CQE of an entry refused before it reached the engine.
func (q *cqueue) refuse(ud uint64, code Code) {
	q.ring.Post(&queue.CQE{UserData: ud, Code: uint32(code), State: uint8(xfer.StateFailed)})
}

// refuseLater answers an entry being prepared with code once the worker
// has published sq_head past it (q.answers).
func (q *cqueue) refuseLater(ud uint64, code Code) {
	q.answers = append(q.answers, queue.CQE{UserData: ud, Code: uint32(code), State: uint8(xfer.StateFailed)})
}

// newQueue makes a queue of geometry g for c and gives it to a worker. It
// returns the queue's memfd and, when the workers wait on eventfd
// doorbells, the queue's eventfd (else -1), both to pass to the client.
func newQueue(c *Session, id uint64, g queue.Geometry) (*cqueue, int, int, error) {
	rx := c.h.Reactors
	if rx == nil {
		return nil, -1, -1, fmt.Errorf("%w: no reactor serves queues", ErrUnavailable)
	}
	ring, fd, err := queue.Create(id, g)
	if err != nil {
		return nil, -1, -1, err
	}
	q := &cqueue{c: c, id: id, ring: ring}
	// As many stream slots as completion slots: the ring bounds what is in
	// flight, and slots of requests ended early (a deadline) stay held
	// until their transport's Done.
	// The queue resolves its requests' segments before the stream has
	// them, and the stream's ends go straight to the ring as CQEs
	// (DaemonRing.StreamDone): the engine calls nothing of the session's
	// back but the segments' own methods.
	q.st, err = c.h.Engine.NewStream(int(g.CQEntries), nil, ring)
	if err != nil {
		unix.Close(fd) //nolint:errcheck // nothing to do about it
		return nil, -1, -1, errors.Join(err, ring.Release())
	}
	q.worker = rx.Pick()
	bell := -1
	if rx.EventfdDoorbells() {
		// The worker waits on this eventfd, not on the futex word: the
		// queue's own wake-ups (a freed stream slot, closing) go through
		// the worker's.
		w := q.worker
		if bell, err = ring.UseEventfd(func() { rx.Wake(w) }); err != nil {
			rx.Unpick(w)
			q.st.Close(err)
			unix.Close(fd) //nolint:errcheck // nothing to do about it
			return nil, -1, -1, errors.Join(err, ring.Release())
		}
	}
	q.st.OnFree(ring.Kick)
	n := min(int(g.SQEntries), takeMax)
	q.sqes = make([]queue.SQE, n)
	q.answers = make([]queue.CQE, 0, n)
	q.reqs = make([]xfer.StreamRequest, 0, n)
	q.res = make([]error, n)
	q.notes = make([][]byte, n)
	q.st.SetHome(rx.Home(q.worker))
	if err := rx.Attach(q.worker, q); err != nil {
		q.st.Close(err)
		unix.Close(fd) //nolint:errcheck // nothing to do about it
		if bell >= 0 {
			unix.Close(bell) //nolint:errcheck // nothing to do about it
		}
		return nil, -1, -1, errors.Join(fmt.Errorf("%w: %w", ErrUnavailable, err), ring.Release())
	}
	return q, fd, bell, nil
}

// Serve implements reactor.Queue: one pass on the worker's thread. While
// requests wait in q.pend it gives the stream their next group and
// nothing more; otherwise it takes new entries, checks them, publishes
// sq_head, answers what needs no transport and submits the first group of
// the rest. A pass gives the stream one group (submitGroup) because the
// transport may carry it out on this thread (the local transport copies a
// call of up to 4 MiB inline by default, and as much of a larger one): a
// client that fills its ring with large requests would otherwise hold the
// worker for all of them, and every other queue it serves would wait.
func (q *cqueue) Serve() bool {
	if len(q.pend) > 0 {
		before := len(q.pend)
		q.submit()
		return len(q.pend) < before // none taken: every stream slot is held
	}
	n := q.ring.Take(q.sqes)
	if n == 0 {
		if q.ring.Broken() && !q.brokenSeen {
			q.brokenSeen = true
			q.c.h.warns().brokenQueue.Event(append(q.c.who(), slog.Uint64("queue", q.id),
				slog.Uint64("violations", uint64(q.ring.Violations())))...)
		}
		return false
	}
	q.prepare(q.sqes[:n])
	if h := testhook.QueuePublish.Load(); h != nil {
		(*h)()
	}
	q.ring.Publish()
	// Answered only now, so that a client that reaps these first sees
	// their entries' slots free.
	for i := range q.answers {
		q.ring.Post(&q.answers[i])
	}
	q.answers = q.answers[:0]
	if q.store != nil {
		q.store.published()
	}
	q.submit()
	return true
}

// Doorbell implements reactor.Queue. A queue whose requests wait for a
// stream slot sleeps on the ring's wake word, which the stream's OnFree
// (Kick) changes when a slot frees; otherwise it sleeps for entries or
// completion room (queue.DaemonRing.Doorbell).
func (q *cqueue) Doorbell() (*atomic.Uint32, uint32, bool) {
	if len(q.pend) > 0 {
		w := q.ring.WakeWord()
		v := w.Load() // before the check: a Kick after it changes the word
		if q.st.Free() > 0 || q.ring.Closed() {
			return nil, 0, false
		}
		return w, v, true
	}
	return q.ring.Doorbell()
}

// Awake implements reactor.Queue.
func (q *cqueue) Awake() { q.ring.Awake() }

// Idle implements reactor.Queue: no request waits for a stream slot and
// every one taken is answered.
func (q *cqueue) Idle() bool { return len(q.pend) == 0 && q.ring.Idle() }

// EventfdDoorbell implements reactor.Queue.
func (q *cqueue) EventfdDoorbell() (int, bool) { return q.ring.EventfdDoorbell() }

// prepare checks and converts taken entries into q.pend. An entry that
// fails a check, and a no-op, is answered from q.answers once the entries
// are published: the copy is what is checked and what is used.
func (q *cqueue) prepare(sqes []queue.SQE) {
	now := time.Now()
	q.pend = q.pend[:0]
	for i := range sqes {
		e := &sqes[i]
		if e.Op == queue.OpNop {
			q.answers = append(q.answers, queue.CQE{UserData: e.UserData, State: uint8(xfer.StateCompleted)})
			continue
		}
		if e.Op >= queue.OpStoreFirst {
			q.storeOp(e)
			continue
		}
		r, code := q.request(e, i)
		if code != tcproto.CodeOK {
			q.refuseLater(e.UserData, code)
			continue
		}
		timeout := q.c.h.DefaultWait
		if e.TimeoutUS > 0 {
			timeout = time.Duration(e.TimeoutUS) * time.Microsecond
		}
		r.Deadline = now.Add(timeout)
		q.pend = append(q.pend, r)
	}
}

// request converts one entry into a stream request, copies its
// notification out of the data area and resolves its two segments through
// this connection only (NOT_FOUND for another's). What else a request must
// be (a length, bounds, pool blocks it holds) the engine checks as it takes
// the request: the pool view refuses ranges outside the connection's
// blocks (PERMISSION_DENIED).
func (q *cqueue) request(e *queue.SQE, i int) (xfer.StreamRequest, Code) {
	r := xfer.StreamRequest{UserData: e.UserData, Req: xfer.Request{Op: xfer.Op(e.Op), Local: xfer.SegmentID(e.Local),
		LocalOffset: e.LocalOff, Target: xfer.SegmentID(e.Target), TargetOffset: e.TargetOff, Length: e.Length}}
	if (e.Op != queue.OpRead && e.Op != queue.OpWrite) || e.Flags&^queue.SQEFlagNotify != 0 {
		return r, tcproto.CodeINVALID_ARGUMENT
	}
	if e.Flags&queue.SQEFlagNotify != 0 {
		if e.Op != queue.OpWrite || e.NotifyLen > wire.MaxNotify {
			return r, tcproto.CodeINVALID_ARGUMENT
		}
		buf := q.notes[i]
		if cap(buf) < int(e.NotifyLen) {
			buf = make([]byte, wire.MaxNotify)
			q.notes[i] = buf
		}
		if !q.ring.Data(buf, e.NotifyOff, e.NotifyLen) {
			return r, tcproto.CodeINVALID_ARGUMENT
		}
		r.Notify = buf[:e.NotifyLen]
	}
	if e.Length == 0 {
		return r, tcproto.CodeOK // the stream refuses it, as any request of no bytes
	}
	var ok bool
	if r.LocalSeg, ok = q.resolve(r.Req.Local); !ok {
		return r, status.CodeOf(xfer.ErrNoSegment)
	}
	if r.TargetSeg, ok = q.resolve(r.Req.Target); !ok {
		return r, status.CodeOf(xfer.ErrNoSegment)
	}
	return r, tcproto.CodeOK
}

// submit gives the first group of q.pend (submitGroup) to the stream, as
// much of it as the stream has slots for; the rest stays in q.pend for the
// worker's next pass, and so does what finds every slot held (requests
// past their deadline whose transport has not answered yet). It never
// waits: the worker serves other queues meanwhile.
func (q *cqueue) submit() {
	if len(q.pend) == 0 {
		return
	}
	g := submitGroup(q.pend)
	res := q.res[:g]
	n, err := q.st.Submit(q.pend[:g], res)
	if err != nil {
		code := status.CodeOf(err)
		for _, r := range q.pend {
			q.refuse(r.UserData, code)
		}
		q.pend = q.pend[:0]
		return
	}
	for i, e := range res[:n] {
		switch {
		case e == nil:
		case errors.Is(e, xfer.ErrTimeout):
			// Its deadline passed while it waited for a slot: answered as
			// a request the engine timed out.
			q.ring.StreamDone(q.pend[i].UserData, xfer.StateTimeout, 0, e)
		default:
			q.refuse(q.pend[i].UserData, status.CodeOf(e))
		}
	}
	q.pend = q.pend[:copy(q.pend, q.pend[n:])]
}

// groupBytes bounds the bytes of one Submit of requests smaller than it,
// and is the size from which a request is large. The bound was set when a
// call's inline copies were all answered as it returned; the stream now
// answers each as its transport ends it, so what the bound still does is
// keep each pass of this worker short. Reads of this size or more go
// together, as many as come in a row: a call of more than the local
// transport's inline bytes spreads its copy over the workers, which a
// large read needs to keep up with copy() (its source, the pool, is
// mostly out of cache). A write of this size or more goes alone: one
// core's stores keep up with copy(), and alone it stays under the inline
// bytes, so no copy worker is woken for it. Both rules are the local
// transport's policy, measured before the stream answered inside Submit
// (8 × 1 MiB local writes, the two builds alternating: 0.81-0.93x copy()
// alone, 0.70-0.75x together; tcp and uring 1 MiB writes the same either
// way, on 2 vCPUs); they belong in that transport once a quiet A/B shows
// they still pay.
const groupBytes = 256 << 10

// submitGroup is how many of reqs (at least one) the next Submit takes.
func submitGroup(reqs []xfer.StreamRequest) int {
	if r := &reqs[0].Req; r.Length >= groupBytes {
		if r.Op == xfer.OpWrite {
			return 1
		}
		i := 1
		for i < len(reqs) && reqs[i].Req.Length >= groupBytes && reqs[i].Req.Op != xfer.OpWrite {
			i++
		}
		return i
	}
	var total uint64
	for i, r := range reqs {
		if r.Req.Length >= groupBytes {
			return i
		}
		total += r.Req.Length
		if total > groupBytes && i > 0 {
			return i
		}
	}
	return len(reqs)
}

// close stops the queue (see cqueue); it returns once the worker is gone.
// What is in flight ends Canceled, each with a CQE; the mapping goes when
// the last transport has answered.
func (q *cqueue) close() {
	q.once.Do(func() {
		q.ring.Close()
		q.c.h.Reactors.Detach(q.worker, q)
		// The worker waits on the eventfd doorbell no more (an armed read
		// of it is cancelled by user_data, which needs no fd): it is
		// closed now, not with the mapping, which may outlive the server.
		if err := q.ring.CloseDoorbell(); err != nil {
			q.c.log.Warn("closing a closed queue's eventfd doorbell failed", "queue", q.id, "err", err)
		}
		// Entries taken but never given to the engine still get their
		// CQEs; the worker no longer touches q.
		for _, r := range q.pend {
			q.refuse(r.UserData, tcproto.CodeUNAVAILABLE)
		}
		q.pend = q.pend[:0]
		q.st.Close(fmt.Errorf("%w: queue closed", xfer.ErrCanceled))
		h := q.c.h
		h.mu.Lock()
		q.addTo(&h.closedQueues)
		h.mu.Unlock()
		go func() {
			select {
			case <-q.st.Idle():
				if !q.storeIdle() { // store calls in flight post their CQEs first
					return
				}
				if err := q.ring.Release(); err != nil {
					q.c.log.Warn("unmapping a closed queue failed", "queue", q.id, "err", err)
				}
			case <-q.c.h.Closing:
			}
		}()
	})
}

// OpenQueue makes a queue for this session and returns its memfd for the
// answer, and its eventfd doorbell when the workers wait on those (else
// -1), passed after the memfd; the caller closes both once the answer is
// sent. OpenQueue is not idempotent by key: an fd cannot be replayed.
func (c *Session) OpenQueue(m *wire.OpenQueueRequest, r *wire.Response) (int, int, error) {
	lim := &c.h.Limits
	if len(c.queues) >= lim.MaxQueues {
		return -1, -1, fmt.Errorf("%w: %d queues open (max %d)", ErrLimit, len(c.queues), lim.MaxQueues)
	}
	if m.SQEntries == 0 || int(m.SQEntries) > lim.MaxQueueEntries || int64(m.CQEntries) > 4*int64(lim.MaxQueueEntries) ||
		int64(m.DataSize) > int64(lim.MaxQueueData) {
		return -1, -1, fmt.Errorf("%w: queue of %d/%d entries and %d data bytes (max %d entries, %d bytes)",
			ErrLimit, m.SQEntries, m.CQEntries, m.DataSize, lim.MaxQueueEntries, lim.MaxQueueData)
	}
	g, err := queue.NewGeometry(m.SQEntries, m.CQEntries, m.DataSize)
	if err != nil {
		return -1, -1, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	id := c.h.nextQueue.Add(1)
	q, fd, bell, err := newQueue(c, id, g)
	if err != nil {
		return -1, -1, err
	}
	c.qmu.Lock()
	c.queues[id] = q
	c.qmu.Unlock()
	*wire.SetResponse[wire.OpenQueueResponse](r) = wire.OpenQueueResponse{Queue: id,
		SQEntries: g.SQEntries, CQEntries: g.CQEntries, DataSize: g.DataSize, Size: g.Size}
	c.log.Debug("queue opened", "queue", id, "sq_entries", g.SQEntries, "cq_entries", g.CQEntries, "data_size", g.DataSize)
	return fd, bell, nil
}

// CloseQueue closes one of this session's queues.
func (c *Session) CloseQueue(m *wire.CloseQueueRequest, r *wire.Response) error {
	q, ok := c.queues[m.Queue]
	if !ok {
		return fmt.Errorf("%w: queue %d", ErrNotFound, m.Queue)
	}
	c.qmu.Lock()
	delete(c.queues, m.Queue)
	c.qmu.Unlock()
	q.close()
	wire.SetResponse[wire.CloseQueueResponse](r)
	return nil
}

// queueCounters are this connection's queues' counters for Stats.
func (c *Session) queueCounters(dst []wire.Counter) []wire.Counter {
	var inflight, unreaped, violations uint32
	var posted, wakes, sleeps uint64
	for _, q := range c.queues {
		i, u, p := q.ring.Counts()
		inflight, unreaped, posted = inflight+i, unreaped+u, posted+p
		violations += q.ring.Violations()
		wakes += q.ring.WakeCounts.ClientWakes.Load()
		sleeps += q.ring.WakeCounts.WorkerSleeps.Load()
	}
	return append(dst,
		wire.Counter{Name: "queues", Value: uint64(len(c.queues))},
		wire.Counter{Name: "queue_inflight", Value: uint64(inflight)},
		wire.Counter{Name: "queue_unreaped", Value: uint64(unreaped)},
		wire.Counter{Name: "queue_completions", Value: posted},
		wire.Counter{Name: "queue_violations", Value: uint64(violations)},
		wire.Counter{Name: "queue_client_wakes", Value: wakes},
		wire.Counter{Name: "queue_worker_sleeps", Value: sleeps},
	)
}

// QueueTotals are the counters of every queue a server has served,
// open or closed, for stats and metrics.
type QueueTotals struct {
	Open, Opened uint64
	// InFlight and Unreaped are the open queues' requests taken and not
	// answered, and answers not reaped: their depth now.
	InFlight, Unreaped                                 uint64
	Completions, ClientWakes, WorkerSleeps, Violations uint64
}

// QueueTotals is what the queues of the sessions closed so far left
// behind, and how many queues were ever opened; a scrape adds the open
// ones with AddQueueTotals.
func (h *Host) QueueTotals() QueueTotals {
	h.mu.Lock()
	t := h.closedQueues
	h.mu.Unlock()
	t.Opened = h.nextQueue.Load()
	return t
}

// AddQueueTotals adds the session's open queues to t.
func (c *Session) AddQueueTotals(t *QueueTotals) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	for _, q := range c.queues {
		q.addTo(t)
		inflight, unreaped, _ := q.ring.Counts()
		t.Open++
		t.InFlight += uint64(inflight)
		t.Unreaped += uint64(unreaped)
	}
}

// addTo adds q's counters to t.
func (q *cqueue) addTo(t *QueueTotals) {
	_, _, posted := q.ring.Counts()
	t.Completions += posted
	t.ClientWakes += q.ring.WakeCounts.ClientWakes.Load()
	t.WorkerSleeps += q.ring.WakeCounts.WorkerSleeps.Load()
	t.Violations += uint64(q.ring.Violations())
}
