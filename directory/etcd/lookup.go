package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorcast/tensorcast/directory"
)

// Lookup implements directory.Directory for the transports: the member's
// address and epoch as the cache last knew them, whatever their age (the
// peer's handshake decides; lookups that answer requests go through
// ResolveMember, which applies the budget), else a configured or observed
// peer.
func (d *Dir) Lookup(id string) (directory.Peer, bool) {
	if id != d.cfg.Self {
		if m, ok := d.cache.Peek(id); ok {
			return directory.Peer{ID: id, Addr: m.Addr, Epoch: m.Epoch}, true
		}
	}
	return d.static.Lookup(id)
}

// List implements directory.Directory: this daemon, the registered
// members and the configured or observed peers, sorted by id.
func (d *Dir) List() []directory.Peer {
	out := d.static.List()
	seen := make(map[string]int, len(out))
	for i, p := range out {
		seen[p.ID] = i
	}
	for _, mv := range d.cache.Members() {
		m := mv.Member
		p := directory.Peer{ID: m.ID, Addr: m.Addr, Epoch: m.Epoch, Self: m.ID == d.cfg.Self}
		if i, ok := seen[m.ID]; ok {
			if !out[i].Self {
				out[i] = p
			}
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b directory.Peer) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Update implements directory.Directory. The transports call it with what
// a peer's handshake showed: for a registered member, that confirms the
// entry or, with another epoch, marks it stale (a correction); a peer
// outside the store is kept as the embedded directory keeps it.
func (d *Dir) Update(p directory.Peer) error {
	if p.ID == d.cfg.Self {
		return d.static.Update(p)
	}
	if m, ok := d.cache.Peek(p.ID); ok {
		if p.Epoch != 0 {
			d.Observe(p.ID, p.Epoch, m)
		}
		return nil
	}
	return d.static.Update(p)
}

// Remove implements directory.Directory for configured and observed
// peers; registered members leave by their lease.
func (d *Dir) Remove(id string) error { return d.static.Remove(id) }

// Observe records the epoch peer id showed (its handshake, or a token it
// issued); m is the entry the cache had.
func (d *Dir) Observe(id string, epoch uint64, m directory.Member) {
	if d.cache.Observe(id, epoch) {
		d.log.Info("peer runs another epoch than its directory entry says; the entry is stale until etcd rewrites it",
			"peer", id, "entry_epoch", fmt.Sprintf("%#x", m.Epoch), "peer_epoch", fmt.Sprintf("%#x", epoch))
	}
}

// ResolveMember looks daemon id up for a request in lane (see
// directory.Cache.ResolveMember). A peer the config names (or that
// authenticated to this daemon) and the store does not know is answered
// from the config.
func (d *Dir) ResolveMember(ctx context.Context, lane directory.Lane, id string) (directory.MemberView, error) {
	if d.closed.Load() {
		return directory.MemberView{}, directory.ErrClosed
	}
	v, err := d.cache.ResolveMember(ctx, lane, id)
	if err != nil && (errors.Is(err, directory.ErrNotFound) || errors.Is(err, directory.ErrUnavailable)) {
		if p, ok := d.static.Lookup(id); ok && !p.Self && p.Addr != "" {
			return directory.MemberView{Member: directory.Member{ID: id, Addr: p.Addr, Epoch: p.Epoch}, Source: directory.SourceCache}, nil
		}
	}
	return v, err
}

// ResolveExport looks the catalog entry owner/name up for a request in
// lane.
func (d *Dir) ResolveExport(ctx context.Context, lane directory.Lane, owner, name string) (directory.ExportView, error) {
	if d.closed.Load() {
		return directory.ExportView{}, directory.ErrClosed
	}
	return d.cache.ResolveExport(ctx, lane, owner, name)
}

// Unreachable records that the address the directory gave for id did not
// answer as id (the dial failed, or another daemon answered).
func (d *Dir) Unreachable(id string, err error) {
	if d.cache.Unreachable(id) {
		d.log.Info("peer did not answer at its directory address; the entry is stale until etcd rewrites it", "peer", id, "err", err)
	}
}

// ExportGone records that owner refused name as not exported.
func (d *Dir) ExportGone(owner, name string) {
	if d.cache.ExportGone(owner, name) {
		d.log.Info("owner no longer exports a segment the catalog lists; the entry is stale until etcd rewrites it", "owner", owner, "name", name)
	}
}

// Status implements directory.Reporter. It reads the lease time left of
// up to maxStatusLeases members from etcd, within ctx and statusLeaseWait
// in all, and none while etcd is down: a report never waits long on the
// store it reports on.
func (d *Dir) Status(ctx context.Context) directory.Status {
	d.smu.Lock()
	st := directory.Status{Backend: "etcd", State: d.state, Since: d.since, Outages: d.outages,
		Endpoints: slices.Clone(d.cfg.Endpoints), Prefix: d.cfg.Prefix, Budget: d.cfg.Budget, LeaseTTL: d.cfg.LeaseTTL,
		Self: d.cfg.Self, Epoch: d.self.Epoch}
	down := d.state == directory.StateDown
	d.smu.Unlock()
	st.Cache = d.cache.Stats()
	d.pmu.Lock()
	for name, e := range d.desired {
		if d.applied[name] == e.Generation {
			st.Published++
		} else {
			st.Pending++
		}
	}
	d.pmu.Unlock()
	// Lease times are read from etcd, at most maxStatusLeases of them
	// within statusLeaseWait in all; none while etcd is known down (each
	// would wait out its timeout), and none after a read failed.
	lctx, lcancel := context.WithTimeout(ctx, statusLeaseWait)
	defer lcancel()
	readLeases := !down && !d.closed.Load()
	for i, mv := range d.cache.Members() {
		ms := directory.MemberStatus{ID: mv.Member.ID, Epoch: mv.Member.Epoch, Addr: mv.Member.Addr, Caps: mv.Member.Caps,
			Self: mv.Member.ID == d.cfg.Self, Age: mv.Age, LeaseLeft: -1}
		if readLeases && i < maxStatusLeases && mv.Lease != 0 {
			d.requests.Add(1)
			ttl, err := d.cli.TimeToLive(lctx, clientv3.LeaseID(mv.Lease))
			switch {
			case err != nil:
				readLeases = false
			case ttl.TTL >= 0:
				ms.LeaseLeft = time.Duration(ttl.TTL) * time.Second
			}
		}
		st.Members = append(st.Members, ms)
	}
	st.Requests = d.requests.Load()
	return st
}
