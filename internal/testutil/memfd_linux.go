package testutil

import (
	"testing"

	"golang.org/x/sys/unix"
)

// UnsealableMemfd is a memfd of size bytes made the way an engine's own
// shared-memory allocator makes one: without MFD_ALLOW_SEALING, so that no
// seal can ever be added and its owner can shrink it at any time. The
// caller owns the descriptor (passing it to shm.MapBuffer hands it over).
func UnsealableMemfd(t testing.TB, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("engine-host-pool", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	return fd
}
