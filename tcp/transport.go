package tcp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/xfer"
)

// Remote is a segment of a peer daemon, opened with Node.Open. It
// implements xfer.Segment with Kind() == xfer.KindRemote and carries the
// capability token its owner issued; every data request presents it. The
// token expires after the owner's TokenTTL; the node renews it before then
// (tokens.go) for as long as the owner still grants it. It dies with the
// owner's epoch: requests then fail with xfer.ErrPermission and the segment
// must be opened again.
type Remote struct {
	node   *Node
	peer   *peer
	name   string
	id     xfer.SegmentID
	size   uint64
	rights Rights
	epoch  uint64
	cred   atomic.Pointer[credential]
	// renewing is set while a renewal is in flight; renewAfter (unix ns)
	// holds the next attempt back after a failed one.
	renewing   atomic.Bool
	renewAfter atomic.Int64
	closed     atomic.Bool
	refs       atomic.Int64
}

// credential is a Remote's current token: the bytes requests present,
// when it expires and when it was issued (as this node saw it).
type credential struct {
	token  []byte
	expiry int64
	got    int64
}

var _ xfer.Segment = (*Remote)(nil)

// ID implements xfer.Segment; ids are unique within this node.
func (r *Remote) ID() xfer.SegmentID { return r.id }

// Kind implements xfer.Segment.
func (r *Remote) Kind() xfer.Kind { return xfer.KindRemote }

// Size implements xfer.Segment.
func (r *Remote) Size() uint64 { return r.size }

// Acquire implements xfer.Segment; false once the Remote or its Node is
// closed.
func (r *Remote) Acquire() bool {
	if r.closed.Load() || r.node.closed.Load() {
		return false
	}
	r.refs.Add(1)
	return true
}

// Release implements xfer.Segment.
func (r *Remote) Release() { r.refs.Add(-1) }

// Peer is the owning daemon's id.
func (r *Remote) Peer() string { return r.peer.id }

// Name is the segment's name on its owner.
func (r *Remote) Name() string { return r.name }

// Rights are what the token grants.
func (r *Remote) Rights() Rights { return r.rights }

// Epoch is the owner's epoch the token is bound to.
func (r *Remote) Epoch() uint64 { return r.epoch }

// Close forgets the segment; later Acquire calls fail.
func (r *Remote) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.node.mu.Lock()
		delete(r.node.remotes, r)
		r.node.mu.Unlock()
	}
	return nil
}

type pendKind uint8

const (
	pkRead pendKind = iota + 1
	pkWrite
	pkOpen
	pkNotify
	pkExchange
)

// pending is one request on the wire, registered in its connection's
// table until answered. Data requests are pooled: one reference belongs to
// the frame's write (writer.go), one to whoever ends the request.
type pending struct {
	node     *Node
	kind     pendKind
	id       uint64
	ts       *taskState
	loff     uint64 // offset in ts.local
	n        uint32
	sent     int64 // unix ns, for RequestTimeout
	deadline int64 // unix ns, notifications
	due      int64 // unix ns: when the reaper looks at it (reaper.go); guarded by the peer's mu
	dslot    int32 // its slot in its connection's due heap
	hdr      [hdrLen]byte
	bufs     [3][]byte
	refs     atomic.Int32
	// iov is what of bufs is still to be written and wnext the next frame
	// in its connection's write queue (writer.go); guarded by the
	// connection's wmu while queued.
	iov   [][]byte
	wnext *pending

	// open and exchange requests
	doneCh chan struct{}
	err    error
	size   uint64
	token  []byte // the token; for an exchange, the answer's body
	status uint16 // exchange: the answer's status
}

func (pd *pending) isData() bool { return pd.kind == pkRead || pd.kind == pkWrite }

func (pd *pending) release() {
	if pd.refs.Add(-1) != 0 || !pd.isData() {
		return
	}
	n := pd.node
	*pd = pending{node: n}
	n.pendPool.Put(pd)
}

// finish ends a request taken out of its connection's table.
func (pd *pending) finish(moved uint64, err error) {
	switch pd.kind {
	case pkRead, pkWrite:
		ts := pd.ts
		pd.release()
		ts.part(moved, err)
	case pkNotify:
		pd.ts.complete(err)
	case pkOpen, pkExchange:
		pd.err = err
		close(pd.doneCh)
	}
}

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
	n.active.Add(-1)
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
			n.active.Add(-1)
			return i, xfer.ErrClosed
		}
		n.dispatch(t)
	}
	return len(tasks), nil
}

func (n *Node) fail(t *xfer.Task, err error) {
	t.Done(0, err)
	n.active.Add(-1)
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
	return nil, fmt.Errorf("%w: no session with peer %s", ErrConnLost, p.id)
}

func (n *Node) sendNotify(ts *taskState) error {
	if time.Now().UnixNano() > ts.deadline {
		return fmt.Errorf("%w: notification deadline passed before the data landed", xfer.ErrTimeout)
	}
	tok := ts.r.cred.Load().token
	meta := make([]byte, 0, 2+len(tok)+len(ts.notify))
	meta = binary.LittleEndian.AppendUint16(meta, uint16(len(tok)))
	meta = append(append(meta, tok...), ts.notify...)
	pd := &pending{node: n, kind: pkNotify, ts: ts, deadline: ts.deadline}
	pd.refs.Store(2)
	c, err := n.register(ts.r.peer, pd)
	if err != nil {
		return err
	}
	putHeader(pd.hdr[:], &header{typ: tNotify, id: pd.id, metaLen: uint16(len(meta))})
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], meta
	c.send(pd, 2)
	return nil
}

// Open asks peer for segment with rights and returns it as a Remote. The
// owner answers with the size and a signed capability token.
func (n *Node) Open(peerID, segment string, rights Rights) (*Remote, error) {
	if n.closed.Load() {
		return nil, xfer.ErrClosed
	}
	if segment == "" || len(segment) > maxNameLen || rights == 0 || rights&^(RightRead|RightWrite) != 0 {
		return nil, fmt.Errorf("%w: open %q with rights %v", xfer.ErrInvalid, segment, rights)
	}
	if peerID == n.cfg.DaemonID {
		return nil, fmt.Errorf("%w: %q is this daemon", xfer.ErrInvalid, peerID)
	}
	p, err := n.peerFor(peerID)
	if err != nil {
		return nil, err
	}
	cred, t, size, err := n.openToken(p, segment, rights)
	if err != nil {
		return nil, err
	}
	r := &Remote{node: n, peer: p, name: segment, id: xfer.SegmentID(n.segID.Add(1)), size: size,
		rights: rights, epoch: t.epoch}
	r.cred.Store(cred)
	n.mu.Lock()
	n.remotes[r] = struct{}{}
	n.mu.Unlock()
	return r, nil
}

// roundTrip sends one control request (h with meta) to p and waits up to
// timeout for its answer, which it returns. On timeout it takes the request
// back and returns nil; with dropLate, the id is remembered so that an
// answer arriving later is dropped rather than taken for a protocol error.
func (n *Node) roundTrip(p *peer, kind pendKind, h header, meta []byte, timeout time.Duration, dropLate bool) (*pending, error) {
	pd := &pending{node: n, kind: kind, doneCh: make(chan struct{})}
	pd.refs.Store(2)
	c, err := n.register(p, pd)
	if err != nil {
		return nil, err
	}
	h.id, h.metaLen = pd.id, uint16(len(meta))
	putHeader(pd.hdr[:], &h)
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], meta
	c.send(pd, 2)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-pd.doneCh:
	case <-timer.C:
		p.mu.Lock()
		if c.reqs[pd.id] == pd {
			c.takeLocked(pd)
			if dropLate {
				c.rememberLateLocked(pd.id)
			}
			p.mu.Unlock()
			return nil, nil
		}
		p.mu.Unlock()
		<-pd.doneCh
	}
	return pd, nil
}

func (n *Node) peerFor(id string) (*peer, error) {
	if _, ok := n.dir.Lookup(id); !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPeer, id)
	}
	return n.peer(id, true), nil
}

// dial opens the peer's session: ConnsPerPeer connections, each dialed and
// authenticated within HandshakeTimeout. Only the peer's pump calls it.
func (n *Node) dial(p *peer) error {
	dp, ok := n.dir.Lookup(p.id)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownPeer, p.id)
	}
	if dp.Addr == "" {
		return fmt.Errorf("%w: %q has no address yet (it is accepted when it dials in, and tells its address then)", ErrUnknownPeer, p.id)
	}
	conns := make([]*conn, 0, n.cfg.ConnsPerPeer)
	closeAll := func() {
		for _, c := range conns {
			_ = c.g.Close()
		}
	}
	var hs hello
	for i := 0; i < n.cfg.ConnsPerPeer; i++ {
		c, h, err := n.dialOne(p, dp.Addr)
		if err == nil && i > 0 && h.epoch != hs.epoch {
			_ = c.g.Close()
			err = fmt.Errorf("%w: peer %s changed epoch while we dialed", ErrProtocol, p.id)
		}
		if err != nil {
			closeAll()
			p.errs.Add(1)
			return err
		}
		hs = h
		conns = append(conns, c)
	}
	p.mu.Lock()
	old := p.adoptEpochLocked(hs.epoch)
	p.blob = hs.blob
	p.slice.Store(int64(min(n.cfg.SliceSize, int(hs.maxFrame), int(min(hs.window, 1<<30)))))
	for _, c := range conns {
		if !c.closed {
			p.sess = append(p.sess, c)
		}
	}
	p.wakeLocked()
	p.mu.Unlock()
	n.peerSeen(p, hs.addr, hs.epoch, old)
	n.log.Info("peer session open", "peer", p.id, "addr", dp.Addr, "epoch", fmt.Sprintf("%#x", hs.epoch), "conns", len(conns))
	return nil
}

// peerSeen closes what a new epoch replaced and records the epoch.
func (n *Node) peerSeen(p *peer, addr string, epoch uint64, old []*conn) {
	if len(old) > 0 {
		n.log.Info("peer has a new epoch: its old session is closed", "peer", p.id, "epoch", fmt.Sprintf("%#x", epoch), "closed_conns", len(old))
	}
	for _, c := range old {
		_ = c.g.Close()
	}
	upd := directory.Peer{ID: p.id, Epoch: epoch}
	if dp, known := n.dir.Lookup(p.id); known && dp.Addr == "" {
		// Listed without an address: the one it advertises is where to
		// dial it.
		upd.Addr = addr
	}
	if err := n.dir.Update(upd); err != nil {
		n.log.Warn("directory update", "peer", p.id, "err", err)
	}
}

// dialOne connects, authenticates and hands the connection to the event
// loops.
func (n *Node) dialOne(p *peer, addr string) (*conn, hello, error) {
	d := net.Dialer{Timeout: n.cfg.HandshakeTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: peerKeepAlive, Interval: peerKeepAlive / 5, Count: 5}}
	nc, err := d.DialContext(n.ctx, "tcp", addr)
	if err != nil {
		if n.closed.Load() {
			return nil, hello{}, xfer.ErrClosed
		}
		return nil, hello{}, fmt.Errorf("%w: dial %s at %s: %w", ErrConnLost, p.id, addr, err)
	}
	// Close interrupts a handshake the peer never answers.
	stop := context.AfterFunc(n.ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	hs, err := n.clientHandshake(nc, p)
	stop()
	if err != nil {
		nc.Close()
		if n.closed.Load() {
			return nil, hs, xfer.ErrClosed
		}
		return nil, hs, err
	}
	c := &conn{n: n, role: roleClient, created: time.Now(), peer: p, epoch: hs.epoch, reqs: make(map[uint64]*pending),
		window: min(n.cfg.MaxInflightBytes, int64(min(hs.window, 1<<62))), wkick: make(chan struct{}, 1)}
	// The writer's own descriptor, taken before gnet takes the socket
	// (writer.go).
	if c.wfd, err = writerFD(nc); err != nil {
		nc.Close()
		return nil, hs, fmt.Errorf("%w: connection to %s: %w", ErrConnLost, p.id, err)
	}
	n.lifeMu.RLock()
	if n.closed.Load() {
		n.lifeMu.RUnlock()
		nc.Close()
		c.closeWriterFD()
		return nil, hs, xfer.ErrClosed
	}
	_, err = n.cli.EnrollContext(nc, c)
	if err != nil || c.g == nil {
		n.lifeMu.RUnlock()
		c.closeWriterFD()
		return nil, hs, fmt.Errorf("%w: enroll connection to %s: %v", ErrConnLost, p.id, err)
	}
	n.writerWG.Add(1)
	go c.writer()
	n.lifeMu.RUnlock()
	return c, hs, nil
}

func (h *cliHandler) OnOpen(g gnet.Conn) ([]byte, gnet.Action) {
	if c, ok := g.Context().(*conn); ok {
		c.g, c.fd = g, g.Fd()
	}
	return nil, gnet.None
}

// hello is what this node says about itself in a handshake.
func (n *Node) hello() hello {
	h := hello{id: n.cfg.DaemonID, epoch: n.epoch, addr: n.addr, blob: n.cfg.Blob,
		maxFrame: uint32(n.cfg.MaxFrame), window: uint64(n.cfg.MaxInflightBytes)}
	_, _ = rand.Read(h.nonce[:])
	return h
}

// clientHandshake runs the dialing side of the handshake on the plain
// connection, before it joins an event loop.
func (n *Node) clientHandshake(nc net.Conn, p *peer) (hello, error) {
	_ = nc.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	hc := n.hello()
	metaC := hc.append(nil)
	if err := writeRaw(nc, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC); err != nil {
		return hello{}, fmt.Errorf("%w: handshake with %s: %w", ErrConnLost, p.id, err)
	}
	h, meta, err := n.readRaw(nc)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	if h.typ == tRefuse {
		n.log.Warn("peer refused us", "peer", p.id, "reason", string(meta))
		return hello{}, fmt.Errorf("%w: %s: %s", ErrRefused, p.id, meta)
	}
	if h.typ != tHelloReply {
		return hello{}, fmt.Errorf("%w: handshake with %s: frame %d", ErrProtocol, p.id, h.typ)
	}
	hs, mac, err := decodeHello(meta, true)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	body := meta[:len(meta)-macLen]
	refuse := func(reason string, err error) (hello, error) {
		n.log.Warn("refusing peer", "peer", p.id, "reason", reason, "epoch", fmt.Sprintf("%#x", hs.epoch))
		_ = writeRaw(nc, &header{typ: tRefuse, metaLen: uint16(len(reason))}, []byte(reason))
		p.errs.Add(1)
		return hello{}, fmt.Errorf("%w: %s: %s", err, p.id, reason)
	}
	if !hmac.Equal(mac, handshakeMAC(n.hsKey, labelServer, metaC, body)) {
		return refuse("authentication failed (wrong cluster key?)", ErrAuth)
	}
	if hs.id != p.id {
		return refuse(fmt.Sprintf("answered as daemon %q", hs.id), ErrAuth)
	}
	p.mu.Lock()
	stale := p.isRetiredLocked(hs.epoch)
	p.mu.Unlock()
	if stale {
		return refuse("stale epoch", ErrStaleEpoch)
	}
	auth := handshakeMAC(n.hsKey, labelClient, metaC, body)
	if err := writeRaw(nc, &header{typ: tAuth, metaLen: macLen}, auth); err != nil {
		return hello{}, fmt.Errorf("%w: handshake with %s: %w", ErrConnLost, p.id, err)
	}
	h, meta, err = n.readRaw(nc)
	if err != nil {
		return hello{}, fmt.Errorf("handshake with %s: %w", p.id, err)
	}
	switch h.typ {
	case tAuthOK:
	case tRefuse:
		n.log.Warn("peer refused us", "peer", p.id, "reason", string(meta))
		return hello{}, fmt.Errorf("%w: %s: %s", ErrRefused, p.id, meta)
	default:
		return hello{}, fmt.Errorf("%w: handshake with %s: frame %d", ErrProtocol, p.id, h.typ)
	}
	_ = nc.SetDeadline(time.Time{})
	return hs, nil
}

func writeRaw(w io.Writer, h *header, meta []byte) error {
	b := make([]byte, hdrLen, hdrLen+len(meta))
	putHeader(b, h)
	_, err := w.Write(append(b, meta...))
	return err
}

func (n *Node) readRaw(r io.Reader) (header, []byte, error) {
	var hb [hdrLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return header{}, nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	h, err := decodeHeader(hb[:], n.lim)
	if err != nil {
		return h, nil, err
	}
	if h.payloadLen() != 0 {
		return h, nil, fmt.Errorf("%w: payload during handshake", ErrProtocol)
	}
	meta := make([]byte, h.metaLen)
	if _, err := io.ReadFull(r, meta); err != nil {
		return h, nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return h, meta, nil
}
