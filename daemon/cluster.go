package daemon

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/peer/plane"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store/cluster"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// storePoolExport is the name this daemon's pool is exported under, for
// reading only, to the daemons that read its store's values (the holds
// they take pin what they read; no client can take the name, which is
// taken before the control socket listens).
const storePoolExport = "tc-store-pool"

// openCluster builds the store across hosts when this daemon has a peer
// plane, configured peers or the etcd directory, and one store (no
// [[tenants]]): its pool
// exported for reading, a mover over the engine and the plane, and the
// Cluster as the store's Remote. Otherwise the store is this host's alone
// (said in the log when peers are configured). It runs after the store
// and the engine, before the control server.
func (d *Daemon) openCluster() error {
	if d.peers == nil || len(d.stores) == 0 || len(d.cfg.Peers) == 0 && d.dir == nil {
		return nil
	}
	log := d.log.With("component", "cluster")
	if len(d.stores) > 1 {
		log.Warn("the store across hosts is off with [[tenants]]: each tenant's store is this host's alone")
		return nil
	}
	pool := d.pools[0]
	exp, err := d.exports.Export(storePoolExport, peer.DaemonTenant, pool, 0, pool.Size(), wire.RightRead)
	if err != nil {
		return fmt.Errorf("store across hosts: exporting the pool: %w", err)
	}
	d.poolExport = exp
	members := make([]string, len(d.cfg.Peers))
	for i, p := range d.cfg.Peers {
		members[i] = p.ID
	}
	mv := &mover{engine: d.engine, plane: d.peers, pool: pool, remotes: map[string]heldRemote{}, nextID: d.reg.NextID,
		inline: int(d.cfg.RDMAInlineRead)}
	ccfg := cluster.Config{Shards: d.cfg.StoreShards, Members: members, Pool: pool.Bytes(), Log: log,
		Replicas: d.cfg.StoreReplicas, Admission: d.admission,
		// A reader's cached home answers are as old as a cached
		// directory answer may be.
		Staleness: time.Duration(d.cfg.StalenessBudget)}
	if dir := d.dir; dir != nil {
		// The members the etcd directory's cache holds: no request to
		// etcd per store call, nor per probe.
		ccfg.Directory = func() []string {
			ms := dir.Cache().Members()
			ids := make([]string, len(ms))
			for i, m := range ms {
				ids[i] = m.Member.ID
			}
			return ids
		}
		// Homes claim their shards in etcd with fenced generations.
		ccfg.Fence = etcdFence{dir: dir, epoch: d.peers.Node().Epoch()}
	}
	cl, err := cluster.New(ccfg, d.stores[0], nodePeers{d.peers.Node()}, mv)
	if err != nil {
		return fmt.Errorf("store across hosts: %w", err)
	}
	d.cluster, d.mover = cl, mv
	d.stores[0].SetRemote(cl)
	if d.cfg.RDMA != "off" && mv.inline > 0 {
		log.Info("store across hosts: a cached get of one key whose value is up to rdma_inline_read, from a holder linked by rdma, is read in one peer exchange, over tcp",
			"rdma_inline_read", d.cfg.RDMAInlineRead.String())
	}
	return nil
}

// locate answers tcctl cluster locate: key's shard, its home and
// generation, and the holders the home names.
func (d *Daemon) locate(key []byte) (wire.ClusterLocateResponse, error) {
	cl := d.cluster
	if cl == nil {
		return wire.ClusterLocateResponse{}, fmt.Errorf("%w: the store across hosts is closed", xfer.ErrUnavailable)
	}
	w, err := cl.Where(key)
	if err != nil {
		return wire.ClusterLocateResponse{}, err
	}
	r := wire.ClusterLocateResponse{Shard: uint32(w.Shard), Home: w.Home, Generation: w.Generation}
	for _, h := range w.Holders[:min(len(w.Holders), wire.MaxLocateHolders)] {
		r.Holders = append(r.Holders, h.ID)
		r.HolderEpochs = append(r.HolderEpochs, h.Epoch)
		r.HolderTiers = append(r.HolderTiers, h.Tier)
		r.HolderSizes = append(r.HolderSizes, h.Size)
		r.HolderCRCs = append(r.HolderCRCs, h.CRC)
	}
	return r, nil
}

// shards answers tcctl cluster shards: count shards from first (at most
// wire.MaxShardsAnswer), their homes, generations and keys indexed here,
// and the read claims this daemon, as a home, has outstanding by holder.
func (d *Daemon) shards(first, count uint32) (wire.ClusterShardsResponse, error) {
	cl := d.cluster
	if cl == nil {
		return wire.ClusterShardsResponse{}, fmt.Errorf("%w: the store across hosts is closed", xfer.ErrUnavailable)
	}
	if count == 0 || count > wire.MaxShardsAnswer {
		count = wire.MaxShardsAnswer
	}
	total := cl.ShardCount()
	r := wire.ClusterShardsResponse{ShardsTotal: uint32(total), First: uint32(min(int(first), total)), Fenced: cl.Fenced()}
	idx := map[string]uint16{}
	ref := func(id string) uint16 {
		if id == "" {
			return wire.NoHome
		}
		if i, ok := idx[id]; ok {
			return i
		}
		if len(r.HomeIDs) >= wire.MaxShardHomes {
			return wire.NoHome // more homes than an answer names: shown as none
		}
		i := uint16(len(r.HomeIDs))
		idx[id] = i
		r.HomeIDs = append(r.HomeIDs, id)
		return i
	}
	for _, s := range cl.Shards(int(first), int(count)) {
		r.Homes = append(r.Homes, ref(s.Home))
		r.Rendezvous = append(r.Rendezvous, ref(s.Rendezvous))
		r.Generations = append(r.Generations, s.Gen)
		r.Keys = append(r.Keys, uint32(min(s.Keys, math.MaxUint32)))
	}
	by := cl.ClaimsByHolder()
	for _, h := range slices.Sorted(maps.Keys(by)) {
		if len(r.ClaimHolders) == wire.MaxShardHomes {
			break
		}
		r.ClaimHolders = append(r.ClaimHolders, h)
		r.ClaimCounts = append(r.ClaimCounts, uint32(by[h]))
	}
	r.ClaimsOutstanding = cl.ReadClaims().Outstanding
	r.Holds = uint32(cl.Holds())
	return r, nil
}

// detachCluster makes the store this host's alone: no store call starts
// a remote step from then on. It runs before the engine closes.
func (d *Daemon) detachCluster() {
	if d.cluster != nil {
		d.stores[0].SetRemote(nil)
	}
}

// closeCluster stops the store across hosts once the engine and the peer
// node are closed (so that no move or exchange it waits for can hang):
// the fetches in flight have ended, the claims readers held here are
// released and the remote segments it read from are closed. It runs
// before the store closes.
func (d *Daemon) closeCluster() {
	if d.cluster == nil {
		return
	}
	d.stores[0].SetRemote(nil)
	d.cluster.Close()
	d.mover.close()
	if !d.poolExport.End(time.Second) {
		d.log.Warn("peer reads of the store's pool still in flight after 1s")
	}
	d.cluster = nil
}

// nodePeers is the tcp node as the cluster speaks on it.
type nodePeers struct{ n *tcp.Node }

func (p nodePeers) ID() string    { return p.n.ID() }
func (p nodePeers) Epoch() uint64 { return p.n.Epoch() }

// Handle and HandleNested hand h on as a tcp.Handler (a nil h stays nil:
// the handler is removed).
func (p nodePeers) Handle(kind string, h func(string, uint64, []byte) ([]byte, error)) error {
	return p.n.Handle(kind, h)
}

func (p nodePeers) HandleNested(kind string, h func(string, uint64, []byte) ([]byte, error)) error {
	return p.n.HandleNested(kind, h)
}

// HandleInline serves a data exchange on the connection's event loop
// (cluster.QuickPeers: the one-round-trip read).
func (p nodePeers) HandleInline(kind string, h func(string, uint64, []byte, func(resp, payload []byte)) error) error {
	if h == nil {
		return p.n.HandleInline(kind, nil)
	}
	return p.n.HandleInline(kind, h)
}

func (p nodePeers) ExchangeAt(id string, epoch uint64, kind string, req []byte, timeout time.Duration) ([]byte, error) {
	return p.n.ExchangeAt(id, epoch, kind, req, timeout)
}

func (p nodePeers) DropStalled(id, reason string) int { return p.n.DropStalled(id, reason) }

// Unreachable: no session can be had with the peer (no address, refused,
// lost), it did not answer in time, or it runs another epoch; not a
// failure of its handler.
func (p nodePeers) Unreachable(err error) bool {
	for _, e := range []error{tcp.ErrConnLost, tcp.ErrUnknownPeer, tcp.ErrRefused, tcp.ErrStaleEpoch, tcp.ErrAuth, xfer.ErrTimeout} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (p nodePeers) Busy(err error) bool { return errors.Is(err, tcp.ErrPeerBusy) }

func (p nodePeers) EpochOf(id string) uint64 {
	for _, s := range p.n.Peers() {
		if s.ID == id {
			return s.Epoch
		}
	}
	return 0
}

// mover moves values from a holder's exported pool into this daemon's
// pool through the engine: rdma where the plane's link to the holder is
// up, else tcp (Plane.Route decides per request).
type mover struct {
	engine *xfer.Engine
	plane  *plane.Plane
	pool   *shm.Pool

	// mu guards remotes: the holders' pool exports this daemon opened,
	// by holder id.
	mu      sync.Mutex
	remotes map[string]heldRemote
	// nextID names an opened remote segment in this daemon's id space
	// (the registry's), as a client's remote segments are named.
	nextID func() xfer.SegmentID
	// inline is the largest value ReadKey reads from a holder whose link
	// is rdma, for a get of one key (config rdma_inline_read; 0: none).
	inline int
}

// heldRemote is a holder's pool export as this daemon opened it, and the
// id its moves name it by.
type heldRemote struct {
	seg peer.RemoteSegment
	id  xfer.SegmentID
}

// remote is holder's pool export at epoch, opened once and reopened when
// the holder restarted.
func (m *mover) remote(holder string, epoch uint64) (heldRemote, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.remotes[holder]; ok {
		if epoch == 0 || r.seg.Epoch() == epoch {
			return r, nil
		}
		_ = r.seg.Close()
		delete(m.remotes, holder)
	}
	rs, err := m.plane.OpenRemote(peer.OpenContext{Lane: "hybrid-cache-first", Tenant: peer.DaemonTenant}, holder, storePoolExport, wire.RightRead, wire.TransportAuto)
	if err != nil {
		return heldRemote{}, err
	}
	if epoch != 0 && rs.Epoch() != epoch {
		_ = rs.Close()
		return heldRemote{}, fmt.Errorf("%w: %s runs epoch %#x, the value was announced by %#x", tcp.ErrStaleEpoch, holder, rs.Epoch(), epoch)
	}
	r := heldRemote{seg: rs, id: m.nextID()}
	m.remotes[holder] = r
	return r, nil
}

// forget drops holder's remote segment after a failed read, so that the
// next read opens it afresh.
func (m *mover) forget(holder string, r heldRemote) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.remotes[holder] == r {
		delete(m.remotes, holder)
		_ = r.seg.Close()
	}
}

func (m *mover) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.remotes {
		_ = r.seg.Close()
		delete(m.remotes, id)
	}
}

// pair resolves the two segments a move names.
type pair struct {
	pool   xfer.Segment
	remote heldRemote
}

func (p pair) Resolve(id xfer.SegmentID) (xfer.Segment, bool) {
	switch id {
	case p.pool.ID():
		return p.pool, true
	case p.remote.id:
		return p.remote.seg, true
	}
	return nil, false
}

// Read implements cluster.Mover: one batch of READs, every one done or an
// error; after an error, settled closes once no transport can write into
// the spans any more.
func (m *mover) Read(holder string, epoch uint64, spans []cluster.Span, deadline time.Time) (<-chan struct{}, error) {
	r, err := m.remote(holder, epoch)
	if err != nil {
		return nil, err
	}
	reqs := make([]xfer.Request, len(spans))
	for i, s := range spans {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: m.pool.ID(), LocalOffset: s.Local,
			Target: r.id, TargetOffset: s.Remote, Length: s.Length}
	}
	id, err := m.engine.AllocateBatch(len(reqs))
	if err != nil {
		return nil, err
	}
	results := make([]error, len(reqs))
	sums := make([]xfer.Sum, len(reqs)) // tcp takes each value's crc32c as it lands
	if err := m.engine.Submit(id, reqs, xfer.SubmitOptions{Deadline: deadline, Resolver: pair{m.pool, r}, Sums: sums}, results); err != nil {
		return m.settle(id), err
	}
	sum, werr := m.engine.Wait(id, deadline)
	if werr != nil {
		m.forget(holder, r)
		return m.settle(id), werr
	}
	if sum.Completed != len(reqs) {
		var first error
		for i := range reqs {
			if st, err := m.engine.Status(id, i); err == nil && st.Err != nil {
				first = st.Err
				break
			}
		}
		m.forget(holder, r)
		return m.settle(id), fmt.Errorf("%w: %d of %d reads from %s failed: %v", xfer.ErrUnavailable, len(reqs)-sum.Completed, len(reqs), holder, first)
	}
	for i := range spans {
		spans[i].Sum = sums[i]
	}
	return nil, m.engine.Free(id)
}

// settle hands back a read batch that did not complete. The channel closes
// once no transport can write into its destinations any more: a READ that
// timed out may still land (an rdma READ cannot be called back), and the
// blocks it lands in must not go back to the pool, where another value
// may take them, before that. It never closes for a batch whose transport
// broke its dispatch contract: that transport may write at any time.
func (m *mover) settle(id xfer.BatchID) <-chan struct{} {
	settled := make(chan struct{})
	if !m.engine.AbandonThen(id, func() { close(settled) }) {
		close(settled) // unknown: cannot be, the batch is the caller's and not freed
	}
	return settled
}

// ReadKey implements cluster.KeyReader: a data exchange with holder over
// tcp, whose answer's payload lands in dst (a block of this daemon's
// pool). Over a link whose bulk bytes go by rdma it reads only the value
// of a get of one key (alone) up to rdma_inline_read so: for that one, the
// copy into the answer costs less than the hold's round trip and release
// beside an RDMA READ; several values cost less in one hold and a batch of
// READs than in an exchange each. It does not block: false when the
// holder's pool is not open here yet (the two-step read opens it), the
// link to it is rdma and dst not such a value, dst is larger than a data
// frame, there is no session, or the flow-control windows to the holder
// have no room for dst (the two-step read queues).
func (m *mover) ReadKey(holder string, epoch uint64, kind string, req, dst []byte, alone bool, deadline time.Time,
	done func([]byte, int, error)) bool {
	node := m.plane.Node()
	if len(dst) > node.MaxDataPayload() {
		return false
	}
	m.mu.Lock()
	r, ok := m.remotes[holder]
	m.mu.Unlock()
	if !ok || epoch != 0 && r.seg.Epoch() != epoch {
		return false
	}
	if t := m.plane.Route(m.pool, r.seg); t != xfer.Transport(node) && (!alone || len(dst) > m.inline) {
		return false // rdma moves the bytes: the hold and READs
	}
	return node.ExchangeInto(holder, epoch, kind, req, dst, deadline, done) == nil
}

// collectCluster is the store across hosts' metrics source.
func (d *Daemon) collectCluster(e *metrics.Emit) {
	cl := d.cluster
	if cl == nil {
		return
	}
	s := cl.Stats()
	e.Gauge("tensorcast_cluster_members", "Members of the store across hosts up, this daemon included.", float64(s.Members))
	e.Gauge("tensorcast_cluster_home_shards", "Shards this daemon is home of.", float64(s.HomeOf))
	e.Gauge("tensorcast_cluster_index_keys", "Keys in this daemon's location index (as a home).", float64(s.IndexKeys))
	e.Gauge("tensorcast_cluster_claims", "Claims other daemons' readers hold here now.", float64(s.Holds))
	e.Gauge("tensorcast_cluster_tombstones", "Removed copies this daemon (a home) remembers for holders it did not reach.", float64(s.Tombstones))
	e.Gauge("tensorcast_cluster_tombstones_kept", "Copies of other homes' tombstones this daemon keeps in case their home dies.", float64(s.TombsKept))
	e.Gauge("tensorcast_cluster_puts_apart", "Puts whose time this daemon notes, made while members were away or lately: a removal told late spares those put after it.", float64(s.PutsApart))
	e.Gauge("tensorcast_cluster_home_claims", "Claims this daemon, as a home, has handed readers and not had back.", float64(s.ClaimsOutstanding))
	e.Gauge("tensorcast_cluster_shards_rebuilding", "Shards this daemon is home of whose index may still lack copies: a member up has not said it re-announced them since they were gained.", float64(s.Rebuilding))
	e.Gauge("tensorcast_cluster_reads_unsettled", "Failed remote reads whose blocks stay reserved until their late transfers end.", float64(s.Unsettled))
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"tensorcast_cluster_view_changes_total", "Changes of the members up (each moves shards).", s.ViewChanges},
		{"tensorcast_cluster_announced_total", "Keys queued for announcement to their homes.", s.Announced},
		{"tensorcast_cluster_announce_sent_total", "Keys announced to another home.", s.AnnounceSent},
		{"tensorcast_cluster_announce_dropped_total", "Announcements dropped (queue full or closing).", s.AnnounceDropped},
		{"tensorcast_cluster_announce_failed_total", "Announcements whose home did not answer.", s.AnnounceFailed},
		{"tensorcast_cluster_reannounced_total", "Keys re-announced to new homes after a change of members.", s.Reannounced},
		{"tensorcast_cluster_home_lookups_total", "Keys asked of another daemon's home.", s.Lookups},
		{"tensorcast_cluster_home_lookups_local_total", "Keys answered from this daemon's own index.", s.LookupsLocal},
		{"tensorcast_cluster_home_lookup_failures_total", "Keys whose home did not answer.", s.LookupFailed},
		{"tensorcast_cluster_home_cache_hits_total", "Keys answered from this daemon's cache of home answers (no home round trip).", s.CacheHits},
		{"tensorcast_cluster_remote_misses_total", "Remote gets no daemon held.", s.RemoteMisses},
		{"tensorcast_cluster_remote_failures_total", "Remote gets every holder failed.", s.RemoteFailed},
		{"tensorcast_cluster_crc_mismatches_total", "Values read from a holder whose crc32c did not match (never answered).", s.CRCMismatch},
		{"tensorcast_cluster_crc_on_landing_total", "Values read from a holder whose crc32c the transport took as the bytes landed (tcp), not read again.", s.CRCLanded},
		{"tensorcast_cluster_one_round_trip_reads_total", "Remote gets read in one exchange with the holder, the bytes in its answer (tcp, or rdma_inline_read).", s.QuickReads},
		{"tensorcast_cluster_one_round_trip_fallbacks_total", "Remote gets begun in one exchange that went the hold-and-read way (busy, not in memory, failed).", s.QuickFallbacks},
		{"tensorcast_cluster_one_round_trip_served_total", "Values this daemon as a holder sent in the answer to one exchange.", s.QuickServed},
		{"tensorcast_cluster_claims_given_total", "Claims handed to other daemons' readers.", s.HoldsGiven},
		{"tensorcast_cluster_claims_refused_total", "Claims refused (too many held).", s.HoldsRefused},
		{"tensorcast_cluster_removes_total", "Keys removed as their home, with every copy.", s.Removes},
		{"tensorcast_cluster_tombstone_hits_total", "Re-announced copies answered \"removed\" (removed while their holder was away).", s.TombHits},
		{"tensorcast_cluster_tombstone_retried_total", "Removed copies a holder dropped when asked again (back after being away, or a member a removal's drop did not reach).", s.TombRetried},
		{"tensorcast_cluster_drop_retry_rounds_total", "Rounds of drops asked again of a member after one it did not take (busy or slow).", s.DropRetryRounds},
		{"tensorcast_cluster_drops_soon_total", "Removed copies a member dropped when asked again within the removal's time (busy or slow at first).", s.DropsSoon},
		{"tensorcast_cluster_removes_kept_total", "Keys whose removal answered UNAVAILABLE: a member kept its copy past the removal's time (asked again in rounds).", s.RemovesKept},
		{"tensorcast_cluster_tombstone_drops_total", "Copies this daemon dropped because their home said they were removed.", s.TombDrops},
		{"tensorcast_cluster_tombstones_expired_total", "Tombstones gone by age (10 minutes): that holder's copy stays.", s.TombExpired},
		{"tensorcast_cluster_tombstones_evicted_total", "Tombstones gone by the table's bound: that holder's copy stays.", s.TombEvicted},
		{"tensorcast_cluster_puts_apart_over_total", "Puts' notes pushed out by the table's bound: a removal told late takes those values.", s.PutsApartOver},
		{"tensorcast_cluster_puts_kept_total", "Values put after their key's removal elsewhere that the removal's late drop left here.", s.PutsKept},
		{"tensorcast_cluster_older_kinds_total", "Messages sent as the kind an older release knows, to a member that serves none with removal ages.", s.OlderKinds},
		{"tensorcast_cluster_walks_taken_total", "Members' word that they re-announced the keys of shards this daemon gained.", s.WalksTaken},
		{"tensorcast_cluster_remove_asks_unnamed_total", "Drops a removal asked of members the index did not name, for shards still being rebuilt.", s.RemoveAsksUnnamed},
		{"tensorcast_cluster_late_losses_total", "Failed exchanges with a member that were sent before it answered again: not taken for it going down.", s.LateLosses},
		{"tensorcast_cluster_busy_retries_total", "Exchanges sent again after their peer answered busy (every exchange handler of its taken).", s.BusyRetries},
		{"tensorcast_cluster_busy_hellos_total", "Hellos a member answered busy: it stays in.", s.BusyHellos},
		{"tensorcast_cluster_stale_refused_total", "Messages this daemon refused as a home: sent for a generation it does not hold.", s.StaleRefused},
		{"tensorcast_cluster_stale_answers_total", "Messages other homes refused for a stale generation (refreshed and sent again once).", s.StaleAnswers},
		{"tensorcast_cluster_shards_claimed_total", "Shards this daemon claimed in etcd as their home.", s.ClaimsWon},
		{"tensorcast_cluster_home_claims_granted_total", "Claims handed readers by this daemon as a home.", s.ClaimsGranted},
		{"tensorcast_cluster_home_claims_refused_total", "Reads answered busy by this daemon as a home: every copy of the key at its reader limit.", s.ClaimsRefused},
		{"tensorcast_cluster_home_claims_expired_total", "Claims that reached their read's deadline unreleased.", s.ClaimsExpired},
		{"tensorcast_cluster_home_claims_foreign_total", "Claim releases refused by this daemon as a home: the claim was another reader's.", s.ClaimsForeign},
		{"tensorcast_cluster_readers_refused_total", "Keys this daemon as a holder answered busy in a read: at its reader limit for the key.", s.ReadersRefused},
		{"tensorcast_cluster_tombstones_handed_total", "Tombstones this daemon handed to the new home of their shard.", s.TombsHanded},
		{"tensorcast_cluster_tombstone_handoffs_stopped_total", "Hand-offs of tombstones stopped at a message the new home did not take (handed again with the next probe).", s.HandStopped},
		{"tensorcast_cluster_tombstones_taken_total", "Tombstones this daemon took from the previous home of their shard.", s.TombsTaken},
		{"tensorcast_cluster_tombstone_keeps_total", "Copies of tombstones this daemon (a home) gave keepers.", s.KeepsGiven},
		{"tensorcast_cluster_tombstone_keep_failures_total", "Copies of tombstones a keeper did not take: the removal holds only while this home lives.", s.KeepsFailed},
		{"tensorcast_cluster_tombstones_unkept_total", "Tombstones this daemon (a home) made with no member up to keep a copy: the removal holds only while this home lives.", s.KeepsNone},
		{"tensorcast_cluster_over_budget_total", "Remote gets and serves refused by the mode's budget.", s.OverBudget},
		{"tensorcast_cluster_replicas_made_total", "Copies of values put here made on other daemons.", s.ReplicasMade},
		{"tensorcast_cluster_replica_failures_total", "Copies of values put here that failed (or had too few daemons up).", s.ReplicaFailures},
		{"tensorcast_cluster_replicas_short_total", "Puts that asked for more copies than daemons were up.", s.ReplicasShort},
	} {
		e.Counter(c.name, c.help, float64(c.v))
	}
	for _, id := range slices.Sorted(maps.Keys(s.ByPeer)) {
		p := s.ByPeer[id]
		l := metrics.L("peer", id)
		e.Counter("tensorcast_cluster_remote_gets_total", "Values read from another daemon, by holder.", float64(p.Gets), l)
		e.Counter("tensorcast_cluster_remote_bytes_total", "Bytes of values read from another daemon, by holder.", float64(p.Bytes), l)
	}
}

// clusterCounters are the store across hosts' figures for Stats (tcctl
// stats).
func (d *Daemon) clusterCounters(dst []wire.Counter) []wire.Counter {
	cl := d.cluster
	if cl == nil {
		return dst
	}
	s := cl.Stats()
	return append(dst,
		wire.Counter{Name: "cluster_members", Value: uint64(s.Members)},
		wire.Counter{Name: "cluster_home_shards", Value: uint64(s.HomeOf)},
		wire.Counter{Name: "cluster_index_keys", Value: uint64(s.IndexKeys)},
		wire.Counter{Name: "cluster_claims", Value: uint64(s.Holds)},
		wire.Counter{Name: "cluster_remote_hits", Value: s.RemoteHits},
		wire.Counter{Name: "cluster_remote_misses", Value: s.RemoteMisses},
		wire.Counter{Name: "cluster_remote_failures", Value: s.RemoteFailed},
		wire.Counter{Name: "cluster_remote_bytes", Value: s.RemoteBytes},
		wire.Counter{Name: "cluster_home_lookups", Value: s.Lookups},
		wire.Counter{Name: "cluster_home_lookups_local", Value: s.LookupsLocal},
		wire.Counter{Name: "cluster_home_cache_hits", Value: s.CacheHits},
		wire.Counter{Name: "cluster_reannounced", Value: s.Reannounced},
		wire.Counter{Name: "cluster_crc_mismatches", Value: s.CRCMismatch},
		wire.Counter{Name: "cluster_crc_on_landing", Value: s.CRCLanded},
		wire.Counter{Name: "cluster_one_round_trip_reads", Value: s.QuickReads},
		wire.Counter{Name: "cluster_one_round_trip_fallbacks", Value: s.QuickFallbacks},
		wire.Counter{Name: "cluster_tombstones", Value: uint64(s.Tombstones)},
		wire.Counter{Name: "cluster_shards_rebuilding", Value: uint64(s.Rebuilding)},
		wire.Counter{Name: "cluster_stale_refused", Value: s.StaleRefused},
		wire.Counter{Name: "cluster_home_claims", Value: s.ClaimsOutstanding},
		wire.Counter{Name: "cluster_home_claims_refused", Value: s.ClaimsRefused},
		wire.Counter{Name: "cluster_replicas", Value: uint64(d.cfg.StoreReplicas)},
		wire.Counter{Name: "cluster_replicas_made", Value: s.ReplicasMade},
		wire.Counter{Name: "cluster_replica_failures", Value: s.ReplicaFailures},
		wire.Counter{Name: "cluster_over_budget", Value: s.OverBudget},
		wire.Counter{Name: "cluster_mode", Value: uint64(d.admission.Mode())},
	)
}
