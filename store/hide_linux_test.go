//go:build linux

package store

import (
	"bytes"
	"testing"
)

// TestRemovedElsewhereWhilePinnedJournal: a key removed from another host
// while pinned here is gone from the L1 journal at once, so a daemon that
// dies while the pin lasts does not find it again in the pool it adopts;
// the other values are found again.
func TestRemovedElsewhereWhilePinnedJournal(t *testing.T) {
	e, jmem := journalEnv(t, 1024, 16<<20)
	ss := e.s.NewSession()
	keys := keysN("journal", 3)
	vals := valuesFor(keys, 7000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	locs, codes, _ := e.get(ss, keys[:1])
	mustCodes(t, "get", codes, OK)
	mustCodes(t, "remove from elsewhere", e.removeHere(keys[:1]), OK)
	if got := e.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, vals[0]) {
		t.Fatal("the pinned block's bytes changed after the removal")
	}
	// The daemon dies with the pin held: the journal as it is now.
	s2, _ := e.restartOver(bytes.Clone(jmem))
	e.s = s2
	if st := s2.Stats(); st.L1Recovered != 2 {
		t.Fatalf("%d values found again after the restart, want 2", st.L1Recovered)
	}
	mustCodes(t, "exists after the restart", e.exists(keys), NotFound, OK, OK)
	e.checkValues(keys[1:], vals[1:])
}
