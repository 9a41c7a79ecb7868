package daemon

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// dirSizes is every name under dir with its size (symlinks not followed).
func dirSizes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		got[p] = st.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// fdOf is the number of a descriptor of this process open on path.
func fdOf(t *testing.T, path string) string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("no /proc/self/fd: %v", err)
	}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && l == path {
			return e.Name()
		}
	}
	t.Fatalf("no descriptor open on %s", path)
	return ""
}

// TestTenantFileConfinement: tenant b's registrations that name tenant a's
// directory, by absolute path, "..", a symlink of its own or
// /proc/self/fd/N, are refused and leave a's directory as it was: no file
// created, none grown. The stores' L2 files are refused to their own
// tenant and to connections without one, on every path.
func TestTenantFileConfinement(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.Tenants = []TenantConfig{
		{Name: "a", UIDs: []uint32{uidA}, PoolSize: 16 << 20},
		{Name: "b", UIDs: []uint32{uidB}, PoolSize: 8 << 20},
	}
	d, err := New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	runDaemon(t, d)
	if d.files == nil {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier, so no file segments to confine")
	}
	tenants := filepath.Join(cfg.DataDir, "tenants")
	dirA, dirB := filepath.Join(tenants, "a"), filepath.Join(tenants, "b")
	var ids xfer.SegmentID = 1 << 40
	open := func(tenant, path string, size uint64) error {
		ids++
		seg, err := d.files.OpenFileFor(tenant, ids, path, false, size)
		if err == nil {
			seg.Close()
		}
		return err
	}
	if err := open("a", "a.bin", 1<<20); err != nil {
		t.Fatalf("tenant a creating its own file: %v", err)
	}
	aBin := filepath.Join(dirA, "a.bin")
	l2A := filepath.Join(dirA, "store.l2")
	if _, err := os.Stat(l2A); err != nil {
		t.Fatalf("tenant a's store has no L2 file: %v", err)
	}
	// What b (or a client of b's uid with a shell) could leave in its own
	// directory to lead the daemon elsewhere.
	for name, to := range map[string]string{"to-a-file": aBin, "to-a-new": filepath.Join(dirA, "new-via-link"), "to-a-dir": dirA} {
		if err := os.Symlink(to, filepath.Join(dirB, name)); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.Open(aBin)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldL2, err := os.Open(l2A)
	if err != nil {
		t.Fatal(err)
	}
	defer heldL2.Close()
	if err := os.Link(l2A, filepath.Join(dirA, "l2-hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(l2A, filepath.Join(dirA, "l2-link")); err != nil {
		t.Fatal(err)
	}

	before := dirSizes(t, tenants)
	refusals := []struct{ tenant, path string }{
		{"b", filepath.Join(dirA, "created-by-b")},
		{"b", aBin},
		{"b", "../a/a.bin"},
		{"b", "../a/created-by-b"},
		{"b", "to-a-file"},
		{"b", "to-a-new"},
		{"b", "to-a-dir/created-by-b"},
		{"b", "/proc/self/fd/" + fdOf(t, aBin)},
		{"b", l2A},
		// The store's files, to their own tenant and to no tenant.
		{"a", "store.l2"},
		{"a", l2A},
		{"a", "l2-hard"},
		{"a", "l2-link"},
		{"a", "/proc/self/fd/" + fdOf(t, l2A)},
		{"", l2A},
		{"", filepath.Join(dirA, "l2-hard")},
		{"", "/proc/self/fd/" + fdOf(t, l2A)},
	}
	for _, r := range refusals {
		err := open(r.tenant, r.path, 2<<20)
		if !errors.Is(err, fs.ErrPermission) && !errors.Is(err, xfer.ErrPermission) {
			t.Errorf("tenant %q registering %s: %v, want a permission error", r.tenant, r.path, err)
		}
	}
	after := dirSizes(t, tenants)
	for p, n := range after {
		if m, ok := before[p]; !ok {
			t.Errorf("refused registrations created %s", p)
		} else if m != n {
			t.Errorf("refused registrations changed %s from %d to %d bytes", p, m, n)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("refused registrations removed %s", p)
		}
	}
	if st, _ := os.Stat(aBin); st == nil || st.Size() != 1<<20 {
		t.Fatalf("tenant a's file after b's attempts: %v", st)
	}
}
