package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
)

// openStore opens the KV block stores, one per tenant over the tenant's
// pool (a tenant's values live in its own pool, which only its clients
// map): each with an L2 file through the file tier's io_uring transport
// (the pools registered as its fixed buffers), or in DRAM only when
// store_l2_path is off or io_uring is unavailable (said in the log). The
// default tenant's L2 is store_l2_path; with [[tenants]], tenant NAME's is
// data_dir/tenants/NAME/store.l2. It runs after the file tier and before
// the control server, which serves them.
func (d *Daemon) openStore() error {
	c := &d.cfg.StoreConfig
	log := d.log.With("component", "store")
	if c.Store == "off" {
		log.Info("the KV block store is off (store = off): store calls answer UNAVAILABLE")
		return nil
	}
	for i, pool := range d.pools {
		tlog := log
		path := d.cfg.StoreL2()
		if len(d.cfg.Tenants) > 0 {
			tlog = log.With("tenant", d.names[i])
			if path != "" {
				path = filepath.Join(d.cfg.DataDir, "tenants", d.names[i], "store.l2")
				if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
					return fmt.Errorf("store of tenant %s: %w", d.names[i], err)
				}
			}
		}
		s, err := d.openOneStore(pool, path, d.journalOf(i), tlog)
		if err != nil {
			if len(d.cfg.Tenants) > 0 {
				return fmt.Errorf("store of tenant %s: %w", d.names[i], err)
			}
			return err
		}
		d.stores = append(d.stores, s)
	}
	return nil
}

// openOneStore opens one store over pool, with its L2 at path ("": none)
// and its L1 journal in journal (nil: none).
func (d *Daemon) openOneStore(pool *shm.Pool, path string, journal []byte, log *slog.Logger) (*store.Store, error) {
	c := &d.cfg.StoreConfig
	scfg := store.Config{
		MaxKeysPerCall:     c.StoreMaxKeysPerCall,
		MaxValueSize:       uint64(c.StoreMaxValueSize),
		MaxSessionReserved: uint64(c.StoreMaxSessionReserved),
		MaxSessionPinned:   uint64(c.StoreMaxSessionPinned),
		MaxLeaseTTL:        time.Duration(c.StoreMaxLeaseTTL),
		L1Capacity:         uint64(c.StoreL1Capacity),
		HighWatermark:      c.StoreHighWatermark,
		LowWatermark:       c.StoreLowWatermark,
		WritebackRetries:   c.StoreWritebackRetries,
		// The drain bounds the whole shutdown; the store's wait for its L2
		// operations in flight is bounded by it too.
		CloseTimeout: time.Duration(d.cfg.DrainTimeout),
		L1Journal:    journal,
		Log:          log,
	}
	if scfg.WritebackRetries == 0 {
		scfg.WritebackRetries = -1 // the store's zero is its default; 0 here means none
	}
	var st *store.Store
	var err error
	switch {
	case path == "":
		log.Info("the store runs in DRAM only (store_l2_path = off): values evicted from L1 are gone")
		st, err = store.New(scfg, pool, nil)
	case d.files == nil:
		log.Warn("io_uring is unavailable: the store runs in DRAM only, without its L2", "store_l2_path", path)
		st, err = store.New(scfg, pool, nil)
	default:
		st, err = store.Open(scfg, pool, d.files.t, store.FileL2{Path: path, Size: uint64(c.StoreL2Size),
			FileID: d.reg.NextID(), StagingID: d.reg.NextID()})
		if err == nil {
			d.files.storeL2 = append(d.files.storeL2, path)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store (store_l2_path = %q, store_l2_size = %s, store_l1_capacity = %s): %w",
			path, c.StoreL2Size, c.StoreL1Capacity, err)
	}
	return st, nil
}

// storeOf is tenant i's store, nil with store = off.
func (d *Daemon) storeOf(i int) *store.Store {
	if i < len(d.stores) {
		return d.stores[i]
	}
	return nil
}

// closeStore closes the stores: after the control server (whose
// connections' sessions are closed by then), before the file tier their L2
// I/O goes through and the pools their values live in.
func (d *Daemon) closeStore() {
	d.closeGrants() // their pins go before the stores close
	for _, s := range d.stores {
		if err := s.Close(); err != nil {
			d.log.Warn("closing the store", "err", err)
			d.storeCloseErr = errors.Join(d.storeCloseErr, err)
		}
	}
}

// collectStore is the store's metrics source.
func (d *Daemon) collectStore(e *metrics.Emit) {
	for i, st := range d.stores {
		d.collectOneStore(e, st, d.names[i])
	}
}

func (d *Daemon) collectOneStore(e *metrics.Emit, st *store.Store, tenantName string) {
	s := st.Stats()
	tn := metrics.L("tenant", tenantName)
	tier := func(t string) metrics.Label { return metrics.L("tier", t) }
	const keys = "Keys whose value is on the tier (a key may be on both)."
	e.Gauge("tensorcast_store_keys", "Keys stored (visible to readers).", float64(s.Keys), tn)
	e.Gauge("tensorcast_store_tier_keys", keys, float64(s.L1Keys), tier("l1"), tn)
	e.Gauge("tensorcast_store_tier_keys", keys, float64(s.L2Keys), tier("l2"), tn)
	const used, capacity = "Bytes the store holds on the tier (L1 at pool block size).", "Bytes the store may hold on the tier."
	e.Gauge("tensorcast_store_tier_bytes", used, float64(s.L1Bytes), tier("l1"), tn)
	e.Gauge("tensorcast_store_tier_bytes", used, float64(s.L2Bytes), tier("l2"), tn)
	e.Gauge("tensorcast_store_tier_capacity_bytes", capacity, float64(s.L1Capacity), tier("l1"), tn)
	e.Gauge("tensorcast_store_tier_capacity_bytes", capacity, float64(s.L2Capacity), tier("l2"), tn)
	const evicted = "Values evicted from the tier (from L1: still on L2, or gone without one)."
	e.Counter("tensorcast_store_evictions_total", evicted, float64(s.EvictionsL1), tier("l1"), tn)
	e.Counter("tensorcast_store_evictions_total", evicted, float64(s.EvictionsL2), tier("l2"), tn)
	const hits = "Keys a get or read found, by the tier that held the value (l2: only there, so read back into the pool). Exists and prefix lookups are probes, not counted."
	e.Counter("tensorcast_store_hits_total", hits, float64(s.HitsL1), tier("l1"), tn)
	e.Counter("tensorcast_store_hits_total", hits, float64(s.HitsL2), tier("l2"), tn)
	e.Gauge("tensorcast_store_pins", "Pins and leases held, over all clients.", float64(s.Pins), tn)
	e.Gauge("tensorcast_store_hidden", "Values removed from another host while pinned here: found by no reader, their blocks kept until their last pin goes.", float64(s.Hidden), tn)
	e.Gauge("tensorcast_store_reserved", "Reservations and puts in flight.", float64(s.Reserved), tn)
	e.Gauge("tensorcast_store_dirty", "Values in L1 only, owed a writeback to L2.", float64(s.Dirty), tn)
	e.Gauge("tensorcast_store_l2_in_flight", "L2 operations in flight.", float64(s.IOInFlight), tn)
	// A gauge, not a counter: a slot whose stale header is zeroed later
	// (tensorcast_store_ghosts_zeroed_total) is in use again.
	e.Gauge("tensorcast_store_l2_slots_quarantined", "L2 slots kept out of use: their header could not be zeroed, or a broken transport contract may still touch them.", float64(s.QuarantinedSlots), tn)
	e.Gauge("tensorcast_store_l2_waiting", "Clients' keys waiting for a free L2 I/O task (the store's own writeback holds the others).", float64(s.IOWaiting), tn)
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"tensorcast_store_misses_total", "Keys a get or read looked for that were not stored.", s.Misses},
		{"tensorcast_store_fetched_unseen_total", "Copies fetched from other hosts and stored unseen by readers here until their home took them.", s.Unseen},
		{"tensorcast_store_fetched_confirmed_total", "Fetched copies seen by readers here once their home took them.", s.Confirmed},
		{"tensorcast_store_writebacks_total", "L1→L2 writebacks done.", s.Writebacks},
		{"tensorcast_store_l2_task_waits_total", "Clients' keys that waited for a free L2 I/O task.", s.IOWaits},
		{"tensorcast_store_writeback_retries_total", "Writebacks retried after a failure.", s.WritebackRetries},
		{"tensorcast_store_tombstones_total", "Writebacks that used up their retries (never retried again).", s.Tombstones},
		{"tensorcast_store_dropped_unwritten_total", "Values evicted from L1 whose writeback had become a tombstone.", s.DroppedUnwritten},
		{"tensorcast_store_durable_puts_total", "Durable puts acknowledged (on L2).", s.DurablePuts},
		{"tensorcast_store_durable_failures_total", "Durable puts that failed and were rolled back.", s.DurableFailures},
		{"tensorcast_store_aborted_total", "Reservations given back uncommitted by the client (StoreAbort).", s.Aborted},
		{"tensorcast_store_promotions_total", "Values read from L2 back into the pool.", s.Promotions},
		{"tensorcast_store_promotion_failures_total", "Reads of values from L2 that failed.", s.PromotionFailures},
		{"tensorcast_store_corrupt_reads_total", "Values read from L2 whose checksum did not match (dropped).", s.CorruptReads},
		{"tensorcast_store_l1_full_total", "Allocations refused: L1 full even after eviction.", s.L1Full},
		{"tensorcast_store_remove_failures_total", "Removals whose L2 invalidation failed (the key stays).", s.RemoveFailures},
		{"tensorcast_store_ghosts_zeroed_total", "Stale L2 block headers, left by a failed zeroing, that the store zeroed later (their slots in use again).", s.GhostsZeroed},
		{"tensorcast_store_ghost_zero_failures_total", "Later zeroings of stale L2 block headers that failed again (retried at a back-off).", s.GhostZeroFailures},
		{"tensorcast_store_leases_expired_total", "Timed pins ended by their TTL.", s.LeasesExpired},
		{"tensorcast_store_pin_limit_total", "Pins refused: the client's session held store_max_session_pinned bytes of values pinned.", s.PinLimit},
		{"tensorcast_store_recovered_blocks_total", "Blocks indexed from L2 at start-up.", s.Recovered},
		{"tensorcast_store_torn_dropped_total", "Damaged L2 headers dropped at start-up.", s.TornDropped},
		{"tensorcast_store_l1_recovered_total", "L1 values found again at start-up (a restart that kept L1).", s.L1Recovered},
		{"tensorcast_store_l1_dropped_total", "L1 journal records dropped at start-up: torn, a value changed, or lost to a newer copy.", s.L1Dropped + s.L1Torn},
		{"tensorcast_store_l1_journal_full_total", "L1 values not recorded for the next restart: the journal was full.", s.L1JournalFull},
		{"tensorcast_store_transport_violations_total", "Broken transport contracts the store caught.", s.TransportViolations},
		{"tensorcast_store_quarantined_total", "Pool blocks and I/O tasks kept out of use for good after a broken transport contract.",
			s.QuarantinedBlocks + s.QuarantinedTasks},
	} {
		e.Counter(c.name, c.help, float64(c.v), tn)
	}
}
