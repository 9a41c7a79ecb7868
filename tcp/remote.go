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

// Rights are what the token grants.
func (r *Remote) Rights() Rights { return r.rights }

// Epoch is the owner's epoch the token is bound to.
func (r *Remote) Epoch() uint64 { return r.epoch }

// Regs implements xfer.Registered: the registrations other transports
// keep on the segment, such as the owner's RDMA keys of it.
func (r *Remote) Regs() *xfer.Regs { return &r.regs }

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
