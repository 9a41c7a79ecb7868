package store

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// removeHere runs RemoveHere of keys and returns their codes.
func (e *testEnv) removeHere(keys [][]byte) []Code {
	e.t.Helper()
	codes := make([]Code, len(keys))
	if err := e.s.RemoveHere(keys, codes, nil); err != nil {
		e.t.Fatalf("RemoveHere: %v", err)
	}
	return codes
}

// gone checks that no lookup of this store finds key: Get, Read, Exists,
// LookupPrefix (with and without pin), Pin, Holdings and List.
func (e *testEnv) gone(ss *Session, key []byte) {
	e.t.Helper()
	keys := [][]byte{key}
	if _, codes, _ := e.get(ss, keys); codes[0] != NotFound {
		e.t.Fatalf("Get of %q: %v, want NOT_FOUND", key, codes[0])
	}
	if _, codes := e.read(keys, 1<<20); codes[0] != NotFound {
		e.t.Fatalf("Read of %q: %v, want NOT_FOUND", key, codes[0])
	}
	if codes := e.exists(keys); codes[0] != NotFound {
		e.t.Fatalf("Exists of %q: %v, want NOT_FOUND", key, codes[0])
	}
	for _, pin := range []bool{false, true} {
		if n, err := ss.LookupPrefix(keys, pin); err != nil || n != 0 {
			e.t.Fatalf("LookupPrefix (pin %v) of %q: %d %v, want 0", pin, key, n, err)
		}
	}
	codes := make([]Code, 1)
	if err := ss.Pin(keys, 0, codes); err == nil || codes[0] != NotFound {
		e.t.Fatalf("Pin of %q: %v %v, want NOT_FOUND", key, codes[0], err)
	}
	for i := range e.s.IndexShards() {
		for _, h := range e.s.Holdings(i, func([]byte) bool { return true }, nil) {
			if bytes.Equal(h.Key, key) {
				e.t.Fatalf("Holdings lists %q", key)
			}
		}
	}
	infos, _, err := e.s.List(key, 10)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, in := range infos {
		if bytes.Equal(in.Key, key) {
			e.t.Fatalf("List lists %q", key)
		}
	}
}

// TestRemovedElsewhereWhilePinned: a key removed from another host while
// clients here pin it is gone at once for every lookup here; the pins keep
// their bytes, exact, until the last goes, which frees the block; a put of
// the key meanwhile is a new value that new readers get while the old
// pins still read the old bytes. A local Remove of a pinned key is still
// refused.
func TestRemovedElsewhereWhilePinned(t *testing.T) {
	e := newEnv(t, 8<<20)
	reader, other, writer := e.s.NewSession(), e.s.NewSession(), e.s.NewSession()
	defer reader.Close()
	defer other.Close()
	defer writer.Close()
	keep := [][]byte{[]byte("keep")}
	mustCodes(t, "put keep", e.put(writer, keep, valuesFor(keep, 3000), false), OK)
	blocks, l1 := e.pool.Stats().Blocks, e.s.Stats().L1Bytes

	key := []byte("pinned")
	keys := [][]byte{key}
	old := bytes.Repeat([]byte("old value "), 500)
	mustCodes(t, "put", e.put(writer, keys, [][]byte{old}, false), OK)
	locs, codes, _ := e.get(reader, keys) // one pin
	mustCodes(t, "get", codes, OK)
	if n, err := reader.LookupPrefix(keys, true); err != nil || n != 1 { // two
		t.Fatalf("lookup_prefix with pin: %d %v", n, err)
	}
	if err := other.Pin(keys, 0, codes); err != nil { // and another session's
		t.Fatal(err)
	}

	if _, err := e.s.Remove(keys, codes, nil, nil, 0); err == nil && codes[0] != FailedPrecondition {
		t.Fatalf("local Remove of a pinned key: %v, want FAILED_PRECONDITION", codes[0])
	}
	mustCodes(t, "remove from elsewhere", e.removeHere(keys), OK)
	if st := e.s.Stats(); st.Hidden != 1 || st.Keys != 1 || st.Pins != 3 {
		t.Fatalf("after the removal: %d hidden, %d keys, %d pins; want 1, 1, 3", st.Hidden, st.Keys, st.Pins)
	}
	e.gone(writer, key)
	mem := e.pool.Bytes()
	if got := mem[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, old) {
		t.Fatal("the pinned block's bytes changed after the removal")
	}
	mustCodes(t, "remove from elsewhere again", e.removeHere(keys), OK)

	// A put of the key now is a new value, for new readers.
	fresh := bytes.Repeat([]byte("fresh "), 900)
	mustCodes(t, "put again", e.put(writer, keys, [][]byte{fresh}, false), OK)
	e.checkValues(keys, [][]byte{fresh})
	nlocs, codes, _ := e.get(reader, keys)
	mustCodes(t, "get the new value", codes, OK)
	if nlocs[0] == locs[0] || !bytes.Equal(mem[nlocs[0].Offset:nlocs[0].Offset+nlocs[0].Length], fresh) {
		t.Fatalf("get after the put again: %+v (the old one at %+v)", nlocs[0], locs[0])
	}
	if !bytes.Equal(mem[locs[0].Offset:locs[0].Offset+locs[0].Length], old) {
		t.Fatal("the old pin's bytes changed under a put of its key")
	}

	// Unpins take the hidden value's pins first: two of the reader's, then
	// the other session's goes with it.
	if err := reader.Unpin([][]byte{key, key}, make([]Code, 2)); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Hidden != 1 || e.s.pinsOf("pinned") != 1 {
		t.Fatalf("after two unpins: %d hidden, %d pins on the new value; want 1, 1", st.Hidden, e.s.pinsOf("pinned"))
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Hidden != 0 || st.Pins != 1 {
		t.Fatalf("after the last pin of the hidden value: %d hidden, %d pins; want 0, 1", st.Hidden, st.Pins)
	}
	if err := reader.Unpin(keys, codes); err != nil {
		t.Fatal(err)
	}
	if err := reader.Unpin(keys, codes); err == nil || codes[0] != FailedPrecondition {
		t.Fatalf("an unpin past the pins: %v %v", codes[0], err)
	}
	e.checkValues(keys, [][]byte{fresh})

	// The new value removed too: the pool is as before the first put.
	mustCodes(t, "remove the new value", e.removeHere(keys), OK)
	if b, st := e.pool.Stats().Blocks, e.s.Stats(); b != blocks || st.L1Bytes != l1 || st.Keys != 1 || st.Pins != 0 {
		t.Fatalf("after everything went: %d blocks, %d L1 bytes, %d keys, %d pins; want %d, %d, 1, 0",
			b, st.L1Bytes, st.Keys, st.Pins, blocks, l1)
	}
	e.checkValues(keep, valuesFor(keep, 3000))
}

// TestRemoveRecordsHere: a removal that names a record removes only it,
// never a value put again under its key since (even with the same bytes);
// a key answered BUSY names the record it found.
func TestRemoveRecordsHere(t *testing.T) {
	e := newEnv(t, 8<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	keys := [][]byte{[]byte("rec")}
	vals := valuesFor(keys, 2000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	h, sh, _ := e.s.hash(keys[0])
	sh.mu.Lock()
	idx, _ := sh.find(h, keys[0])
	e1 := sh.ent(idx)
	e1.io++ // a copy out in flight: the removal is BUSY
	sh.mu.Unlock()
	ids := make([]RecordID, 1)
	codes := make([]Code, 1)
	if err := e.s.RemoveRecordsHere(keys, ids, codes, nil); err != nil || codes[0] != Busy || ids[0] == 0 {
		t.Fatalf("remove with I/O in flight: %v %v, record %x", err, codes[0], ids[0])
	}
	first := ids[0]
	sh.mu.Lock()
	e1.io--
	sh.mu.Unlock()
	// Removed and put again with the same bytes: another record.
	mustCodes(t, "remove", e.removeHere(keys), OK)
	mustCodes(t, "put again", e.put(ss, keys, vals, false), OK)
	if err := e.s.RemoveRecordsHere(keys, ids, codes, nil); err != nil || codes[0] != OK {
		t.Fatalf("remove of the old record: %v %v", err, codes[0])
	}
	e.checkValues(keys, vals)
	if ids[0] != first {
		t.Fatalf("the record named changed: %x, was %x", ids[0], first)
	}
	ids[0] = 0
	if err := e.s.RemoveRecordsHere(keys, ids, codes, nil); err != nil || codes[0] != OK {
		t.Fatalf("remove of any record: %v %v", err, codes[0])
	}
	mustCodes(t, "exists", e.exists(keys), NotFound)
	if err := e.s.RemoveRecordsHere(keys, make([]RecordID, 2), codes, nil); err == nil {
		t.Fatal("RemoveRecordsHere with ids of another length accepted")
	}
}

// TestRemovedElsewhereWhilePinnedL2: a pinned key on L2 removed from
// another host has its block header zeroed before RemoveHere returns, so a
// store opened again over the file (a daemon killed while the pin lasted)
// does not find it; its pin still reads the bytes. A key pinned only on L2
// (no block in the pool) goes the same way, and its last unpin frees the
// entry.
func TestRemovedElsewhereWhilePinnedL2(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("l2pin", 4)
	vals := valuesFor(keys, 6000)
	mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	// keys[0] pinned in the pool; keys[1] pinned on L2 only.
	locs, codes, _ := e.get(ss, keys[:1])
	mustCodes(t, "get", codes, OK)
	e.s.evict(1<<62, 1<<20)
	if err := ss.Pin(keys[1:2], 0, codes[:1]); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.L1Keys != 1 {
		t.Fatalf("%d keys in L1, want the pinned one", st.L1Keys)
	}
	mustCodes(t, "remove from elsewhere", e.removeHere(keys[:2]), OK, OK)
	for _, k := range keys[:2] {
		for off := 0; off+hdrMax <= len(e.file.data); off += int(e.file.align) {
			if h, err := decodeHeader(e.file.data[off:off+hdrMax], magicBlock); err == nil && bytes.Equal(h.key, k) {
				t.Fatalf("the header of %q is still on L2 at %d after RemoveHere", k, off)
			}
		}
	}
	if st := e.s.Stats(); st.Hidden != 2 || st.L2Keys != 2 || st.Keys != 2 {
		t.Fatalf("after the removal: %d hidden, %d on L2, %d keys; want 2, 2, 2", st.Hidden, st.L2Keys, st.Keys)
	}
	e.gone(ss, keys[0])
	e.gone(ss, keys[1])
	if got := e.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, vals[0]) {
		t.Fatal("the pinned block's bytes changed after the removal")
	}
	if err := ss.Unpin(keys[1:2], codes[:1]); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Hidden != 1 || st.Pins != 1 {
		t.Fatalf("after unpinning the L2-only one: %d hidden, %d pins; want 1, 1", st.Hidden, st.Pins)
	}
	// Restarted with the pin still held: the file says nothing of them.
	e.reopen()
	ss.Close()
	mustCodes(t, "exists after the restart", e.exists(keys), NotFound, NotFound, OK, OK)
	e.checkValues(keys[2:], vals[2:])
}

// TestRemovedElsewhereWhilePinnedWriteback: a pinned key whose writeback
// is in flight when the removal comes is invisible at once, and hidden
// once the writeback has ended (the header it wrote zeroed again, or
// nothing written); its pin keeps the bytes, and it does not come back
// after a restart.
func TestRemovedElsewhereWhilePinnedWriteback(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback fails %v", fail), func(t *testing.T) {
			e, ss := holdingWritebacks(t)
			keys := [][]byte{[]byte("wb")}
			vals := valuesFor(keys, 5000)
			mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
			locs, codes, _ := e.get(ss, keys)
			mustCodes(t, "get", codes, OK)
			e.waitHeld("the writeback in flight", 1)
			done := make(chan []Code, 1)
			go func() {
				codes := make([]Code, 1)
				if err := e.s.RemoveHere(keys, codes, nil); err != nil {
					t.Errorf("RemoveHere: %v", err)
				}
				done <- codes
			}()
			e.waitFor("the key invisible", func() bool { return e.exists(keys)[0] == NotFound })
			e.endWritebacks(fail)
			mustCodes(t, "remove from elsewhere", <-done, OK)
			e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			if st := e.s.Stats(); st.Hidden != 1 || st.L2Keys != 0 || st.Dirty != 0 || st.Keys != 0 {
				t.Fatalf("after the removal: %d hidden, %d on L2, %d dirty, %d keys; want 1, 0, 0, 0",
					st.Hidden, st.L2Keys, st.Dirty, st.Keys)
			}
			e.gone(ss, keys[0])
			if got := e.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, vals[0]) {
				t.Fatal("the pinned block's bytes changed after the removal")
			}
			if err := ss.Unpin(keys, codes); err != nil {
				t.Fatal(err)
			}
			if st := e.s.Stats(); st.Hidden != 0 || st.Pins != 0 || e.pool.Stats().Blocks != 0 {
				t.Fatalf("after the unpin: %d hidden, %d pins, %d blocks", st.Hidden, st.Pins, e.pool.Stats().Blocks)
			}
			e.reopen()
			mustCodes(t, "exists after the restart", e.exists(keys), NotFound)
		})
	}
}

// TestRemoveThroughPinsForOthers: a Remove here of a key that only
// sessions for other hosts' reads pin (a holder's holds) hides it at once,
// answering OK, whichever way those pins came (a promotion from L2, a hit
// in the pool, Pin); one a session of this host's clients pins too is
// refused (FAILED_PRECONDITION), before and after the others' pins go.
// The hidden blocks keep their bytes for the pins and go with the last.
func TestRemoveThroughPinsForOthers(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	mine := e.s.NewSession()
	defer mine.Close()
	others := e.s.NewSessionForOthers()
	defer others.Close()
	keys := keysN("others", 4)
	vals := valuesFor(keys, 6000)
	mustCodes(t, "put", e.put(mine, keys, vals, true), OK, OK, OK, OK)
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	e.dropL1()
	codes := make([]Code, 1)
	// keys[0]: pinned for others by a get that promotes it from L2.
	locs, cs, _ := e.get(others, keys[:1])
	mustCodes(t, "others' get of an L2-only key", cs, OK)
	// keys[1]: in the pool, unpinned, then pinned for others by a hit.
	_, cs, _ = e.get(mine, keys[1:2])
	mustCodes(t, "client's get", cs, OK)
	if err := mine.Unpin(keys[1:2], codes); err != nil {
		t.Fatal(err)
	}
	_, cs, _ = e.get(others, keys[1:2])
	mustCodes(t, "others' get of a key in the pool", cs, OK)
	// keys[2]: Pin for others; keys[3]: pinned by both.
	if err := others.Pin(keys[2:3], 0, codes); err != nil {
		t.Fatal(err)
	}
	for _, ss := range []*Session{others, mine} {
		_, cs, _ = e.get(ss, keys[3:4])
		mustCodes(t, "get of the key both pin", cs, OK)
	}
	e.s.check(t)
	remove := func(keys [][]byte) []Code {
		t.Helper()
		codes := make([]Code, len(keys))
		if _, err := e.s.Remove(keys, codes, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
		return codes
	}
	mustCodes(t, "remove here", remove(keys), OK, OK, OK, FailedPrecondition)
	for _, k := range keys[:3] {
		e.gone(mine, k)
	}
	if st := e.s.Stats(); st.Hidden != 3 {
		t.Fatalf("%d hidden after the removal, want the 3 only others pin", st.Hidden)
	}
	if got := e.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, vals[0]) {
		t.Fatal("a hidden block's bytes changed while pinned for others")
	}
	if err := others.Unpin(keys[2:3], codes); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Hidden != 2 {
		t.Fatalf("%d hidden after others unpinned one, want 2", st.Hidden)
	}
	if err := others.Close(); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Hidden != 0 || st.Pins != 1 {
		t.Fatalf("after others closed: %d hidden, %d pins; want 0, the client's 1", st.Hidden, st.Pins)
	}
	mustCodes(t, "remove of the key the client pins", remove(keys[3:]), FailedPrecondition)
	if err := mine.Unpin(keys[3:], codes); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove once the client unpinned it", remove(keys[3:]), OK)
	e.s.check(t)
}

// TestRemoveWhileReadHere: a local Remove of a key another daemon is
// reading from this one (ReadHere, a one-round-trip read) is not refused:
// the key goes at once for every reader here, the read in progress keeps
// its exact bytes, and the block is freed when the read ends. (With the
// read holding the block as I/O in flight, the Remove answered BUSY.)
func TestRemoveWhileReadHere(t *testing.T) {
	e := newEnv(t, 8<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	key := []byte("lent")
	keys := [][]byte{key}
	val := bytes.Repeat([]byte("lent value "), 400)
	blocks := e.pool.Stats().Blocks
	mustCodes(t, "put", e.put(ss, keys, [][]byte{val}, false), OK)

	var inside []Code
	var seen []byte
	code, inMem := e.s.ReadHere(key, func(v []byte) {
		codes := make([]Code, 1)
		if _, err := e.s.Remove(keys, codes, nil, nil, 0); err != nil {
			t.Errorf("Remove during the read: %v", err)
		}
		inside = codes
		e.gone(ss, key)
		if st := e.s.Stats(); st.Hidden != 1 {
			t.Errorf("during the read, after the Remove: %d hidden, want 1", st.Hidden)
		}
		seen = append(seen, v...)
	})
	if code != OK || !inMem {
		t.Fatalf("ReadHere: %v, in memory %v", code, inMem)
	}
	mustCodes(t, "remove during the read", inside, OK)
	if !bytes.Equal(seen, val) {
		t.Fatal("the read's bytes changed under the Remove")
	}
	if st := e.s.Stats(); st.Hidden != 0 || st.Pins != 0 || st.Keys != 0 {
		t.Fatalf("after the read: %d hidden, %d pins, %d keys; want none", st.Hidden, st.Pins, st.Keys)
	}
	if b := e.pool.Stats().Blocks; b != blocks {
		t.Fatalf("%d pool blocks after the read, want %d (the removed value's freed)", b, blocks)
	}
	e.gone(ss, key)
}
