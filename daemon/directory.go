package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/directory/etcd"
	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/wire"
)

// The multi-host directory in the daemon. With directory = etcd the
// daemon opens an etcd.Dir and claims its id before its peer plane listens
// (the tcp node finds peers in it; New fails there when another live
// daemon holds the id), registers once the peer plane and RDMA are up,
// and hands it to the export table (its catalog) and to the peer plane
// (its Resolver, which lets a request's lane choose how OpenRemote may
// look a peer up). The directory closes after the peer plane: leaving
// revokes the lease.

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
		Self: cfg.DaemonID, Static: static, Log: log, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("directory = etcd (etcd_endpoints = %v): %w", cfg.EtcdEndpoints, err)
	}
	return d, nil
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
	m := d.peers.Member()
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
		if r, ok := d.peers.Node().Directory().(directory.Reporter); ok {
			return r, nil
		}
		return nil, fmt.Errorf("the peer plane's directory %T cannot report itself", d.peers.Node().Directory())
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

// collectDirectory is the etcd directory's metrics source (nothing with
// the embedded one): the cache's age beside its staleness budget, and how
// lookups were answered.
func (d *Daemon) collectDirectory(e *metrics.Emit) {
	if d.dir == nil {
		return
	}
	s := d.dir.Cache().Stats()
	age := math.Inf(1)
	if s.Age != directory.Never {
		age = s.Age.Seconds()
	}
	e.Bool("tensorcast_directory_up", "Whether the etcd directory is up (its feed and lease current).", d.dir.State() == directory.StateUp)
	e.Gauge("tensorcast_directory_cache_age_seconds", "Time since the feed last proved the directory cache current (+Inf before the first listing).", age)
	e.Gauge("tensorcast_directory_staleness_budget_seconds", "The staleness_budget: lookups in a cache older than this fall back or fail.",
		time.Duration(d.cfg.StalenessBudget).Seconds())
	e.Gauge("tensorcast_directory_members", "Daemons the directory cache holds.", float64(s.Members))
	e.Gauge("tensorcast_directory_exports", "Exports the directory cache holds.", float64(s.Exports))
	e.Counter("tensorcast_directory_lookups_total", "Directory lookups.", float64(s.Lookups))
	e.Counter("tensorcast_directory_hits_total", "Lookups answered from the cache within the staleness budget.", float64(s.Hits))
	const fallbacks = "Lookups past the staleness budget, by where they went: etcd (store) or the owning peer."
	e.Counter("tensorcast_directory_fallbacks_total", fallbacks, float64(s.FallbackStore), metrics.L("to", "store"))
	e.Counter("tensorcast_directory_fallbacks_total", fallbacks, float64(s.FallbackPeer), metrics.L("to", "peer"))
	e.Counter("tensorcast_directory_unavailable_total", "Lookups that failed closed (UNAVAILABLE).", float64(s.Unavailable))
	e.Counter("tensorcast_directory_etcd_requests_total", "Requests the directory made to etcd.", float64(d.dir.Requests()))
}
