package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// TestBusyMemberStaysIn: a member that answers busy (every exchange
// handler of its taken, as on a daemon back from a restart that its
// members all tell at once) is there. A hello it answers busy leaves it in
// the view, so its shards do not move (taking it out made the other
// daemon stand in as home of its shards, where removals sent to it never
// reached); an exchange it answers busy is sent again within its deadline
// and gets through once it has room; one it answers busy until the
// deadline fails with that answer, and it is still not taken for down.
func TestBusyMemberStaysIn(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 500 * time.Millisecond, ProbeEvery: time.Hour})
	a := f.node("a")
	key := keyHomedOn(f, a, "busy/key", "b")
	locatedOnA := func() bool {
		_, hs, err := a.c.Locate([]byte(key))
		return err == nil && slices.ContainsFunc(hs, func(h Holder) bool { return h.ID == "a" })
	}

	f.busyFor("b", -1)
	a.c.probe()
	if h := a.c.Home([]byte(key)); h != "b" {
		t.Fatalf("b answered a hello busy and its shard's home is %s now, want b", h)
	}
	if st := a.c.Stats(); st.BusyHellos == 0 {
		t.Fatal("no busy hello counted")
	}

	// Three busy answers, then room: the announcement gets through.
	f.busyFor("b", 3)
	a.put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, locatedOnA, "a's copy announced to b through its busy answers")
	f.kindMu.Lock()
	answered := f.busyAnswers
	f.kindMu.Unlock()
	if st := a.c.Stats(); answered != 1+3 || st.BusyRetries == 0 {
		t.Fatalf("%d busy answers (want the hello's and 3), %d exchanges sent again", answered, st.BusyRetries)
	}

	// Busy past the removal's deadline: not OK, and b is still home.
	f.busyFor("b", -1)
	if code, err := removeOn(t, a, key); code == store.OK {
		t.Fatalf("a removal its home answered busy until the deadline: OK (%v), want it not taken", err)
	}
	if h := a.c.Home([]byte(key)); h != "b" {
		t.Fatalf("after a removal b answered busy, its shard's home is %s, want b", h)
	}
	f.busyFor("b", 0)
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("the removal once b has room: %v, %v", code, err)
	}
	if locatedOnA() {
		t.Fatal("the removed key's home still names a's copy")
	}
}
