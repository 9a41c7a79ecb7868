package daemon

import (
	"log/slog"
	"os"
	"strconv"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// fileTier is the io_uring transport with the pool registered as fixed
// buffers; it opens file segments for RegisterFile.
type fileTier struct {
	t   *uring.Transport
	log *slog.Logger
}

// newFileTier starts the io_uring transport. Files may be opened under
// data_dir and under allowed_files (directories, or block devices). When
// io_uring cannot start, the daemon runs without file segments and says so.
func newFileTier(cfg Config, pool *shm.Pool, log *slog.Logger) *fileTier {
	ucfg := uring.Config{AllowedDirs: []string{cfg.DataDir}}
	for _, p := range cfg.AllowedFiles {
		if st, err := os.Stat(p); err == nil && st.Mode()&os.ModeDevice != 0 {
			ucfg.AllowedDevices = append(ucfg.AllowedDevices, p)
		} else {
			ucfg.AllowedDirs = append(ucfg.AllowedDirs, p)
		}
	}
	t, err := uring.New(ucfg, log)
	if err != nil {
		log.Warn("io_uring unavailable: file segments are off", "err", err)
		return nil
	}
	if err := t.RegisterBuffers(pool); err != nil {
		// The transport already logged its fallback to plain READ/WRITE.
		log.Info("pool not registered as fixed buffers", "err", err)
	}
	f := t.Features()
	log.Info("file tier ready", "allowed_dirs", ucfg.AllowedDirs, "allowed_devices", ucfg.AllowedDevices,
		"fixed_buffers", f.FixedBuffers, "single_issuer", f.SingleIssuer, "defer_taskrun", f.DeferTaskrun, "sqpoll", f.SQPoll)
	return &fileTier{t: t, log: log}
}

// OpenFile implements control.FileOpener.
func (f *fileTier) OpenFile(id xfer.SegmentID, path string, direct bool, size uint64) (control.FileSegment, error) {
	seg, err := f.t.OpenFile(id, path, uring.FileOptions{Direct: direct, Size: size, Create: true})
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
			wire.Counter{Name: p + "fixed", Value: r.Fixed},
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
