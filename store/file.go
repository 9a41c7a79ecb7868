package store

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/xfer"
)

// FileL2 describes an L2 file for Open.
type FileL2 struct {
	// Path of the file (or block device) the store keeps its L2 in; a
	// missing file is created (mode 0600). It must be allowed by the
	// transport (uring.Config.AllowedDirs / AllowedDevices).
	Path string
	// Size of the L2 in bytes; a smaller regular file is extended (sparse)
	// to it. A store formatted on a larger size ignores the regions past
	// the new one, and never uses what they held again.
	Size uint64
	// FileID and StagingID are segment ids of their own (the daemon's
	// registry hands them out).
	FileID, StagingID xfer.SegmentID
	// Buffered opens without O_DIRECT. By default O_DIRECT is used, and a
	// file system that refuses it (tmpfs, overlayfs) falls back to buffered
	// I/O, said in the log.
	Buffered bool
	// RegionSize, VerifyOnOpen, NoVerifyReads: see L2.
	RegionSize    uint64
	VerifyOnOpen  bool
	NoVerifyReads bool
}

// Open builds a store whose L2 is the file f.Path, moved through tr with
// the pool registered as fixed buffers (READ_FIXED / WRITE_FIXED). The
// store owns the file and closes it in Close; tr and pool stay the
// caller's.
func Open(cfg Config, pool *shm.Pool, tr *uring.Transport, f FileL2) (*Store, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := tr.RegisterBuffers(pool); err != nil {
		log.Info("store: pool not registered as fixed buffers", "err", err)
	}
	file, err := tr.OpenFile(f.FileID, f.Path, uring.FileOptions{Direct: !f.Buffered, Size: f.Size, Create: true})
	if !f.Buffered && errors.Is(err, uring.ErrDirectUnsupported) {
		log.Warn("store: the L2 file system refuses O_DIRECT; using buffered I/O", "path", f.Path, "err", err)
		file, err = tr.OpenFile(f.FileID, f.Path, uring.FileOptions{Size: f.Size, Create: true})
	}
	if err != nil {
		return nil, fmt.Errorf("store: open L2 file %s: %w", f.Path, err)
	}
	s, err := New(cfg, pool, &L2{Transport: tr, File: file, StagingID: f.StagingID, RegionSize: f.RegionSize,
		VerifyOnOpen: f.VerifyOnOpen, NoVerifyReads: f.NoVerifyReads})
	if err != nil {
		return nil, errors.Join(err, file.Close())
	}
	s.l2.owned = file
	log.Info("store: L2 file open", "path", file.Path(), "size", file.Size(), "direct", file.Direct(),
		"fixed_file", file.Fixed())
	return s, nil
}
