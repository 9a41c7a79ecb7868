//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// createMemfd makes a close-on-exec, sealable memfd of size bytes, hugetlb
// (2 MiB pages) when huge. On error the memfd is closed.
func createMemfd(name string, size uint64, huge bool) (int, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	if huge {
		flags |= unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	}
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return -1, os.NewSyscallError("memfd_create", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return -1, errors.Join(os.NewSyscallError("ftruncate", err), closeFd(fd))
	}
	return fd, nil
}

// addSeals adds seals to a memfd.
func addSeals(fd, seals int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return os.NewSyscallError("fcntl F_ADD_SEALS", err)
	}
	return nil
}

// sealPool seals the pool's memfd so no holder can change its size or add
// seals (F_SEAL_FUTURE_WRITE would stop new clients from mapping it).
func sealPool(fd int) error {
	return addSeals(fd, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
}

// sealClient seals a client's memfd against shrinking and growing.
func sealClient(fd int) error {
	return addSeals(fd, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
}

// sealShrink seals a passed memfd against shrinking: all the daemon's
// mapping needs. Growing stays the client's business.
func sealShrink(fd int) error {
	return addSeals(fd, unix.F_SEAL_SHRINK)
}

// mapShared maps size bytes of fd read-write, shared. A mapping of at
// least hugeSpan bytes starts on a hugeSpan boundary, so that the kernel
// maps the 2 MiB pages of fd (hugetlb, or transparent: see collapse) with
// one page-table entry each, in the daemon and in a client alike; it owns
// the address space up to its length rounded up to hugeSpan, which unmap
// gives back whole.
func mapShared(fd int, size uint64) ([]byte, error) {
	const prot = unix.PROT_READ | unix.PROT_WRITE
	if size < hugeSpan {
		p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), prot, unix.MAP_SHARED)
		if err != nil {
			return nil, os.NewSyscallError("mmap", err)
		}
		return unsafe.Slice((*byte)(p), size), nil
	}
	// Reserve a span one hugeSpan longer than needed, map fd over its
	// first aligned part, and give back what lies outside the span.
	span := mappedSpan(size)
	r, err := unix.MmapPtr(-1, 0, nil, uintptr(span+hugeSpan), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, os.NewSyscallError("mmap (reserving address space)", err)
	}
	total := uintptr(span + hugeSpan)
	head := -uintptr(r) & (hugeSpan - 1) // bytes up to the first boundary
	a := unsafe.Add(r, head)
	p, err := unix.MmapPtr(fd, 0, a, uintptr(size), prot, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return nil, errors.Join(os.NewSyscallError("mmap", err), munmapPtr(r, total))
	}
	tail := head + uintptr(span)
	if err := errors.Join(munmapPtr(r, head), munmapPtr(unsafe.Add(r, tail), total-tail)); err != nil {
		return nil, errors.Join(err, munmapPtr(a, uintptr(span)))
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// hugeSpan is the unit of collapse and of mapShared's alignment: the 2 MiB
// page of x86-64 and arm64 with 4 KiB base pages.
const hugeSpan = HugepageSize

// mappedSpan is the address space a mapping of size bytes owns (mapShared).
func mappedSpan(size uint64) uint64 {
	if size < hugeSpan {
		return size
	}
	return (size + hugeSpan - 1) &^ (hugeSpan - 1)
}

func munmapPtr(p unsafe.Pointer, n uintptr) error {
	if n == 0 {
		return nil
	}
	if err := unix.MunmapPtr(p, n); err != nil {
		return os.NewSyscallError("munmap", err)
	}
	return nil
}

// unmap unmaps a mapping made by mapShared.
func unmap(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return munmapPtr(unsafe.Pointer(&mem[0]), uintptr(mappedSpan(uint64(len(mem)))))
}

// collapse places the pool mapping mem, fresh from mapShared over a new
// memfd of normal pages, on transparent 2 MiB pages: for each whole
// hugeSpan it writes the first byte (MADV_COLLAPSE wants a page present;
// the pool is zero, so the write changes nothing) and asks the kernel to
// collapse the span (Linux 6.1 and later; shmem_enabled = never still
// allows it, deny does not). It returns how many spans it collapsed of how
// many, and the first error; it stops at a refusal that every span would
// get (EINVAL: the kernel cannot, or is told not to). The pages are then
// resident, as the io_uring registration of the pool makes them anyway.
func collapse(mem []byte) (done, spans int, err error) {
	spans = len(mem) / hugeSpan
	for i := 0; i < spans; i++ {
		span := mem[i*hugeSpan : (i+1)*hugeSpan]
		span[0] = 0
		if e := unix.Madvise(span, unix.MADV_COLLAPSE); e != nil {
			if err == nil {
				err = os.NewSyscallError("madvise MADV_COLLAPSE", e)
			}
			if errors.Is(e, unix.EINVAL) {
				return done, spans, err
			}
			continue
		}
		done++
	}
	return done, spans, err
}

func closeFd(fd int) error {
	if err := unix.Close(fd); err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

// prefault faults in every page of mem for writing.
func prefault(mem []byte) error {
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
		return os.NewSyscallError("madvise MADV_POPULATE_WRITE", err)
	}
	return nil
}

// fdInfo is what MapBuffer needs to know about a passed fd.
type fdInfo struct {
	regular bool   // S_IFREG (a memfd is one too)
	kind    string // the file type, for errors
	size    int64
	memory  bool // shmem or hugetlbfs backed (a memfd, a tmpfs file): seals apply
	shrink  bool // F_SEAL_SHRINK is set
	sealed  bool // F_SEAL_SEAL is set: no seal can be added
}

// inspectFd reads a passed fd's type, size and seals.
func inspectFd(fd int) (fdInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fdInfo{}, os.NewSyscallError("fstat", err)
	}
	info := fdInfo{size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		info.regular, info.kind = true, "regular file"
	case unix.S_IFDIR:
		info.kind = "directory"
	case unix.S_IFIFO:
		info.kind = "pipe"
	case unix.S_IFSOCK:
		info.kind = "socket"
	case unix.S_IFCHR:
		info.kind = "character device"
	case unix.S_IFBLK:
		info.kind = "block device"
	case unix.S_IFLNK:
		info.kind = "symlink"
	default:
		info.kind = fmt.Sprintf("file type %#o", st.Mode&unix.S_IFMT)
	}
	if !info.regular {
		return info, nil
	}
	// F_GET_SEALS answers only for shmem and hugetlbfs files (memfds, and
	// tmpfs files such as /dev/shm's); files on other file systems give
	// EINVAL. A memfd made without MFD_ALLOW_SEALING, and any tmpfs file
	// that is not a memfd, carries F_SEAL_SEAL from the start.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case err == nil:
		info.memory = true
		info.shrink = seals&unix.F_SEAL_SHRINK != 0
		info.sealed = seals&unix.F_SEAL_SEAL != 0
	case err == unix.EINVAL:
		info.kind = "file on a disk file system"
	default:
		return info, os.NewSyscallError("fcntl F_GET_SEALS", err)
	}
	return info, nil
}

// fileSize reads fd's size.
func fileSize(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, os.NewSyscallError("fstat", err)
	}
	return st.Size, nil
}
