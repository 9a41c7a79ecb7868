//go:build linux

package shm

import (
	"errors"
	"math"
	"testing"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// newTestPool makes a normal-page pool of slabs slabs of maxBlock bytes.
func newTestPool(t testing.TB, slabs, minBlock, maxBlock uint64) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{ID: 7, Size: slabs * maxBlock, Hugepages: HugepagesOff,
		MinBlock: minBlock, MaxBlock: maxBlock}, nil)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func checkPool(t *testing.T, p *Pool) {
	t.Helper()
	if err := p.a.check(); err != nil {
		t.Fatalf("allocator invariants: %v", err)
	}
}

func TestAllocEveryClass(t *testing.T) {
	p := newTestPool(t, 4, 4*kib, 64*kib)
	tests := []struct {
		size, class uint64
	}{
		{1, 4 * kib}, {4*kib - 1, 4 * kib}, {4 * kib, 4 * kib},
		{4*kib + 1, 8 * kib}, {8 * kib, 8 * kib},
		{9 * kib, 16 * kib}, {16 * kib, 16 * kib},
		{16*kib + 1, 32 * kib}, {32 * kib, 32 * kib},
		{33 * kib, 64 * kib}, {64 * kib, 64 * kib},
	}
	for _, tt := range tests {
		off, err := p.Alloc(tt.size)
		if err != nil {
			t.Fatalf("Alloc(%d): %v", tt.size, err)
		}
		if off%tt.class != 0 || off+tt.class > p.Size() {
			t.Errorf("Alloc(%d) = %d: not a %d-aligned block inside the pool", tt.size, off, tt.class)
		}
		if got, ok := p.BlockSize(off); !ok || got != tt.class {
			t.Errorf("BlockSize(Alloc(%d)) = %d, %v; want %d", tt.size, got, ok, tt.class)
		}
		checkPool(t, p)
		if err := p.Free(off); err != nil {
			t.Fatalf("Free(%d): %v", off, err)
		}
		if _, ok := p.BlockSize(off); ok {
			t.Errorf("BlockSize(%d) after Free reports a live block", off)
		}
		checkPool(t, p)
	}
	if st := p.Stats(); st.Blocks != 0 || st.Used != 0 || st.FreeSlabs != 4 {
		t.Errorf("after freeing everything: %+v", st)
	}
}

func TestAllocBadSizes(t *testing.T) {
	p := newTestPool(t, 2, 4*kib, 64*kib)
	for _, tt := range []struct {
		size uint64
		want error
	}{
		{0, ErrInvalidSize},
		{64*kib + 1, ErrTooLarge},
		{math.MaxUint64, ErrTooLarge},
	} {
		if _, err := p.Alloc(tt.size); !errors.Is(err, tt.want) {
			t.Errorf("Alloc(%d) = %v, want %v", tt.size, err, tt.want)
		}
		if err := p.AllocN(tt.size, make([]uint64, 2)); !errors.Is(err, tt.want) {
			t.Errorf("AllocN(%d) = %v, want %v", tt.size, err, tt.want)
		}
	}
	if st := p.Stats(); st.Blocks != 0 || st.FreeSlabs != 2 {
		t.Errorf("refused sizes changed the pool: %+v", st)
	}
}

func TestExhaustion(t *testing.T) {
	for _, size := range []uint64{4 * kib, 16 * kib, 64 * kib} {
		p := newTestPool(t, 3, 4*kib, 64*kib)
		n := 3 * 64 * kib / size
		seen := map[uint64]bool{}
		for i := uint64(0); i < n; i++ {
			off, err := p.Alloc(size)
			if err != nil {
				t.Fatalf("size %d: Alloc #%d of %d: %v", size, i, n, err)
			}
			if seen[off] {
				t.Fatalf("size %d: offset %d handed out twice", size, off)
			}
			seen[off] = true
		}
		if _, err := p.Alloc(size); !errors.Is(err, ErrPoolExhausted) {
			t.Fatalf("size %d: Alloc on a full pool = %v, want ErrPoolExhausted", size, err)
		}
		// Every other class is exhausted too: no slab is free.
		if _, err := p.Alloc(1); size != 4*kib && !errors.Is(err, ErrPoolExhausted) {
			t.Fatalf("size %d: Alloc(1) with no free slab = %v, want ErrPoolExhausted", size, err)
		}
		st := p.Stats()
		if st.FreeBytes != 0 || st.FreeSlabs != 0 || st.Used != p.Size() {
			t.Errorf("size %d: full pool stats %+v", size, st)
		}
		checkPool(t, p)
	}
}

func TestAllocNAllOrNothing(t *testing.T) {
	p := newTestPool(t, 2, 4*kib, 64*kib) // 32 blocks of 4 KiB
	keep, err := p.Alloc(64 * kib)        // one whole slab
	if err != nil {
		t.Fatal(err)
	}
	offs := make([]uint64, 17)
	for i := range offs {
		offs[i] = math.MaxUint64
	}
	if err := p.AllocN(4*kib, offs); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("AllocN(17 x 4 KiB) with room for 16 = %v, want ErrPoolExhausted", err)
	}
	for i, off := range offs {
		if off != math.MaxUint64 {
			t.Fatalf("failed AllocN wrote offs[%d] = %d", i, off)
		}
	}
	if st := p.Stats(); st.Blocks != 1 || st.FreeSlabs != 1 {
		t.Fatalf("failed AllocN changed the pool: %+v", st)
	}
	checkPool(t, p)
	if err := p.AllocN(4*kib, offs[:16]); err != nil {
		t.Fatalf("AllocN(16 x 4 KiB) with room for 16: %v", err)
	}
	seen := map[uint64]bool{}
	for _, off := range offs[:16] {
		if seen[off] || off/(64*kib) == keep/(64*kib) || off%(4*kib) != 0 {
			t.Fatalf("AllocN gave a bad or repeated offset %d", off)
		}
		seen[off] = true
	}
	checkPool(t, p)
	// A partly used class: AllocN uses the class's free blocks and new slabs.
	for _, off := range offs[:8] {
		if err := p.Free(off); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Free(keep); err != nil {
		t.Fatal(err)
	}
	if err := p.AllocN(4*kib, make([]uint64, 24)); err != nil {
		t.Fatalf("AllocN(24) with 8 free blocks and a free slab: %v", err)
	}
	if st := p.Stats(); st.Blocks != 32 || st.FreeSlabs != 0 {
		t.Fatalf("after AllocN(24): %+v", st)
	}
	if err := p.AllocN(4*kib, nil); err != nil {
		t.Fatalf("AllocN of zero blocks: %v", err)
	}
	checkPool(t, p)
}

func TestBadFree(t *testing.T) {
	p := newTestPool(t, 2, 4*kib, 64*kib)
	a, err := p.Alloc(8 * kib)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(8 * kib)
	if err != nil {
		t.Fatal(err)
	}
	for name, off := range map[string]uint64{
		"never allocated slab": 64 * kib,
		"inside a block":       a + 4*kib,
		"unaligned":            a + 1,
		"past the end":         p.Size(),
		"far past the end":     math.MaxUint64,
		"free block in a held slab": func() uint64 {
			return b + 8*kib
		}(),
	} {
		if err := p.Free(off); !errors.Is(err, ErrBadFree) {
			t.Errorf("Free(%s = %d) = %v, want ErrBadFree", name, off, err)
		}
		if _, ok := p.BlockSize(off); ok {
			t.Errorf("BlockSize(%s) reports a live block", name)
		}
	}
	if err := p.Free(a); err != nil {
		t.Fatalf("Free(a): %v", err)
	}
	if err := p.Free(a); !errors.Is(err, ErrBadFree) {
		t.Errorf("double Free = %v, want ErrBadFree", err)
	}
	if err := p.Free(b); err != nil {
		t.Fatalf("Free(b): %v", err)
	}
	// The slab went back to the free list: b's offset is not a block now.
	if err := p.Free(b); !errors.Is(err, ErrBadFree) {
		t.Errorf("double Free after the slab was released = %v, want ErrBadFree", err)
	}
	if st := p.Stats(); st.Blocks != 0 || st.FreeSlabs != 2 {
		t.Errorf("bad frees changed the pool: %+v", st)
	}
	checkPool(t, p)
}

func TestSlabReuse(t *testing.T) {
	p := newTestPool(t, 1, 4*kib, 64*kib) // a single slab
	var small []uint64
	for range 16 {
		off, err := p.Alloc(4 * kib)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, off)
	}
	if _, err := p.Alloc(8 * kib); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("another class while the only slab is held = %v, want ErrPoolExhausted", err)
	}
	for i, off := range small {
		if err := p.Free(off); err != nil {
			t.Fatal(err)
		}
		st := p.Stats()
		if want := uint64(0); i < 15 && st.FreeSlabs != want {
			t.Fatalf("slab released with %d blocks still live", 15-i)
		}
	}
	if st := p.Stats(); st.FreeSlabs != 1 || st.Classes[0].Slabs != 0 {
		t.Fatalf("slab not returned after its last block: %+v", st)
	}
	// Another class gets the slab now, and a freed block is reused.
	off, err := p.Alloc(32 * kib)
	if err != nil {
		t.Fatalf("Alloc of another class after the slab was freed: %v", err)
	}
	off2, err := p.Alloc(32 * kib)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(off); err != nil {
		t.Fatal(err)
	}
	again, err := p.Alloc(20 * kib)
	if err != nil || again != off {
		t.Fatalf("Alloc after Free = %d, %v; want the freed block %d", again, err, off)
	}
	for _, o := range []uint64{again, off2} {
		if err := p.Free(o); err != nil {
			t.Fatal(err)
		}
	}
	checkPool(t, p)
}

func TestStatsAndFragmentation(t *testing.T) {
	p := newTestPool(t, 4, 4*kib, 64*kib)
	st := p.Stats()
	if st.Size != 256*kib || st.Slabs != 4 || st.FreeSlabs != 4 || st.FreeBytes != st.Size ||
		st.Used != 0 || st.Blocks != 0 || st.Fragmentation != 0 || len(st.Classes) != 5 || st.Hugepages {
		t.Fatalf("empty pool stats: %+v", st)
	}
	// 5 KiB in an 8 KiB block: one slab of 64 KiB held, 5 KiB of it requested.
	a, err := p.Alloc(5 * kib)
	if err != nil {
		t.Fatal(err)
	}
	st = p.Stats()
	if st.Used != 8*kib || st.Requested != 5*kib || st.Blocks != 1 || st.FreeBytes != 248*kib || st.FreeSlabs != 3 {
		t.Fatalf("after Alloc(5 KiB): %+v", st)
	}
	if want := float64(64-5) / 64; st.Fragmentation != want {
		t.Errorf("fragmentation %v, want %v", st.Fragmentation, want)
	}
	c := st.Classes[1]
	if c.BlockSize != 8*kib || c.Live != 1 || c.Slabs != 1 || c.FreeBlocks != 7 {
		t.Errorf("8 KiB class: %+v", c)
	}
	// Fill the slab with exact 8 KiB requests and add a full 64 KiB block.
	var more []uint64
	for range 7 {
		off, err := p.Alloc(8 * kib)
		if err != nil {
			t.Fatal(err)
		}
		more = append(more, off)
	}
	big, err := p.Alloc(64 * kib)
	if err != nil {
		t.Fatal(err)
	}
	st = p.Stats()
	if st.Used != 128*kib || st.Requested != 125*kib || st.Blocks != 9 || st.FreeSlabs != 2 {
		t.Fatalf("after filling: %+v", st)
	}
	if want := float64(128-125) / 128; st.Fragmentation != want {
		t.Errorf("fragmentation %v, want %v", st.Fragmentation, want)
	}
	var sumLive, sumUsed uint64
	for _, c := range st.Classes {
		sumLive += c.Live
		sumUsed += c.Live * c.BlockSize
	}
	if sumLive != st.Blocks || sumUsed != st.Used || st.FreeBytes != st.Size-st.Used {
		t.Errorf("per-class counts do not add up: %+v", st)
	}
	for _, off := range append(more, a, big) {
		if err := p.Free(off); err != nil {
			t.Fatal(err)
		}
	}
	if st = p.Stats(); st.Fragmentation != 0 || st.Used != 0 || st.Requested != 0 || st.FreeSlabs != 4 {
		t.Errorf("after freeing all: %+v", st)
	}
}

func TestAllocZeroAllocs(t *testing.T) {
	p := newTestPool(t, 4, 4*kib, 64*kib)
	offs := make([]uint64, 8)
	n := testing.AllocsPerRun(1000, func() {
		off, err := p.Alloc(4 * kib)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Free(off); err != nil {
			t.Fatal(err)
		}
		if err := p.AllocN(16*kib, offs); err != nil {
			t.Fatal(err)
		}
		for _, o := range offs {
			if err := p.Free(o); err != nil {
				t.Fatal(err)
			}
		}
		if _, ok := p.BlockSize(offs[0]); ok {
			t.Fatal("freed block still live")
		}
	})
	if n != 0 {
		t.Errorf("Alloc/AllocN/Free/BlockSize allocate %v times per run, want 0", n)
	}
}
