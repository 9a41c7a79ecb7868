//go:build linux

package uring

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestZeroAllocs: a steady-state submit/complete cycle allocates nothing,
// with and without registered buffers.
func TestZeroAllocs(t *testing.T) {
	for _, register := range []bool{true, false} {
		dir := t.TempDir()
		tr := newTransport(t, Config{AllowedDirs: []string{dir}, Entries: 64})
		f := openTestFile(t, tr, dir, true, 4<<20)
		pool := newMemSeg(t, 2, 4<<20)
		if register {
			if err := tr.RegisterBuffers(pool); err != nil {
				t.Fatal(err)
			}
		}
		rec := make(xfertest.Chan, 64)
		tasks := make([]*xfer.Task, 16)
		for i := range tasks {
			op := xfer.OpRead
			if i%2 == 1 {
				op = xfer.OpWrite
			}
			tasks[i] = newTask(rec, op, pool, uint64(i)*8192, f, uint64(i)*8192, 4096)
		}
		cycle := func() {
			n, err := tr.Submit(tasks)
			if n != len(tasks) || err != nil {
				panic(err)
			}
			for range tasks {
				<-rec
			}
		}
		cycle() // warm up
		if a := testing.AllocsPerRun(200, cycle); a != 0 {
			t.Fatalf("register=%v: %.2f allocations per %d-task cycle, want 0", register, a, len(tasks))
		}
		if register && tr.Stats()[0].Fixed == 0 {
			t.Fatal("fixed buffers not used")
		}
	}
}

// TestDirectRefused: a file system without O_DIRECT fails at OpenFile, not
// per request. ramfs never has O_DIRECT; tmpfs has it since Linux 6.6.
func TestDirectRefused(t *testing.T) {
	testutil.Require(t, testutil.Mount)
	for _, fstype := range []string{"ramfs", "tmpfs"} {
		t.Run(fstype, func(t *testing.T) {
			dir := t.TempDir()
			if err := unix.Mount("none", dir, fstype, 0, ""); err != nil {
				testutil.Missing(t, testutil.Mount, "mount -t %s failed: %v", fstype, err)
			}
			defer unix.Unmount(dir, unix.MNT_DETACH)
			tr := newTransport(t, Config{AllowedDirs: []string{dir}})
			f, err := tr.OpenFile(1, filepath.Join(dir, "f"), FileOptions{Direct: true, Create: true, Size: 1 << 20})
			probeFD, perr := unix.Open(filepath.Join(dir, "probe"), unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o600)
			if perr == nil {
				unix.Close(probeFD)
			}
			kernelRefuses := perr != nil
			switch {
			case kernelRefuses && (!errors.Is(err, ErrDirectUnsupported) || !errors.Is(err, xfer.ErrNotSupported)):
				t.Fatalf("%s refuses O_DIRECT but OpenFile said %v", fstype, err)
			case !kernelRefuses && err != nil:
				t.Fatalf("%s accepts O_DIRECT on this kernel but OpenFile failed: %v", fstype, err)
			case !kernelRefuses:
				// Then requests must work end to end.
				defer f.Close()
				pool := newMemSeg(t, 2, 1<<20)
				rec := newRecorder()
				offA, _ := f.Alignment()
				if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 0, uint64(offA))); err != nil || n != uint64(offA) {
					t.Fatalf("write on %s: %d %v", fstype, n, err)
				}
				t.Logf("%s accepts O_DIRECT on this kernel (alignment %d)", fstype, offA)
			default:
				t.Logf("%s: %v", fstype, err)
			}
			if ramfs := fstype == "ramfs"; ramfs && !kernelRefuses {
				t.Fatal("ramfs accepted O_DIRECT: the refusal path is untested")
			}
		})
	}
}

// TestENOSPC fills a small loop-mounted ext4 file system: the write that
// does not fit ends with an error matching syscall.ENOSPC.
func TestENOSPC(t *testing.T) {
	mnt := testutil.MountSmallExt4(t)
	tr := newTransport(t, Config{AllowedDirs: []string{mnt}})
	f, err := tr.OpenFile(1, filepath.Join(mnt, "big"), FileOptions{Direct: true, Create: true, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	var lastErr error
	var written uint64
	for off := uint64(0); off < 64<<20; off += 1 << 20 {
		n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, off, 1<<20))
		written += n
		if err != nil {
			lastErr = err
			break
		}
	}
	if !errors.Is(lastErr, syscall.ENOSPC) {
		t.Fatalf("after %d bytes: got %v, want ENOSPC", written, lastErr)
	}
	if written == 0 || written >= 16<<20 {
		t.Fatalf("wrote %d bytes to a 16 MiB file system", written)
	}
	t.Logf("ENOSPC after %d bytes: %v", written, lastErr)
}

// TestBlockDevice: a loop block device named in AllowedDevices works with
// O_DIRECT at its logical block size; the same device reached through a
// symlink in an allowed directory, or not listed, is refused.
func TestBlockDevice(t *testing.T) {
	testutil.Require(t, testutil.Mount)
	base := t.TempDir()
	img := filepath.Join(base, "dev.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 8<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).CombinedOutput()
	if err != nil {
		testutil.Missing(t, testutil.Mount, "losetup could not attach a loop device: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	allowed := filepath.Join(base, "allowed")
	if err := os.Mkdir(allowed, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dev, filepath.Join(allowed, "dev")); err != nil {
		t.Fatal(err)
	}

	refuse := newTransport(t, Config{AllowedDirs: []string{allowed}})
	if _, err := refuse.OpenFile(1, filepath.Join(allowed, "dev"), FileOptions{Direct: true}); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("device through a symlink in an allowed dir: %v", err)
	}

	tr := newTransport(t, Config{AllowedDirs: []string{allowed}, AllowedDevices: []string{dev}})
	f, err := tr.OpenFile(1, dev, FileOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offA, memA := f.Alignment()
	lbs, err := unix.IoctlGetInt(f.fd, unix.BLKSSZGET)
	if err != nil || uint32(lbs) != offA || uint32(lbs) != memA {
		t.Fatalf("alignment %d/%d, BLKSSZGET %d (%v)", offA, memA, lbs, err)
	}
	if f.Size() != 8<<20 {
		t.Fatalf("size %d, want %d", f.Size(), 8<<20)
	}
	pool := newMemSeg(t, 2, 1<<20)
	if err := tr.RegisterBuffers(pool); err != nil {
		t.Fatal(err)
	}
	for i := range pool.Bytes()[:64<<10] {
		pool.Bytes()[i] = byte(i*13 + 1)
	}
	rec := newRecorder()
	off := uint64(8<<20 - 64<<10) // the device's last 64 KiB
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, off, 64<<10)); err != nil || n != 64<<10 {
		t.Fatalf("write: %d %v", n, err)
	}
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 512<<10, f, off, 64<<10)); err != nil || n != 64<<10 {
		t.Fatalf("read: %d %v", n, err)
	}
	if crc32.Checksum(pool.Bytes()[:64<<10], castagnoli) != crc32.Checksum(pool.Bytes()[512<<10:576<<10], castagnoli) {
		t.Fatal("device data differs")
	}
	if _, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 0, f, 8<<20, 512)); !errors.Is(err, xfer.ErrInvalid) {
		t.Fatalf("read past the device end: %v", err)
	}
}

// TestRefusedOpenChangesNothing: an open refused by a check made after the
// file is opened (a size of 0, a Within it lies outside of) leaves no file
// behind and no file grown; a file in Refuse is refused through a hard
// link and through /proc/self/fd/N.
func TestRefusedOpenChangesNothing(t *testing.T) {
	dir := t.TempDir()
	tr := newTransport(t, Config{AllowedDirs: []string{dir}})
	if _, err := tr.OpenFile(1, filepath.Join(dir, "empty"), FileOptions{Create: true}); !errors.Is(err, ErrConfig) {
		t.Fatalf("creating a file of size 0: %v", err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.OpenFile(1, filepath.Join(dir, "outside"), FileOptions{Create: true, Size: 4096, Within: []string{sub}}); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("creating outside Within: %v", err)
	}
	own := filepath.Join(dir, "own")
	if err := os.WriteFile(own, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(own, filepath.Join(sub, "hard")); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(own)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, p := range []string{own, filepath.Join(sub, "hard"), "/proc/self/fd/" + strconv.Itoa(int(held.Fd()))} {
		if _, err := tr.OpenFile(1, p, FileOptions{Create: true, Size: 1 << 20, Refuse: []string{own}}); !errors.Is(err, xfer.ErrPermission) {
			t.Fatalf("opening %s, a refused file: %v", p, err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 2 {
		t.Errorf("%d entries in the directory after refused opens, want own and sub: %v", len(ents), ents)
	}
	if st, err := os.Stat(own); err != nil || st.Size() != 4096 {
		t.Errorf("the refused file after the opens: %v %v", st, err)
	}
}

// TestDirectReadPastTruncatedEnd: a direct file cut short since it was
// opened, to a size that is no multiple of its alignment, ends a read
// past the new end with ErrShortIO at that end, with the bytes that were
// there; the rest is not sent again at an offset direct I/O refuses
// (EINVAL). The file is on ext4, which has O_DIRECT.
func TestDirectReadPastTruncatedEnd(t *testing.T) {
	dir := testutil.MountSmallExt4(t)
	tr := newTransport(t, Config{AllowedDirs: []string{dir}})
	path := filepath.Join(dir, "cut")
	f, err := tr.OpenFile(1, path, FileOptions{Direct: true, Create: true, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offA, _ := f.Alignment()
	pool := newMemSeg(t, 2, 1<<20)
	rec := newRecorder()
	if n, err := runOne(t, tr, rec, newTask(rec, xfer.OpWrite, pool, 0, f, 0, 1<<16)); err != nil || n != 1<<16 {
		t.Fatalf("write: %d, %v", n, err)
	}
	end := int64(offA) + 100
	if err := os.Truncate(path, end); err != nil {
		t.Fatal(err)
	}
	before := tr.Stats()[0].Resubmits
	n, err := runOne(t, tr, rec, newTask(rec, xfer.OpRead, pool, 0, f, 0, 1<<16))
	if !errors.Is(err, ErrShortIO) || errors.Is(err, syscall.EINVAL) || n != uint64(end) {
		t.Fatalf("a read of 64 KiB from a direct file cut to %d bytes: n=%d err=%v; want ErrShortIO at %d", end, n, err, end)
	}
	if !strings.Contains(err.Error(), fmt.Sprint(end)) {
		t.Fatalf("%q does not name the offset where the file ends (%d)", err, end)
	}
	if r := tr.Stats()[0].Resubmits - before; r != 0 {
		t.Fatalf("the rest of the read was sent again %d times, at an offset direct I/O refuses", r)
	}
}
