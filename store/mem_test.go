package store

import (
	"encoding/binary"
	"flag"
	"runtime"
	"testing"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

var memKeys = flag.Int("store.memkeys", 1_000_000, "keys indexed by TestIndexMemoryPerKey (try 10000000)")

// addL2Only indexes key as a block on L2, through the same structures
// recovery fills (entry, key arena, hash table, L2 list, slot owner).
func (s *Store) addL2Only(k []byte, size uint32) {
	t := s.l2
	h, sh, si := s.hash(k)
	sh.mu.Lock()
	idx := sh.insert(h, k, stReady)
	e := sh.ent(idx)
	e.flags, e.size, e.crc = fL2, size, 1
	t.mu.Lock()
	slot, opener, err := t.alloc(t.g.classOf(uint64(size)), ref{si, idx, e.gen}.packed())
	if err != nil {
		panic(err)
	}
	if opener != noRegion {
		t.regions[opener].state = regOpen
	}
	t.mu.Unlock()
	e.l2 = slot
	sh.l2Touch(idx)
	sh.mu.Unlock()
	s.c.keys.Add(1)
}

// TestIndexMemoryPerKey measures the heap the index takes per key (entry,
// hash table, key bytes, L2 slot bookkeeping), from runtime.MemStats, with
// 32-byte keys: it must be at most 128 bytes plus the key (from 100k keys
// on; below, the shards' first chunks dominate). The default run indexes a
// million keys; for the large figure (a few seconds, about 1.3 GB):
//
//	go test -run TestIndexMemoryPerKey -v ./store/ -store.memkeys=10000000
func TestIndexMemoryPerKey(t *testing.T) {
	n := *memKeys
	if invariants.RaceEnabled && n > 200_000 {
		n = 200_000 // the race detector is slow; the figure does not depend on it
	}
	const keyLen = 32
	slot := uint64(2 * 4096)
	e := newEnv(t, 8<<20, func(e *testEnv) {
		e.file = &fakeFile{id: 900, align: 4096, null: true, size: 4096 + uint64(n)*slot*11/10 + 128<<20}
		e.tr = newFakeL2()
		e.l2 = &L2{Transport: e.tr, File: e.file, StagingID: stagingID}
	})
	var key [keyLen]byte
	for i := range key {
		key[i] = byte(i * 37)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range n {
		binary.BigEndian.PutUint64(key[:], uint64(i)*0x9e3779b97f4a7c15)
		e.s.addL2Only(key[:], 4096)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := e.s.Stats().Keys; got != uint64(n) {
		t.Fatalf("%d keys indexed, want %d", got, n)
	}
	perKey := float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
	t.Logf("%d keys: %.1f bytes per key (%.1f plus the %d-byte key)", n, perKey, perKey-keyLen, keyLen)
	if n >= 100_000 && perKey-keyLen > 128 {
		t.Fatalf("%.1f bytes per key beyond the key, want at most 128", perKey-keyLen)
	}
	runtime.KeepAlive(e.s)
}
