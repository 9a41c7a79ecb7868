//go:build linux

package uring

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestShrunkClientBuffer: a client buffer of an unsealable memfd, shrunk
// to nothing by its owner, is memory the kernel cannot reach: each read
// and write through it ends with EFAULT (the kernel's answer, not a signal
// to the daemon), buffered and direct, and the same buffer regrown moves
// bytes again.
func TestShrunkClientBuffer(t *testing.T) {
	const size = 256 << 10
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			dir := t.TempDir()
			tr := newTransport(t, Config{AllowedDirs: []string{dir}})
			f := openTestFile(t, tr, dir, direct, 1<<20)
			fd := testutil.UnsealableMemfd(t, size)
			defer unix.Close(fd)
			own, err := unix.Dup(fd)
			if err != nil {
				t.Fatal(err)
			}
			b, err := shm.MapBuffer(7, own, size, size)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if !xfer.IsUnsealed(b) {
				t.Fatalf("a memfd without MFD_ALLOW_SEALING mapped as %v", b.Sealing())
			}
			rec := newRecorder()
			if err := unix.Ftruncate(fd, 0); err != nil {
				t.Fatal(err)
			}
			for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
				if n, err := runOne(t, tr, rec, newTask(rec, op, b, 0, f, 0, 64<<10)); !errors.Is(err, unix.EFAULT) || n != 0 {
					t.Errorf("%v through the shrunk buffer: %d bytes, %v; want EFAULT", op, n, err)
				}
			}
			if err := unix.Ftruncate(fd, size); err != nil {
				t.Fatal(err)
			}
			for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
				if n, err := runOne(t, tr, rec, newTask(rec, op, b, 0, f, 0, 64<<10)); err != nil || n != 64<<10 {
					t.Errorf("%v through the regrown buffer: %d bytes, %v", op, n, err)
				}
			}
		})
	}
}
