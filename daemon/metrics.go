package daemon

import (
	"fmt"
	"strconv"
	"time"

	"github.com/tensorcast/tensorcast/internal/faultcopy"
	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// newMetrics builds the registry with every source this daemon has and
// binds the endpoint (nil with metrics_address off). Sources read the
// components' own counters at scrape time; nothing here runs per request.
func (d *Daemon) newMetrics() error {
	d.metrics = metrics.NewRegistry(metrics.ReadBuildInfo(Version))
	for _, s := range []struct {
		name string
		src  metrics.SourceFunc
	}{
		{"transports", d.collectTransports},
		{"engine", d.collectEngine},
		{"pool", d.collectPool},
		{"control", d.collectControl},
		{"queues", d.collectQueues},
		{"uring", d.collectRings},
		{"peers", d.collectPeers},
		{"kernel", d.collectKernel},
		{"store", d.collectStore},
		{"grants", d.collectGrants},
		{"directory", d.collectDirectory},
		{"cluster", d.collectCluster},
		{"endpoint", d.collectEndpoint},
	} {
		if err := d.metrics.Register(s.name, s.src); err != nil {
			return err
		}
	}
	if d.cfg.MetricsOff() {
		return nil
	}
	scfg := metrics.ServerConfig{
		MaxConns:         d.cfg.MetricsMaxConns,
		HeaderTimeout:    time.Duration(d.cfg.MetricsHeaderTimeout),
		IdleTimeout:      time.Duration(d.cfg.MetricsIdleTimeout),
		SnapshotInterval: time.Duration(d.cfg.MetricsSnapshotInterval),
	}
	log := d.log.With("component", "metrics")
	if nofile, ok := metrics.FDLimit(); ok {
		scfg.ReservedFDs = d.cfg.MetricsReserve(nofile)
		log.Info("metrics endpoint descriptor budget", "nofile", nofile, "reserved_for_control", scfg.ReservedFDs,
			"max_conns", scfg.MaxConns)
	} else {
		log.Warn("metrics endpoint: the process's descriptor limit is unknown; only metrics_max_conns bounds it")
	}
	srv, err := metrics.Listen(d.cfg.MetricsAddress, d.metrics, scfg, log)
	if err != nil {
		return fmt.Errorf("%w: metrics_address = %q: %v", ErrConfig, d.cfg.MetricsAddress, err)
	}
	d.metricsSrv = srv
	return nil
}

// collectEndpoint reports the metrics endpoint's own connections.
func (d *Daemon) collectEndpoint(e *metrics.Emit) {
	if d.metricsSrv == nil {
		return
	}
	s := d.metricsSrv.Stats()
	e.Gauge("tensorcast_metrics_rendered_timestamp_seconds", "When this scrape's rendering was made (scrapes within metrics_snapshot_interval share one): rates are over its changes, not the scrapes'.",
		float64(time.Now().UnixNano())/1e9)
	e.Gauge("tensorcast_metrics_connections", "Connections the metrics endpoint holds.", float64(s.Conns))
	const refused = "Metrics connections closed as they came: past metrics_max_conns, or short of descriptors (the last metrics_reserved_fds are the control socket's)."
	e.Counter("tensorcast_metrics_refused_total", refused, float64(s.Refused.MaxConns), metrics.L("reason", "max_conns"))
	e.Counter("tensorcast_metrics_refused_total", refused, float64(s.Refused.Descriptors), metrics.L("reason", "descriptors"))
	e.Counter("tensorcast_metrics_renders_total", "Renderings of the metrics (scrapes within metrics_snapshot_interval share one).", float64(s.Renders))
	e.Counter("tensorcast_metrics_scrapes_total", "Scrapes answered.", float64(s.Scrapes))
}

// Metrics is the daemon's registry: a component added later registers its
// source here (see package metrics).
func (d *Daemon) Metrics() *metrics.Registry { return d.metrics }

// MetricsAddr is the bound address of the metrics endpoint, "" when off.
func (d *Daemon) MetricsAddr() string {
	if d.metricsSrv == nil {
		return ""
	}
	return d.metricsSrv.Addr()
}

// errorCode sorts a task's error into the status code a client would see,
// for the per-transport error counters.
func (d *Daemon) errorCode(err error) int { return int(status.CodeOf(err)) }

func (d *Daemon) collectTransports(e *metrics.Emit) {
	for _, t := range d.engine.TransportStats() {
		l := metrics.L("transport", t.Name)
		e.Counter("tensorcast_transport_requests_total", "Requests the transport ended (success or error).", float64(t.Requests), l)
		e.Counter("tensorcast_transport_bytes_total", "Bytes the transport reported moved.", float64(t.Bytes), l)
		e.Counter("tensorcast_transport_refused_total", "Requests the transport refused at dispatch (queue full, closed).", float64(t.Refused), l)
		e.Gauge("tensorcast_transport_in_flight", "Requests dispatched to the transport and not yet ended.", float64(t.InFlight), l)
		for c, n := range t.Errors {
			if n != 0 {
				e.Counter("tensorcast_transport_errors_total", "Requests the transport ended with an error, by the code a client sees.",
					float64(n), l, metrics.L("code", wire.Code(c).String()))
			}
		}
		e.LatencyHistogram("tensorcast_transport_latency_seconds", transportLatencyHelp, &t.Latency, l)
	}
}

// transportLatencyHelp: the engine times a sample of the submit calls
// (xfer.TransportStats.Latency), so the histogram's count is not the
// requests'.
var transportLatencyHelp = "Time from dispatch to the transport's completion, for a sample of the submit calls: about 1 in " +
	strconv.Itoa(xfer.SampleEvery) + ", every request of a sampled call. Its _count is about 1/" + strconv.Itoa(xfer.SampleEvery) +
	" of tensorcast_transport_requests_total, which counts every request."

func (d *Daemon) collectEngine(e *metrics.Emit) {
	s := d.engine.Stats()
	const tasks = "Tasks by state: waiting and pending now."
	e.Gauge("tensorcast_engine_tasks", tasks, float64(s.Waiting), metrics.L("state", xfer.StateWaiting.String()))
	e.Gauge("tensorcast_engine_tasks", tasks, float64(s.Pending), metrics.L("state", xfer.StatePending.String()))
	const ended = "Tasks that ended, by terminal state."
	for _, x := range []struct {
		st xfer.State
		n  uint64
	}{{xfer.StateCompleted, s.Completed}, {xfer.StateFailed, s.Failed}, {xfer.StateTimeout, s.Timeout}, {xfer.StateCanceled, s.Canceled}} {
		e.Counter("tensorcast_engine_tasks_ended_total", ended, float64(x.n), metrics.L("state", x.st.String()))
	}
	e.Gauge("tensorcast_engine_batches", "Batches: live (allocated), retiring (freed, still owed a completion).", float64(s.BatchesLive), metrics.L("state", "live"))
	e.Gauge("tensorcast_engine_batches", "Batches: live (allocated), retiring (freed, still owed a completion).", float64(s.BatchesRetiring), metrics.L("state", "retiring"))
	e.Counter("tensorcast_engine_bytes_total", "Bytes moved by ended tasks.", float64(s.Bytes))
	e.Counter("tensorcast_engine_contract_violations_total", "Transport contract violations the engine caught.", float64(s.Violations))
	e.Counter("tensorcast_memory_faults_total", "Copies into or out of client-shared memory that faulted (a client shrank its unsealed buffer under them); each failed only its own request.",
		float64(faultcopy.Faults()))
}

// collectPool reports each tenant's pool, labelled with the tenant.
func (d *Daemon) collectPool(e *metrics.Emit) {
	for i, p := range d.pools {
		s := p.Stats()
		tn := metrics.L("tenant", metrics.SanitizeLabel(d.names[i]))
		e.Gauge("tensorcast_pool_size_bytes", "Size of the tenant's DRAM pool (its quota).", float64(s.Size), tn)
		e.Gauge("tensorcast_pool_used_bytes", "Pool bytes in live blocks, at their block size.", float64(s.Used), tn)
		e.Gauge("tensorcast_pool_requested_bytes", "Pool bytes the live blocks were asked for.", float64(s.Requested), tn)
		e.Gauge("tensorcast_pool_free_bytes", "Pool bytes in no live block.", float64(s.FreeBytes), tn)
		e.Gauge("tensorcast_pool_blocks", "Live pool blocks.", float64(s.Blocks), tn)
		e.Gauge("tensorcast_pool_slabs", "Slabs in the pool.", float64(s.Slabs), tn)
		e.Gauge("tensorcast_pool_free_slabs", "Slabs held by no block size class.", float64(s.FreeSlabs), tn)
		e.Gauge("tensorcast_pool_fragmentation_ratio", "Share of held slabs' bytes that carries no requested data (0..1).", s.Fragmentation, tn)
		e.Bool("tensorcast_pool_hugepages", "Whether the pool is backed by hugepages.", s.Hugepages, tn)
		e.Gauge("tensorcast_pool_thp_bytes", "Pool bytes placed on transparent huge pages when the pool was made.", float64(s.THPBytes), tn)
		for _, c := range s.Classes {
			l := metrics.L("block_size", strconv.FormatUint(c.BlockSize, 10))
			e.Gauge("tensorcast_pool_class_blocks", "Live blocks per block size class.", float64(c.Live), tn, l)
			e.Gauge("tensorcast_pool_class_free_blocks", "Unused blocks in the slabs a class holds.", float64(c.FreeBlocks), tn, l)
			e.Gauge("tensorcast_pool_class_slabs", "Slabs held per block size class.", float64(c.Slabs), tn, l)
		}
	}
}

func (d *Daemon) collectControl(e *metrics.Emit) {
	e.Gauge("tensorcast_control_clients", "Client connections on the control socket.", float64(d.server.Connections()))
	for _, u := range d.server.TenantUsage() {
		e.Gauge("tensorcast_control_tenant_clients", "Client connections on the control socket, by tenant.", float64(u.Connections),
			metrics.L("tenant", metrics.SanitizeLabel(u.Name)))
	}
	e.Gauge("tensorcast_segments_registered", "Segments registered: pools, client buffers, files, opened remote segments.", float64(d.reg.Len()))
	failures, failing := d.server.AcceptFailures()
	e.Counter("tensorcast_control_accept_failures_total", "Accepts on the control socket that failed for want of descriptors or memory (each retry counts).", float64(failures))
	e.Gauge("tensorcast_control_accept_failing_seconds", "How long accepting on the control socket has been failing (0 while it works); past accept_stall_timeout the daemon is unhealthy.", failing.Seconds())
	e.Counter("tensorcast_control_panics_total", "Requests whose handler panicked (each answered INTERNAL); from the first the daemon is unhealthy, so that systemd restarts it.", float64(d.server.Panics()))
	e.Bool("tensorcast_healthy", "Whether the daemon can serve new clients (its watchdog keep-alives stop when not).", d.health() == nil)
	for _, rc := range d.server.RequestCounts(nil) {
		e.Counter("tensorcast_control_requests_total", "Control requests decoded, by message type.", float64(rc.Count), metrics.L("type", rc.Kind))
	}
}

func (d *Daemon) collectQueues(e *metrics.Emit) {
	q := d.server.QueueTotals()
	e.Gauge("tensorcast_queues_open", "Shared-memory queues open.", float64(q.Open))
	e.Counter("tensorcast_queues_opened_total", "Shared-memory queues opened.", float64(q.Opened))
	e.Gauge("tensorcast_queue_in_flight", "Requests the open queues took and have not answered yet.", float64(q.InFlight))
	e.Gauge("tensorcast_queue_unreaped", "Answers in the open queues' completion rings not reaped yet.", float64(q.Unreaped))
	e.Counter("tensorcast_queue_completions_total", "Completions posted on queues.", float64(q.Completions))
	e.Counter("tensorcast_queue_client_wakes_total", "Futex wakes of clients sleeping for completions.", float64(q.ClientWakes))
	e.Counter("tensorcast_queue_worker_sleeps_total", "Sleeps of queue workers waiting for entries or room.", float64(q.WorkerSleeps))
	e.Counter("tensorcast_queue_violations_total", "Queues broken by an invalid index their client wrote (the daemon's own count).", float64(q.Violations))
}

func (d *Daemon) collectRings(e *metrics.Emit) {
	if d.files == nil {
		return
	}
	for i, r := range d.files.t.Stats() {
		l := metrics.L("ring", strconv.Itoa(i))
		e.Gauge("tensorcast_uring_ring_entries", "Slots of the io_uring ring.", float64(r.Entries), l)
		e.Gauge("tensorcast_uring_ring_in_flight", "Tasks holding a ring slot.", float64(r.InFlight), l)
		e.Counter("tensorcast_uring_ring_sqes_total", "SQEs handed to the kernel.", float64(r.Submitted), l)
		e.Counter("tensorcast_uring_ring_resubmits_total", "Short transfers and EAGAIN/EINTR/ECANCELED retries.", float64(r.Resubmits), l)
		e.Counter("tensorcast_uring_ring_kernel_cancels_total", "Requests the kernel answered -ECANCELED though nobody canceled them (resent).", float64(r.KernelCancels), l)
		e.Counter("tensorcast_uring_ring_enters_total", "io_uring_enter calls.", float64(r.Enters), l)
		e.Counter("tensorcast_uring_ring_enter_errors_total", "io_uring_enter calls that failed (not EINTR or ETIME; EAGAIN and EBUSY when nothing was there to reap); each is retried after a back-off.", float64(r.EnterErrors), l)
		e.Bool("tensorcast_uring_ring_failed", "Whether the ring failed (its io_uring_enter kept failing): its tasks ended, it takes no more, and the daemon is unhealthy.", r.Down, l)
		e.Counter("tensorcast_uring_ring_wakeups_total", "Wake-ups of a sleeping poller.", float64(r.Wakeups), l)
		e.Counter("tensorcast_uring_ring_fixed_sqes_total", "SQEs that used a registered buffer.", float64(r.Fixed), l)
		e.Counter("tensorcast_uring_ring_traced_sqes_total", "SQEs picked for the kernel-side latency view (ebpf_uring_sample).", float64(r.Traced), l)
	}
}

func (d *Daemon) collectPeers(e *metrics.Emit) {
	if d.peers == nil {
		return
	}
	const denied = "Peer requests for an export of the tenant refused because it does not grant the asking client's tenant."
	for _, name := range d.names {
		n, _ := d.exports.Denied(name)
		e.Counter("tensorcast_peer_tenant_denied_total", denied, float64(n), metrics.L("tenant", metrics.SanitizeLabel(name)))
	}
	info := d.peers.RDMAInfo()
	links := make(map[string]*wire.RDMAPeer, len(info.Peers))
	for i := range info.Peers {
		links[info.Peers[i].ID] = &info.Peers[i]
	}
	for _, p := range d.peers.Node().Peers() {
		id := metrics.L("peer", metrics.SanitizeLabel(p.ID))
		state := linkState(p.Connected, info.State, links[p.ID])
		for _, s := range linkStates {
			e.Bool("tensorcast_peer_link_state", linkStateHelp, s == state, id, metrics.L("state", s))
		}
		e.Counter("tensorcast_peer_received_bytes_total", "Payload bytes received from the peer.", float64(p.BytesIn), id)
		e.Counter("tensorcast_peer_sent_bytes_total", "Payload bytes sent to the peer.", float64(p.BytesOut), id)
		e.Counter("tensorcast_peer_errors_total", "Connections to the peer dropped for an error.", float64(p.Errors), id)
		e.Bool("tensorcast_peer_connected", "Whether a session with the peer is up.", p.Connected, id)
		e.Gauge("tensorcast_peer_connections", "Authenticated connections with the peer, by who dialed.", float64(p.Conns), id, metrics.L("direction", "outbound"))
		e.Gauge("tensorcast_peer_connections", "Authenticated connections with the peer, by who dialed.", float64(p.Inbound), id, metrics.L("direction", "inbound"))
		e.Gauge("tensorcast_peer_info", "The peer's address and the epoch (run) it is known by (always 1).", 1, id,
			metrics.L("addr", metrics.SanitizeLabel(p.Addr)), metrics.L("epoch", fmt.Sprintf("%#x", p.Epoch)))
	}
}

// linkStates are the values of tensorcast_peer_link_state's state label.
var linkStates = [...]string{"rdma", "tcp_fallback", "tcp", "down"}

const linkStateHelp = "How requests reach the peer (1 for the current state): rdma; tcp_fallback, this daemon has RDMA " +
	"but the peer's link is not up (it failed, or the peer has none); tcp, this daemon runs no RDMA (rdma off or no device); " +
	"down, no session."

// linkState is a peer's state for tensorcast_peer_link_state, from its
// session and what the RDMA plane (in state plane) says of it (nil when it
// says nothing).
func linkState(connected bool, plane wire.RDMAState, p *wire.RDMAPeer) string {
	switch {
	case !connected:
		return "down"
	case plane != wire.RDMAEnabled:
		return "tcp"
	case p != nil && p.Transport == "rdma":
		return "rdma"
	}
	return "tcp_fallback"
}
