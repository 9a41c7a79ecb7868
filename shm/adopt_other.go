//go:build !linux

package shm

type memfdFacts struct {
	dev, ino uint64
	size     int64
	huge     bool
	memfd    bool
	seals    int
}

func inspectMemfd(int) (memfdFacts, error) { return memfdFacts{}, ErrNotSupported }

const poolSeals = 0

func setCloexec(int) {}
