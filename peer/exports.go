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

// SplitRemote splits a remote segment's name into its parts:
// "peer/segment" names the export of the asker's own tenant on daemon
// peer, "peer/tenant/segment" the export of another tenant there (which
// it must grant the asker's tenant); owner is "" for the first. It fails
// with ErrInvalid when name is of neither shape or a part is too long or,
// for tenant, not a tenant's name.
func SplitRemote(name string) (peerID, owner, segment string, err error) {
	peerID, segment, ok := strings.Cut(name, "/")
	if t, s, two := strings.Cut(segment, "/"); ok && two {
		owner, segment = t, s
		if !ValidTenant(owner) {
			return "", "", "", fmt.Errorf("%w: remote name %q: %q is not a tenant's name", ErrInvalid, name, owner)
		}
	}
	if !ok || peerID == "" || segment == "" || len(peerID) > MaxPeerID || len(segment) > MaxSegmentName ||
		strings.Contains(segment, "/") {
		return "", "", "", fmt.Errorf("%w: remote name %q (want peer/segment or peer/tenant/segment)", ErrInvalid, name)
	}
	return peerID, owner, segment, nil
}

// Tenants of exports and of peer requests. An export's name is its
// tenant's: two tenants export the same name without meeting, and a
// peer's client reaches the export of its own tenant's name on its daemon
// (the tenant a peer request carries) or one that grants that tenant
// explicitly (Export's grants), never another. A peer request without a
// tenant (from a daemon of a release before tenants, or from a client in
// no tenant) is of DefaultTenant, and so are the exports of a client in
// no tenant; the wire leaves the default tenant out (WireTenant), so
// daemons without [[tenants]] speak to each other as before.
const (
	// DefaultTenant is the tenant of a daemon without [[tenants]], of
	// requests that carry none and of exports by a client in no tenant.
	DefaultTenant = "default"
	// MaxTenant bounds a tenant's name.
	MaxTenant = wire.MaxTenant
	// MaxGrants bounds the tenants one export grants.
	MaxGrants = wire.MaxGrants
)

// ValidTenant reports whether s may name a tenant: 1..MaxTenant bytes of
// [A-Za-z0-9._-].
func ValidTenant(s string) bool {
	if s == "" || len(s) > MaxTenant {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch r := s[i]; {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

// WireTenant is tenant as the peer protocol carries it: "" for
// DefaultTenant (and for none), which the protocol leaves out.
func WireTenant(tenant string) string {
	if tenant == DefaultTenant {
		return ""
	}
	return tenant
}

// namespace is the key of tenant's names in the table: "" for
// DefaultTenant and for none (WireTenant's), so that a request without a
// tenant finds the default tenant's exports.
func namespace(tenant string) string { return WireTenant(tenant) }

// CheckGrants is nil when grants may be given to an export: at most
// MaxGrants tenants' names, none twice and none the exporter's own
// (tenant); otherwise an error wrapping ErrInvalid.
func CheckGrants(tenant string, grants []string) error {
	if len(grants) > MaxGrants {
		return fmt.Errorf("%w: %d tenants granted (max %d)", ErrInvalid, len(grants), MaxGrants)
	}
	for i, g := range grants {
		switch {
		case !ValidTenant(g):
			return fmt.Errorf("%w: grant %q is not a tenant's name", ErrInvalid, g)
		case namespace(g) == namespace(tenant):
			return fmt.Errorf("%w: grant %q is the exporter's own tenant", ErrInvalid, g)
		case slices.Contains(grants[:i], g):
			return fmt.Errorf("%w: tenant %q granted twice", ErrInvalid, g)
		}
	}
	return nil
}

// Catalog is told about the daemon's exports so that daemons that do not
// list this one in their config can find them (the multi-host directory's
// catalog, *etcd.Dir). Both calls come from the exporting connection's
// goroutine and must not wait on the network.
//
// It is told only of the default tenant's exports (the names a peer's
// client reaches as "peer/segment" without tenants): another tenant's
// names are that tenant's, and its clients' peers open them by name.
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
// Names are per tenant: the table is keyed by the exporter's tenant and
// the name, and a peer request reaches an export only as Resolve allows.
// Lookups take a read lock on one shard of the names, never a global
// lock. An export ends (Export.End) when its owner unexports it or goes:
// the name is gone at once, and the end waits for the peer requests still
// in its range before the range goes back to the owner.
type Exports struct {
	catalog Catalog
	shards  [exportShards]exportShard

	// deniedMu guards denied: the peer requests refused (ErrDenied) by
	// the tenant whose export they asked for, for at most
	// maxDeniedTenants tenants (the names come from peers); deniedAll
	// counts them all.
	deniedMu  sync.Mutex
	denied    map[string]uint64
	deniedAll atomic.Uint64
}

// maxDeniedTenants bounds the tenants Denied counts refusals for apart.
const maxDeniedTenants = 256

type exportShard struct {
	// mu guards m.
	mu sync.RWMutex
	m  map[exportKey]*Export
}

// exportKey is an export's place in the table: its tenant's namespace and
// its name.
type exportKey struct{ tenant, name string }

// NewExports returns an empty table. catalog, when not nil, is told about
// every export and its end.
func NewExports(catalog Catalog) *Exports {
	t := &Exports{catalog: catalog, denied: map[string]uint64{}}
	for i := range t.shards {
		t.shards[i].m = map[exportKey]*Export{}
	}
	return t
}

// shard is the shard of k (FNV-1a over its name; no allocation).
func (t *Exports) shard(k exportKey) *exportShard {
	h := uint32(2166136261)
	for i := 0; i < len(k.name); i++ {
		h ^= uint32(k.name[i])
		h *= 16777619
	}
	return &t.shards[h%exportShards]
}

// Get is the export named name by tenant, or nil.
func (t *Exports) Get(tenant, name string) *Export {
	k := exportKey{namespace(tenant), name}
	s := t.shard(k)
	s.mu.RLock()
	e := s.m[k]
	s.mu.RUnlock()
	return e
}

// Resolve is the export a peer's client of tenant asker reaches as name
// of tenant owner ("": its own tenant's): its own tenant's export of that
// name, else ErrNotFound; or another tenant's that grants asker, else
// ErrDenied, whether that tenant exports the name or not (a refusal does
// not say what another tenant exports).
func (t *Exports) Resolve(asker, owner, name string) (*Export, error) {
	if owner == "" || namespace(owner) == namespace(asker) {
		if e := t.Get(asker, name); e != nil {
			return e, nil
		}
		return nil, fmt.Errorf("%w: no segment exported as %q", ErrNotFound, name)
	}
	if e := t.Get(owner, name); e != nil && e.Grants(asker) {
		return e, nil
	}
	t.deniedAll.Add(1)
	t.deniedMu.Lock()
	if _, ok := t.denied[tenantName(owner)]; ok || len(t.denied) < maxDeniedTenants {
		t.denied[tenantName(owner)]++
	}
	t.deniedMu.Unlock()
	return nil, fmt.Errorf("%w: %q of tenant %q to tenant %q", ErrDenied, name, owner, tenantName(asker))
}

// Denied is how many peer requests for an export of tenant were refused
// because it does not grant the asker's tenant (ErrDenied), and how many
// were refused so for any tenant.
func (t *Exports) Denied(tenant string) (n, all uint64) {
	t.deniedMu.Lock()
	n = t.denied[tenantName(tenant)]
	t.deniedMu.Unlock()
	return n, t.deniedAll.Load()
}

// tenantName is tenant as logs and errors name it.
func tenantName(tenant string) string {
	if namespace(tenant) == "" {
		return DefaultTenant
	}
	return tenant
}

// Export publishes [off, off+n) of seg under name, granting peers rights
// (wire.RightRead | wire.RightWrite); tenant is the owner's, whose clients
// alone may subscribe to its notifications and whose peers' clients alone
// reach it. It fails with ErrInvalid for a bad name, rights or range and
// with xfer.ErrExists when tenant exports the name already.
func (t *Exports) Export(name, tenant string, seg xfer.MemSegment, off, n uint64, rights uint8) (*Export, error) {
	return t.ExportTo(name, tenant, nil, seg, off, n, rights)
}

// ExportTo is Export that also lets the peers' clients of the tenants
// grants reach the export (as "peer/tenant/name"), with the same rights.
// It fails with ErrInvalid for grants CheckGrants refuses.
func (t *Exports) ExportTo(name, tenant string, grants []string, seg xfer.MemSegment, off, n uint64, rights uint8) (*Export, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if err := CheckGrants(tenant, grants); err != nil {
		return nil, err
	}
	if !ValidRights(rights) {
		return nil, fmt.Errorf("%w: rights %d", ErrInvalid, rights)
	}
	if end := off + n; n == 0 || end < off || end > seg.Size() {
		return nil, fmt.Errorf("%w: range [%d, +%d) outside segment %d of %d bytes", ErrInvalid, off, n, seg.ID(), seg.Size())
	}
	e := &Export{t: t, name: name, tenant: tenant, key: exportKey{namespace(tenant), name}, grants: slices.Clone(grants),
		source: seg.ID(), rights: rights,
		view: exportView{parent: seg, off: off, size: n, drained: make(chan struct{})}, subs: map[*Inbox]struct{}{}}
	s := t.shard(e.key)
	s.mu.Lock()
	if _, dup := s.m[e.key]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: segment name %q is exported already by tenant %q", xfer.ErrExists, name, tenantName(tenant))
	}
	s.m[e.key] = e
	s.mu.Unlock()
	if t.catalog != nil && e.key.tenant == "" {
		t.catalog.Exported(name, n, rights)
	}
	return e, nil
}

// Deliver queues a notification a peer attached to a WRITE into export e
// (which Resolve found) for every inbox subscribed to it. It fails,
// queueing nothing, when e ended or nobody subscribed (ErrNotFound) or a
// subscriber's queue is full (ErrLimit): the writer then gets a negative
// acknowledgement. It never blocks; payload is copied.
func (e *Export) Deliver(payload []byte) error {
	name := e.name
	if len(payload) > wire.MaxNotify {
		return fmt.Errorf("%w: notification of %d bytes (max %d)", ErrLimit, len(payload), wire.MaxNotify)
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

// Subscribe delivers the notifications of the segment tenant exports as
// name to in from now on: another tenant's notifications carry its data,
// and its names are its own, so a name tenant does not export fails with
// ErrNotFound.
func (t *Exports) Subscribe(name, tenant string, in *Inbox) error {
	e := t.Get(tenant, name)
	if e == nil {
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
			if tenant != "" && e.key.tenant != namespace(tenant) || e.key.tenant == DaemonTenant {
				continue
			}
			dst = append(dst, wire.SegmentInfo{Name: []byte(e.name), Segment: uint64(e.source), Size: e.view.size, Rights: e.rights,
				Grants: slices.Clone(e.grants)})
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
	key    exportKey
	grants []string       // other tenants whose peers' clients reach it
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

// Tenant is the exporter's tenant (DefaultTenant for a client in none).
func (e *Export) Tenant() string { return tenantName(e.tenant) }

// Grants reports whether a peer's client of tenant reaches the export:
// tenant is the exporter's own, or the export grants it. Both are compared
// as namespaces: a grant of DefaultTenant names the peers' clients whose
// requests carry no tenant (WireTenant leaves it out).
func (e *Export) Grants(tenant string) bool {
	ns := namespace(tenant)
	return ns == e.key.tenant || slices.ContainsFunc(e.grants, func(g string) bool { return namespace(g) == ns })
}

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
	s := e.t.shard(e.key)
	s.mu.Lock()
	if s.m[e.key] == e {
		delete(s.m, e.key)
	}
	s.mu.Unlock()
	if e.t.catalog != nil && e.key.tenant == "" {
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

// OnDrained has f run once the export ended and no peer request holds
// its range any more: before OnDrained returns when that is so already,
// else on the goroutine that brings it about (End, or the Release of the
// last peer request). It is for an owner whose End gave up waiting
// (a peer request outlived its wait): the range is its again only when f
// runs, however late.
func (e *Export) OnDrained(f func()) {
	v := &e.view
	v.mu.Lock()
	select {
	case <-v.drained:
		v.mu.Unlock()
		f()
		return
	default:
	}
	v.after = append(v.after, f)
	v.mu.Unlock()
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

	// mu guards after: what runs once drained closes (OnDrained), and
	// the closing itself, so that one registered as it closes runs once.
	mu    sync.Mutex
	after []func()
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
		v.drain() // the last reference of an ended export
	}
}

// drain closes drained and runs what OnDrained registered. It is called
// once: by close when no reference is held, else by the last unref.
func (v *exportView) drain() {
	v.mu.Lock()
	close(v.drained)
	after := v.after
	v.after = nil
	v.mu.Unlock()
	for _, f := range after {
		f()
	}
}

// busy reports whether references are held.
func (v *exportView) busy() bool { return v.state.Load()&^closedBit != 0 }

// close refuses new references and waits up to limit for the ones held;
// it reports whether they all ended. It is called once.
func (v *exportView) close(limit time.Duration) bool {
	if v.state.Or(closedBit) == 0 {
		v.drain()
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
