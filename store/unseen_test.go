//go:build linux

package store

import (
	"bytes"
	"testing"
)

// TestFetchedCopyUnseenUntilConfirmed: a copy fetched from another host
// answers the get that fetched it, and no other reader here finds it
// (GetHere, ReadHere, Stat, List, Holdings, Exists here) until its home has
// taken it; it owes no writeback and has no journal record, so a restart
// does not find it; removal and HeldHere find it. Confirm of another
// record of the key leaves it unseen; Confirm of its own makes it seen,
// journaled and owed a writeback.
func TestFetchedCopyUnseenUntilConfirmed(t *testing.T) {
	e, jmem := journalEnv(t, 256, 16<<20, withL2(64<<20))
	s := e.s
	far1, far2 := bytes.Repeat([]byte{1}, 5000), bytes.Repeat([]byte{2}, 3000)
	r := &fakeRemote{s: s, stored: map[string]uint32{}, others: map[string][]byte{"far/1": far1, "far/2": far2},
		keepUnseen: true}
	s.SetRemote(r)
	ss := s.NewSession()
	defer ss.Close()
	key := []byte("far/1")

	// The fetching get answers from the copy, in place.
	locs := make([]Location, 1)
	codes := make([]Code, 1)
	if _, err := ss.Get([][]byte{key}, locs, codes, nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("get: %v %v", err, codes[0])
	}
	if got := s.poolMem[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, far1) {
		t.Fatal("the fetching get's location does not hold the value")
	}
	r.fetching.Wait()
	id := r.unseen["far/1"]
	if id == 0 {
		t.Fatal("the fetched copy was announced as a put, not as an unseen copy")
	}

	// Unseen by every other reader here, held all the same.
	unseen := func(when string) {
		t.Helper()
		ss2 := s.NewSession()
		defer ss2.Close()
		if err := ss2.GetHere([][]byte{key}, locs, codes, nil); err != nil || codes[0] != NotFound {
			t.Fatalf("%s: GetHere %v %v, want NOT_FOUND", when, err, codes[0])
		}
		if c, _ := s.ReadHere(key, func([]byte) {}); c != NotFound {
			t.Fatalf("%s: ReadHere %v, want NOT_FOUND", when, c)
		}
		if _, err := s.statHere(key); err == nil {
			t.Fatalf("%s: Stat found it", when)
		}
		if ks, _, err := s.List([]byte("far/"), 10); err != nil || len(ks) != 0 {
			t.Fatalf("%s: List %v %v", when, ks, err)
		}
		var held []Held
		for i := 0; i < s.IndexShards(); i++ {
			held = s.Holdings(i, func([]byte) bool { return true }, held)
		}
		if len(held) != 0 {
			t.Fatalf("%s: Holdings %d values", when, len(held))
		}
		if !s.HeldHere(key) {
			t.Fatalf("%s: HeldHere is false", when)
		}
		if st := s.Stats(); st.Dirty != 0 || st.Unseen != 1 || st.Confirmed != 0 {
			t.Fatalf("%s: %d owed a writeback, %d unseen, %d confirmed; want 0, 1, 0", when, st.Dirty, st.Unseen, st.Confirmed)
		}
		if bytes.Contains(jmem, key) {
			t.Fatalf("%s: the journal has a record of it", when)
		}
	}
	unseen("fetched")
	s.Confirm([][]byte{key}, []RecordID{id + 1}) // another record of the key
	unseen("confirmed as another record")

	// Its own record: seen, owed a writeback, journaled.
	s.Confirm([][]byte{key}, []RecordID{id})
	if err := ss.GetHere([][]byte{key}, locs, codes, nil); err != nil || codes[0] != OK {
		t.Fatalf("GetHere once confirmed: %v %v", err, codes[0])
	}
	if st := s.Stats(); st.Dirty+st.L2Keys != 1 || st.Confirmed != 1 {
		t.Fatalf("once confirmed: %d owed a writeback, %d on L2, %d confirmed", st.Dirty, st.L2Keys, st.Confirmed)
	}
	if !bytes.Contains(jmem, key) {
		t.Fatal("once confirmed: no journal record")
	}

	// A restart finds the confirmed copy and not an unseen one; a removal
	// finds an unseen one.
	far2Key := []byte("far/2")
	if _, err := ss.Get([][]byte{far2Key}, locs, codes, nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("get of far/2: %v %v", err, codes[0])
	}
	r.fetching.Wait()
	if err := ss.Close(); err != nil {
		t.Fatal(err)
	}
	s2, _ := e.restartOver(bytes.Clone(jmem))
	e.s = s2
	e.checkValues([][]byte{key}, [][]byte{far1})
	if c := e.exists([][]byte{far2Key}); c[0] != NotFound {
		t.Fatalf("an unseen copy after a restart: %v, want NOT_FOUND", c[0])
	}
}

// TestUnseenCopyRemovedAndEvicted: a removal here takes an unseen fetched
// copy (and tells the Remote), and eviction drops one though the store
// has L2 (it owes no writeback).
func TestUnseenCopyRemovedAndEvicted(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(64<<20))
	s := e.s
	r := &fakeRemote{s: s, stored: map[string]uint32{}, keepUnseen: true, others: map[string][]byte{
		"far/1": bytes.Repeat([]byte{1}, 5000), "far/2": bytes.Repeat([]byte{2}, 5000)}}
	s.SetRemote(r)
	dst := make([]byte, 5000)
	lens := make([]uint64, 2)
	codes := make([]Code, 2)
	keys := [][]byte{[]byte("far/1"), []byte("far/2")}
	if _, err := s.Read(keys, [][]byte{dst, dst}, lens, codes, nil, nil, 0); err != nil || codes[0] != OK || codes[1] != OK {
		t.Fatalf("read: %v %v", err, codes)
	}
	r.fetching.Wait()
	if _, err := s.Remove(keys[:1], codes[:1], nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("remove: %v %v", err, codes[0])
	}
	if s.HeldHere(keys[0]) {
		t.Fatal("an unseen copy is held after its removal")
	}
	s.evict(1<<30, 1<<20)
	if s.HeldHere(keys[1]) {
		t.Fatal("an unseen copy stays after an eviction of everything")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.removed) != 1 || len(r.evicted) != 2 {
		t.Fatalf("told removed %v, gone %v", r.removed, r.evicted)
	}
}
