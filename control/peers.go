package control

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// maxSegmentName and maxPeerID bound the parts of "peer/segment".
const (
	maxSegmentName = 255
	maxPeerID      = 64
)

// exportView is the part of a connection's segment (a registered buffer or
// a range of its pool blocks) that peers reach under an exported name. It
// counts its own references so that unexporting waits for the peer
// requests still touching it before the range goes back to its owner.
type exportView struct {
	parent    xfer.MemSegment
	off, size uint64
	closed    atomic.Bool
	refs      atomic.Int64
}

var _ xfer.MemSegment = (*exportView)(nil)

func (v *exportView) ID() xfer.SegmentID { return v.parent.ID() }
func (v *exportView) Kind() xfer.Kind    { return v.parent.Kind() }
func (v *exportView) Size() uint64       { return v.size }
func (v *exportView) Bytes() []byte      { return v.parent.Bytes()[v.off : v.off+v.size] }

func (v *exportView) Acquire() bool {
	if v.closed.Load() {
		return false
	}
	v.refs.Add(1)
	if v.closed.Load() {
		v.refs.Add(-1)
		return false
	}
	if !v.parent.Acquire() {
		v.refs.Add(-1)
		return false
	}
	return true
}

func (v *exportView) Release() {
	v.parent.Release()
	v.refs.Add(-1)
}

// close refuses new references and waits up to limit for the ones held
// (peer requests copying into or out of the range); it reports whether
// they all ended.
func (v *exportView) close(limit time.Duration) bool {
	v.closed.Store(true)
	deadline := time.Now().Add(limit)
	for v.refs.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}

// export is one exported segment.
type export struct {
	name   string
	owner  *conn
	view   *exportView
	source xfer.SegmentID // the owner's buffer, or the pool
	rights uint8
	subs   map[*conn]struct{} // guarded by exportTable.mu
}

// exportTable is the daemon's exported segments by name.
type exportTable struct {
	// mu guards m and every export's subs. Lock order: exportTable.mu,
	// then a connection's noteQueue.mu.
	mu sync.Mutex
	m  map[string]*export
	// onEnd is called after an export ended (see SetUnexportHook).
	onEnd atomic.Pointer[UnexportHook]
}

// noteQueue is a connection's bounded queue of notifications.
type noteQueue struct {
	// mu guards q.
	mu sync.Mutex
	q  []wire.Notification
	// wake has room for one token: Deliver leaves one when it queues.
	wake chan struct{}
}

// remote is a peer's segment a connection opened.
type remote struct {
	seg       RemoteSegment
	peer      string
	name      string
	rights    uint8
	transport uint8
}

// Lookup returns the segment exported under name; the peer plane calls it
// for every request a peer makes.
func (s *Server) Lookup(name string) (xfer.MemSegment, error) {
	s.exp.mu.Lock()
	e := s.exp.m[name]
	s.exp.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("%w: no segment exported as %q", ErrNotFound, name)
	}
	return e.view, nil
}

// Granted reports the rights (wire.RightRead | wire.RightWrite) the segment
// exported as name grants to peers.
func (s *Server) Granted(name string) (uint8, bool) {
	s.exp.mu.Lock()
	defer s.exp.mu.Unlock()
	e := s.exp.m[name]
	if e == nil {
		return 0, false
	}
	return e.rights, true
}

// Deliver queues a notification a peer attached to a WRITE into the
// segment exported as name, for every connection subscribed to it. It
// fails, queueing nothing, when the name is not exported, nobody
// subscribed, or a subscriber's queue is full: the writer then gets a
// negative acknowledgement. It never blocks.
func (s *Server) Deliver(name string, payload []byte) error {
	if len(payload) > wire.MaxNotify {
		return fmt.Errorf("%w: notification of %d bytes (max %d)", ErrLimit, len(payload), wire.MaxNotify)
	}
	s.exp.mu.Lock()
	defer s.exp.mu.Unlock()
	e := s.exp.m[name]
	if e == nil {
		return fmt.Errorf("%w: no segment exported as %q", ErrNotFound, name)
	}
	if len(e.subs) == 0 {
		return fmt.Errorf("%w: nobody subscribed to %q", ErrNotFound, name)
	}
	limit := s.cfg.Limits.MaxNotifications
	for c := range e.subs {
		c.notes.mu.Lock()
		full := len(c.notes.q) >= limit
		c.notes.mu.Unlock()
		if full {
			return fmt.Errorf("%w: notification queue of connection %d is full (%d)", ErrLimit, c.id, limit)
		}
	}
	seg := []byte(name)
	for c := range e.subs {
		p := slices.Clone(payload)
		if p == nil {
			p = []byte{}
		}
		c.notes.mu.Lock()
		c.notes.q = append(c.notes.q, wire.Notification{Segment: seg, Payload: p})
		c.notes.mu.Unlock()
		select {
		case c.notes.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

func validRights(r uint8) bool { return r != 0 && r&^(wire.RightRead|wire.RightWrite) == 0 }

func (c *conn) exportSegment(m *wire.ExportSegmentRequest) error {
	name := string(m.Name)
	if len(name) > maxSegmentName || strings.Contains(name, "/") {
		return fmt.Errorf("%w: export name %q (1..%d bytes, no '/')", ErrMalformed, name, maxSegmentName)
	}
	if !validRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if len(c.exports) >= c.s.cfg.Limits.MaxExports {
		return fmt.Errorf("%w: %d segments exported", ErrLimit, len(c.exports))
	}
	id := xfer.SegmentID(m.Segment)
	off, n := m.Offset, m.Length
	var parent xfer.MemSegment
	if c.pool != nil && id == c.pool.ID() {
		if n == 0 || !c.blocks.coversRange(off, n) {
			return fmt.Errorf("%w: pool range [%d, +%d) is not held by this connection", ErrPermission, off, n)
		}
		parent = c.pool
	} else {
		c.mu.Lock()
		b, ok := c.buffers[id]
		c.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: buffer %d", ErrNotFound, id)
		}
		if n == 0 && off < b.Size() {
			n = b.Size() - off
		}
		if end := off + n; n == 0 || end < off || end > b.Size() {
			return fmt.Errorf("%w: range [%d, +%d) outside buffer %d of %d bytes", ErrMalformed, off, n, id, b.Size())
		}
		parent = b
	}
	e := &export{name: name, owner: c, view: &exportView{parent: parent, off: off, size: n}, source: id,
		rights: m.Rights, subs: make(map[*conn]struct{})}
	t := &c.s.exp
	t.mu.Lock()
	if _, dup := t.m[name]; dup {
		t.mu.Unlock()
		return fmt.Errorf("%w: segment name %q is exported already", xfer.ErrExists, name)
	}
	t.m[name] = e
	t.mu.Unlock()
	c.exports = append(c.exports, e)
	if cat := c.s.deps.Catalog; cat != nil {
		cat.Exported(name, n, m.Rights)
	}
	c.log.Info("segment exported", "name", name, "segment", id, "offset", off, "size", n, "rights", m.Rights)
	wire.SetResponse[wire.ExportSegmentResponse](&c.resp).Size = n
	return nil
}

func (c *conn) unexportSegment(m *wire.UnexportSegmentRequest) error {
	i := slices.IndexFunc(c.exports, func(e *export) bool { return e.name == string(m.Name) })
	if i < 0 {
		return fmt.Errorf("%w: this connection exports no %q", ErrNotFound, m.Name)
	}
	c.dropExport(i)
	wire.SetResponse[wire.UnexportSegmentResponse](&c.resp)
	return nil
}

// dropExport removes c.exports[i] from the table (its subscribers stop
// receiving) and waits for the peer requests still in its range.
func (c *conn) dropExport(i int) {
	e := c.exports[i]
	c.exports = slices.Delete(c.exports, i, i+1)
	t := &c.s.exp
	t.mu.Lock()
	delete(t.m, e.name)
	subs := e.subs
	e.subs = nil
	t.mu.Unlock()
	if cat := c.s.deps.Catalog; cat != nil {
		cat.Unexported(e.name)
	}
	for sc := range subs {
		sc.unsubscribed(e)
	}
	wait := c.s.cfg.ReleaseWait
	if c.s.isClosing() {
		// The peer plane is closed or closing with the daemon; a request
		// still inside the range keeps the memory it references alive
		// (its reference), and a pool range lingers (below).
		wait = 0
	}
	if !e.view.close(wait) {
		c.log.Warn("peer requests still in an unexported range", "name", e.name)
		if e.source == c.poolID() {
			c.lingering = append(c.lingering, e)
		}
	}
	if h := t.onEnd.Load(); h != nil {
		(*h)(e.name, e.view)
	}
	c.log.Info("segment unexported", "name", e.name)
}

// exported reports whether an export of c, or an unexported pool range a
// peer request still holds, overlaps [off, off+n) of seg.
func (c *conn) exported(seg xfer.SegmentID, off, n uint64) bool {
	overlaps := func(e *export) bool {
		return e.source == seg && off < e.view.off+e.view.size && e.view.off < off+n
	}
	for _, e := range c.exports {
		if overlaps(e) {
			return true
		}
	}
	c.lingering = slices.DeleteFunc(c.lingering, func(e *export) bool { return e.view.refs.Load() == 0 })
	return slices.ContainsFunc(c.lingering, overlaps)
}

// dropExportsOf unexports everything c exported from segment seg.
func (c *conn) dropExportsOf(seg xfer.SegmentID) {
	for i := len(c.exports) - 1; i >= 0; i-- {
		if c.exports[i].source == seg {
			c.dropExport(i)
		}
	}
}

func (c *conn) subscribe(m *wire.SubscribeRequest) error {
	name := string(m.Name)
	if len(c.subs) >= c.s.cfg.Limits.MaxExports {
		return fmt.Errorf("%w: %d subscriptions", ErrLimit, len(c.subs))
	}
	t := &c.s.exp
	t.mu.Lock()
	e := t.m[name]
	if e != nil && e.owner.tenant != c.tenant {
		// Another tenant's notifications carry its data: not for this
		// client, and not even that the name exists.
		e = nil
	}
	if e != nil {
		e.subs[c] = struct{}{}
	}
	t.mu.Unlock()
	if e == nil {
		return fmt.Errorf("%w: no segment exported as %q (by this tenant)", ErrNotFound, name)
	}
	c.smu.Lock()
	c.subs[e] = struct{}{}
	c.smu.Unlock()
	wire.SetResponse[wire.SubscribeResponse](&c.resp)
	return nil
}

// unsubscribed forgets e, which its owner unexported.
func (c *conn) unsubscribed(e *export) {
	c.smu.Lock()
	delete(c.subs, e)
	c.smu.Unlock()
}

// maxPollItems bounds one PollNotifications answer.
const maxPollItems = 1024

func (c *conn) pollNotifications(m *wire.PollNotificationsRequest) error {
	max := int(m.Max)
	if max <= 0 || max > maxPollItems {
		max = maxPollItems
	}
	// Keep the answer well inside a frame.
	budget := c.s.cfg.MaxFrame/2 - 64
	deadline := c.deadline(m.TimeoutMS)
	if m.TimeoutMS == 0 && c.req.Ctx.DeadlineMS == 0 {
		deadline = time.Now() // no timeout: do not wait
	}
	r := wire.SetResponse[wire.PollNotificationsResponse](&c.resp)
	for {
		c.notes.mu.Lock()
		k := 0
		for k < len(c.notes.q) && k < max {
			sz := len(c.notes.q[k].Segment) + len(c.notes.q[k].Payload) + 32
			if k > 0 && sz > budget {
				break
			}
			budget -= sz
			k++
		}
		r.Notifications = append(r.Notifications, c.notes.q[:k]...)
		clear(c.notes.q[:k])
		c.notes.q = c.notes.q[k:]
		if len(c.notes.q) == 0 {
			c.notes.q = nil
		}
		c.notes.mu.Unlock()
		if k > 0 {
			return nil
		}
		wait := time.Until(deadline)
		if wait <= 0 || c.s.draining.Load() {
			return nil
		}
		t := time.NewTimer(min(wait, waitSlice))
		select {
		case <-c.notes.wake:
		case <-t.C:
		case <-c.s.closing:
		}
		t.Stop()
	}
}

func (c *conn) openRemote(m *wire.OpenRemoteRequest) error {
	pp := c.s.deps.Peers
	if pp == nil {
		return fmt.Errorf("%w: no peer plane configured", ErrUnavailable)
	}
	peer, seg, ok := strings.Cut(string(m.Name), "/")
	if !ok || peer == "" || seg == "" || len(peer) > maxPeerID || len(seg) > maxSegmentName {
		return fmt.Errorf("%w: remote name %q (want peer/segment)", ErrMalformed, m.Name)
	}
	if !validRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if m.Transport > wire.TransportRDMA {
		return fmt.Errorf("%w: transport %d (want auto, tcp or rdma)", ErrMalformed, m.Transport)
	}
	c.mu.Lock()
	held := len(c.remotes)
	c.mu.Unlock()
	if held >= c.s.cfg.Limits.MaxExports {
		return fmt.Errorf("%w: %d remote segments open", ErrLimit, held)
	}
	var rs RemoteSegment
	var err error
	if lo, ok := pp.(LaneOpener); ok {
		rs, err = lo.OpenRemoteIn(OpenContext{Lane: string(c.req.Ctx.Lane), PolicyVersion: c.req.Ctx.PolicyVersion},
			peer, seg, m.Rights, m.Transport)
	} else {
		rs, err = pp.OpenRemote(peer, seg, m.Rights, m.Transport)
	}
	if err != nil {
		return err
	}
	id := c.s.deps.Registry.NextID()
	c.mu.Lock()
	c.remotes[id] = remote{seg: rs, peer: peer, name: seg, rights: m.Rights, transport: m.Transport}
	c.mu.Unlock()
	c.log.Info("remote segment opened", "peer", peer, "name", seg, "segment", id, "size", rs.Size(),
		"epoch", fmt.Sprintf("%#x", rs.Epoch()), "transport", wire.TransportName(m.Transport))
	*wire.SetResponse[wire.OpenRemoteResponse](&c.resp) = wire.OpenRemoteResponse{Segment: uint64(id), Size: rs.Size(), Epoch: rs.Epoch()}
	return nil
}

func (c *conn) closeRemote(m *wire.CloseRemoteRequest) error {
	id := xfer.SegmentID(m.Segment)
	c.mu.Lock()
	r, ok := c.remotes[id]
	delete(c.remotes, id)
	c.segGen.Add(1)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: remote segment %d", ErrNotFound, id)
	}
	wire.SetResponse[wire.CloseRemoteResponse](&c.resp)
	return r.seg.Close()
}

func (c *conn) peers() error {
	pp := c.s.deps.Peers
	if pp == nil {
		return fmt.Errorf("%w: no peer plane configured", ErrUnavailable)
	}
	wire.SetResponse[wire.PeersResponse](&c.resp).Peers = pp.Peers()
	return nil
}

// segmentsList reports the daemon's exported segments and the remote
// segments its connections opened.
func (c *conn) segmentsList() {
	var out []wire.SegmentInfo
	t := &c.s.exp
	t.mu.Lock()
	for _, e := range t.m {
		out = append(out, wire.SegmentInfo{Name: []byte(e.name), Segment: uint64(e.source), Size: e.view.size, Rights: e.rights})
	}
	t.mu.Unlock()
	c.s.mu.Lock()
	conns := make([]*conn, 0, len(c.s.conns))
	for sc := range c.s.conns {
		conns = append(conns, sc)
	}
	c.s.mu.Unlock()
	for _, sc := range conns {
		sc.mu.Lock()
		for id, r := range sc.remotes {
			out = append(out, wire.SegmentInfo{Name: []byte(r.name), Peer: []byte(r.peer), Segment: uint64(id),
				Size: r.seg.Size(), Rights: r.rights, Epoch: r.seg.Epoch(), Transport: r.transport})
		}
		sc.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b wire.SegmentInfo) int {
		if d := bytes.Compare(a.Peer, b.Peer); d != 0 {
			return d
		}
		return bytes.Compare(a.Name, b.Name)
	})
	wire.SetResponse[wire.SegmentsResponse](&c.resp).Segments = out
}

// notifyArgs is the positional Notify of the current Submit or Transfer
// for the engine (SubmitOptions.Notify): nil when the call carries none,
// else one entry per request, nil where a request carries none. Each
// payload is copied: the frame's buffer is reused for the next frame while
// the task, which holds its notification until it ends, is still in
// flight. Whether a request may carry one (a WRITE to a peer's segment)
// is its transport's to say, at its position.
func (c *conn) notifyArgs(notify [][]byte) [][]byte {
	if len(notify) == 0 {
		return nil
	}
	out := make([][]byte, len(notify))
	for i, p := range notify {
		if len(p) > 0 && c.codes[i] == tcproto.CodeOK {
			out[i] = slices.Clone(p)
		}
	}
	return out
}

// releasePeers drops what the connection holds of the peer plane:
// subscriptions, queued notifications, exports (waiting for peer requests
// in their ranges) and opened remote segments. It runs before the
// connection's buffers and pool blocks are released.
func (c *conn) releasePeers() {
	c.smu.Lock()
	subs := c.subs
	c.subs = map[*export]struct{}{}
	c.smu.Unlock()
	t := &c.s.exp
	t.mu.Lock()
	for e := range subs {
		if e.subs != nil {
			delete(e.subs, c)
		}
	}
	t.mu.Unlock()
	c.notes.mu.Lock()
	c.notes.q = nil
	c.notes.mu.Unlock()
	for i := len(c.exports) - 1; i >= 0; i-- {
		c.dropExport(i)
	}
	c.mu.Lock()
	rems := c.remotes
	c.remotes = map[xfer.SegmentID]remote{}
	c.segGen.Add(1)
	c.mu.Unlock()
	for _, r := range rems {
		r.seg.Close() //nolint:errcheck // forgetting a remote segment cannot fail in a way to act on
	}
}

// taskCode is codeForState, with the peer plane's errors mapped by the
// plane.
func (c *conn) taskCode(st xfer.State, err error) Code {
	if st == xfer.StateFailed && err != nil && c.s.deps.Peers != nil && CodeOf(err) == tcproto.CodeINTERNAL {
		if code, ok := c.s.deps.Peers.Code(err); ok {
			return code
		}
	}
	return codeForState(st, err)
}

func (c *conn) remoteCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.remotes)
}

func (c *conn) queuedNotes() int {
	c.notes.mu.Lock()
	defer c.notes.mu.Unlock()
	return len(c.notes.q)
}
