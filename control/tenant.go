package control

import (
	"fmt"
	"os"
	"slices"

	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Tenant is a set of local users who trust each other with their data: the
// clients of one tenant share its pool, and nothing of one tenant is
// readable by another. Each tenant has its own pool (its own memfd: a client
// is passed, and so can map, only its tenant's), so pool memory never moves
// between tenants and one tenant's blocks are never another's; the pool's
// size is the tenant's pool quota.
//
// A peer belongs to the first tenant that lists its uid; else to the one
// tenant that lists its primary or a supplementary gid (more than one is
// ambiguous and refused). Root and the daemon's own uid, unless
// Config.DeniedUIDs names them, are let in without being listed: into the
// default tenant when the server has one (no Deps.Tenants), else with no
// pool (control calls, stats, their own buffers).
type Tenant struct {
	// Name names the tenant in logs, metrics and stats: 1..64 bytes of
	// [A-Za-z0-9._-].
	Name string
	UIDs []uint32
	GIDs []uint32
	// Pool is the tenant's own pool; required, one per tenant.
	Pool Pool
	// Store is the tenant's KV block store, over Pool; nil: none (store
	// calls answer UNAVAILABLE).
	Store *store.Store
	// Grants are the retention handles and placement leases of Store;
	// nil: none (their calls answer UNAVAILABLE).
	Grants *grant.Grants
}

// DefaultTenant is the tenant's name when Deps.Tenants is empty: the users
// of Config.AllowedUIDs and AllowedGIDs, with Deps.Pool.
const DefaultTenant = "default"

// maxTenants bounds Deps.Tenants.
const maxTenants = 256

// tenant is a Tenant as the server keeps it.
type tenant struct {
	Tenant
	// index is the tenant's position (0-based) in the server's list; it is
	// stable for the daemon's configuration, not across changes of it.
	index int
	// keyPrefix namespaces the tenant's store keys (StoreKey).
	keyPrefix []byte
}

// # Store keys per tenant
//
// The store (being wired into the daemon) keeps its L1 values in a pool
// that the client reads in place, so a tenant's values must live in that
// tenant's pool: the daemon opens one store per tenant, over the tenant's
// pool (store.Open(cfg, tenantPool, uring, its own L2 under
// data_dir/tenants/NAME), and the control layer hands a connection's store
// calls to c.tenant's store. Tenants' key spaces are then apart by
// construction. Where one store serves several tenants all the same (an
// L2 shared between them, say), the control layer namespaces every key
// itself: StoreKey before any store call that takes keys (Put, Reserve,
// Commit, Get, Exists, Remove, Pin, Unpin, LookupPrefix, Stat) and for List's
// prefix, and StripStoreKey on every key a store call returns (List, Stat)
// before it goes to the client, dropping those it refuses. A connection
// without a tenant (c.tenant == nil: root or the daemon's uid when tenants
// are configured) has no store, as it has no pool: errNoPool.

// StoreKeyPrefixLen is the length of the namespace prefix StoreKey puts
// before a client's key.
const StoreKeyPrefixLen = 2

// StoreKey appends to dst the key under which the store keeps key for this
// tenant: a 2-byte big-endian tenant number, then the client's bytes. Two
// tenants' equal keys are so different keys in one store, and a listing by
// prefix (which the control layer also prefixes) never crosses tenants.
// The store's key limit applies to the result: a client key may be at most
// that limit minus StoreKeyPrefixLen.
func (t *tenant) StoreKey(dst, key []byte) []byte {
	return append(append(dst, t.keyPrefix...), key...)
}

// StripStoreKey returns the client's key of a store key of this tenant, and
// false for a key of another tenant (which must never be shown).
func (t *tenant) StripStoreKey(k []byte) ([]byte, bool) {
	if len(k) < len(t.keyPrefix) || string(k[:len(t.keyPrefix)]) != string(t.keyPrefix) {
		return nil, false
	}
	return k[len(t.keyPrefix):], true
}

// validTenantName reports whether s may name a tenant.
func validTenantName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

// buildTenants checks the tenants of cfg and deps and returns them with the
// tenant that root and the daemon's uid join when no tenant lists them (nil
// when there is none: they get no pool).
func buildTenants(cfg *Config, deps *Deps) ([]*tenant, *tenant, error) {
	list := deps.Tenants
	if len(list) == 0 {
		if deps.Pool == nil {
			return nil, nil, fmt.Errorf("%w: Deps needs Pool or Tenants", ErrConfig)
		}
		list = []Tenant{{Name: DefaultTenant, UIDs: cfg.AllowedUIDs, GIDs: cfg.AllowedGIDs, Pool: deps.Pool, Store: deps.Store, Grants: deps.Grants}}
	} else {
		if deps.Pool != nil || deps.Store != nil || deps.Grants != nil {
			return nil, nil, fmt.Errorf("%w: Deps.Pool or Deps.Store with Deps.Tenants (each tenant has its pool and store)", ErrConfig)
		}
		if len(cfg.AllowedUIDs) > 0 || len(cfg.AllowedGIDs) > 0 {
			return nil, nil, fmt.Errorf("%w: AllowedUIDs/AllowedGIDs with Tenants: list the users in their tenants", ErrConfig)
		}
		if len(list) > maxTenants {
			return nil, nil, fmt.Errorf("%w: %d tenants (max %d)", ErrConfig, len(list), maxTenants)
		}
	}
	uids, gids := map[uint32]string{}, map[uint32]string{}
	pools := map[xfer.SegmentID]string{}
	out := make([]*tenant, 0, len(list))
	for i, t := range list {
		if !validTenantName(t.Name) {
			return nil, nil, fmt.Errorf("%w: tenant name %q (1..64 bytes of A-Za-z0-9._-)", ErrConfig, t.Name)
		}
		if slices.ContainsFunc(out, func(o *tenant) bool { return o.Name == t.Name }) {
			return nil, nil, fmt.Errorf("%w: tenant %q appears twice", ErrConfig, t.Name)
		}
		if t.Pool == nil {
			return nil, nil, fmt.Errorf("%w: tenant %q has no pool", ErrConfig, t.Name)
		}
		if o, dup := pools[t.Pool.ID()]; dup {
			return nil, nil, fmt.Errorf("%w: tenants %q and %q share pool segment %d", ErrConfig, o, t.Name, t.Pool.ID())
		}
		pools[t.Pool.ID()] = t.Name
		for _, u := range t.UIDs {
			if o, dup := uids[u]; dup && o != t.Name {
				return nil, nil, fmt.Errorf("%w: uid %d is in tenants %q and %q", ErrConfig, u, o, t.Name)
			}
			uids[u] = t.Name
		}
		for _, g := range t.GIDs {
			if o, dup := gids[g]; dup && o != t.Name {
				return nil, nil, fmt.Errorf("%w: gid %d is in tenants %q and %q", ErrConfig, g, o, t.Name)
			}
			gids[g] = t.Name
		}
		out = append(out, &tenant{Tenant: t, index: i, keyPrefix: []byte{byte(i >> 8), byte(i)}})
	}
	var admin *tenant
	if len(deps.Tenants) == 0 {
		admin = out[0]
	}
	return out, admin, nil
}

// tenantOf is the tenant of a peer, or an error matching ErrPermission
// when it may not connect. ok=false with a nil error is an admin (root or
// the daemon's uid) let in without a tenant.
func (s *Server) tenantOf(cr cred) (*tenant, error) {
	if slices.Contains(s.cfg.DeniedUIDs, cr.Uid) {
		return nil, fmt.Errorf("%w: uid %d is in DeniedUIDs", ErrPermission, cr.Uid)
	}
	for _, t := range s.tenants {
		if slices.Contains(t.UIDs, cr.Uid) {
			return t, nil
		}
	}
	var found *tenant
	for _, t := range s.tenants {
		if !slices.Contains(t.GIDs, cr.Gid) && !slices.ContainsFunc(cr.Groups, func(g uint32) bool { return slices.Contains(t.GIDs, g) }) {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("%w: uid %d is in groups of tenants %q and %q", ErrPermission, cr.Uid, found.Name, t.Name)
		}
		found = t
	}
	if found != nil {
		return found, nil
	}
	if s.isAdmin(cr.Uid) {
		return s.admin, nil
	}
	return nil, fmt.Errorf("%w: uid %d gid %d (groups %v) is in no tenant", ErrPermission, cr.Uid, cr.Gid, cr.Groups)
}

// isAdmin reports whether uid is root or the daemon's own uid, which are
// let in unless DeniedUIDs names them.
func (s *Server) isAdmin(uid uint32) bool {
	return uid == 0 || uid == uint32(os.Geteuid())
}

// needGroups reports whether any tenant is chosen by gid, so accepting a
// peer must read its supplementary groups.
func needGroups(ts []*tenant) bool {
	return slices.ContainsFunc(ts, func(t *tenant) bool { return len(t.GIDs) > 0 })
}

// TenantUsage is one tenant's pool usage and connections, for stats and
// metrics.
type TenantUsage struct {
	Name        string
	PoolID      xfer.SegmentID
	Connections int
	// Pool is the pool's counters as Stats reports them (size, used,
	// blocks, ...), when the pool reports stats.
	Pool []wire.Counter
}

// TenantUsage reports every tenant's pool usage and connections.
func (s *Server) TenantUsage() []TenantUsage {
	n := make([]int, len(s.tenants))
	s.mu.Lock()
	for c := range s.conns {
		if c.tenant != nil {
			n[c.tenant.index]++
		}
	}
	s.mu.Unlock()
	out := make([]TenantUsage, len(s.tenants))
	for i, t := range s.tenants {
		out[i] = TenantUsage{Name: t.Name, PoolID: t.Pool.ID(), Connections: n[i], Pool: statsCounters(t.Pool, nil)}
	}
	return out
}

// tenantCounters appends every tenant's pool usage to dst as
// tenant.NAME.COUNTER (and tenant.NAME.connections), for the Stats of root
// and the daemon's uid: another tenant's client sees only its own pool.
func (s *Server) tenantCounters(dst []wire.Counter) []wire.Counter {
	for _, u := range s.TenantUsage() {
		p := "tenant." + u.Name + "."
		dst = append(dst, wire.Counter{Name: p + "connections", Value: uint64(u.Connections)})
		for _, c := range u.Pool {
			switch c.Name {
			case "size", "used", "requested", "free_bytes", "blocks", "slabs", "free_slabs":
				dst = append(dst, wire.Counter{Name: p + c.Name, Value: c.Value})
			}
		}
	}
	return dst
}
