package peer

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Names of exports and of remote segments ("peer/segment").
const (
	// MaxSegmentName bounds an export's name (and the segment part of a
	// remote name).
	MaxSegmentName = 255
	// MaxPeerID bounds the daemon id part of a remote name.
	MaxPeerID = 64
)

// DaemonTenant is the tenant of the exports the daemon makes itself (no
// client's tenant can be named so): they are not listed, and no client
// subscribes to their notifications.
const DaemonTenant = "\x00daemon"

// ValidRights reports whether r is a non-empty set of wire.RightRead and
// wire.RightWrite.
func ValidRights(r uint8) bool { return r != 0 && r&^(wire.RightRead|wire.RightWrite) == 0 }

// CheckName is nil when name may be exported: 1..MaxSegmentName bytes,
// no '/'; otherwise an error wrapping ErrInvalid.
func CheckName(name string) error {
	if name == "" || len(name) > MaxSegmentName || strings.Contains(name, "/") {
		return fmt.Errorf("%w: export name %q (1..%d bytes, no '/')", ErrInvalid, name, MaxSegmentName)
	}
	return nil
}

// SplitRemote splits a remote segment's name, "peer/segment", into its
// parts; ErrInvalid when it is not of that shape or a part is too long.
func SplitRemote(name string) (peerID, segment string, err error) {
	peerID, segment, ok := strings.Cut(name, "/")
	if !ok || peerID == "" || segment == "" || len(peerID) > MaxPeerID || len(segment) > MaxSegmentName {
		return "", "", fmt.Errorf("%w: remote name %q (want peer/segment)", ErrInvalid, name)
	}
	return peerID, segment, nil
}

// Catalog is told about the daemon's exports so that daemons that do not
// list this one in their config can find them (the multi-host directory's
// catalog, *etcd.Dir). Both calls come from the exporting connection's
// goroutine and must not wait on the network.
type Catalog interface {
	Exported(name string, size uint64, rights uint8)
	Unexported(name string)
}

// exportShards is how many locks the table's names are spread over: peer
// requests look an export up by name for every request, and exports
// change rarely, so each shard is read-locked on that path and two
// requests for different names rarely meet.
const exportShards = 16

// Exports is the daemon's table of exported segments by name: what a
// local client lets peers reach (a range of one of its buffers or of its
// pool blocks), with the rights it grants and the subscribers of the
// notifications that ride WRITEs into it. The peer plane serves peers
// from it (its tcp node, package peer/plane, and its RDMA links, package
// rdma/link); the control server exports and unexports on its clients'
// behalf.
//
// Lookups take a read lock on one shard of the names, never a global
// lock. An export ends (Export.End) when its owner unexports it or goes:
// the name is gone at once, and the end waits for the peer requests still
// in its range before the range goes back to the owner.
type Exports struct {
	catalog Catalog
	shards  [exportShards]exportShard
}

type exportShard struct {
	// mu guards m.
	mu sync.RWMutex
	m  map[string]*Export
}

// NewExports returns an empty table. catalog, when not nil, is told about
// every export and its end.
func NewExports(catalog Catalog) *Exports {
	t := &Exports{catalog: catalog}
	for i := range t.shards {
		t.shards[i].m = map[string]*Export{}
	}
	return t
}

// shard is the shard of name (FNV-1a; no allocation).
func (t *Exports) shard(name string) *exportShard {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return &t.shards[h%exportShards]
}

// Get is the export named name, or nil.
func (t *Exports) Get(name string) *Export {
	s := t.shard(name)
	s.mu.RLock()
	e := s.m[name]
	s.mu.RUnlock()
	return e
}

// Export publishes [off, off+n) of seg under name, granting peers rights
// (wire.RightRead | wire.RightWrite); tenant is the owner's, whose clients
// alone may subscribe to its notifications. It fails with ErrInvalid for a
// bad name, rights or range and with xfer.ErrExists when the name is
// taken.
func (t *Exports) Export(name, tenant string, seg xfer.MemSegment, off, n uint64, rights uint8) (*Export, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if !ValidRights(rights) {
		return nil, fmt.Errorf("%w: rights %d", ErrInvalid, rights)
	}
	if end := off + n; n == 0 || end < off || end > seg.Size() {
		return nil, fmt.Errorf("%w: range [%d, +%d) outside segment %d of %d bytes", ErrInvalid, off, n, seg.ID(), seg.Size())
	}
	e := &Export{t: t, name: name, tenant: tenant, source: seg.ID(), rights: rights,
		view: exportView{parent: seg, off: off, size: n, drained: make(chan struct{})}, subs: map[*Inbox]struct{}{}}
	s := t.shard(name)
	s.mu.Lock()
	if _, dup := s.m[name]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: segment name %q is exported already", xfer.ErrExists, name)
	}
	s.m[name] = e
	s.mu.Unlock()
	if t.catalog != nil {
		t.catalog.Exported(name, n, rights)
	}
	return e, nil
}

// Lookup is the range exported as name (tcp.Exporter), which a peer
// request holds with Acquire while it copies into or out of it.
func (t *Exports) Lookup(name string) (xfer.MemSegment, error) {
	e := t.Get(name)
	if e == nil {
		return nil, fmt.Errorf("%w: no segment exported as %q", ErrNotFound, name)
	}
	return &e.view, nil
}

// Granted is the rights (wire.RightRead | wire.RightWrite) the export
// named name grants to peers; false when there is none.
func (t *Exports) Granted(name string) (uint8, bool) {
	e := t.Get(name)
	if e == nil {
		return 0, false
	}
	return e.rights, true
}

// Deliver (tcp.Exporter) queues a notification a peer
// attached to a WRITE into the segment exported as name for every inbox
// subscribed to it. It fails, queueing nothing, when the name is not
// exported (ErrNotFound), nobody subscribed (ErrNotFound) or a
// subscriber's queue is full (ErrLimit): the writer then gets a negative
// acknowledgement. It never blocks; payload is copied.
func (t *Exports) Deliver(name string, payload []byte) error {
	if len(payload) > wire.MaxNotify {
		return fmt.Errorf("%w: notification of %d bytes (max %d)", ErrLimit, len(payload), wire.MaxNotify)
	}
	e := t.Get(name)
	if e == nil {
		return fmt.Errorf("%w: no segment exported as %q", ErrNotFound, name)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.subs) == 0 {
		return fmt.Errorf("%w: nobody subscribed to %q", ErrNotFound, name)
	}
	held := make([]*Inbox, 0, len(e.subs))
	for in := range e.subs {
		if !in.reserve() {
			for _, r := range held {
				r.unreserve()
			}
			return fmt.Errorf("%w: notification queue of %s is full (%d)", ErrLimit, in.name, in.limit)
		}
		held = append(held, in)
	}
	seg := []byte(name)
	for _, in := range held {
		p := slices.Clone(payload)
		if p == nil {
			p = []byte{}
		}
		in.put(wire.Notification{Segment: seg, Payload: p})
	}
	return nil
}

// Subscribe delivers the notifications of the segment exported as name to
// in from now on, when its owner is of tenant: another tenant's
// notifications carry its data, so for those, as for a name not exported,
// it fails with ErrNotFound (not even saying the name exists).
func (t *Exports) Subscribe(name, tenant string, in *Inbox) error {
	e := t.Get(name)
	if e == nil || e.tenant != tenant {
		return fmt.Errorf("%w: no segment exported as %q (by this tenant)", ErrNotFound, name)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return fmt.Errorf("%w: %q is being unexported", ErrNotFound, name)
	}
	if !in.add(e) {
		return fmt.Errorf("%w: %s is closed", ErrUnavailable, in.name)
	}
	e.subs[in] = struct{}{}
	return nil
}

// List appends the exports of tenant to dst, as Segments reports them:
// every export for "" (a connection in no tenant, the daemon's admin).
// Another tenant's exports are not listed: their names say what it
// shares.
//
// The daemon's own exports (tenant DaemonTenant: the store's pool as the
// other daemons read it) are no client's segments and are never listed.
func (t *Exports) List(dst []wire.SegmentInfo, tenant string) []wire.SegmentInfo {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if tenant != "" && e.tenant != tenant || e.tenant == DaemonTenant {
				continue
			}
			dst = append(dst, wire.SegmentInfo{Name: []byte(e.name), Segment: uint64(e.source), Size: e.view.size, Rights: e.rights})
		}
		s.mu.RUnlock()
	}
	return dst
}

// Export is one exported segment, owned by the connection that exported
// it; End ends it.
type Export struct {
	t      *Exports
	name   string
	tenant string
	source xfer.SegmentID // the owner's segment (its buffer, or the pool)
	rights uint8
	view   exportView

	// mu guards the fields below. Lock order: Export.mu, then Inbox.mu.
	mu    sync.Mutex
	subs  map[*Inbox]struct{}
	ends  []func() // run once the export ended (OnEnd)
	ended bool
}

// Name is the name the segment is exported under.
func (e *Export) Name() string { return e.name }

// Source is the owner's segment the export is a range of.
func (e *Export) Source() xfer.SegmentID { return e.source }

// Size is the export's length in bytes.
func (e *Export) Size() uint64 { return e.view.size }

// Rights is what the export grants peers (wire.RightRead |
// wire.RightWrite).
func (e *Export) Rights() uint8 { return e.rights }

// Segment is the exported range as peers reach it: its Acquire refuses
// once the export ended, and the end waits for the references taken.
func (e *Export) Segment() xfer.MemSegment { return &e.view }

// Overlaps reports whether the export covers any of [off, off+n) of
// segment seg.
func (e *Export) Overlaps(seg xfer.SegmentID, off, n uint64) bool {
	return e.source == seg && off < e.view.off+e.view.size && e.view.off < off+n
}

// Busy reports whether a peer request still holds the export's range.
func (e *Export) Busy() bool { return e.view.busy() }

// End unexports: the name is gone from the table (new peer requests find
// nothing; the catalog is told), its subscribers stop receiving, and it
// waits up to wait for the peer requests still in its range. Then what
// OnEnd registered runs (the RDMA plane revokes the export's keys), so
// that when End returns no peer reaches the range any more. It reports whether the peer requests
// all ended within wait; a range that some still hold stays Busy until
// they do. A second End only reports that.
func (e *Export) End(wait time.Duration) bool {
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		return !e.view.busy()
	}
	e.ended = true
	subs := e.subs
	e.subs = nil
	e.mu.Unlock()
	s := e.t.shard(e.name)
	s.mu.Lock()
	if s.m[e.name] == e {
		delete(s.m, e.name)
	}
	s.mu.Unlock()
	if e.t.catalog != nil {
		e.t.catalog.Unexported(e.name)
	}
	for in := range subs {
		in.forget(e)
	}
	drained := e.view.close(wait)
	e.mu.Lock()
	ends := e.ends
	e.ends = nil
	e.mu.Unlock()
	for _, f := range ends {
		f()
	}
	return drained
}

// OnEnd has f run when the export ends, after the wait for its peer
// requests and before End returns (the RDMA plane revokes the export's
// registration there). It reports false, and f will not run, when the
// export is ending already.
func (e *Export) OnEnd(f func()) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return false
	}
	e.ends = append(e.ends, f)
	return true
}

// closedBit marks an exportView whose export ended.
const closedBit = 1 << 62

// exportView is the range of the owner's segment that peers reach under
// the export's name. It counts the references peer requests hold, so that
// ending the export waits for them (an event, not a poll) before the
// range goes back to its owner.
type exportView struct {
	parent    xfer.MemSegment
	off, size uint64
	// state is the references held, with closedBit set once the export
	// ended: Acquire then refuses, and the Release that drops the last
	// reference closes drained. Updated with atomics only: this is every
	// peer request's path.
	state   atomic.Int64
	drained chan struct{}
}

var _ xfer.MemSegment = (*exportView)(nil)

func (v *exportView) ID() xfer.SegmentID { return v.parent.ID() }
func (v *exportView) Kind() xfer.Kind    { return v.parent.Kind() }
func (v *exportView) Size() uint64       { return v.size }
func (v *exportView) Bytes() []byte      { return v.parent.Bytes()[v.off : v.off+v.size] }

// Acquire takes a reference unless the export ended (or its owner's
// segment is going).
func (v *exportView) Acquire() bool {
	for {
		s := v.state.Load()
		if s&closedBit != 0 {
			return false
		}
		if v.state.CompareAndSwap(s, s+1) {
			break
		}
	}
	if !v.parent.Acquire() {
		v.unref()
		return false
	}
	return true
}

// Release drops a reference Acquire took.
func (v *exportView) Release() {
	v.parent.Release()
	v.unref()
}

func (v *exportView) unref() {
	if v.state.Add(-1) == closedBit {
		close(v.drained) // the last reference of an ended export
	}
}

// busy reports whether references are held.
func (v *exportView) busy() bool { return v.state.Load()&^closedBit != 0 }

// close refuses new references and waits up to limit for the ones held;
// it reports whether they all ended. It is called once.
func (v *exportView) close(limit time.Duration) bool {
	if v.state.Or(closedBit) == 0 {
		close(v.drained)
		return true
	}
	if limit <= 0 {
		return false
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-v.drained:
		return true
	case <-timer.C:
		return false
	}
}
