package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/directory/etcd"
	"github.com/tensorcast/tensorcast/ktrace"
	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/peer/plane"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Version is the daemon's version, reported by Hello and the log.
var Version = "0.1.0-dev"

// Daemon is one running tensorcastd: the pool, the segment registry, the
// engine and its transports, the control server, the metrics endpoint.
//
// Start-up order: pool, registry, transports (the export table, then the
// peer plane when peer_listen is set: its tcp node, then RDMA with the
// pools registered), engine,
// the KV block store (its L2 through the file tier), control socket (inherited from systemd when socket-activated), eBPF
// views, metrics endpoint, then READY. Shutdown is STOPPING, then the
// bounded drain (drain.go): no new work (clients told UNAVAILABLE), the
// transports get drain_timeout to finish, what is left is abandoned and
// logged, and the parts close (metrics endpoint and eBPF views, engine,
// peer node, control server, store, the peer plane's RDMA, files, local transport, pool) within
// drain_timeout plus a small grace, whatever a transport does.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	notify *Notifier
	// watchdog is the WATCHDOG=1 period; zero when systemd wants none.
	watchdog time.Duration

	// pools are the tenants' pools, in the order of TenantList (one, the
	// default tenant's, without [[tenants]]); names are the tenants' names.
	pools []*shm.Pool
	names []string
	reg   *xfer.Registry
	local *xfer.Local
	files *fileTier
	// stores are the tenants' KV block stores, beside pools (each tenant's
	// values live in its own pool); empty with store = off.
	stores []*store.Store
	// grants are each store's retention handles and placement leases,
	// beside stores; admission is the mode's budgets for remote work
	// (grant.go).
	grants    []*grant.Grants
	admission *grant.Admission
	// cluster is the store across hosts (cluster.go), nil when the store
	// is this host's alone; mover moves its values, poolExport is the
	// pool as its peers read it.
	cluster    *cluster.Cluster
	mover      *mover
	poolExport *peer.Export
	// keep hands the pools and the stores' L1 journals to systemd across
	// restarts (restart.go).
	keep keepL1
	// lockFile holds SOCKET.lock, the daemon's claim on the socket, its
	// pools and L2 files: released once nothing of the daemon can write
	// them (handoff.go). hand is the hand-off to a newer daemon
	// (store_handoff = on), nil otherwise; storeCloseErr is what closing
	// the stores said, which keeps their state from being handed over.
	lockFile      *os.File
	hand          *handoffState
	storeCloseErr error
	// started is set when Run started the parts' goroutines.
	started atomic.Bool
	dir     *etcd.Dir // nil with the embedded directory
	// exports is the daemon's export table: the control server exports
	// into it, the peer plane serves peers from it.
	exports *peer.Exports
	peers   *plane.Plane // nil without peer_listen
	engine  *xfer.Engine
	server  *control.Server
	// reactors serve the clients' queues: the guests of the file tier's
	// rings, or on their own threads without io_uring.
	reactors *reactor.Pool

	metrics    *metrics.Registry
	metricsSrv *metrics.Server // nil with metrics_address off
	kviews     *ktrace.Views   // nil with ebpf off or unavailable

	// closeOnce guards the teardown in shutdown.
	closeOnce sync.Once
	// stopping is set when the shutdown starts: the watchdog no longer
	// asks for health then.
	stopping atomic.Bool
}

// SyscallLoops is how many goroutines a daemon run with cfg keeps asleep
// in system calls that hold their Go processor until the runtime's monitor
// takes it back (io_uring_enter, futex, epoll_wait): one per reactor
// worker, and the tcp node's event loops when the daemon has a peer plane.
// cmd/tensorcastd runs that many Go processors beyond its CPUs.
func SyscallLoops(cfg Config) int {
	n := reactor.Config{Workers: cfg.DataWorkers}.WorkersFor()
	if cfg.PeerListen != "" {
		n += tcp.EventLoops()
	}
	return n
}

// New builds a daemon from a validated config. Nothing listens until Run.
func New(cfg Config, log *slog.Logger, getenv func(string) string) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("%w: data_dir = %q: %v", ErrConfig, cfg.DataDir, err)
	}
	d := &Daemon{cfg: cfg, log: log, notify: NewNotifier(getenv), watchdog: WatchdogInterval(getenv)}
	defer func() {
		if err != nil {
			d.closeParts()
		}
	}()

	// Descriptors systemd passed: the control socket, and the pools and L1
	// journals it kept from the daemon before this one.
	in, err := listenFDs(getenv)
	if err != nil {
		return nil, err
	}
	// The socket's lock, taken over from a running daemon with
	// store_handoff = on: its pools and L1 journals, as systemd would pass
	// them.
	handed, err := d.acquireLock()
	if err != nil {
		in.closeAll()
		return nil, err
	}
	in.merge(handed)
	d.planKeepL1(getenv)
	d.reg = xfer.NewRegistry()
	segs := make([]xfer.MemSegment, 0, len(cfg.TenantList()))
	for _, t := range cfg.TenantList() {
		size := cfg.TenantPoolSize(t)
		p, adopted, err := d.newPool(in, shm.PoolConfig{ID: d.reg.NextID(), Name: t.Name, Size: uint64(size), Hugepages: cfg.Hugepages},
			t.Name, log.With("component", "pool", "tenant", t.Name))
		if err != nil {
			return nil, fmt.Errorf("pool of tenant %q (pool_size = %s, hugepages = %s): %w", t.Name, size, cfg.Hugepages, err)
		}
		d.pools, d.names = append(d.pools, p), append(d.names, t.Name)
		d.keep.adopted = append(d.keep.adopted, adopted)
		segs = append(segs, p)
		if err := d.reg.Add(p); err != nil {
			return nil, err
		}
	}
	d.local = xfer.NewLocal(xfer.LocalConfig{}, log.With("component", "local"))
	workers := reactor.Config{Workers: cfg.DataWorkers, Poll: time.Duration(cfg.DataPoll)}
	if cfg.DataPoll == 0 {
		workers.Poll = -1 // never
	}
	if cfg.DataDoorbell != "auto" {
		workers.Doorbell = cfg.DataDoorbell
	}
	d.files = newFileTier(cfg, workers.WorkersFor(), segs, d.notify, log.With("component", "uring"))
	var host reactor.Host // an untyped nil without the file tier
	if d.files != nil {
		host = d.files.t
	}
	if d.reactors, err = reactor.New(workers, host, log.With("component", "reactor")); err != nil {
		return nil, err
	}
	// Memory↔memory requests go to the local transport, those whose target
	// is a file to the io_uring tier and those whose target is a peer's
	// segment to the peer plane's transport for it (its rdma link, or tcp).
	rt := xfer.KindRouter{Mem: d.local}
	if d.files != nil {
		rt.File = d.files.transport()
	}
	if d.dir, err = openDirectory(cfg, log); err != nil {
		return nil, err
	}
	d.exports = peer.NewExports(catalogOf(d.dir))
	if d.dir != nil {
		// Before the peer plane listens: a daemon refused for a held id
		// never listens on its peer port.
		if err := d.claimDirectory(); err != nil {
			return nil, err
		}
	}
	if cfg.PeerListen != "" {
		// Each reactor worker reaps the completions of the RDMA work it
		// posts, in its own loop (rdma.Homes).
		homes := rdma.NewHomes(d.reactors.Workers(), 0)
		for i := range homes.Len() {
			if err := d.reactors.AddReaper(i, homes.Home(i)); err != nil {
				return nil, err
			}
		}
		if d.peers, err = newPeerPlane(cfg, d.dir, segs, d.exports, homes, d.handedPeerListener(in), log); err != nil {
			return nil, err
		}
		rt.Remote = d.peers
		if d.dir != nil {
			if err := d.joinDirectory(); err != nil {
				return nil, err
			}
		}
	}
	d.engine = xfer.NewEngine(xfer.Config{ErrorCode: d.errorCode}, rt, log.With("component", "engine"))
	if err := d.openJournals(in); err != nil {
		return nil, err
	}
	if err := d.openStore(); err != nil {
		return nil, err
	}
	if err := d.storeFDs(); err != nil {
		return nil, err
	}
	if err := d.openGrants(); err != nil {
		return nil, err
	}
	if err := d.openCluster(); err != nil {
		return nil, err
	}

	scfg := control.Config{
		Socket:      cfg.Socket,
		Mode:        os.FileMode(cfg.SocketMode),
		MaxFrame:    int(cfg.MaxFrame),
		MaxConns:    cfg.MaxConns,
		AllowedUIDs: cfg.AllowedUIDs,
		AllowedGIDs: cfg.AllowedGIDs,
		Limits:      control.Limits{MaxBufferSize: uint64(cfg.MaxBufferSize)},

		MaxConnsPerUID: cfg.MaxConnsPerUID,
		DeniedUIDs:     cfg.DeniedUIDs,
		FrameTimeout:   time.Duration(cfg.FrameTimeout),
		AcceptStall:    time.Duration(cfg.AcceptStallTimeout),
		DaemonID:       cfg.DaemonID,
		Version:        Version,
		PeerAddr:       d.PeerAddr(),
	}
	deps := control.Deps{Engine: d.engine, Registry: d.reg, Exports: d.exports, RDMA: plane.NoPlane, Reactors: d.reactors}
	if len(cfg.Tenants) == 0 {
		deps.Pool, deps.Store, deps.Grants = d.pools[0], d.storeOf(0), d.grantsOf(0)
	} else {
		scfg.AllowedUIDs, scfg.AllowedGIDs = nil, nil
		for i, t := range cfg.Tenants {
			deps.Tenants = append(deps.Tenants, control.Tenant{Name: t.Name, UIDs: t.UIDs, GIDs: t.GIDs, Pool: d.pools[i], Store: d.storeOf(i),
				Grants: d.grantsOf(i)})
		}
	}
	if d.files != nil {
		deps.FileOpener = d.files
	}
	deps.TransportStats = d.transportCounters
	deps.Admission = d.admission
	if d.cluster != nil {
		deps.Locate = d.locate
		deps.Shards = d.shards
	}
	if d.peers != nil {
		deps.Peers, deps.RDMA = d.peers, d.peers
	}
	if deps.Directory, err = d.directoryReporter(); err != nil {
		return nil, err
	}
	inherited, err := inheritedListener(in)
	if err != nil {
		return nil, err
	}
	for _, name := range in.closeRest(log) {
		d.forget(name) // kept for a daemon that keeps L1; this one does not
	}
	if inherited != nil {
		scfg.Listener = inherited
		if addr := inherited.Addr().String(); addr != cfg.Socket {
			log.Warn("serving on the socket systemd passed, not on the configured one", "inherited", addr, "socket", cfg.Socket)
			d.cfg.Socket = addr
		}
		log.Info("control socket inherited from systemd (socket activation)", "socket", d.cfg.Socket)
	}
	d.server, err = control.NewServer(scfg, deps, log.With("component", "control"))
	if err != nil {
		if inherited != nil {
			inherited.Close()
		}
		return nil, fmt.Errorf("control socket %s: %w", cfg.Socket, err)
	}
	if err := d.openKernelViews(); err != nil {
		return nil, err
	}
	if err := d.newMetrics(); err != nil {
		return nil, err
	}
	if err := d.listenHandoff(); err != nil {
		return nil, err
	}
	return d, nil
}

// Run serves until ctx is canceled (SIGTERM, SIGINT), then drains within
// drain_timeout and tears down. It returns nil after a clean drain.
func (d *Daemon) Run(ctx context.Context) error {
	d.started.Store(true)
	var handReqs chan *net.UnixConn // nil: never ready
	if d.hand != nil {
		handReqs = d.hand.reqs
		go d.serveHandoff()
	}
	d.server.Start()
	metricsAddr := "off"
	if d.metricsSrv != nil {
		d.metricsSrv.Start()
		metricsAddr = d.metricsSrv.Addr()
	}
	var poolSize uint64
	for _, p := range d.pools {
		poolSize += p.Size()
	}
	d.log.Info("tensorcastd ready", "version", Version, "socket", d.cfg.Socket,
		"pool_size", Size(poolSize).String(), "tenants", d.names, "hugepages", d.pools[0].Hugepages(), "data_dir", d.cfg.DataDir,
		"file_tier", d.files != nil, "daemon_id", d.cfg.DaemonID, "peer_plane", d.peerAddr(), "metrics", metricsAddr)
	if err := d.notify.Notify("READY=1\nSTATUS=serving on " + d.cfg.Socket); err != nil {
		d.log.Warn("sd_notify READY failed", "err", err)
	}

	// The watchdog goroutine is owned by Run: stopped (close(stop)) and
	// waited for before Run returns. It sends WATCHDOG=1 only while the
	// daemon is healthy (health), so a daemon that cannot serve is
	// restarted by systemd rather than kept alive.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if d.watchdog > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(d.watchdog)
			defer t.Stop()
			unhealthy := false
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					var err error
					if !d.stopping.Load() {
						err = d.health() // a drain closes the server: not a fault
					}
					if err != nil {
						if !unhealthy {
							d.log.Error("daemon unhealthy: watchdog keep-alives stop, so that systemd restarts it", "err", err)
							if nerr := d.notify.Notify("STATUS=unhealthy: " + err.Error()); nerr != nil {
								d.log.Warn("sd_notify STATUS failed", "err", nerr)
							}
						}
						unhealthy = true
						continue
					}
					if unhealthy {
						unhealthy = false
						d.log.Info("daemon healthy again: watchdog keep-alives resume")
						if nerr := d.notify.Notify("STATUS=serving on " + d.cfg.Socket); nerr != nil {
							d.log.Warn("sd_notify STATUS failed", "err", nerr)
						}
					}
					if err := d.notify.Notify("WATCHDOG=1"); err != nil {
						d.log.Warn("sd_notify WATCHDOG failed", "err", err)
					}
				}
			}
		}()
	}

	select {
	case <-ctx.Done():
		d.log.Info("shutting down: draining", "drain_timeout", d.cfg.DrainTimeout.String())
	case c := <-handReqs:
		d.hand.conn = c
		d.holdPeerListener()
		d.log.Info("handing over to a new daemon: draining", "drain_timeout", d.cfg.DrainTimeout.String())
	}
	d.stopping.Store(true)
	if err := d.notify.Notify("STOPPING=1"); err != nil {
		d.log.Warn("sd_notify STOPPING failed", "err", err)
	}
	err := d.shutdown()
	close(stop)
	wg.Wait()
	d.notify.Close()
	if err == nil && d.hand != nil && d.hand.handedOver {
		// Exiting would have the container restarted in its pod, and the
		// daemon there would ask for the pools back: this one holds
		// nothing now (no pool, journal, L2 file, socket or lock) and
		// waits to be stopped.
		d.log.Info("handed over: this daemon holds nothing any more; waiting for SIGTERM to exit")
		<-ctx.Done()
	}
	return err
}

// closeParts closes whatever New built, in reverse order; safe on a
// partially built daemon.
func (d *Daemon) closeParts() {
	// The endpoint goes first: its sources read the parts closed below.
	if d.metricsSrv != nil {
		if err := d.metricsSrv.Close(); err != nil {
			d.log.Warn("closing metrics endpoint", "err", err)
		}
	}
	d.closeKernelViews()
	if d.server != nil {
		if err := d.server.Close(); err != nil {
			d.log.Warn("closing control server", "err", err)
		}
	}
	d.detachCluster()
	if d.engine != nil {
		if err := d.engine.Close(); err != nil {
			d.log.Warn("closing engine", "err", err)
		}
	}
	if d.cluster != nil {
		d.peers.Stop() // the cluster's exchanges end at once
		d.closeCluster()
	}
	d.closeStore()
	d.closeJournals()
	if d.peers != nil {
		d.peers.Close()
	}
	if d.dir != nil {
		d.dir.Close()
	}
	if d.files != nil {
		d.files.Close()
	}
	if d.reactors != nil {
		d.reactors.Close()
	}
	if d.local != nil {
		if err := d.local.Close(); err != nil {
			d.log.Warn("closing local transport", "err", err)
		}
	}
	d.closePools()
	d.closeHandoffListener()
	d.releaseLock()
}

// health is nil while the daemon can serve new clients; otherwise why not
// (its control server cannot accept: see control.Server.Health; or an
// io_uring ring failed: see uring.Transport.Health).
func (d *Daemon) health() error {
	if d.server == nil {
		return control.ErrClosed
	}
	if err := d.server.Health(); err != nil {
		return err
	}
	if d.files != nil {
		return d.files.t.Health()
	}
	return nil
}

// closePools closes the tenants' pools.
func (d *Daemon) closePools() {
	for i, p := range d.pools {
		if err := p.Close(); err != nil {
			d.log.Warn("closing pool", "tenant", d.names[i], "err", err)
		}
	}
}

// peerAddr is the peer plane's address for the log; "off" without one.
func (d *Daemon) peerAddr() string {
	if d.peers == nil {
		return "off"
	}
	return d.peers.Node().Addr()
}

// PeerAddr is the address the peer plane listens on ("" without one).
func (d *Daemon) PeerAddr() string {
	if d.peers == nil {
		return ""
	}
	return d.peers.Node().Addr()
}

// transportCounters are the transports' counters for Stats: the io_uring
// rings' and the RDMA plane's, whichever this daemon has.
func (d *Daemon) transportCounters(dst []wire.Counter) []wire.Counter {
	if d.files != nil {
		dst = d.files.counters(dst)
	}
	for i, w := range d.reactors.Stats() {
		p := "reactor.worker" + strconv.Itoa(i) + "."
		dst = append(dst,
			wire.Counter{Name: p + "queues", Value: uint64(w.Queues)},
			wire.Counter{Name: p + "passes", Value: w.Passes},
			wire.Counter{Name: p + "sleeps", Value: w.Sleeps},
			wire.Counter{Name: p + "deaf", Value: w.Deaf},
			wire.Counter{Name: p + "polls", Value: w.Polls},
			wire.Counter{Name: p + "poll_misses", Value: w.PollMisses},
			wire.Counter{Name: p + "polls_capped", Value: w.PollsCapped})
	}
	if d.peers != nil {
		dst = d.peers.Counters(dst)
	}
	return d.clusterCounters(d.directoryCounters(d.kernelCounters(dst)))
}
