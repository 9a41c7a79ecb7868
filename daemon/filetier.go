package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// fileTier is the io_uring transport with the pools (one per tenant)
// registered as fixed buffers; it opens file segments for RegisterFile.
type fileTier struct {
	t   *uring.Transport
	log *slog.Logger
	// tenants are, with [[tenants]], where each tenant's clients may open
	// files (nil without: every client may open what the daemon may).
	tenants map[string]tenantFiles
	// storeL2 are the stores' L2 files, which clients may not open.
	storeL2 []string
}

// tenantFiles is where one tenant's clients may open files: its own
// directory and its allowed_files.
type tenantFiles struct {
	dir   string
	paths []string
}

// ringEntries is each ring's slots: the requests it holds in flight.
const ringEntries = 4096

// ringBatch is each ring's step (uring.Config.Batch): the SQEs one
// io_uring_enter hands the kernel, and the completions reaped between two
// submissions. A worker's requests come in its clients' batches (tcbench
// and fio submit 8 at a time); the transport's default of 4 split each into
// two io_uring_enter calls. In an A/B at 4 KiB QD32 through the queue,
// the daemon and client together then spent 9.1 µs of CPU per I/O instead
// of 19.4 (random reads), 7.0 instead of 16.1 (random writes) and 8.0
// instead of 26.2 (random reads, 4 jobs), at the same throughput
// (BENCHMARKS.md, "The rings' step").
const ringBatch = 8

// newFileTier starts the io_uring transport, with rings rings. Files may be opened under
// data_dir and under allowed_files (directories, or block devices). When
// io_uring cannot start, the daemon runs without file segments and says so.
func newFileTier(cfg Config, rings int, pools []xfer.MemSegment, notify *Notifier, log *slog.Logger) *fileTier {
	// One ring per reactor worker: each worker is its ring's guest. A
	// guest's queues never wait for a slot of their own ring (only that
	// thread frees one; a full ring answers at once), so each ring holds
	// what many queues keep in flight: 4096 requests, about 1.3 MiB of
	// slots and rings.
	ucfg := uring.Config{AllowedDirs: []string{cfg.DataDir}, Rings: rings, Entries: ringEntries, Batch: ringBatch}
	if cfg.EBPF != "off" {
		ucfg.TraceEvery = cfg.EBPFUringSample
	}
	for _, p := range cfg.AllowedFiles {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeDevice != 0 {
			ucfg.AllowedDevices = append(ucfg.AllowedDevices, p)
		} else {
			ucfg.AllowedDirs = append(ucfg.AllowedDirs, p)
		}
	}
	var tenants map[string]tenantFiles
	if len(cfg.Tenants) > 0 {
		tenants = map[string]tenantFiles{}
		for _, tc := range cfg.Tenants {
			dir := filepath.Join(cfg.DataDir, "tenants", tc.Name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				log.Warn("io_uring: cannot create a tenant's file directory: file segments are off", "tenant", tc.Name, "dir", dir, "err", err)
				return nil
			}
			// Compare with resolved paths: the transport resolves what it
			// opens.
			tf := tenantFiles{dir: resolvePath(dir)}
			for _, p := range tc.AllowedFiles {
				tf.paths = append(tf.paths, resolvePath(p))
			}
			tenants[tc.Name] = tf
			for _, p := range tc.AllowedFiles {
				if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeDevice != 0 {
					ucfg.AllowedDevices = append(ucfg.AllowedDevices, p)
				} else {
					ucfg.AllowedDirs = append(ucfg.AllowedDirs, p)
				}
			}
		}
	}
	t, err := uring.New(ucfg, log)
	if err != nil {
		log.Warn("io_uring unavailable: file segments are off", "err", err)
		return nil
	}
	// Registering faults in and pins every page of the pools, once per
	// ring, before the daemon listens. On a virtual machine whose host
	// backs guest memory on first touch that took 1.2 s for 256 MiB and
	// 61 s for 4 GiB. Say so, how long it took, and keep systemd's
	// start-up timeout from ending it (regWait).
	var poolBytes int
	for _, p := range pools {
		poolBytes += len(p.Bytes())
	}
	fixed := t.Features().FixedBuffers
	if fixed {
		log.Info("registering the pools as io_uring fixed buffers: every page is faulted in and pinned", "bytes", poolBytes, "rings", rings)
	}
	// Extend sends nothing for a registration under 10 s (none at all
	// without fixed buffers).
	ext := notify.Extend(fmt.Sprintf("pinning %d MiB of pool as io_uring fixed buffers", poolBytes>>20),
		10*time.Second, regWait(poolBytes), func(err error) { log.Warn("systemd notify", "err", err) })
	start := time.Now()
	err = t.RegisterBuffers(pools...)
	ext.Stop()
	if err != nil {
		// The transport already logged its fallback to plain READ/WRITE.
		log.Info("pools not registered as fixed buffers", "err", err)
	} else if fixed {
		registered := 0
		for _, p := range pools {
			if regs := xfer.RegsOf(p); regs != nil && regs.Load(xfer.SlotURing) != nil {
				registered++
			}
		}
		log.Info("pools registered as io_uring fixed buffers", "pools", len(pools), "registered", registered,
			"bytes", poolBytes, "took", time.Since(start).Round(time.Millisecond))
	}
	f := t.Features()
	log.Info("file tier ready", "allowed_dirs", ucfg.AllowedDirs, "allowed_devices", ucfg.AllowedDevices,
		"fixed_buffers", f.FixedBuffers, "single_issuer", f.SingleIssuer, "defer_taskrun", f.DeferTaskrun, "sqpoll", f.SQPoll)
	return &fileTier{t: t, log: log, tenants: tenants}
}

// regWait bounds how long the pools' registration keeps extending
// systemd's start-up timeout: 60 s, and 30 s more per GiB of pool.
func regWait(poolBytes int) time.Duration {
	return 60*time.Second + time.Duration(poolBytes>>20)*30*time.Second/1024
}

// OpenFileFor implements control.TenantFileOpener: with [[tenants]], a
// tenant's client opens files only in its own directory (where a relative
// path is taken) and its allowed_files, so no tenant reaches another's
// files; a connection without a tenant (root, the daemon's uid) and every
// client without [[tenants]] open what OpenFile allows. The transport
// checks the resolved path before it creates, opens or extends anything,
// so a refused registration changes nothing on disk; the stores' L2 files
// are refused on every path.
func (f *fileTier) OpenFileFor(tenant string, id xfer.SegmentID, path string, direct bool, size uint64) (control.FileSegment, error) {
	tf, ok := f.tenants[tenant]
	if f.tenants == nil || tenant == "" {
		return f.OpenFile(id, path, direct, size)
	}
	if !ok {
		return nil, fmt.Errorf("%w: tenant %q has no files", control.ErrPermission, tenant)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(tf.dir, path)
	}
	seg, err := f.t.OpenFile(id, path, uring.FileOptions{Direct: direct, Size: size, Create: true,
		Within: append([]string{tf.dir}, tf.paths...), Refuse: f.storeL2})
	if errors.Is(err, uring.ErrNotAllowed) {
		return nil, fmt.Errorf("%w: outside tenant %q's files (%s and allowed_files), or the daemon's own: %w",
			control.ErrPermission, tenant, tf.dir, err)
	}
	if err != nil {
		return nil, err
	}
	return seg, nil
}

// resolvePath is p with its symlinks resolved, or p when it cannot be.
func resolvePath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// OpenFile implements control.FileOpener.
func (f *fileTier) OpenFile(id xfer.SegmentID, path string, direct bool, size uint64) (control.FileSegment, error) {
	seg, err := f.t.OpenFile(id, path, uring.FileOptions{Direct: direct, Size: size, Create: true, Refuse: f.storeL2})
	if err != nil {
		return nil, err
	}
	return seg, nil
}

func (f *fileTier) transport() xfer.Transport { return f.t }

// counters reports the ring features in use and each ring's queue depth
// and counters, for `tcctl stats`.
func (f *fileTier) counters(dst []wire.Counter) []wire.Counter {
	flag := func(b bool) uint64 {
		if b {
			return 1
		}
		return 0
	}
	ft := f.t.Features()
	dst = append(dst,
		wire.Counter{Name: "uring.single_issuer", Value: flag(ft.SingleIssuer)},
		wire.Counter{Name: "uring.defer_taskrun", Value: flag(ft.DeferTaskrun)},
		wire.Counter{Name: "uring.coop_taskrun", Value: flag(ft.CoopTaskrun)},
		wire.Counter{Name: "uring.sqpoll", Value: flag(ft.SQPoll)},
		wire.Counter{Name: "uring.fixed_buffers", Value: flag(ft.FixedBuffers)},
		wire.Counter{Name: "uring.fixed_files", Value: flag(ft.FixedFiles)},
	)
	for i, r := range f.t.Stats() {
		p := "uring.ring" + strconv.Itoa(i) + "."
		dst = append(dst,
			wire.Counter{Name: p + "entries", Value: uint64(r.Entries)},
			wire.Counter{Name: p + "in_flight", Value: uint64(r.InFlight)},
			wire.Counter{Name: p + "submitted", Value: r.Submitted},
			wire.Counter{Name: p + "completed", Value: r.Completed},
			wire.Counter{Name: p + "failed", Value: r.Failed},
			wire.Counter{Name: p + "resubmits", Value: r.Resubmits},
			wire.Counter{Name: p + "kernel_cancels", Value: r.KernelCancels},
			wire.Counter{Name: p + "fixed", Value: r.Fixed},
			wire.Counter{Name: p + "traced", Value: r.Traced},
			wire.Counter{Name: p + "enters", Value: r.Enters},
			wire.Counter{Name: p + "wakeups", Value: r.Wakeups},
		)
	}
	return dst
}

// Close stops the transport; in-flight I/O is canceled or drained.
func (f *fileTier) Close() {
	if err := f.t.Close(); err != nil {
		f.log.Warn("closing io_uring transport", "err", err)
	}
}
