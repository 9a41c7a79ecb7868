//go:build linux

package shm

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAdoptPoolKeepsBytesAndClaims: a pool adopted from another's memfd is
// the same memory with the same identity; the blocks claimed are never
// handed out again until freed, and the rest of the pool is free.
func TestAdoptPoolKeepsBytesAndClaims(t *testing.T) {
	cfg := PoolConfig{ID: 7, Size: 8 * mib, Hugepages: HugepagesOff, MaxBlock: mib}
	p, err := NewPool(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Alloc(5000) // an 8 KiB block
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(mib)
	if err != nil {
		t.Fatal(err)
	}
	copy(p.Bytes()[a:], "first value")
	copy(p.Bytes()[b:], "second value")
	id1, err := p.Identity()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(p.Fd())
	if err != nil {
		t.Fatal(err)
	}
	p.Close()

	if _, err := AdoptPool(PoolConfig{ID: 7, Size: 16 * mib, Hugepages: HugepagesOff, MaxBlock: mib}, fd, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("adopting a pool of another size: %v, want ErrInvalidConfig", err)
	}
	q, err := AdoptPool(cfg, fd, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if id2, _ := q.Identity(); id2 != id1 {
		t.Fatalf("identity %v after adoption, was %v", id2, id1)
	}
	if !bytes.HasPrefix(q.Bytes()[a:], []byte("first value")) || !bytes.HasPrefix(q.Bytes()[b:], []byte("second value")) {
		t.Fatal("adopted pool lost its bytes")
	}
	offs := []uint64{a, b, a, a + 4096, 3, 64 * mib}
	sizes := []uint64{5000, mib, 5000, 4096, 4096, 4096}
	ok := make([]bool, len(offs))
	if err := q.Claim(offs, sizes, ok); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, true, false, false, false, false}; !equalBools(ok, want) {
		t.Fatalf("claimed %v, want %v (duplicate, other class in the slab, misaligned, outside)", ok, want)
	}
	if err := q.Claim(offs[:1], sizes[:1], ok[:1]); err == nil {
		t.Fatal("a second Claim on a pool with live blocks succeeded")
	}
	st := q.Stats()
	if st.Blocks != 2 || st.Used != 8192+mib {
		t.Fatalf("after claiming: %d blocks, %d bytes used", st.Blocks, st.Used)
	}
	// Everything else can be allocated, never a claimed block.
	seen := map[uint64]bool{}
	for {
		off, err := q.Alloc(5000)
		if errors.Is(err, ErrPoolExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if off == a || off >= b && off < b+mib || seen[off] {
			t.Fatalf("allocated %d again (claimed %d and %d)", off, a, b)
		}
		seen[off] = true
	}
	if want := (8*mib - 8192 - mib) / 8192; len(seen) != want {
		t.Fatalf("allocated %d blocks of 8 KiB after the claim, want %d", len(seen), want)
	}
	if err := q.Free(a); err != nil {
		t.Fatalf("freeing a claimed block: %v", err)
	}
	if err := q.Free(b); err != nil {
		t.Fatalf("freeing a claimed block: %v", err)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRegionAdopt: a region's bytes outlive it through a dup of its memfd,
// and adopting checks the size.
func TestRegionAdopt(t *testing.T) {
	r, err := NewRegion("test-journal", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), "kept")
	fd, err := unix.Dup(r.Fd())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := AdoptRegion(fd, 128<<10); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("adopting with another size: %v", err)
	}
	r2, err := AdoptRegion(fd, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if !bytes.HasPrefix(r2.Bytes(), []byte("kept")) {
		t.Fatal("region lost its bytes")
	}
}
