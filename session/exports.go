package session

import (
	"fmt"
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
func (s *Session) ExportSegment(m *wire.ExportSegmentRequest, r *wire.Response) error {
	name := string(m.Name)
	if err := peer.CheckName(name); err != nil {
		return err
	}
	if !peer.ValidRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if len(s.exports) >= s.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d segments exported", ErrLimit, len(s.exports))
	}
	id := xfer.SegmentID(m.Segment)
	off, n := m.Offset, m.Length
	var parent xfer.MemSegment
	if s.pool != nil && id == s.pool.ID() {
		if n == 0 || !s.blocks.coversRange(off, n) {
			return fmt.Errorf("%w: pool range [%d, +%d) is not held by this connection", ErrPermission, off, n)
		}
		parent = s.pool
	} else {
		s.mu.Lock()
		b, ok := s.buffers[id]
		s.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: buffer %d", ErrNotFound, id)
		}
		if n == 0 && off < b.Size() {
			n = b.Size() - off
		}
		parent = b
	}
	e, err := s.h.Exports.Export(name, s.tenant, parent, off, n, m.Rights)
	if err != nil {
		return err
	}
	s.exports = append(s.exports, e)
	s.log.Info("segment exported", "name", name, "segment", id, "offset", off, "size", n, "rights", m.Rights)
	wire.SetResponse[wire.ExportSegmentResponse](r).Size = n
	return nil
}

// UnexportSegment ends one of the session's exports.
func (s *Session) UnexportSegment(m *wire.UnexportSegmentRequest, r *wire.Response) error {
	i := slices.IndexFunc(s.exports, func(e *peer.Export) bool { return e.Name() == string(m.Name) })
	if i < 0 {
		return fmt.Errorf("%w: this connection exports no %q", ErrNotFound, m.Name)
	}
	s.dropExport(i)
	wire.SetResponse[wire.UnexportSegmentResponse](r)
	return nil
}

// dropExport ends s.exports[i] (its subscribers stop receiving, what RDMA
// registered for it is revoked) after the peer requests still in its
// range, waiting up to ReleaseWait for them.
func (s *Session) dropExport(i int) {
	e := s.exports[i]
	s.exports = slices.Delete(s.exports, i, i+1)
	wait := s.h.ReleaseWait
	if s.h.closing() {
		// The peer plane is closed or closing with the daemon; a request
		// still inside the range keeps the memory it references alive
		// (its reference), and a pool range lingers (below).
		wait = 0
	}
	if !e.End(wait) {
		s.log.Warn("peer requests still in an unexported range", "name", e.Name())
		if e.Source() == s.poolID() {
			s.lingering = append(s.lingering, e)
		}
	}
	s.log.Info("segment unexported", "name", e.Name())
}

// exported reports whether an export of c, or an unexported pool range a
// peer request still holds, overlaps [off, off+n) of seg.
func (s *Session) exported(seg xfer.SegmentID, off, n uint64) bool {
	overlaps := func(e *peer.Export) bool { return e.Overlaps(seg, off, n) }
	if slices.ContainsFunc(s.exports, overlaps) {
		return true
	}
	s.lingering = slices.DeleteFunc(s.lingering, func(e *peer.Export) bool { return !e.Busy() })
	return slices.ContainsFunc(s.lingering, overlaps)
}

// dropExportsOf unexports everything c exported from segment seg.
func (s *Session) dropExportsOf(seg xfer.SegmentID) {
	for i := len(s.exports) - 1; i >= 0; i-- {
		if s.exports[i].Source() == seg {
			s.dropExport(i)
		}
	}
}

// Subscribe subscribes the session to an export's notifications.
func (s *Session) Subscribe(m *wire.SubscribeRequest, r *wire.Response) error {
	if n := s.inbox.Subscriptions(); n >= s.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d subscriptions", ErrLimit, n)
	}
	if err := s.h.Exports.Subscribe(string(m.Name), s.tenant, s.inbox); err != nil {
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
func (s *Session) PollNotifications(ctx *wire.Context, m *wire.PollNotificationsRequest, r *wire.Response) error {
	max := int(m.Max)
	if max <= 0 || max > maxPollItems {
		max = maxPollItems
	}
	// Keep the answer well inside a frame.
	budget := s.h.MaxFrame/2 - 64
	deadline := s.deadline(ctx, m.TimeoutMS)
	if m.TimeoutMS == 0 && ctx.DeadlineMS == 0 {
		deadline = time.Now() // no timeout: do not wait
	}
	a := wire.SetResponse[wire.PollNotificationsResponse](r)
	for {
		a.Notifications = s.inbox.Take(a.Notifications, max, budget)
		if len(a.Notifications) > 0 || s.h.Draining() || !s.inbox.Wait(deadline, s.h.Quiesced) {
			return nil
		}
	}
}

// OpenRemote opens a segment of a peer daemon for the session.
func (s *Session) OpenRemote(ctx *wire.Context, m *wire.OpenRemoteRequest, r *wire.Response) error {
	pp := s.h.Peers
	if pp == nil {
		return fmt.Errorf("%w: no peer plane configured", ErrUnavailable)
	}
	peerID, seg, err := peer.SplitRemote(string(m.Name))
	if err != nil {
		return err
	}
	if !peer.ValidRights(m.Rights) {
		return fmt.Errorf("%w: rights %d", ErrMalformed, m.Rights)
	}
	if m.Transport > wire.TransportRDMA {
		return fmt.Errorf("%w: transport %d (want auto, tcp or rdma)", ErrMalformed, m.Transport)
	}
	s.mu.Lock()
	held := len(s.remotes)
	s.mu.Unlock()
	if held >= s.h.Limits.MaxExports {
		return fmt.Errorf("%w: %d remote segments open", ErrLimit, held)
	}
	rs, err := pp.OpenRemote(OpenContext{Lane: string(ctx.Lane), PolicyVersion: ctx.PolicyVersion},
		peerID, seg, m.Rights, m.Transport)
	if err != nil {
		return err
	}
	id := s.h.Registry.NextID()
	s.mu.Lock()
	s.remotes[id] = remote{seg: rs, peer: peerID, name: seg, rights: m.Rights, transport: m.Transport}
	s.mu.Unlock()
	s.log.Info("remote segment opened", "peer", peerID, "name", seg, "segment", id, "size", rs.Size(),
		"epoch", fmt.Sprintf("%#x", rs.Epoch()), "transport", wire.TransportName(m.Transport))
	*wire.SetResponse[wire.OpenRemoteResponse](r) = wire.OpenRemoteResponse{Segment: uint64(id), Size: rs.Size(), Epoch: rs.Epoch()}
	return nil
}

// CloseRemote closes a remote segment the session opened.
func (s *Session) CloseRemote(m *wire.CloseRemoteRequest, r *wire.Response) error {
	id := xfer.SegmentID(m.Segment)
	s.mu.Lock()
	rem, ok := s.remotes[id]
	delete(s.remotes, id)
	s.segGen.Add(1)
	s.mu.Unlock()
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
func (s *Session) notifyArgs(notify [][]byte) [][]byte {
	if len(notify) == 0 {
		return nil
	}
	out := make([][]byte, len(notify))
	for i, p := range notify {
		if len(p) > 0 && s.codes[i] == tcproto.CodeOK {
			out[i] = slices.Clone(p)
		}
	}
	return out
}

// releasePeers drops what the connection holds of the peer plane:
// subscriptions, queued notifications, exports (waiting for peer requests
// in their ranges) and opened remote segments. It runs before the
// connection's buffers and pool blocks are released.
func (s *Session) releasePeers() {
	s.inbox.Close()
	for i := len(s.exports) - 1; i >= 0; i-- {
		s.dropExport(i)
	}
	s.mu.Lock()
	rems := s.remotes
	s.remotes = map[xfer.SegmentID]remote{}
	s.segGen.Add(1)
	s.mu.Unlock()
	for _, r := range rems {
		r.seg.Close() //nolint:errcheck // forgetting a remote segment cannot fail in a way to act on
	}
}

// taskCode is codeForState, with the peer plane's errors mapped by the
// plane.
func (s *Session) taskCode(st xfer.State, err error) Code {
	if st == xfer.StateFailed && err != nil && s.h.Peers != nil && CodeOf(err) == tcproto.CodeINTERNAL {
		if code, ok := s.h.Peers.Code(err); ok {
			return code
		}
	}
	return CodeForState(st, err)
}

func (s *Session) remoteCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.remotes)
}

// Remotes appends to dst the remote segments the session opened.
func (s *Session) Remotes(dst []wire.SegmentInfo) []wire.SegmentInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.remotes {
		dst = append(dst, wire.SegmentInfo{Name: []byte(r.name), Peer: []byte(r.peer), Segment: uint64(id),
			Size: r.seg.Size(), Rights: r.rights, Epoch: r.seg.Epoch(), Transport: r.transport})
	}
	return dst
}
