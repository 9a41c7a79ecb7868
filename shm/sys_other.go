//go:build !linux

package shm

import (
	"os"
)

func createMemfd(string, uint64, bool) (int, error) { return -1, ErrNotSupported }

func sealPool(int) error { return ErrNotSupported }

func sealClient(int) error { return ErrNotSupported }

func sealShrink(int) error { return ErrNotSupported }

func fileSize(int) (int64, error) { return 0, ErrNotSupported }

func mapShared(int, uint64) ([]byte, error) { return nil, ErrNotSupported }

func unmap([]byte) error { return ErrNotSupported }

func prefault([]byte) error { return ErrNotSupported }

func collapse(mem []byte) (int, int, error) { return 0, 0, ErrNotSupported }

// closeFd closes fd, so MapBuffer keeps its ownership promise here too.
func closeFd(fd int) error { return os.NewFile(uintptr(fd), "fd").Close() }

type fdInfo struct {
	regular bool
	kind    string
	size    int64
	memory  bool
	shrink  bool
	sealed  bool
}

func inspectFd(int) (fdInfo, error) { return fdInfo{}, ErrNotSupported }
