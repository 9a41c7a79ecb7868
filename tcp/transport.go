package tcp

// The data path of the Transport: Submit and Cancel, each task's state
// through its slices, and sending the slices and notifications on the
// peer's connections.

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// taskState follows one task through its slices (and its notification).
type taskState struct {
	n     *Node
	t     *xfer.Task
	r     *Remote
	local []byte // the task's local range
	toff  uint64
	op    xfer.Op
	// left counts the slices sent and not yet answered, +1 for the hold of
	// whoever still sends the task (the submitting goroutine or the pump).
	left  atomic.Int64
	moved atomic.Uint64
	err   atomic.Pointer[error]
	// notify is the task's notification (Task.Notify, nil for none),
	// deadline the task's deadline (unix ns) for the notification's ACK and
	// for the stall check.
	notify   []byte
	deadline int64
	// sent is the offset of the next slice to send; only the task's
	// current sender touches it.
	sent uint64

	// Queue fields, guarded by the peer's mu while the task is in
	// peer.queued (pump.go).
	prev, next *taskState
	listed     bool  // in the peer's list (false while the pump holds it)
	expires    int64 // unix ns: the wait in the queue ends in a timeout
	dslot      int32 // its slot in peer.waits while listed
	canceled   bool  // Cancel came while the pump held it
}

func (ts *taskState) dueAt() int64    { return ts.expires }
func (ts *taskState) dueSlot() *int32 { return &ts.dslot }

func (ts *taskState) setErr(err error) { ts.err.CompareAndSwap(nil, &err) }

func (ts *taskState) part(moved uint64, err error) {
	if err != nil {
		ts.setErr(err)
	} else {
		ts.moved.Add(moved)
	}
	if ts.left.Add(-1) == 0 {
		ts.end()
	}
}

// end runs when every slice is answered: a notification, if any, goes out
// now that the data has landed; otherwise the task completes.
func (ts *taskState) end() {
	var err error
	if p := ts.err.Load(); p != nil {
		err = *p
	}
	if err == nil && ts.notify != nil {
		if err = ts.n.sendNotify(ts); err == nil {
			return
		}
	}
	ts.complete(err)
}

func (ts *taskState) complete(err error) {
	n, t, moved := ts.n, ts.t, ts.moved.Load()
	*ts = taskState{}
	n.taskPool.Put(ts)
	t.Done(moved, err)
	n.taskGone()
}

// stopSending is the end of the sender's part: the slices not sent are
// given up (with err, unless nil) and the sender's hold is dropped, so the
// task ends once the slices in flight are answered.
func (ts *taskState) stopSending(err error) {
	if err != nil {
		ts.setErr(err)
	}
	ts.part(0, nil)
}

// Cancel implements xfer.Transport. A task still waiting in its peer's
// queue ends at once with xfer.ErrCanceled (after the slices it already
// sent are answered); one whose slices are all on the wire ends within
// its deadline plus stallGrace (a silent connection is dropped), within
// RequestTimeout in any case, and its notification by its deadline.
func (n *Node) Cancel(t *xfer.Task) {
	r, ok := t.Target.(*Remote)
	if !ok || r == nil || r.node != n {
		return
	}
	p := r.peer
	p.mu.Lock()
	ts := p.queued[t]
	if ts == nil {
		p.mu.Unlock()
		return
	}
	if !ts.listed {
		// The pump holds it; it gives it up when it puts it down.
		ts.canceled = true
		p.mu.Unlock()
		return
	}
	p.unlinkLocked(ts)
	p.mu.Unlock()
	ts.stopSending(fmt.Errorf("%w: while waiting for peer %s", xfer.ErrCanceled, p.id))
}

// Submit implements xfer.Transport. task.Local must be an xfer.MemSegment
// and task.Target a *Remote of this node. Submit never waits: it sends
// what the peer's session and flow-control window take now and queues the
// rest for the peer's pump (see the package doc), which dials a peer
// without a live session. Every task it returns in tasks[:n] ends with
// exactly one Done; validation failures end with a typed error, a task
// past the peer's queue bound with ErrBacklog.
//
// A task with Notify set must be a WRITE with at most MaxNotify bytes of
// notification: once its data has landed, the target daemon delivers the
// notification through its Exporter.Deliver, and the task completes only
// on the target's positive ACK before the task's Deadline (RequestTimeout
// from dispatch when it has none). A negative ACK fails it
// (ErrNotifyRejected), no ACK by the deadline ends it with xfer.ErrTimeout,
// a broken connection fails it (ErrConnLost).
func (n *Node) Submit(tasks []*xfer.Task) (int, error) {
	for i, t := range tasks {
		n.active.Add(1)
		if n.closed.Load() {
			n.taskGone()
			return i, xfer.ErrClosed
		}
		n.dispatch(t)
	}
	return len(tasks), nil
}

func (n *Node) fail(t *xfer.Task, err error) {
	t.Done(0, err)
	n.taskGone()
}

func (n *Node) dispatch(t *xfer.Task) {
	r, ok := t.Target.(*Remote)
	if !ok || r == nil || r.node != n {
		n.fail(t, fmt.Errorf("%w: target is not a remote segment of this node", xfer.ErrInvalid))
		return
	}
	loc, ok := t.Local.(xfer.MemSegment)
	if !ok || loc == nil {
		n.fail(t, fmt.Errorf("%w: local side is not a memory segment", xfer.ErrInvalid))
		return
	}
	if xfer.IsUnsealed(loc) {
		// The payload would go through the connection's stream, which other
		// requests share: a fault half-way through a frame would break them
		// all, and gnet copies what the socket does not take at once.
		n.fail(t, fmt.Errorf("%w: local segment %d", xfer.ErrUnsealed, loc.ID()))
		return
	}
	q := t.Req
	var need Rights
	switch q.Op {
	case xfer.OpRead:
		need = RightRead
	case xfer.OpWrite:
		need = RightWrite
	default:
		n.fail(t, fmt.Errorf("%w: op %d", xfer.ErrInvalid, q.Op))
		return
	}
	lb := loc.Bytes()
	lsize := min(uint64(len(lb)), loc.Size())
	if q.Length == 0 || q.LocalOffset > lsize || q.Length > lsize-q.LocalOffset ||
		q.TargetOffset > r.size || q.Length > r.size-q.TargetOffset {
		n.fail(t, fmt.Errorf("%w: %d bytes at local %d / target %d outside the segments", xfer.ErrInvalid, q.Length, q.LocalOffset, q.TargetOffset))
		return
	}
	if t.Notify != nil && (q.Op != xfer.OpWrite || len(t.Notify) > MaxNotify) {
		n.fail(t, fmt.Errorf("%w: a notification (at most %d bytes, this one %d) rides only on a WRITE",
			xfer.ErrInvalid, MaxNotify, len(t.Notify)))
		return
	}
	if r.rights&need == 0 {
		n.fail(t, fmt.Errorf("%w: %s/%s opened with rights %v", xfer.ErrPermission, r.peer.id, r.name, r.rights))
		return
	}
	ts := n.taskPool.Get().(*taskState)
	ts.n, ts.t, ts.r, ts.op, ts.toff = n, t, r, q.Op, q.TargetOffset
	ts.local = lb[q.LocalOffset : q.LocalOffset+q.Length]
	ts.notify = t.Notify
	n.start(ts)
}

// Notify takes t, whose target is a remote segment of this node and whose
// moved bytes another transport already placed there (an RDMA WRITE), and
// sends only its notification (t.Notify), as a notified WRITE's follows its
// data: t ends on the owner's ACK with moved, on a negative ACK with
// ErrNotifyRejected, with no ACK by its deadline with xfer.ErrTimeout, on a
// broken connection with ErrConnLost. Like Submit it never blocks (a peer
// without a session waits in its queue while the pump dials) and ends t
// exactly once, possibly before it returns; with the node's pools warm it
// allocates nothing.
func (n *Node) Notify(t *xfer.Task, moved uint64) {
	n.active.Add(1)
	if n.closed.Load() {
		n.fail(t, xfer.ErrClosed)
		return
	}
	r, ok := t.Target.(*Remote)
	switch {
	case !ok || r == nil || r.node != n:
		n.fail(t, fmt.Errorf("%w: target is not a remote segment of this node", xfer.ErrInvalid))
		return
	case t.Req.Op != xfer.OpWrite || t.Notify == nil || len(t.Notify) > MaxNotify:
		n.fail(t, fmt.Errorf("%w: a notification (at most %d bytes, this one %d) rides only on a WRITE",
			xfer.ErrInvalid, MaxNotify, len(t.Notify)))
		return
	case r.rights&RightWrite == 0:
		n.fail(t, fmt.Errorf("%w: %s/%s opened with rights %v", xfer.ErrPermission, r.peer.id, r.name, r.rights))
		return
	}
	ts := n.taskPool.Get().(*taskState)
	ts.n, ts.t, ts.r, ts.op, ts.toff = n, t, r, xfer.OpWrite, t.Req.TargetOffset
	ts.notify = t.Notify
	ts.moved.Store(moved)
	n.start(ts) // nothing to send: the notification goes once a session takes it
}

// start sends ts, or queues it behind its peer's queue or for a session.
func (n *Node) start(ts *taskState) {
	t, r := ts.t, ts.r
	if t.Deadline.IsZero() {
		ts.deadline = time.Now().Add(n.cfg.RequestTimeout).UnixNano()
	} else {
		ts.deadline = t.Deadline.UnixNano()
	}
	ts.left.Store(1)
	p := r.peer
	p.mu.Lock()
	if p.head == nil && len(p.sess) > 0 {
		// Nothing waits ahead of it: send what fits now.
		p.mu.Unlock()
		if n.sendSome(ts) == sentAll {
			ts.stopSending(nil)
			return
		}
		p.mu.Lock()
		n.enqueueLocked(p, ts, true)
		p.mu.Unlock()
		return
	}
	n.enqueueLocked(p, ts, false)
	p.mu.Unlock()
}

// sendState is how far sendSome got with a task.
type sendState uint8

const (
	sentAll   sendState = iota // nothing left to send (or a failure stopped it)
	needRoom                   // the flow-control window is full
	needDials                  // the peer has no usable session
)

// sendSome sends ts's slices from ts.sent on for as long as the peer's
// session and window take them, without waiting. The sender's hold on ts
// stays with the caller, who drops it (stopSending) once it is done with
// ts: with sentAll at once, otherwise when it gives up the rest; ts.sent
// says where to resume.
func (n *Node) sendSome(ts *taskState) sendState {
	p := ts.r.peer
	length := uint64(len(ts.local))
	for ts.sent < length {
		if ts.err.Load() != nil {
			// A slice already failed: the task fails, the rest need not go.
			return sentAll
		}
		slice := uint64(p.slice.Load())
		if slice == 0 {
			return needDials // no session has told us its frame size
		}
		k := uint32(min(slice, length-ts.sent))
		ts.left.Add(1)
		st, err := n.sendSlice(ts, ts.sent, k)
		if err != nil || st != sentAll {
			ts.left.Add(-1)
			if err != nil {
				ts.setErr(err)
				return sentAll
			}
			return st
		}
		ts.sent += uint64(k)
	}
	return sentAll
}

// sendSlice sends k bytes at off of ts's range as one request. sentAll
// means it went out; needRoom / needDials that it did not (nothing taken);
// an error, whatever the state, that the task cannot go on (the node is
// closed).
func (n *Node) sendSlice(ts *taskState, off uint64, k uint32) (sendState, error) {
	r := ts.r
	pd := n.pendPool.Get().(*pending)
	pd.kind, pd.ts, pd.loff, pd.n = pkRead, ts, off, k
	typ := tReadReq
	if ts.op == xfer.OpWrite {
		pd.kind, typ = pkWrite, tWriteReq
	}
	pd.refs.Store(2)
	c, st, err := n.tryRegister(r.peer, pd, int64(k))
	if c == nil {
		pd.refs.Store(1)
		pd.release()
		return st, err
	}
	tok := r.cred.Load().token
	putHeader(pd.hdr[:], &header{typ: typ, id: pd.id, arg: ts.toff + off, n: k, metaLen: uint16(len(tok))})
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], tok
	nb := 2
	if typ == tWriteReq {
		pd.bufs[2] = ts.local[off : off+uint64(k)]
		nb = 3
		r.peer.bytesOut.Add(uint64(k))
	}
	c.send(pd, nb)
	return sentAll, nil
}

// tryRegister puts data request pd, of ln bytes, on the least-loaded of
// the peer's connections with room in its window and the peer's. It never
// waits: with no room it returns needRoom, with no session needDials, and
// an error once the node is closed.
func (n *Node) tryRegister(p *peer, pd *pending, ln int64) (*conn, sendState, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n.closed.Load() {
		return nil, needDials, xfer.ErrClosed
	}
	var best *conn
	live := false
	for i := range p.sess {
		c := p.sess[(p.rr+i)%len(p.sess)]
		if c.dropping {
			continue
		}
		live = true
		if c.inflight+ln <= c.window && (best == nil || c.inflight < best.inflight) {
			best = c
		}
	}
	if !live {
		return nil, needDials, nil
	}
	if best == nil || p.inflight+ln > n.cfg.MaxPeerInflightBytes {
		return nil, needRoom, nil
	}
	p.rr++
	pd.id = n.nextID.Add(1)
	pd.sent = time.Now().UnixNano()
	best.addLocked(pd)
	best.inflight += ln
	p.inflight += ln
	return best, sentAll, nil
}

// register puts control request pd (no credit) on one of the peer's
// connections, or fails when the peer has no session.
func (n *Node) register(p *peer, pd *pending) (*conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n.closed.Load() {
		return nil, xfer.ErrClosed
	}
	for i := range p.sess {
		c := p.sess[(p.rr+i)%len(p.sess)]
		if c.dropping {
			continue
		}
		p.rr++
		pd.id = n.nextID.Add(1)
		pd.sent = time.Now().UnixNano()
		c.addLocked(pd)
		return c, nil
	}
	return nil, errNoSession(p)
}

// errNoSession is a request's failure when p has no session: nothing is
// dialed for it.
func errNoSession(p *peer) error {
	return fmt.Errorf("%w: no session with peer %s", ErrConnLost, p.id)
}

func (n *Node) sendNotify(ts *taskState) error {
	if time.Now().UnixNano() > ts.deadline {
		return fmt.Errorf("%w: notification deadline passed before the data landed", xfer.ErrTimeout)
	}
	tok := ts.r.cred.Load().token
	pd := n.pendPool.Get().(*pending)
	pd.kind, pd.ts, pd.deadline = pkNotify, ts, ts.deadline
	pd.meta = binary.LittleEndian.AppendUint16(pd.meta[:0], uint16(len(tok)))
	pd.meta = append(append(pd.meta, tok...), ts.notify...)
	pd.refs.Store(2)
	c, err := n.register(ts.r.peer, pd)
	if err != nil {
		pd.refs.Store(1)
		pd.release()
		return err
	}
	putHeader(pd.hdr[:], &header{typ: tNotify, id: pd.id, metaLen: uint16(len(pd.meta))})
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], pd.meta
	c.send(pd, 2)
	return nil
}
