//go:build linux

package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// MountSmallExt4 mounts a 16 MiB ext4 file system (no journal) on a loop
// device for the rest of t and returns its mount point: the file system
// the tests of a full disk fill. Without root, the tools or a loop device
// it skips t, naming what is missing, or fails it where ProvidesEnv lists
// Mount.
func MountSmallExt4(t testing.TB) string {
	t.Helper()
	Require(t, Mount)
	base := t.TempDir()
	img, mnt := filepath.Join(base, "fs.img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run("truncate", "-s", "16M", img)
	run("mkfs.ext4", "-q", "-F", "-O", "^has_journal", img)
	loop := strings.TrimSpace(run("losetup", "--find", "--show", img))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	if err := unix.Mount(loop, mnt, "ext4", 0, ""); err != nil {
		Missing(t, Mount, "mounting a loop ext4 failed (no loop devices in this container?): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}
