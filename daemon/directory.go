package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcd"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
)

// The multi-host directory in the daemon. With directory = etcd the
// daemon opens an etcd.Dir and claims its id before its peer plane listens
// (the tcp node finds peers in it; New fails there when another live
// daemon holds the id), registers once the peer plane and RDMA are up,
// tells it about every export (the control server's catalog hook) and
// lets the request's lane choose how OpenRemote may look a peer up
// (dirPlane). The directory closes after the peer plane: leaving revokes
// the lease.

// openDirectory opens the etcd directory when the config asks for it; nil
// for the embedded one.
func openDirectory(cfg Config, log *slog.Logger) (*etcd.Dir, error) {
	if cfg.Directory != "etcd" {
		return nil, nil
	}
	static := make([]directory.Peer, len(cfg.Peers))
	for i, pc := range cfg.Peers {
		static[i] = directory.Peer{ID: pc.ID, Addr: pc.Addr}
	}
	d, err := etcd.Open(etcd.Config{
		Endpoints: cfg.EtcdEndpoints, Prefix: cfg.EtcdPrefix,
		CAFile: cfg.EtcdCAFile, CertFile: cfg.EtcdCertFile, KeyFile: cfg.EtcdKeyFile,
		Budget: time.Duration(cfg.StalenessBudget), LeaseTTL: time.Duration(cfg.EtcdLeaseTTL),
		Self: cfg.DaemonID, Static: static, Log: log, Clock: cfg.clock,
	})
	if err != nil {
		return nil, fmt.Errorf("directory = etcd (etcd_endpoints = %v): %w", cfg.EtcdEndpoints, err)
	}
	return d, nil
}

// peerDirectory is the directory the tcp node uses: the etcd one, or nil
// for the node's own embedded one (a nil *etcd.Dir must not become a
// non-nil interface).
func peerDirectory(d *etcd.Dir) directory.Directory {
	if d == nil {
		return nil
	}
	return d
}

// claimDirectory claims this daemon's id in etcd, before anything
// listens: another live holder of the id stops start-up here.
func (d *Daemon) claimDirectory() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg.EtcdLeaseTTL)+30*time.Second)
	defer cancel()
	if err := d.dir.Claim(ctx); err != nil {
		return fmt.Errorf("directory = etcd (daemon_id = %q, etcd_endpoints = %v): %w", d.cfg.DaemonID, d.cfg.EtcdEndpoints, err)
	}
	return nil
}

// joinDirectory registers this daemon: its id, epoch, peer address, RDMA
// addressing and capabilities.
func (d *Daemon) joinDirectory() error {
	m := directory.Member{ID: d.cfg.DaemonID, Epoch: d.peers.node.Epoch(), Addr: d.peers.node.Addr(),
		Caps: []string{"tcp", "notify"}}
	if d.rdma != nil {
		i := d.rdma.info()
		m.RDMA = &directory.RDMAAddr{Device: i.Device, Port: i.Port, GID: i.GID, MTU: i.MTU}
		m.Caps = append(m.Caps, "rdma")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg.EtcdLeaseTTL)+30*time.Second)
	defer cancel()
	if err := d.dir.Join(ctx, m); err != nil {
		return fmt.Errorf("directory = etcd (daemon_id = %q, etcd_endpoints = %v): %w", d.cfg.DaemonID, d.cfg.EtcdEndpoints, err)
	}
	return nil
}

// directoryReporter is what tcctl directory reports: the etcd directory,
// else the peer plane's embedded one (the configured peers, with the
// epochs their handshakes told), else, without a peer plane, the
// configured peers alone.
func (d *Daemon) directoryReporter() (directory.Reporter, error) {
	if d.dir != nil {
		return d.dir, nil
	}
	if d.peers != nil {
		if r, ok := d.peers.node.Directory().(directory.Reporter); ok {
			return r, nil
		}
		return nil, fmt.Errorf("the peer plane's directory %T cannot report itself", d.peers.node.Directory())
	}
	peers := make([]directory.Peer, len(d.cfg.Peers))
	for i, pc := range d.cfg.Peers {
		peers[i] = directory.Peer{ID: pc.ID, Addr: pc.Addr}
	}
	return directory.NewEmbedded(directory.Peer{ID: d.cfg.DaemonID}, peers)
}

// directoryCounters appends the directory's state and cache counters to
// dst for Stats.
func (d *Daemon) directoryCounters(dst []wire.Counter) []wire.Counter {
	if d.dir == nil {
		return dst
	}
	s := d.dir.Cache().Stats()
	up := uint64(0)
	if d.dir.State() == directory.StateUp {
		up = 1
	}
	age := uint64(0)
	if s.Age != directory.Never {
		age = uint64(s.Age / time.Millisecond)
	} else {
		age = ^uint64(0)
	}
	return append(dst,
		wire.Counter{Name: "directory_up", Value: up},
		wire.Counter{Name: "directory_cache_age_ms", Value: age},
		wire.Counter{Name: "directory_members", Value: uint64(s.Members)},
		wire.Counter{Name: "directory_exports", Value: uint64(s.Exports)},
		wire.Counter{Name: "directory_lookups", Value: s.Lookups},
		wire.Counter{Name: "directory_hits", Value: s.Hits},
		wire.Counter{Name: "directory_fallbacks_store", Value: s.FallbackStore},
		wire.Counter{Name: "directory_fallbacks_peer", Value: s.FallbackPeer},
		wire.Counter{Name: "directory_unavailable", Value: s.Unavailable},
		wire.Counter{Name: "directory_corrections", Value: s.Corrections},
		wire.Counter{Name: "directory_dropped", Value: s.Dropped},
		wire.Counter{Name: "directory_etcd_requests", Value: d.dir.Requests()},
	)
}

// dirPlane is the peer plane as the control server sees it with the etcd
// directory: OpenRemote first resolves the peer as the request's lane
// allows, then opens at the address found, and what the owner answers
// corrects the directory.
type dirPlane struct {
	*peerPlane
	dir *etcd.Dir
}

var _ control.LaneOpener = (*dirPlane)(nil)

// OpenRemote implements control.PeerPlane for requests without a
// context: the default lane (catalog-first).
func (p *dirPlane) OpenRemote(peer, segment string, rights, transport uint8) (control.RemoteSegment, error) {
	return p.OpenRemoteIn(control.OpenContext{}, peer, segment, rights, transport)
}

// OpenRemoteIn implements control.LaneOpener. The lookup may fail closed
// (UNAVAILABLE: nothing cached within the budget and the lane may not, or
// could not, ask etcd), find nothing (NOT_FOUND), or give an address that
// the owner's handshake and token then confirm or refute: a peer that
// does not answer as itself there, or refuses the export, is an error for
// the caller and a correction for the cache.
func (p *dirPlane) OpenRemoteIn(ctx control.OpenContext, peer, segment string, rights, transport uint8) (control.RemoteSegment, error) {
	lane, err := directory.ParseLane(ctx.Lane)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", control.ErrMalformed, err)
	}
	v, err := p.dir.ResolveMember(context.Background(), lane, peer)
	switch {
	case errors.Is(err, directory.ErrNotFound):
		return nil, fmt.Errorf("%w: %w", control.ErrNotFound, err)
	case err != nil:
		p.log.Debug("remote segment refused: the directory cannot answer", "peer", peer, "name", segment, "lane", lane.String(), "err", err)
		return nil, fmt.Errorf("%w: %w", control.ErrUnavailable, err)
	}
	r, err := p.peerPlane.OpenRemote(peer, segment, rights, transport)
	switch {
	case err == nil:
		p.dir.Observe(peer, r.Epoch(), v.Member)
		return r, nil
	case errors.Is(err, tcp.ErrNotFound):
		p.dir.ExportGone(peer, segment)
	case errors.Is(err, tcp.ErrConnLost), errors.Is(err, tcp.ErrAuth), errors.Is(err, tcp.ErrRefused):
		p.dir.Unreachable(peer, err)
		age := "never synced"
		if v.Age != directory.Never {
			age = v.Age.Round(time.Millisecond).String() + " old"
		}
		return nil, fmt.Errorf("%w: %s did not answer as itself at %s, the address the directory gave (%s, %s): %w",
			control.ErrUnavailable, peer, v.Member.Addr, v.Source, age, err)
	}
	return nil, err
}
