package rdma

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

func TestKeyTableLookup(t *testing.T) {
	const chunk = 1 << 12
	kt, err := newKeyTable(0x10000, 3*chunk+100, chunk)
	if err != nil {
		t.Fatal(err)
	}
	for i := range kt.chunks() {
		kt.lkeys[i] = uint32(100 + i)
		kt.rkeys[i] = uint32(200 + i)
	}
	if kt.chunks() != 4 {
		t.Fatalf("chunks = %d, want 4", kt.chunks())
	}
	cases := []struct {
		off, n     uint64
		ok         bool
		addr       uint64
		lkey, rkey uint32
		span       uint64
	}{
		{0, 10, true, 0x10000, 100, 200, 10},
		{chunk - 1, 1, true, 0x10000 + chunk - 1, 100, 200, 1},
		{chunk - 1, 2, true, 0x10000 + chunk - 1, 100, 200, 1}, // crosses: first chunk covers 1
		{chunk, 2 * chunk, true, 0x10000 + chunk, 101, 201, chunk},
		{3 * chunk, 100, true, 0x10000 + 3*chunk, 103, 203, 100},
		{3*chunk + 99, 1, true, 0x10000 + 3*chunk + 99, 103, 203, 1},
		{3*chunk + 99, 2, false, 0, 0, 0, 0}, // past the end
		{3*chunk + 100, 1, false, 0, 0, 0, 0},
		{0, 0, false, 0, 0, 0, 0},
		{1, ^uint64(0), false, 0, 0, 0, 0}, // n overflows off+n
	}
	for _, c := range cases {
		addr, lk, rk, span, ok := kt.lookup(c.off, c.n)
		if ok != c.ok || addr != c.addr || lk != c.lkey || rk != c.rkey || span != c.span {
			t.Errorf("lookup(%d, %d) = %#x %d %d %d %v, want %#x %d %d %d %v",
				c.off, c.n, addr, lk, rk, span, ok, c.addr, c.lkey, c.rkey, c.span, c.ok)
		}
	}
}

func TestKeyTableRejects(t *testing.T) {
	for _, c := range []struct{ addr, size, chunk uint64 }{
		{0, 0, 4096}, {0, 100, 0}, {0, 100, 3000}, {^uint64(0) - 10, 100, 4096},
	} {
		if _, err := newKeyTable(c.addr, c.size, c.chunk); !errors.Is(err, ErrNotRegistered) {
			t.Errorf("newKeyTable(%#x, %d, %d) err = %v, want ErrNotRegistered", c.addr, c.size, c.chunk, err)
		}
	}
}

func TestRegisterRegionParallel(t *testing.T) {
	const chunk = 1 << 20
	var mu sync.Mutex
	seen := map[uint64]uint64{}
	var inFlight, peak atomic.Int32
	reg := func(off, n uint64) (uint32, uint32, any, error) {
		c := inFlight.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		defer inFlight.Add(-1)
		mu.Lock()
		seen[off] = n
		mu.Unlock()
		i := uint32(off / chunk)
		return 1000 + i, 2000 + i, off + 1, nil
	}
	var freed atomic.Int32
	dereg := func(any) error { freed.Add(1); return nil }
	r, err := registerRegion(0x7f0000000000, 5*chunk+1, chunk, 4, reg, dereg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Chunks() != 6 || len(seen) != 6 {
		t.Fatalf("chunks %d, registered %d, want 6", r.Chunks(), len(seen))
	}
	if seen[5*chunk] != 1 {
		t.Errorf("last chunk registered with %d bytes, want 1", seen[5*chunk])
	}
	_, lk, rk, _, ok := r.Lookup(4*chunk+7, 1)
	if !ok || lk != 1004 || rk != 2004 {
		t.Errorf("Lookup in chunk 4 = %d %d %v", lk, rk, ok)
	}
	rem := r.Remote(9)
	if rem.ChunkSize != chunk || len(rem.RKeys) != 6 || rem.RKeys[5] != 2005 {
		t.Errorf("Remote = %+v", rem)
	}
	if err := r.Release(); err != nil || freed.Load() != 6 {
		t.Errorf("release: %v, freed %d", err, freed.Load())
	}
}

func TestRegisterRegionRollsBack(t *testing.T) {
	const chunk = 1 << 16
	boom := errors.New("ENOMEM")
	var registered, freed atomic.Int32
	reg := func(off, n uint64) (uint32, uint32, any, error) {
		if off == 2*chunk {
			return 0, 0, 0, boom
		}
		registered.Add(1)
		return 1, 1, off + 1, nil
	}
	dereg := func(any) error { freed.Add(1); return nil }
	_, err := registerRegion(4096, 8*chunk, chunk, 3, reg, dereg)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the registration error", err)
	}
	if registered.Load() != 7 || freed.Load() != 7 {
		t.Errorf("registered %d, freed %d, want 7 and 7", registered.Load(), freed.Load())
	}
}

func TestRemoteRegionTable(t *testing.T) {
	r := RemoteRegion{Name: 1, Addr: 4096, Size: 3 << 20, ChunkSize: 1 << 20, RKeys: []uint32{7, 8, 9}}
	kt, err := r.table()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, rk, span, ok := kt.lookup(1<<20-4, 8); !ok || rk != 7 || span != 4 {
		t.Errorf("lookup across chunks: rkey %d span %d ok %v", rk, span, ok)
	}
	r.RKeys = r.RKeys[:2]
	if _, err := r.table(); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("short rkeys: err = %v", err)
	}
}

func BenchmarkRegionLookup(b *testing.B) {
	kt, _ := newKeyTable(1<<40, 4<<30, 1<<30)
	b.ReportAllocs()
	var sink uint32
	for i := 0; b.Loop(); i++ {
		_, lk, _, _, _ := kt.lookup(uint64(i)<<16&(4<<30-1), 65536)
		sink += lk
	}
	_ = sink
}
