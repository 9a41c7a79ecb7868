//go:build linux

package shm

import (
	"os"

	"golang.org/x/sys/unix"
)

// memfdFacts are what adopting a memfd checks: its identity, size, page
// size and seals.
type memfdFacts struct {
	dev, ino uint64
	size     int64
	huge     bool // on hugetlbfs
	memfd    bool // shmem or hugetlbfs backed: it answers F_GET_SEALS
	seals    int
}

func inspectMemfd(fd int) (memfdFacts, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return memfdFacts{}, os.NewSyscallError("fstat", err)
	}
	f := memfdFacts{dev: uint64(st.Dev), ino: st.Ino, size: st.Size}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return f, nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return f, os.NewSyscallError("fstatfs", err)
	}
	f.huge = fs.Type == unix.HUGETLBFS_MAGIC
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err == nil {
		f.memfd, f.seals = true, seals
	}
	return f, nil
}

// poolSeals are the seals NewPool sets; an adopted pool must carry them all.
const poolSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

func setCloexec(fd int) { unix.CloseOnExec(fd) }
