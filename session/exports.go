package session

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// remote is a peer's segment a connection opened.
type remote struct {
	seg       RemoteSegment
	peer      string
	name      string
	rights    uint8
	transport uint8
}

// ExportSegment exports a range of the session's pool blocks or of a
// buffer of it to peers, under a name.
func (c *Session) ExportSegment(m *wire.ExportSegmentRequest, r *wire.Response) error {
	name := string(m.Name)
	if err := peer.CheckName(name); err != nil {
		return err
	}
	if !peer.ValidRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if len(c.exports) >= c.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d segments exported", ErrLimit, len(c.exports))
	}
	id := xfer.SegmentID(m.Segment)
	off, n := m.Offset, m.Length
	var parent xfer.MemSegment
	if c.pool != nil && id == c.pool.ID() {
		if n == 0 || !c.blocks.CoversRange(off, n) {
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
		if xfer.IsUnsealed(b) {
			// Peers' requests are served on connections they share with
			// others' (see package tcp): a fault there is no single
			// request's.
			return fmt.Errorf("%w: buffer %d cannot be exported", xfer.ErrUnsealed, id)
		}
		if n == 0 && off < b.Size() {
			n = b.Size() - off
		}
		parent = b
	}
	e, err := c.h.Exports.ExportTo(name, c.tenant, m.Grants, parent, off, n, m.Rights)
	if err != nil {
		return err
	}
	c.exports = append(c.exports, e)
	c.log.Info("segment exported", "name", name, "segment", id, "offset", off, "size", n, "rights", m.Rights, "grants", m.Grants)
	wire.SetResponse[wire.ExportSegmentResponse](r).Size = n
	return nil
}

// UnexportSegment ends one of the session's exports.
func (c *Session) UnexportSegment(m *wire.UnexportSegmentRequest, r *wire.Response) error {
	i := slices.IndexFunc(c.exports, func(e *peer.Export) bool { return e.Name() == string(m.Name) })
	if i < 0 {
		return fmt.Errorf("%w: this connection exports no %q", ErrNotFound, m.Name)
	}
	c.dropExport(i)
	wire.SetResponse[wire.UnexportSegmentResponse](r)
	return nil
}

// dropExport ends s.exports[i] (its subscribers stop receiving, what RDMA
// registered for it is revoked) after the peer requests still in its
// range, waiting up to ReleaseWait for them.
func (c *Session) dropExport(i int) {
	e := c.exports[i]
	c.exports = slices.Delete(c.exports, i, i+1)
	wait := c.h.ReleaseWait
	if c.h.closing() {
		// The peer plane is closed or closing with the daemon; a request
		// still inside the range keeps the memory it references alive
		// (its reference), and a pool range lingers (below).
		wait = 0
	}
	if !e.End(wait) {
		c.h.warns().lingeringExport.Event(append(c.who(), slog.String("name", e.Name()))...)
		if e.Source() == c.poolID() {
			c.lingering = append(c.lingering, e)
		}
	}
	c.log.Info("segment unexported", "name", e.Name())
}

// exported reports whether an export of c, or an unexported pool range a
// peer request still holds, overlaps [off, off+n) of seg.
func (c *Session) exported(seg xfer.SegmentID, off, n uint64) bool {
	overlaps := func(e *peer.Export) bool { return e.Overlaps(seg, off, n) }
	if slices.ContainsFunc(c.exports, overlaps) {
		return true
	}
	c.lingering = slices.DeleteFunc(c.lingering, func(e *peer.Export) bool { return !e.Busy() })
	return slices.ContainsFunc(c.lingering, overlaps)
}

// dropExportsOf unexports everything c exported from segment seg.
func (c *Session) dropExportsOf(seg xfer.SegmentID) {
	for i := len(c.exports) - 1; i >= 0; i-- {
		if c.exports[i].Source() == seg {
			c.dropExport(i)
		}
	}
}

// Subscribe subscribes the session to an export's notifications.
func (c *Session) Subscribe(m *wire.SubscribeRequest, r *wire.Response) error {
	if n := c.inbox.Subscriptions(); n >= c.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d subscriptions", ErrLimit, n)
	}
	if err := c.h.Exports.Subscribe(string(m.Name), c.tenant, c.inbox); err != nil {
		return err
	}
	wire.SetResponse[wire.SubscribeResponse](r)
	return nil
}

// maxPollItems bounds one PollNotifications answer.
const maxPollItems = 1024

// PollNotifications answers with what the session's inbox holds,
// sleeping until a notification is queued (or the call's deadline, or a
// drain) when it holds none.
func (c *Session) PollNotifications(ctx *wire.Context, m *wire.PollNotificationsRequest, r *wire.Response) error {
	max := int(m.Max)
	if max <= 0 || max > maxPollItems {
		max = maxPollItems
	}
	// Keep the answer well inside a frame.
	budget := c.h.MaxFrame/2 - 64
	deadline := c.deadline(ctx, m.TimeoutMS)
	if m.TimeoutMS == 0 && ctx.DeadlineMS == 0 {
		deadline = time.Now() // no timeout: do not wait
	}
	a := wire.SetResponse[wire.PollNotificationsResponse](r)
	for {
		a.Notifications = c.inbox.Take(a.Notifications, max, budget)
		if len(a.Notifications) > 0 || c.h.Draining() || !time.Now().Before(deadline) {
			return nil
		}
		if c.clientGone() {
			return errClientGone
		}
		// In slices, so that a client that hung up is noticed.
		step := deadline
		if t := time.Now().Add(waitSlice); t.Before(step) {
			step = t
		}
		if !c.inbox.Wait(step, c.h.Quiesced) {
			select {
			case <-c.h.Quiesced:
				return nil
			default:
			}
		}
	}
}

// OpenRemote opens a segment of a peer daemon for the session.
func (c *Session) OpenRemote(ctx *wire.Context, m *wire.OpenRemoteRequest, r *wire.Response) error {
	pp := c.h.Peers
	if pp == nil {
		return fmt.Errorf("%w: no peer plane configured", ErrUnavailable)
	}
	peerID, owner, seg, err := peer.SplitRemote(string(m.Name))
	if err != nil {
		return err
	}
	if !peer.ValidRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if m.Transport > wire.TransportRDMA {
		return fmt.Errorf("%w: transport %d (want auto, tcp or rdma)", ErrMalformed, m.Transport)
	}
	c.mu.Lock()
	held := len(c.remotes)
	c.mu.Unlock()
	if held >= c.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d remote segments open", ErrLimit, held)
	}
	rs, err := pp.OpenRemote(OpenContext{Lane: string(ctx.Lane), PolicyVersion: ctx.PolicyVersion, Tenant: c.tenant, Owner: owner},
		peerID, seg, m.Rights, m.Transport)
	if err != nil {
		return err
	}
	id := c.h.Registry.NextID()
	c.mu.Lock()
	listed := seg // as "peer/" + listed names it again
	if owner != "" {
		listed = owner + "/" + seg
	}
	c.remotes[id] = remote{seg: rs, peer: peerID, name: listed, rights: m.Rights, transport: m.Transport}
	c.mu.Unlock()
	c.log.Info("remote segment opened", "peer", peerID, "name", listed, "segment", id, "size", rs.Size(),
		"epoch", fmt.Sprintf("%#x", rs.Epoch()), "transport", wire.TransportName(m.Transport))
	*wire.SetResponse[wire.OpenRemoteResponse](r) = wire.OpenRemoteResponse{Segment: uint64(id), Size: rs.Size(), Epoch: rs.Epoch()}
	return nil
}

// CloseRemote closes a remote segment the session opened.
func (c *Session) CloseRemote(m *wire.CloseRemoteRequest, r *wire.Response) error {
	id := xfer.SegmentID(m.Segment)
	c.mu.Lock()
	rem, ok := c.remotes[id]
	delete(c.remotes, id)
	c.segGen.Add(1)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: remote segment %d", ErrNotFound, id)
	}
	wire.SetResponse[wire.CloseRemoteResponse](r)
	return rem.seg.Close()
}

// notifyArgs is the positional Notify of the current Submit or Transfer
// for the engine (SubmitOptions.Notify): nil when the call carries none,
// else one entry per request, nil where a request carries none. Each
// payload is copied: the frame's buffer is reused for the next frame while
// the task, which holds its notification until it ends, is still in
// flight. Whether a request may carry one (a WRITE to a peer's segment)
// is its transport's to say, at its position.
func (c *Session) notifyArgs(notify [][]byte) [][]byte {
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
func (c *Session) releasePeers() {
	c.inbox.Close()
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

func (c *Session) remoteCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.remotes)
}

// Remotes appends to dst the remote segments the session opened.
func (c *Session) Remotes(dst []wire.SegmentInfo) []wire.SegmentInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, r := range c.remotes {
		dst = append(dst, wire.SegmentInfo{Name: []byte(r.name), Peer: []byte(r.peer), Segment: uint64(id),
			Size: r.seg.Size(), Rights: r.rights, Epoch: r.seg.Epoch(), Transport: r.transport})
	}
	return dst
}
