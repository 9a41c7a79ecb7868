//go:build linux

package store

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// restartOver builds the store a restarted daemon builds: the pool adopted
// from a duplicate of e's pool memfd, the journal from jmem (what the
// journal memfd held when the old daemon died), the same L2. The old store
// is closed first, as a daemon that is gone holds nothing.
func (e *testEnv) restartOver(jmem []byte) (*Store, *shm.Pool) {
	e.t.Helper()
	fd, err := unix.Dup(e.pool.Fd())
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.s.Close(); err != nil {
		e.t.Fatalf("Close: %v", err)
	}
	e.s = nil
	pool, err := shm.AdoptPool(shm.PoolConfig{ID: poolID, Size: e.pool.Size(), Hugepages: shm.HugepagesOff,
		MinBlock: 4096, MaxBlock: 256 << 10}, fd, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := e.cfg
	cfg.L1Journal = jmem
	s, err := New(cfg, pool, e.l2)
	if err != nil {
		e.t.Fatalf("New after the restart: %v", err)
	}
	e.t.Cleanup(func() {
		s.Close()
		pool.Close()
	})
	return s, pool
}

// journalEnv is a store env with an L1 journal of records records.
func journalEnv(t *testing.T, records int, poolSize uint64, opts ...envOpt) (*testEnv, []byte) {
	jmem := make([]byte, L1JournalSize(records))
	return newEnv(t, poolSize, append(opts, withCfg(func(c *Config) { c.L1Journal = jmem }))...), jmem
}

// TestL1JournalKeepsValuesAcrossRestart: every value committed in L1 is
// served again, byte-exact, by a store opened over the adopted pool and
// the journal as the dead daemon left it; reservations (values being
// written), removed keys, a record half written and a value changed after
// its commit are not; the blocks of kept values are never handed out again.
func TestL1JournalKeepsValuesAcrossRestart(t *testing.T) {
	e, jmem := journalEnv(t, 4096, 32<<20)
	ss := e.s.NewSession()
	keys := keysN("copied", 300)
	vals := valuesFor(keys, 3000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)

	// Zero-copy puts: reserved, written in place, committed.
	zkeys := keysN("zero-copy", 100)
	zvals := valuesFor(zkeys, 9000)
	sizes := make([]uint64, len(zkeys))
	for i := range sizes {
		sizes[i] = uint64(len(zvals[i]))
	}
	zlocs := make([]Location, len(zkeys))
	codes := make([]Code, len(zkeys))
	if err := ss.Reserve(zkeys, sizes, zlocs, codes, nil); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "reserve", codes, OK)
	for i, l := range zlocs {
		copy(e.pool.Bytes()[l.Offset:], zvals[i])
	}
	if _, err := ss.Commit(zkeys, false, codes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit", codes, OK)

	// Being written when the daemon dies: reserved, half written.
	hkeys := keysN("half", 20)
	hsizes := make([]uint64, len(hkeys))
	for i := range hsizes {
		hsizes[i] = 8000
	}
	hlocs := make([]Location, len(hkeys))
	hcodes := make([]Code, len(hkeys))
	if err := ss.Reserve(hkeys, hsizes, hlocs, hcodes, nil); err != nil {
		t.Fatal(err)
	}
	for _, l := range hlocs {
		copy(e.pool.Bytes()[l.Offset:], bytes.Repeat([]byte{0xab}, 4000))
	}

	// Removed before the restart.
	gone := keys[:50]
	rcodes := make([]Code, len(gone))
	if _, err := e.s.Remove(gone, rcodes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", rcodes, OK)

	// The journal as the daemon died with it, one record torn (its key
	// changed under its check word), one value changed in the pool after
	// its commit.
	snap := bytes.Clone(jmem)
	torn, changed := keys[50], keys[51]
	tornAt := bytes.Index(snap, torn)
	if tornAt < 0 {
		t.Fatalf("no record of %q in the journal", torn)
	}
	snap[tornAt] ^= 0xff
	locs, gcodes, _ := e.get(ss, [][]byte{changed})
	mustCodes(t, "get", gcodes, OK)
	e.pool.Bytes()[locs[0].Offset+7] ^= 1

	s2, pool2 := e.restartOver(snap)
	e.s = s2
	st := s2.Stats()
	if st.L1Recovered != 300-52+100 || st.L1Dropped != 1 || st.L1Torn != 1 {
		t.Fatalf("recovered %d, dropped %d, torn %d; want %d, 1, 1", st.L1Recovered, st.L1Dropped, st.L1Torn, 300-52+100)
	}
	e.checkValues(keys[52:], vals[52:])
	e.checkValues(zkeys, zvals)
	for _, k := range [][]byte{torn, changed, gone[0], gone[49], hkeys[0], hkeys[19]} {
		if c := e.exists([][]byte{k}); c[0] != NotFound {
			t.Fatalf("%q after the restart: %v, want NOT_FOUND", k, c[0])
		}
	}
	if b := pool2.Stats().Blocks; b != st.L1Recovered {
		t.Fatalf("%d pool blocks live after the restart, %d values kept", b, st.L1Recovered)
	}

	// New values take the free blocks, never a kept one.
	ss2 := s2.NewSession()
	more := keysN("after", 200)
	mvals := valuesFor(more, 5000)
	mustCodes(t, "put after the restart", e.put(ss2, more, mvals, false), OK)
	e.checkValues(keys[52:], vals[52:])
	e.checkValues(zkeys, zvals)
	e.checkValues(more, mvals)
	ss2.Close()
}

// TestL1JournalWithL2: after a restart a key on both tiers keeps its L1
// copy and stays clean; a key only in L1 is owed its writeback again and
// gets it; a journal over another pool is formatted, keeping nothing.
func TestL1JournalWithL2(t *testing.T) {
	e, jmem := journalEnv(t, 1024, 16<<20, withL2(64<<20))
	ss := e.s.NewSession()
	durable := keysN("durable", 40)
	dvals := valuesFor(durable, 6000)
	mustCodes(t, "durable put", e.put(ss, durable, dvals, true), OK)
	dirty := keysN("dirty", 40)
	vvals := valuesFor(dirty, 6000)
	// Writebacks fail (and wait for their retry): the dirty values are in
	// L1 only when the daemon goes.
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(t *xfer.Task) error {
			if isValueWrite(t) {
				return xfertest.ErrInjected
			}
			return nil
		}
	})
	mustCodes(t, "put", e.put(ss, dirty, vvals, false), OK)
	ss.Close()

	s2, _ := e.restartOver(bytes.Clone(jmem))
	e.s = s2
	// The device works again; a writeback the new store tried meanwhile
	// is retried after its backoff.
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	st := s2.Stats()
	if st.L1Recovered != 80 || st.L1Keys != 80 || st.Keys != 80 {
		t.Fatalf("after the restart: %d recovered, %d in L1, %d keys; want 80 of each", st.L1Recovered, st.L1Keys, st.Keys)
	}
	testutil.Eventually(t, flushWait, func() bool {
		e.clk.Advance(2 * time.Second)
		return s2.Flush(time.Millisecond) == nil
	}, "writebacks owed after the restart not done")
	// The 40 values only in L1 were owed their writeback again, the 40 on
	// both tiers were not.
	if st := s2.Stats(); st.Dirty != 0 || st.L2Keys != 80 || st.Writebacks != 40 {
		t.Fatalf("after Flush: %d dirty, %d on L2, %d writebacks; want 0, 80, 40", st.Dirty, st.L2Keys, st.Writebacks)
	}
	e.checkValues(durable, dvals)
	e.checkValues(dirty, vvals)

	// Another pool: the journal says nothing about it.
	other := newEnv(t, 16<<20)
	cfg := other.cfg
	cfg.L1Journal = bytes.Clone(jmem)
	other.s.Close()
	s3, err := New(cfg, other.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	other.s = s3
	if st := s3.Stats(); st.Keys != 0 || st.L1Recovered != 0 {
		t.Fatalf("a journal of another pool gave %d keys", st.Keys)
	}
}

// TestL1JournalFull: values past the journal's records are stored and
// served as ever, counted, and not kept across a restart.
func TestL1JournalFull(t *testing.T) {
	e, jmem := journalEnv(t, 10, 16<<20)
	ss := e.s.NewSession()
	keys := keysN("k", 30)
	vals := valuesFor(keys, 100)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	e.checkValues(keys, vals)
	if st := e.s.Stats(); st.L1JournalFull != 20 {
		t.Fatalf("journal full %d times, want 20", st.L1JournalFull)
	}
	ss.Close()
	s2, _ := e.restartOver(bytes.Clone(jmem))
	e.s = s2
	if st := s2.Stats(); st.Keys != 10 {
		t.Fatalf("%d keys after the restart, want the 10 recorded", st.Keys)
	}
	e.checkValues(keys[:10], vals[:10])
}

// TestL1JournalKeepsLRUOrder: after a restart the values committed last
// are evicted last.
func TestL1JournalKeepsLRUOrder(t *testing.T) {
	e, jmem := journalEnv(t, 64, 16<<20, withCfg(func(c *Config) { c.Shards = 1 }))
	ss := e.s.NewSession()
	keys := keysN("lru", 10)
	vals := valuesFor(keys, 4000)
	for i := range keys {
		mustCodes(t, "put", e.put(ss, keys[i:i+1], vals[i:i+1], false), OK)
	}
	ss.Close()
	s2, _ := e.restartOver(bytes.Clone(jmem))
	e.s = s2
	s2.evict(3*4096, 64)
	mustCodes(t, "after evicting three", e.exists(keys), NotFound, NotFound, NotFound, OK, OK, OK, OK, OK, OK, OK)
}

// TestL1JournalNewerValueWinsOverAQuarantinedCopy: a key whose newer
// value is in L1 only, journaled, has an older block on L2 whose header
// outlived a failed zeroing (a ghost). Recovery finds that block, and the
// journal's record disagrees with it. The L2 block used to win, and the
// key read its older value after the restart; the record is the key's
// value when the daemon went (a record is cleared before its block is
// freed, and a key is put again only once its value has gone), so it
// wins, and the older block's header is zeroed, or kept as a ghost of the
// key when that fails: a Remove after the restart is not undone by the
// next one.
func TestL1JournalNewerValueWinsOverAQuarantinedCopy(t *testing.T) {
	for _, failZero := range []bool{false, true} {
		t.Run(fmt.Sprintf("zeroing at the restart fails %v", failZero), func(t *testing.T) {
			e, jmem := journalEnv(t, 64, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			keys := keysN("j", 1)
			mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
			e.putL1OverFailedEviction(t, ss, keys, 5000)
			ss.Close()

			if failZero {
				e.failZeroWrites()
			}
			jmem2 := bytes.Clone(jmem) // the journal of the store after the restart
			s2, _ := e.restartOver(jmem2)
			e.s = s2
			e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			e.checkValues(keys, valuesFor(keys, 5000))
			s2.check(t)
			if st := s2.Stats(); st.Keys != 1 || st.L1Keys != 1 || st.L2Keys != 0 || st.Dirty != 1 {
				t.Fatalf("after the restart: %+v, want the newer value in L1 only, owed its writeback", st)
			}
			want := 0
			if failZero {
				want = 1
			}
			if g := e.ghosts(keys[0]); g != want {
				t.Fatalf("%d ghosts after the restart, want %d", g, want)
			}
			codes, errs := make([]Code, 1), make([]error, 1)
			if _, err := s2.Remove(keys, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "remove", codes, OK)

			s3, _ := e.restartOver(bytes.Clone(jmem2))
			e.s = s3
			mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
		})
	}
}
