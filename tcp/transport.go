package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

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
// the write callback, one to whoever ends the request.
type pending struct {
	node     *Node
	kind     pendKind
	id       uint64
	ts       *taskState
	loff     uint64 // offset in ts.local
	n        uint32
	c        *conn // set when the frame went through the event loop
	sent     int64 // unix ns, for RequestTimeout
	deadline int64 // unix ns, notifications
	hdr      [hdrLen]byte
	bufs     [3][]byte
	refs     atomic.Int32
	cb       gnet.AsyncCallback // pd.writeDone, bound once

	// open and exchange requests
	doneCh chan struct{}
	err    error
	size   uint64
	token  []byte // the token; for an exchange, the answer's body
	status uint16 // exchange: the answer's status
}

func (pd *pending) isData() bool { return pd.kind == pkRead || pd.kind == pkWrite }

func (pd *pending) writeDone(gnet.Conn, error) error {
	c := pd.c
	c.wmu.Lock()
	c.asyncQueued--
	c.wmu.Unlock()
	pd.release()
	return nil
}

func (pd *pending) release() {
	if pd.refs.Add(-1) != 0 || !pd.isData() {
		return
	}
	n := pd.node
	cb := pd.cb
	*pd = pending{node: n, cb: cb}
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
	n         *Node
	t         *xfer.Task
	r         *Remote
	local     []byte // the task's local range
	toff      uint64
	op        xfer.Op
	left      atomic.Int64 // slices outstanding, +1 while Submit still sends
	moved     atomic.Uint64
	err       atomic.Pointer[error]
	notify    []byte
	deadline  int64
	hasNotify bool
}

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
	if err == nil && ts.hasNotify {
		if err = ts.n.sendNotify(ts); err == nil {
			return
		}
	}
	ts.complete(err)
}

func (ts *taskState) complete(err error) {
	n, t, moved := ts.n, ts.t, ts.moved.Load()
	ts.t, ts.r, ts.local, ts.notify, ts.hasNotify = nil, nil, nil, nil, false
	ts.err.Store(nil)
	ts.moved.Store(0)
	n.taskPool.Put(ts)
	t.Done(moved, err)
	n.active.Add(-1)
}

type notifyReq struct {
	payload  []byte
	deadline time.Time
}

// SetNotify attaches a notification to a WRITE task before it is
// submitted: once the task's data has landed, the target daemon delivers
// payload (at most MaxNotify bytes, copied here) through its
// Exporter.Deliver, and the task completes only on the target's positive
// ACK before deadline. A negative ACK fails it (ErrNotifyRejected), no ACK
// by the deadline ends it with xfer.ErrTimeout, a broken connection fails
// it (ErrConnLost). Submit consumes the entry when it dispatches the task;
// ClearNotify drops an entry for a task that will not be submitted.
func (n *Node) SetNotify(t *xfer.Task, payload []byte, deadline time.Time) error {
	if t == nil || len(payload) > MaxNotify || deadline.IsZero() {
		return fmt.Errorf("%w: notification of %d bytes (max %d) needs a task and a deadline", xfer.ErrInvalid, len(payload), MaxNotify)
	}
	if n.closed.Load() {
		return xfer.ErrClosed
	}
	nr := notifyReq{payload: append([]byte(nil), payload...), deadline: deadline}
	n.mu.Lock()
	if _, ok := n.notifies[t]; !ok {
		n.notifyCount.Add(1)
	}
	n.notifies[t] = nr
	n.mu.Unlock()
	return nil
}

// ClearNotify drops the notification attached to t, if any.
func (n *Node) ClearNotify(t *xfer.Task) { n.takeNotify(t) }

func (n *Node) takeNotify(t *xfer.Task) (notifyReq, bool) {
	if n.notifyCount.Load() == 0 {
		return notifyReq{}, false
	}
	n.mu.Lock()
	nr, ok := n.notifies[t]
	if ok {
		delete(n.notifies, t)
		n.notifyCount.Add(-1)
	}
	n.mu.Unlock()
	return nr, ok
}

// Cancel implements xfer.Transport. It is a no-op: every request ends
// within RequestTimeout (a connection with an older request is dropped)
// and every notification by its deadline.
func (n *Node) Cancel(*xfer.Task) {}

// Submit implements xfer.Transport. task.Local must be an xfer.MemSegment
// and task.Target a *Remote of this node. Submit sends each task's slices,
// waiting for flow-control room at most RequestTimeout; it dials a peer
// without a live session (bounded by HandshakeTimeout). Every task it
// returns in tasks[:n] ends with exactly one Done; validation failures end
// with a typed error.
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
	nr, hasNotify := n.takeNotify(t)
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
	if hasNotify && q.Op != xfer.OpWrite {
		n.fail(t, fmt.Errorf("%w: a notification rides only on a WRITE", xfer.ErrInvalid))
		return
	}
	if r.rights&need == 0 {
		n.fail(t, fmt.Errorf("%w: %s/%s opened with rights %v", xfer.ErrPermission, r.peer.id, r.name, r.rights))
		return
	}
	if err := n.ensureSession(r.peer); err != nil {
		n.fail(t, err)
		return
	}
	ts := n.taskPool.Get().(*taskState)
	ts.n, ts.t, ts.r, ts.op, ts.toff = n, t, r, q.Op, q.TargetOffset
	ts.local = lb[q.LocalOffset : q.LocalOffset+q.Length]
	if hasNotify {
		ts.hasNotify, ts.notify, ts.deadline = true, nr.payload, nr.deadline.UnixNano()
	}
	slice := uint64(r.peer.slice.Load())
	count := int64((q.Length + slice - 1) / slice)
	ts.left.Store(count + 1)
	var sent int64
	for off := uint64(0); off < q.Length; off += slice {
		if err := n.sendSlice(ts, off, uint32(min(slice, q.Length-off))); err != nil {
			ts.setErr(err)
			break
		}
		sent++
	}
	if sent < count {
		ts.left.Add(-(count - sent))
	}
	ts.part(0, nil)
}

func (n *Node) sendSlice(ts *taskState, off uint64, k uint32) error {
	r := ts.r
	pd := n.pendPool.Get().(*pending)
	pd.kind, pd.ts, pd.loff, pd.n = pkRead, ts, off, k
	typ := tReadReq
	if ts.op == xfer.OpWrite {
		pd.kind, typ = pkWrite, tWriteReq
	}
	pd.refs.Store(2)
	c, err := n.register(r.peer, pd, int64(k), true)
	if err != nil {
		pd.refs.Store(1)
		pd.release()
		return err
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
	return nil
}

// send writes pd's frame on a client connection: straight to the socket
// when nothing is queued on the event loop, otherwise (or for the rest of
// a partial write) through the loop, keeping frames in order. It drops the
// write reference of pd when the bytes are in the kernel or in gnet's
// buffer.
func (c *conn) send(pd *pending, nb int) {
	bufs := pd.bufs[:nb]
	c.wmu.Lock()
	if c.fdClosed {
		// Closed under us; the close ends the request.
		c.wmu.Unlock()
		pd.release()
		return
	}
	if !c.asyncMode {
		total := 0
		for _, b := range bufs {
			total += len(b)
		}
		var n int
		var err error
		for {
			n, err = unix.Writev(c.fd, bufs)
			if err != unix.EINTR {
				break
			}
		}
		if err == nil && n == total {
			c.wmu.Unlock()
			pd.release()
			return
		}
		if err != nil && err != unix.EAGAIN {
			c.wmu.Unlock()
			// The connection is broken; its close ends the request.
			c.n.log.Debug("peer connection write failed", "peer", c.peer.id, "err", err)
			_ = c.g.Close()
			pd.release()
			return
		}
		if n > 0 {
			bufs = trimIovec(bufs, n)
		}
	}
	c.asyncMode = true
	c.asyncQueued++
	pd.c = c
	c.wmu.Unlock()
	if err := c.g.AsyncWritev(bufs, pd.cb); err != nil {
		// The loop is gone; so is the connection, whose close ends the
		// request.
		c.wmu.Lock()
		c.asyncQueued--
		c.wmu.Unlock()
		pd.release()
	}
}

// trimIovec drops the first n bytes of bufs, in place.
func trimIovec(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// register puts pd on one of the peer's connections. Data requests take
// credit (ln bytes) on the least-loaded connection with room, waiting for
// room at most RequestTimeout.
func (n *Node) register(p *peer, pd *pending, ln int64, credit bool) (*conn, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		p.mu.Lock()
		if n.closed.Load() {
			p.mu.Unlock()
			return nil, xfer.ErrClosed
		}
		if len(p.sess) == 0 {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: no session with peer %s", ErrConnLost, p.id)
		}
		var best *conn
		for i := range p.sess {
			c := p.sess[(p.rr+i)%len(p.sess)]
			if c.dropping {
				continue
			}
			if !credit {
				best = c
				break
			}
			if c.inflight+ln <= c.window && (best == nil || c.inflight < best.inflight) {
				best = c
			}
		}
		if best != nil && (!credit || p.inflight+ln <= n.cfg.MaxPeerInflightBytes) {
			p.rr++
			pd.id = n.nextID.Add(1)
			pd.sent = time.Now().UnixNano()
			best.reqs[pd.id] = pd
			if credit {
				best.inflight += ln
				p.inflight += ln
			}
			p.mu.Unlock()
			return best, nil
		}
		if p.wake == nil {
			p.wake = make(chan struct{})
		}
		w := p.wake
		p.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(n.cfg.RequestTimeout)
		}
		select {
		case <-w:
		case <-timer.C:
			return nil, fmt.Errorf("%w: no flow-control room toward %s within %v", xfer.ErrTimeout, p.id, n.cfg.RequestTimeout)
		case <-n.done:
			return nil, xfer.ErrClosed
		}
	}
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
	pd.cb = pd.writeDone
	pd.refs.Store(2)
	c, err := n.register(ts.r.peer, pd, 0, false)
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
	pd.cb = pd.writeDone
	pd.refs.Store(2)
	c, err := n.register(p, pd, 0, false)
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
			if dropLate && len(c.timedOut) < 4096 {
				if c.timedOut == nil {
					c.timedOut = make(map[uint64]struct{})
				}
				c.timedOut[pd.id] = struct{}{}
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

// ensureSession makes sure the peer has outbound connections, dialing them
// when it has none; concurrent callers share one dial.
func (n *Node) ensureSession(p *peer) error {
	for {
		p.mu.Lock()
		if len(p.sess) > 0 {
			p.mu.Unlock()
			return nil
		}
		if ch := p.dialing; ch != nil {
			p.mu.Unlock()
			select {
			case <-ch:
			case <-n.done:
				return xfer.ErrClosed
			}
			p.mu.Lock()
			err, live := p.dialErr, len(p.sess) > 0
			p.mu.Unlock()
			if live {
				return nil
			}
			if err != nil {
				return err
			}
			continue
		}
		ch := make(chan struct{})
		p.dialing = ch
		p.mu.Unlock()
		err := n.dial(p)
		p.mu.Lock()
		p.dialing, p.dialErr = nil, err
		close(ch)
		p.mu.Unlock()
		return err
	}
}

func (n *Node) dial(p *peer) error {
	dp, ok := n.dir.Lookup(p.id)
	if !ok || dp.Addr == "" {
		return fmt.Errorf("%w: %q", ErrUnknownPeer, p.id)
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
	if _, known := n.dir.Lookup(p.id); !known {
		upd.Addr = addr
	}
	if err := n.dir.Update(upd); err != nil {
		n.log.Warn("directory update", "peer", p.id, "err", err)
	}
}

// dialOne connects, authenticates and hands the connection to the event
// loops.
func (n *Node) dialOne(p *peer, addr string) (*conn, hello, error) {
	d := net.Dialer{Timeout: n.cfg.HandshakeTimeout}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, hello{}, fmt.Errorf("%w: dial %s at %s: %w", ErrConnLost, p.id, addr, err)
	}
	hs, err := n.clientHandshake(nc, p)
	if err != nil {
		nc.Close()
		return nil, hs, err
	}
	c := &conn{n: n, role: roleClient, created: time.Now(), peer: p, epoch: hs.epoch, reqs: make(map[uint64]*pending),
		window: min(n.cfg.MaxInflightBytes, int64(min(hs.window, 1<<62)))}
	n.lifeMu.RLock()
	if n.closed.Load() {
		n.lifeMu.RUnlock()
		nc.Close()
		return nil, hs, xfer.ErrClosed
	}
	_, err = n.cli.EnrollContext(nc, c)
	n.lifeMu.RUnlock()
	if err != nil || c.g == nil {
		return nil, hs, fmt.Errorf("%w: enroll connection to %s: %v", ErrConnLost, p.id, err)
	}
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
