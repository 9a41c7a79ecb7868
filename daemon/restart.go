package daemon

import (
	"fmt"
	"log/slog"
	"strconv"
	"syscall"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/store"
)

// A restart keeps the store's L1 values (a hitless restart): each tenant's
// pool memfd and its L1 journal (a memfd of the daemon's own, store/
// l1journal.go) are handed to systemd's file descriptor store (FDSTORE=1,
// FDNAME=pool-TENANT and l1journal-TENANT) once at start. systemd keeps
// them while the service restarts, is upgraded or crashes, and passes them
// to the next daemon with LISTEN_FDS/LISTEN_FDNAMES; that daemon adopts
// the pool (the same memory, the same memfd, so clients' mappings stay
// the pool) and its store serves every value the journal recorded.
//
// It is on when store_keep_l1 = auto, the store is on, the daemon runs
// under systemd and systemd says ($FDSTORE, FileDescriptorStoreMax=) that
// its store takes the descriptors. Otherwise start-up is as without it:
// descriptors of an earlier daemon are closed and removed from systemd's
// store (FDSTOREREMOVE=1), so that it does not hold their memory.

const (
	poolFDPrefix    = "pool-"
	journalFDPrefix = "l1journal-"
)

// keepL1 is the daemon's side of a restart that keeps L1.
type keepL1 struct {
	on bool
	// systemd says the pools and journals go to systemd's fd store (else
	// only to a newer daemon, by a hand-off).
	systemd  bool
	journals []*shm.Region // per tenant, when on
	// adopted[i] says whether tenant i's pool (and journal) came from
	// systemd's store: they are in it already.
	adopted, journalAdopted []bool
}

// planKeepL1 decides whether L1 is kept across restarts and says why in
// the log.
func (d *Daemon) planKeepL1(getenv func(string) string) {
	cfg := &d.cfg
	need := 2 * len(cfg.TenantList())
	max, _ := strconv.Atoi(getenv("FDSTORE"))
	handoff := cfg.StoreHandoff == "on"
	var why string
	switch {
	case cfg.Store == "off":
		why = "the store is off"
	case cfg.StoreKeepL1 == "off":
		why = "store_keep_l1 = off"
	case !d.notify.Enabled() && !handoff:
		why = "not started by systemd (no NOTIFY_SOCKET), and store_handoff = off"
	case max < need && !handoff:
		why = fmt.Sprintf("systemd's file descriptor store takes %d descriptors ($FDSTORE), %d are needed (FileDescriptorStoreMax= in the unit)", max, need)
	default:
		d.keep.on = true
		d.keep.systemd = d.notify.Enabled() && max >= need
	}
	if d.keep.systemd {
		d.log.Info("L1 values are kept across restarts: the pools and L1 journals go to systemd's file descriptor store",
			"descriptors", need, "fdstore_max", max, "store_handoff", cfg.StoreHandoff)
		return
	}
	if d.keep.on {
		d.log.Info("L1 values are kept for a hand-off: the pools and L1 journals go to a newer daemon that asks for them (store_handoff = on)")
		return
	}
	d.log.Info("L1 values are not kept across restarts", "why", why)
}

// newPool makes tenant t's pool, adopting the one systemd kept when L1 is
// kept and one was passed. A passed pool that does not fit the config
// (another pool_size, hugepages) is dropped, said in the log.
func (d *Daemon) newPool(in *inheritedFDs, pcfg shm.PoolConfig, tenant string, log *slog.Logger) (*shm.Pool, bool, error) {
	name := poolFDPrefix + tenant
	if fd, ok := in.take(name); ok {
		if d.keep.on {
			fromSystemd := in.fromSystemd(fd)
			p, err := shm.AdoptPool(pcfg, fd, log)
			if err == nil {
				return p, fromSystemd, nil
			}
			d.log.Warn("the pool kept from the previous daemon does not fit the config: a new pool, the L1 values are lost", "tenant", tenant, "err", err,
				"from", map[bool]string{true: "systemd", false: "hand-off"}[fromSystemd])
		}
		syscall.Close(fd)
		d.forget(name)
	}
	p, err := shm.NewPool(pcfg, log)
	return p, false, err
}

// openJournals makes (or adopts) each tenant's L1 journal region, sized by
// store_l1_journal_records; a region of another size is dropped.
func (d *Daemon) openJournals(in *inheritedFDs) error {
	if !d.keep.on {
		return nil
	}
	for _, t := range d.cfg.TenantList() {
		records := d.cfg.L1JournalRecords(d.cfg.TenantPoolSize(t))
		size := store.L1JournalSize(records)
		name := journalFDPrefix + t.Name
		var r *shm.Region
		adopted := false
		if fd, ok := in.take(name); ok {
			var err error
			if r, err = shm.AdoptRegion(fd, size); err == nil {
				adopted = in.fromSystemd(fd)
			} else {
				d.log.Warn("the L1 journal systemd kept does not fit the config: a new one, the L1 values are lost",
					"tenant", t.Name, "store_l1_journal_records", records, "err", err)
				syscall.Close(fd)
				d.forget(name)
			}
		}
		if r == nil {
			var err error
			if r, err = shm.NewRegion("l1journal-"+t.Name, size); err != nil {
				return fmt.Errorf("L1 journal of tenant %q (store_l1_journal_records = %d): %w", t.Name, records, err)
			}
		}
		d.keep.journals = append(d.keep.journals, r)
		d.keep.journalAdopted = append(d.keep.journalAdopted, adopted)
	}
	return nil
}

// journalOf is tenant i's L1 journal memory, nil when L1 is not kept.
func (d *Daemon) journalOf(i int) []byte {
	if i < len(d.keep.journals) {
		return d.keep.journals[i].Bytes()
	}
	return nil
}

// storeFDs hands systemd what it does not hold yet: each tenant's pool and
// L1 journal. It runs once the stores are open (a journal is formatted by
// then), before READY.
func (d *Daemon) storeFDs() error {
	if !d.keep.systemd {
		return nil
	}
	for i, t := range d.cfg.TenantList() {
		if !d.keep.adopted[i] {
			if err := d.notify.NotifyFDs("FDSTORE=1\nFDNAME="+poolFDPrefix+t.Name, d.pools[i].Fd()); err != nil {
				return fmt.Errorf("handing the pool of tenant %q to systemd's fd store: %w", t.Name, err)
			}
		}
		if !d.keep.journalAdopted[i] {
			if err := d.notify.NotifyFDs("FDSTORE=1\nFDNAME="+journalFDPrefix+t.Name, d.keep.journals[i].Fd()); err != nil {
				return fmt.Errorf("handing the L1 journal of tenant %q to systemd's fd store: %w", t.Name, err)
			}
		}
	}
	return nil
}

// forget asks systemd to drop the descriptors it keeps under name.
func (d *Daemon) forget(name string) {
	if err := d.notify.Notify("FDSTOREREMOVE=1\nFDNAME=" + name); err != nil {
		d.log.Warn("sd_notify FDSTOREREMOVE failed", "name", name, "err", err)
	}
}

// closeJournals unmaps the journals; systemd keeps their memfds.
func (d *Daemon) closeJournals() {
	for _, r := range d.keep.journals {
		if err := r.Close(); err != nil {
			d.log.Warn("closing an L1 journal", "err", err)
		}
	}
	d.keep.journals = nil
}
