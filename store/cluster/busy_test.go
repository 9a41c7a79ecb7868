package cluster

import (
	"errors"
	"fmt"
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
// reached); an exchange it answers busy is sent again, a few times, and
// gets through once it has room; one it answers busy every time fails
// with that answer (not OK), soon, and it is still not taken for down.
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
	answered := f.busyOf() // the lookups of locatedOnA may take some of the 3
	if st := a.c.Stats(); answered != 1+3 || st.BusyRetries == 0 {
		t.Fatalf("%d busy answers (want the hello's and 3), %d exchanges sent again", answered, st.BusyRetries)
	}

	// Busy every time: a removal (of a key b holds and is home of, so
	// that nothing else is sent to b meanwhile) fails, not OK, after
	// busyTries sends, and b is still home.
	b := f.node("b")
	held := keyHomedOn(f, a, "busy/held", "b")
	b.put(t, held, value(held, 4096))
	f.busyFor("b", -1)
	before := f.busyOf(kindRemove)
	if code, err := removeOn(t, a, held); code == store.OK {
		t.Fatalf("a removal its home answered busy every time: OK (%v), want it not taken", err)
	}
	tries := f.busyOf(kindRemove) - before
	if tries != busyTries {
		t.Fatalf("a removal its home answered busy every time was sent %d times, want %d", tries, busyTries)
	}
	if h := a.c.Home([]byte(key)); h != "b" {
		t.Fatalf("after a removal b answered busy, its shard's home is %s, want b", h)
	}
	if c := b.here(t, held); c != store.OK {
		t.Fatalf("b's copy after a removal it never took: %v", c)
	}
	f.busyFor("b", 0)
	if code, err := removeOn(t, a, held); code != store.OK {
		t.Fatalf("the removal once b has room: %v, %v", code, err)
	}
	if c := b.here(t, held); c != store.NotFound {
		t.Fatalf("b's copy after the removal: %v, want removed", c)
	}
}

// TestDropAskedAgainOfBusyHolder: a removal whose drop a holder answers
// busy every time (its handlers all taken, as on a daemon back from a
// restart) is not answered OK: the holder, a member still, serves its copy
// to a reader that has a cached home answer, so the remove says so
// (UNAVAILABLE, ErrCopyKept), and so does the same remove sent again while
// it is busy. The holder is asked again, in rounds, while it is busy; the
// same remove sent once it has room drops the copy before it answers OK
// (not left to the next round), and the rounds end.
func TestDropAskedAgainOfBusyHolder(t *testing.T) {
	f, a, b, key := heldOnB(t, 500*time.Millisecond, "busy/drop")

	f.busyFor("b", -1)
	for try := range 2 {
		code, err := removeOn(t, a, key)
		if code != store.Unavailable || !errors.Is(err, ErrCopyKept) {
			t.Fatalf("remove %d at the key's home while b, holding a copy, answers busy: %v, %v; want UNAVAILABLE, the copy kept", try, code, err)
		}
		if c := b.here(t, key); c != store.OK {
			t.Fatalf("b's copy while b answers busy: %v, want still there", c)
		}
	}
	if st := a.c.Stats(); st.RemovesKept != 2 || st.DropsSoon != 0 {
		t.Fatalf("removes kept %d, drops soon %d; want 2 and 0", st.RemovesKept, st.DropsSoon)
	}
	// Four rounds: the next is 800 ms away, past the remove below.
	testutil.Eventually(t, 10*time.Second, func() bool { return a.c.Stats().DropRetryRounds >= 4 },
		"the drop asked of b again while it is busy (a %+v)", testutil.Lazy(a.c.Stats))
	if c := b.here(t, key); c != store.OK {
		t.Fatalf("b's copy while b answers busy: %v, want still there", c)
	}
	f.busyFor("b", 0)
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("the same remove once b has room: %v, %v", code, err)
	}
	if c := b.here(t, key); c != store.NotFound {
		t.Fatalf("b's copy once the remove answered OK: %v, want dropped", c)
	}
	if _, err := b.read(key, 4096); err == nil {
		t.Error("b reads the removed key")
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return a.c.Stats().Tombstones == 0 },
		"the tombstone settled (a %+v)", testutil.Lazy(a.c.Stats))
}

// TestRemoveWaitsOutBusyHolder: a holder busy for longer than an exchange's
// own retries, but not for the removal's time, is asked again within it:
// the remove answers OK with the copy gone, not OK with the copy still
// served until a later round.
func TestRemoveWaitsOutBusyHolder(t *testing.T) {
	f, a, b, key := heldOnB(t, 2*time.Second, "busy/soon")

	f.busyFor("b", busyTries+2) // the drop's own tries, and two more
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("remove while b is busy for a while: %v, %v; want OK", code, err)
	}
	if c := b.here(t, key); c != store.NotFound {
		t.Fatalf("b's copy once the remove answered OK: %v, want dropped", c)
	}
	if st := a.c.Stats(); st.DropsSoon != 1 || st.RemovesKept != 0 {
		t.Fatalf("drops soon %d, removes kept %d; want 1 and 0", st.DropsSoon, st.RemovesKept)
	}
}

// heldOnB is two daemons, a and b, with the cluster timeout given, and a
// key (named from prefix) that a is home of and only b holds.
func heldOnB(t *testing.T, timeout time.Duration, prefix string) (f *fakeNet, a, b *fakeNode, key string) {
	t.Helper()
	f = newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: timeout, ProbeEvery: time.Hour})
	a, b = f.node("a"), f.node("b")
	key = keyHomedOn(f, a, prefix, "a")
	b.put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"b"}) }, "b's copy announced to a")
	return f, a, b, key
}

// TestNestedKinds: the handlers that wait on exchanges of their own (a
// removal on its drops and keepers, a replica on its read and its
// announcement) are registered nested, apart from the handlers they wait
// on, and no other is (Peers.HandleNested): with one bound, a removal at
// each of two busy daemons could wait on a drop at the other that no
// handler there had room for.
func TestNestedKinds(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, ProbeEvery: time.Hour})
	a := f.node("a")
	a.hmu.RLock()
	defer a.hmu.RUnlock()
	var nested []string
	for kind := range a.h {
		if a.nested[kind] {
			nested = append(nested, kind)
		}
	}
	slices.Sort(nested)
	if want := []string{kindRemove, kindReplicate}; !slices.Equal(nested, want) {
		t.Fatalf("nested kinds %v, want %v", nested, want)
	}
	for _, k := range []string{kindDrop, kindDropAges, kindKeep, kindHold, kindRelease, kindAnnounce, kindAnnounceAges} {
		if a.h[k] == nil || a.nested[k] {
			t.Errorf("kind %s, which nested handlers ask for: registered %v, nested %v; want registered, not nested", k, a.h[k] != nil, a.nested[k])
		}
	}
}

// TestDropRoundStopsAtBusy: a round of drops asked again of a holder
// (many tombstones, more than one message) stops at the first message the
// holder answers busy: the next round sends the rest.
func TestDropRoundStopsAtBusy(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 500 * time.Millisecond, ProbeEvery: time.Hour})
	a := f.node("a")
	now := time.Now()
	for i := range 2*maxMsgKeys + 1 {
		a.c.tombs.add([]byte(fmt.Sprintf("busy/round/%d", i)), Holder{ID: "b", Size: 4096, CRC: uint32(i)}, now)
	}
	f.busyFor("b", -1)
	if failed := a.c.dropRound("b"); !failed {
		t.Fatal("a round b answered busy did not fail")
	}
	answered := f.busyOf(kindDrop, kindDropAges)
	if answered != busyTries {
		t.Fatalf("b answered busy %d times in one round, want %d (one message, then the round stops)", answered, busyTries)
	}
}
