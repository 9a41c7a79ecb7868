package tcp

// Remote: a segment exported by another daemon, opened with Node.Open,
// with the credential its requests carry.

import (
	"fmt"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/xfer"
)

var (
	_ xfer.Segment    = (*Remote)(nil)
	_ xfer.Registered = (*Remote)(nil)
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
	access Access
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
	// regs carry what other transports learned for the segment (the
	// owner's RDMA keys of it); Close tears them down.
	regs xfer.Regs
	// via is the transport the segment's holder set for its requests
	// (wire.TransportAuto, TransportTCP or TransportRDMA; SetTransport).
	via atomic.Uint32
}

// credential is a Remote's current token: the bytes requests present,
// when it expires and when it was issued (as this node saw it).
type credential struct {
	token  []byte
	expiry int64
	got    int64
}

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

// Access is what the segment was opened as: its name and, with tenants,
// the tenant of the client that opened it and the export's.
func (r *Remote) Access() Access { return r.access }

// Token is the capability token requests to the segment present now
// (the RDMA plane shows it to the owner to resolve the segment's
// registration). It changes when the node renews it; the bytes are not
// to be modified.
func (r *Remote) Token() []byte { return r.cred.Load().token }

// Rights are what the token grants.
func (r *Remote) Rights() Rights { return r.rights }

// Epoch is the owner's epoch the token is bound to.
func (r *Remote) Epoch() uint64 { return r.epoch }

// Regs implements xfer.Registered: the registrations other transports
// keep on the segment, such as the owner's RDMA keys of it.
func (r *Remote) Regs() *xfer.Regs { return &r.regs }

// SetTransport records the transport the segment's holder asked its
// requests to travel by (wire.TransportAuto, the default, TransportTCP or
// TransportRDMA), for the router to read with Transport. The node itself
// carries every request it is handed, whatever this says.
func (r *Remote) SetTransport(via uint8) { r.via.Store(uint32(via)) }

// Transport is what SetTransport recorded (wire.TransportAuto when
// nothing). It does not lock or allocate.
func (r *Remote) Transport() uint8 { return uint8(r.via.Load()) }

// Close forgets the segment and releases its registrations; later Acquire
// calls fail.
func (r *Remote) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.node.mu.Lock()
		delete(r.node.remotes, r)
		r.node.mu.Unlock()
		r.regs.Teardown()
	}
	return nil
}

// Open asks peer for segment with rights and returns it as a Remote. The
// owner answers with the size and a signed capability token. It is OpenAs
// without tenants.
func (n *Node) Open(peerID, segment string, rights Rights) (*Remote, error) {
	return n.OpenAs(peerID, Access{Name: segment}, rights)
}

// OpenAs asks peer for the access a with rights: the owner serves it only
// as its Exporter allows a's tenants (a permission error otherwise) and
// binds them into the token.
func (n *Node) OpenAs(peerID string, a Access, rights Rights) (*Remote, error) {
	if n.closed.Load() {
		return nil, xfer.ErrClosed
	}
	segment := a.Name
	if segment == "" || len(segment) > maxNameLen || rights == 0 || rights&^(RightRead|RightWrite) != 0 ||
		len(a.Tenant) > MaxTenant || len(a.Owner) > MaxTenant {
		return nil, fmt.Errorf("%w: open %q (tenant %q, of %q) with rights %v", xfer.ErrInvalid, segment, a.Tenant, a.Owner, rights)
	}
	if peerID == n.cfg.DaemonID {
		return nil, fmt.Errorf("%w: %q is this daemon", xfer.ErrInvalid, peerID)
	}
	p, err := n.peerFor(peerID)
	if err != nil {
		return nil, err
	}
	cred, t, size, err := n.openToken(p, a, rights)
	if err != nil {
		return nil, err
	}
	r := &Remote{node: n, peer: p, name: segment, access: a, id: xfer.SegmentID(n.segID.Add(1)), size: size,
		rights: rights, epoch: t.epoch}
	r.cred.Store(cred)
	n.mu.Lock()
	n.remotes[r] = struct{}{}
	n.mu.Unlock()
	return r, nil
}
