//go:build linux

package uring

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// File is a file or block device opened by a Transport: an xfer.Segment of
// kind xfer.KindFile. Its descriptor stays open until Close has been called
// and every reference taken with Acquire has been released.
type File struct {
	t        *Transport
	id       xfer.SegmentID
	path     string
	fd       int
	size     uint64
	direct   bool
	readOnly bool
	offAlign uint32 // O_DIRECT file offset and length alignment
	memAlign uint32 // O_DIRECT memory address alignment
	fixed    int32  // index in the rings' registered-file table, or -1

	refs    atomic.Int64 // the open reference plus every Acquire
	closing atomic.Bool
	unreg   atomic.Int32 // rings that still have to clear the fixed entry
}

var _ xfer.Segment = (*File)(nil)

// ID is the segment id given to OpenFile.
func (f *File) ID() xfer.SegmentID { return f.id }

// Kind is xfer.KindFile.
func (f *File) Kind() xfer.Kind { return xfer.KindFile }

// Size is the segment's size in bytes.
func (f *File) Size() uint64 { return f.size }

// Path is the resolved path the file was opened at.
func (f *File) Path() string { return f.path }

// Direct reports whether the file is open with O_DIRECT.
func (f *File) Direct() bool { return f.direct }

// Alignment is the O_DIRECT alignment of file offsets and lengths, and of
// memory addresses (both 1 without O_DIRECT).
func (f *File) Alignment() (offset, memory uint32) {
	if !f.direct {
		return 1, 1
	}
	return f.offAlign, f.memAlign
}

// Fixed reports whether the file is registered with the rings.
func (f *File) Fixed() bool { return f.fixed >= 0 }

// Acquire takes a reference; false once the file is closing.
func (f *File) Acquire() bool {
	for {
		r := f.refs.Load()
		if r <= 0 || f.closing.Load() {
			return false
		}
		if f.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// Release drops a reference taken by Acquire.
func (f *File) Release() {
	if f.refs.Add(-1) == 0 {
		f.teardown()
	}
}

// Close stops new Acquires and drops the open reference; the descriptor is
// closed when the last reference goes. Safe to call more than once.
func (f *File) Close() error {
	if !f.closing.CompareAndSwap(false, true) {
		return nil
	}
	f.t.fileMu.Lock()
	delete(f.t.files, f)
	f.t.fileMu.Unlock()
	f.Release()
	return nil
}

// teardown runs once, when the last reference is dropped: it may run on a
// poller (the engine releases after Task.Done), so it never waits for one.
func (f *File) teardown() {
	unix.Close(f.fd)
	if f.fixed < 0 {
		return
	}
	t := f.t
	idx := f.fixed
	f.unreg.Store(int32(len(t.rings)))
	for _, r := range t.rings {
		ok := r.post(&command{kind: cmdFile, idx: uint32(idx), fd: -1, after: func() {
			if f.unreg.Add(-1) == 0 {
				t.fileMu.Lock()
				t.fileFree = append(t.fileFree, idx)
				t.fileMu.Unlock()
			}
		}})
		if !ok {
			return // closing: the table goes with the ring
		}
	}
}

// OpenFile opens path as a file segment. The path must resolve (symlinks,
// "..", /proc/self/fd/N included) to a regular file inside one of
// Config.AllowedDirs or to one of Config.AllowedDevices, and inside
// opts.Within when set, and must not be one of opts.Refuse; anything else
// fails with an error matching xfer.ErrPermission. Every check is made
// before the file is created, opened for writing or extended, so a refused
// open changes nothing on disk: a file it created for an open that fails
// later is removed again. With opts.Direct, a file system that refuses
// O_DIRECT fails here with ErrDirectUnsupported. It waits for the pollers
// (file registration), so it must not be called from Task.Done.
func (t *Transport) OpenFile(id xfer.SegmentID, path string, opts FileOptions) (*File, error) {
	if t.closed.Load() {
		return nil, xfer.ErrClosed
	}
	if id == 0 {
		return nil, fmt.Errorf("%w: segment id 0", ErrConfig)
	}
	if path == "" || strings.IndexByte(path, 0) >= 0 {
		return nil, fmt.Errorf("%w: path %q", ErrConfig, path)
	}
	resolved, err := t.resolveFilePath(path, opts)
	if err != nil {
		return nil, err
	}
	flags := unix.O_CLOEXEC | unix.O_NOFOLLOW
	if opts.ReadOnly {
		flags |= unix.O_RDONLY
	} else {
		flags |= unix.O_RDWR
	}
	if opts.Direct {
		flags |= unix.O_DIRECT
	}
	fd, created, err := t.openResolved(resolved, flags, opts.Create)
	if err == unix.ELOOP || err == unix.EXDEV {
		// A symlink where resolution found none (swapped in since, or one
		// left dangling), or a path that leaves its allowed directory.
		return nil, fmt.Errorf("%w: %s (resolved from %q): %w", ErrNotAllowed, resolved, path, os.NewSyscallError("open", err))
	}
	if err != nil {
		if opts.Direct && err == unix.EINVAL {
			return nil, fmt.Errorf("%w: %s: %w", ErrDirectUnsupported, resolved, os.NewSyscallError("open", err))
		}
		return nil, &os.PathError{Op: "open", Path: resolved, Err: err}
	}
	f := &File{t: t, id: id, path: resolved, fd: fd, direct: opts.Direct, readOnly: opts.ReadOnly, fixed: -1}
	if err := t.checkOpened(f, opts); err != nil {
		if created {
			removeCreated(resolved, fd)
		}
		unix.Close(fd)
		return nil, err
	}
	f.refs.Store(1)
	t.registerFile(f)
	t.fileMu.Lock()
	t.files[f] = struct{}{}
	t.fileMu.Unlock()
	if t.closed.Load() {
		f.Close()
		return nil, xfer.ErrClosed
	}
	return f, nil
}

// resolveFilePath resolves path and checks, before anything is opened,
// that it is allowed: by the Config, by opts.Within, and not one of
// opts.Refuse.
func (t *Transport) resolveFilePath(path string, opts FileOptions) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %w", ErrConfig, path, err)
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		if !opts.Create || !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("uring: resolve %q: %w", path, err)
		}
		dir, base := filepath.Split(abs)
		rdir, derr := filepath.EvalSymlinks(dir)
		if derr != nil {
			return "", fmt.Errorf("uring: resolve %q: %w", path, derr)
		}
		resolved = filepath.Join(rdir, base)
	}
	if !t.allowed(resolved) || !allowedWithin(resolved, opts.Within) {
		return "", fmt.Errorf("%w: %s (resolved from %q)", ErrNotAllowed, resolved, path)
	}
	if st, err := os.Stat(resolved); err == nil && refused(st, opts.Refuse) {
		return "", fmt.Errorf("%w: %s (resolved from %q) is the daemon's own", ErrNotAllowed, resolved, path)
	}
	return resolved, nil
}

// allowedWithin reports whether p is one of within or lies strictly inside
// one of them; an empty within allows every path.
func allowedWithin(p string, within []string) bool {
	if len(within) == 0 {
		return true
	}
	for _, w := range within {
		if p == w || inside(p, w) {
			return true
		}
	}
	return false
}

// inside reports whether p lies strictly inside dir.
func inside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// refused reports whether st is one of the files in refuse.
func refused(st os.FileInfo, refuse []string) bool {
	for _, p := range refuse {
		if r, err := os.Stat(p); err == nil && os.SameFile(st, r) {
			return true
		}
	}
	return false
}

// noOpenat2 is set once openat2 was found missing (ENOSYS): opens then
// fall back to open with O_NOFOLLOW, which guards the last component only.
var noOpenat2 atomic.Bool

// openResolved opens resolved, a path resolveFilePath allowed, so that no
// symlink swapped in since can lead elsewhere: relative to the allowed
// directory that holds it with openat2 (RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS: resolved has none left), or with O_NOFOLLOW where
// the kernel has no openat2. With create, a missing file is created first
// (O_EXCL, without O_DIRECT: a file system that refuses O_DIRECT does so
// only after creating) and then opened with flags; created says so, for
// the caller to remove it should a later check refuse the open.
func (t *Transport) openResolved(resolved string, flags int, create bool) (fd int, created bool, err error) {
	root, rel := "", ""
	if !t.isDevice(resolved) {
		for _, d := range t.allowedDirs {
			if inside(resolved, d) && len(d) > len(root) {
				root = d
			}
		}
		rel, _ = filepath.Rel(root, resolved)
	}
	open := func(flags int, mode uint32) (int, error) {
		if root == "" || noOpenat2.Load() {
			return unix.Open(resolved, flags, mode)
		}
		dfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(dfd)
		fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
		if err == unix.ENOSYS {
			noOpenat2.Store(true)
			return unix.Open(resolved, flags, mode)
		}
		return fd, err
	}
	fd, err = open(flags, 0)
	if err != unix.ENOENT || !create {
		return fd, false, err
	}
	cfd, err := open(unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	switch {
	case err == unix.EEXIST: // created by someone else meanwhile
	case err != nil:
		return -1, false, err
	default:
		created = true
	}
	fd, err = open(flags, 0)
	if err != nil && created {
		removeCreated(resolved, cfd)
	}
	if cfd >= 0 {
		unix.Close(cfd)
	}
	return fd, created && err == nil, err
}

// removeCreated removes the file OpenFile created at path for an open that
// failed, if path still names it (fd is open on it).
func removeCreated(path string, fd int) {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) == nil && unix.Lstat(path, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
		unix.Unlink(path) //nolint:errcheck // nothing more to do about it
	}
}

// allowed reports whether a resolved path is an allowed device or lies
// strictly inside an allowed directory.
func (t *Transport) allowed(p string) bool {
	for _, d := range t.allowedDevs {
		if p == d {
			return true
		}
	}
	for _, d := range t.allowedDirs {
		if inside(p, d) {
			return true
		}
	}
	return false
}

func (t *Transport) isDevice(p string) bool {
	for _, d := range t.allowedDevs {
		if p == d {
			return true
		}
	}
	return false
}

// checkOpened verifies what was opened (the path could have been swapped
// between resolution and open), sizes it and finds its O_DIRECT alignment.
// A regular file smaller than opts.Size is extended last, once every
// check has passed.
func (t *Transport) checkOpened(f *File, opts FileOptions) error {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(f.fd))
	if err == nil && link != f.path && (!t.allowed(link) || !allowedWithin(link, opts.Within)) {
		return fmt.Errorf("%w: %s (opened as %s)", ErrNotAllowed, link, f.path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return os.NewSyscallError("fstat", err)
	}
	for _, p := range opts.Refuse {
		var r unix.Stat_t
		if unix.Stat(p, &r) == nil && r.Dev == st.Dev && r.Ino == st.Ino {
			return fmt.Errorf("%w: %s is the daemon's own", ErrNotAllowed, f.path)
		}
	}
	var size uint64
	extend := false
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		size = uint64(st.Size)
		if opts.Size > size {
			if opts.ReadOnly {
				return fmt.Errorf("%w: %s is %d bytes, smaller than Size %d", ErrConfig, f.path, size, opts.Size)
			}
			extend = true
			size = opts.Size
		}
	case unix.S_IFBLK:
		if !t.isDevice(f.path) {
			return fmt.Errorf("%w: block device %s is not in AllowedDevices", ErrNotAllowed, f.path)
		}
		var n uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(f.fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); e != 0 {
			return os.NewSyscallError("ioctl BLKGETSIZE64", e)
		}
		size = n
		if opts.Size > size {
			return fmt.Errorf("%w: device %s is %d bytes, smaller than Size %d", ErrConfig, f.path, size, opts.Size)
		}
	default:
		return fmt.Errorf("%w: %s is not a regular file or block device", ErrConfig, f.path)
	}
	if opts.Size > 0 {
		size = opts.Size
	}
	if size == 0 {
		return fmt.Errorf("%w: %s has size 0 (set FileOptions.Size)", ErrConfig, f.path)
	}
	f.size = size
	if f.direct {
		if err := f.directAlignment(st.Mode&unix.S_IFMT == unix.S_IFBLK); err != nil {
			return err
		}
	}
	if extend {
		if err := unix.Ftruncate(f.fd, int64(size)); err != nil {
			return os.NewSyscallError("ftruncate", err)
		}
	}
	return nil
}

// directAlignment finds the O_DIRECT alignment of the file or block device.
func (f *File) directAlignment(blockDev bool) error {
	f.offAlign, f.memAlign = 4096, 4096
	if blockDev {
		lbs, err := unix.IoctlGetInt(f.fd, unix.BLKSSZGET)
		if err != nil {
			return os.NewSyscallError("ioctl BLKSSZGET", err)
		}
		if lbs > 0 {
			f.offAlign, f.memAlign = uint32(lbs), uint32(lbs)
		}
		return nil
	}
	var sx unix.Statx_t
	if err := unix.Statx(f.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err == nil && sx.Mask&unix.STATX_DIOALIGN != 0 {
		if sx.Dio_offset_align == 0 {
			return fmt.Errorf("%w: %s (statx reports no direct I/O support)", ErrDirectUnsupported, f.path)
		}
		f.offAlign, f.memAlign = sx.Dio_offset_align, max(sx.Dio_mem_align, 1)
	}
	return nil
}

// registerFile puts the file in every ring's registered-file table; on
// failure the file uses its plain descriptor (logged once).
func (t *Transport) registerFile(f *File) {
	if !t.fixedFiles.Load() {
		return
	}
	t.fileMu.Lock()
	if len(t.fileFree) == 0 {
		t.fileMu.Unlock()
		t.warnFiles(fmt.Errorf("registered-file table full (%d entries)", t.cfg.MaxFixedFiles))
		return
	}
	idx := t.fileFree[len(t.fileFree)-1]
	t.fileFree = t.fileFree[:len(t.fileFree)-1]
	t.fileMu.Unlock()
	for i, r := range t.rings {
		if err := r.do(&command{kind: cmdFile, idx: uint32(idx), fd: int32(f.fd)}); err != nil {
			for _, r2 := range t.rings[:i] {
				r2.do(&command{kind: cmdFile, idx: uint32(idx), fd: -1})
			}
			t.fileMu.Lock()
			t.fileFree = append(t.fileFree, idx)
			t.fileMu.Unlock()
			t.warnFiles(err)
			return
		}
	}
	f.fixed = idx
}

func (t *Transport) warnFiles(err error) {
	t.fileMu.Lock()
	defer t.fileMu.Unlock()
	if !t.warnedFiles {
		t.warnedFiles = true
		t.log.Warn("uring: file registration failed, file uses its plain descriptor", "err", err)
	}
}
