package rdma

import (
	"fmt"

	"github.com/tensorcast/tensorcast/xfer"
)

// Keys are a segment's RDMA keys as the segment carries them in its RDMA
// slot (xfer.SlotRDMA): the local keys of a local segment's Region
// (LocalKeys), or the remote keys of a peer's segment as its owner
// registered it (RemoteKeys). The transport finds a task's keys through
// the task's two segments, one atomic load each, with no table of its
// own; whoever puts keys on a segment (xfer.Regs.Set) takes them back
// with xfer.Regs.Drop, or the segment's teardown releases them.
//
// Keys are immutable. They do not keep their Region registered: a request
// whose keys were deregistered fails on the device (IBV_WC_LOC_PROT_ERR or
// IBV_WC_REM_ACCESS_ERR), as does one with keys of another device.
type Keys struct {
	t      keyTable
	remote bool
	owner  any
	// release is the registration's Release (the segment's teardown); nil
	// releases nothing.
	release func()
}

var _ xfer.Registration = (*Keys)(nil)

// LocalKeys are region r's keys for the local side of requests. owner is
// whoever sets them on a segment (Owner reports it); release, when not
// nil, runs as their Release, at the segment's teardown unless they were
// taken back first.
func LocalKeys(r *Region, owner any, release func()) *Keys {
	return &Keys{t: r.keys, owner: owner, release: release}
}

// RemoteKeys are the keys of a peer's region r for the target side of
// requests, checked as the peer's connection data is (ErrNotRegistered
// when its fields disagree). owner and release are LocalKeys'.
func RemoteKeys(r RemoteRegion, owner any, release func()) (*Keys, error) {
	kt, err := r.table()
	if err != nil {
		return nil, err
	}
	return &Keys{t: kt, remote: true, owner: owner, release: release}, nil
}

// RemoteRangeKeys are the keys of [off, off+n) of a peer's region r, at
// target offsets 0..n: a segment the peer exported from inside a larger
// registration. ErrNotRegistered when the range is not inside r.
func RemoteRangeKeys(r RemoteRegion, off, n uint64, owner any, release func()) (*Keys, error) {
	kt, err := r.table()
	if err != nil {
		return nil, err
	}
	if n == 0 || off >= kt.size || n > kt.size-off {
		return nil, fmt.Errorf("%w: range %d+%d outside a region of %d bytes", ErrNotRegistered, off, n, kt.size)
	}
	kt.base, kt.limit = off, n
	return &Keys{t: kt, remote: true, owner: owner, release: release}, nil
}

// Owner is the owner the keys were made with.
func (k *Keys) Owner() any { return k.owner }

// Remote reports whether the keys are a peer's (RemoteKeys), for the
// target side of requests.
func (k *Keys) Remote() bool { return k.remote }

// Release implements xfer.Registration: it runs the release the keys were
// made with.
func (k *Keys) Release() {
	if k.release != nil {
		k.release()
	}
}

// KeysOf is what seg's RDMA slot holds, or nil when it holds no Keys (or
// seg has no slots). It does not lock or allocate.
func KeysOf(seg xfer.Segment) *Keys {
	if seg == nil {
		return nil
	}
	regs := xfer.RegsOf(seg)
	if regs == nil {
		return nil
	}
	k, _ := regs.Load(xfer.SlotRDMA).(*Keys)
	return k
}
