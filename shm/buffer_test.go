//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// fdClosed reports whether fd is no longer open.
func fdClosed(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return errors.Is(err, unix.EBADF)
}

func mustMemfd(t *testing.T, size uint64, seal bool) int {
	t.Helper()
	fd, err := NewMemfd("shm-test", size, seal)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// readOnly opens fd's file again, read-only, and closes fd.
func readOnly(t *testing.T, fd int) int {
	t.Helper()
	defer unix.Close(fd)
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ro
}

// shmFile makes a file in /dev/shm (tmpfs) and unlinks it, as a client
// without memfd_create does.
func shmFile(t *testing.T, size int64) int {
	t.Helper()
	f, err := os.CreateTemp("/dev/shm", "tensorcast-shm-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(f.Name()); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	unix.CloseOnExec(fd)
	return fd
}

// openFile makes a file of size bytes on a disk file system (the test's
// temporary directory, or the package's when that one is tmpfs) and opens
// it with flags.
func openFile(t *testing.T, size int64, flags int) int {
	t.Helper()
	dir := ""
	for _, d := range []string{t.TempDir(), "."} {
		var st unix.Statfs_t
		if err := unix.Statfs(d, &st); err == nil && st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC {
			dir = d
			break
		}
	}
	if dir == "" {
		// The temporary directory and the package's are both in memory:
		// a small ext4 on a loop device is a disk file system.
		dir = testutil.MountSmallExt4(t)
	}
	path := filepath.Join(dir, fmt.Sprintf("shm-test-%d", os.Getpid()))
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestMapBufferRefusals(t *testing.T) {
	before, err := fdCount()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		fd   func(t *testing.T) int
		size uint64
		want error
	}{
		{"pipe", func(t *testing.T) int {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			unix.Close(p[1])
			return p[0]
		}, 4 * kib, ErrNotMappable},
		{"socket", func(t *testing.T) int {
			s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, 4 * kib, ErrNotMappable},
		{"directory", func(t *testing.T) int {
			fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, 4 * kib, ErrNotMappable},
		{"/dev/null", func(t *testing.T) int {
			fd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return fd
		}, 4 * kib, ErrNotMappable},
		{"short memfd", func(t *testing.T) int { return mustMemfd(t, 4*kib, true) }, 8 * kib, ErrShortFile},
		{"file on disk", func(t *testing.T) int { return openFile(t, 4*kib, unix.O_RDWR) }, 4 * kib, ErrNotMappable},
		{"short unsealable memfd", func(t *testing.T) int { return testutil.UnsealableMemfd(t, 4*kib) }, 8 * kib, ErrShortFile},
		{"memfd shrunk before it is sealed", func(t *testing.T) int {
			fd := mustMemfd(t, 8*kib, false)
			if err := unix.Ftruncate(fd, 4*kib); err != nil {
				t.Fatal(err)
			}
			return fd
		}, 8 * kib, ErrShortFile},
		{"size over limit", func(t *testing.T) int { return mustMemfd(t, 64*kib, true) }, 64 * kib, ErrTooLarge},
		{"size 0", func(t *testing.T) int { return mustMemfd(t, 4*kib, true) }, 0, ErrInvalidSize},
		{"read-only memfd (mmap fails)", func(t *testing.T) int { return readOnly(t, mustMemfd(t, 4*kib, true)) }, 4 * kib, unix.EACCES},
		{"read-only sealable memfd (sealing fails)", func(t *testing.T) int { return readOnly(t, mustMemfd(t, 4*kib, false)) }, 4 * kib, unix.EPERM},
		{"write-sealed memfd (mmap fails)", func(t *testing.T) int {
			fd := mustMemfd(t, 4*kib, true)
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err != nil {
				t.Fatal(err)
			}
			return fd
		}, 4 * kib, unix.EPERM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := tt.fd(t)
			b, err := MapBuffer(11, fd, tt.size, 32*kib)
			if !errors.Is(err, tt.want) || b != nil {
				t.Errorf("MapBuffer = %v, %v; want %v", b, err, tt.want)
			}
			if !fdClosed(fd) {
				t.Errorf("MapBuffer left fd %d open after refusing it", fd)
				unix.Close(fd)
			}
		})
	}
	if b, err := MapBuffer(0, mustMemfd(t, 4*kib, true), 4*kib, 32*kib); !errors.Is(err, ErrInvalidID) || b != nil {
		t.Errorf("MapBuffer(id 0) = %v, %v; want ErrInvalidID", b, err)
	}
	if b, err := MapBuffer(11, -1, 4*kib, 32*kib); err == nil || b != nil {
		t.Errorf("MapBuffer(fd -1) = %v, %v; want an error", b, err)
	}
	if after, err := fdCount(); err != nil || after != before {
		t.Errorf("refusals leaked fds: %d before, %d after (%v)", before, after, err)
	}
}

func TestMapBufferAccepts(t *testing.T) {
	before, err := fdCount()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		fd      func(t *testing.T) int
		sealing Sealing
	}{
		{"sealed memfd", func(t *testing.T) int { return mustMemfd(t, 64*kib, true) }, SealedByClient},
		{"sealable memfd", func(t *testing.T) int { return mustMemfd(t, 64*kib, false) }, SealedByDaemon},
		{"memfd without MFD_ALLOW_SEALING", func(t *testing.T) int { return testutil.UnsealableMemfd(t, 64*kib) }, Unsealed},
		{"tmpfs file", func(t *testing.T) int { return shmFile(t, 64*kib) }, Unsealed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fd := tt.fd(t)
			// The client keeps its fd: the daemon gets a copy of it.
			own, err := unix.Dup(fd)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(own)
			// The client's own mapping, made before it passes the fd.
			client, err := MapShared(fd, 64*kib)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := Unmap(client); err != nil {
					t.Error(err)
				}
			}()
			copy(client[100:], "from the client")
			// A buffer smaller than the file maps only its declared size.
			b, err := MapBuffer(12, fd, 48*kib, 64*kib)
			if err != nil {
				t.Fatalf("MapBuffer: %v", err)
			}
			if !fdClosed(fd) {
				t.Errorf("MapBuffer kept fd %d open", fd)
			}
			if b.ID() != 12 || b.Kind() != xfer.KindClient || b.Size() != 48*kib || len(b.Bytes()) != 48*kib {
				t.Errorf("buffer id %d kind %v size %d len %d", b.ID(), b.Kind(), b.Size(), len(b.Bytes()))
			}
			if b.Sealing() != tt.sealing || b.Unsealed() != (tt.sealing == Unsealed) || xfer.IsUnsealed(b) != b.Unsealed() {
				t.Errorf("sealing %v (unsealed %v), want %v", b.Sealing(), b.Unsealed(), tt.sealing)
			}
			// Sealed, the client's own shrink fails and costs only it;
			// unsealed, it goes through (and the daemon must live with it).
			err = unix.Ftruncate(own, 4*kib)
			if sealed := tt.sealing != Unsealed; sealed != errors.Is(err, unix.EPERM) {
				t.Errorf("client's ftruncate to 4 KiB = %v; sealing %v", err, b.Sealing())
			}
			if err := unix.Ftruncate(own, 64*kib); err != nil {
				t.Fatal(err)
			}
			if got := string(b.Bytes()[100:115]); got != "from the client" {
				t.Errorf("buffer sees %q", got)
			}
			copy(b.Bytes()[48*kib-6:], "daemon")
			if got := string(client[48*kib-6 : 48*kib]); got != "daemon" {
				t.Errorf("client sees %q", got)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if isMapped(t, b.Bytes()) {
				t.Error("buffer still mapped after Close with no references")
			}
		})
	}
	if after, err := fdCount(); err != nil || after != before {
		t.Errorf("accepted buffers leaked fds: %d before, %d after (%v)", before, after, err)
	}
}

func TestBufferCloseWithRefs(t *testing.T) {
	b, err := MapBuffer(13, mustMemfd(t, 16*kib, true), 16*kib, 16*kib)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if !b.Acquire() {
			t.Fatal("Acquire on an open buffer failed")
		}
	}
	mem := b.Bytes()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b.Acquire() {
		t.Fatal("Acquire after Close succeeded")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	b.Release()
	mem[0], mem[len(mem)-1] = 7, 8 // still mapped: one reference left
	if !isMapped(t, mem) || mem[0] != 7 {
		t.Fatal("mapping gone while a reference is held")
	}
	b.Release()
	if isMapped(t, mem) {
		t.Fatal("mapping still there after the last Release")
	}
}

func TestNewMemfdAndMapShared(t *testing.T) {
	if _, err := NewMemfd("x", 0, true); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("NewMemfd(size 0) = %v", err)
	}
	fd := mustMemfd(t, 8*kib, true)
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		t.Errorf("sealed memfd has seals %#x, %v", seals, err)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("memfd not close-on-exec: %#x, %v", flags, err)
	}
	if _, err := MapShared(fd, 0); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("MapShared(size 0) = %v", err)
	}
	if err := Unmap(make([]byte, 10)); err == nil {
		t.Error("Unmap of memory that is not a mapping succeeded")
	}
	un := mustMemfd(t, 8*kib, false)
	defer unix.Close(un)
	if seals, err := unix.FcntlInt(uintptr(un), unix.F_GET_SEALS, 0); err != nil || seals != 0 {
		t.Errorf("unsealed memfd has seals %#x, %v", seals, err)
	}
}

// releaseFunc is a registration whose Release calls f.
type releaseFunc func()

func (f releaseFunc) Release() { f() }

// TestBufferTeardownReleasesRegs: a registration set on the buffer is
// released once, at its teardown, while the mapping is still there.
func TestBufferTeardownReleasesRegs(t *testing.T) {
	for _, refHeld := range []bool{false, true} {
		b, err := MapBuffer(14, mustMemfd(t, 16*kib, true), 16*kib, 16*kib)
		if err != nil {
			t.Fatal(err)
		}
		if !b.Acquire() {
			t.Fatal("Acquire on an open buffer failed")
		}
		mem := b.Bytes()
		calls, mappedAtCall := 0, false
		reg := new(releaseFunc)
		*reg = func() { calls++; mappedAtCall = isMapped(t, mem) }
		if !b.Regs().Set(xfer.SlotRDMA, reg) {
			t.Fatal("Set on an open buffer failed")
		}
		if refHeld {
			if !b.Acquire() {
				t.Fatal("second Acquire failed")
			}
		}
		b.Release()
		if calls != 0 {
			t.Fatalf("hook ran before Close (ref held %v)", refHeld)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if refHeld {
			if calls != 0 {
				t.Fatal("hook ran while a reference was held")
			}
			b.Release()
		}
		if calls != 1 || !mappedAtCall {
			t.Fatalf("hook ran %d times, mapping present at the call: %v (ref held %v)", calls, mappedAtCall, refHeld)
		}
		if isMapped(t, mem) {
			t.Fatal("mapping still there after the teardown")
		}
		_ = b.Close()
		if calls != 1 {
			t.Fatalf("hook ran %d times after a second Close", calls)
		}
		if b.Regs().Set(xfer.SlotRDMA, reg) || b.Regs().Load(xfer.SlotRDMA) != nil {
			t.Fatal("a registration was kept after the teardown")
		}
	}
}
