package cluster

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// TestOlderReleaseHolderDropsRemovedCopy: o runs, on the wire, a release
// without the messages with removal ages (olderWire). Its copy of a key
// homed on w is removed on w while the two are cut apart; once they meet
// again, o drops it: w's tombstone is sent to o as the drop o knows, and
// o's re-announcement is answered as o can decode it. Neither side sends
// the other a message o's decoders would refuse (sent with ages, o kept
// the removed copy, readable, for as long as it ran that release).
func TestOlderReleaseHolderDropsRemovedCopy(t *testing.T) {
	f := newNet(t, []string{"w", "o"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	f.olderWire("o")
	w, o := f.node("w"), f.node("o")
	k := keyHomedOn(f, w, "older/k", "w")
	o.put(t, k, value(k, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"o"}) }, "o's copy announced")

	probe := func() { w.c.probe(); o.c.probe() }
	f.partition("w", "o", true)
	testutil.Eventually(t, 10*time.Second, func() bool { probe(); return len(w.c.Members()) == 1 && len(o.c.Members()) == 1 }, "w and o apart")
	if code, err := removeOn(t, w, k); code != store.OK {
		t.Fatalf("remove %s on w while apart: %v, %v", k, code, err)
	}
	if w.c.tombs.live() == 0 {
		t.Fatal("w keeps no tombstone for o's copy, which it could not reach")
	}

	f.partition("w", "o", false)
	testutil.Eventually(t, 10*time.Second, func() bool {
		probe()
		return len(w.c.Members()) == 2 && len(o.c.Members()) == 2 && o.here(t, k) == store.NotFound
	}, "together again and o's removed copy dropped (%s on o: %v; messages an older release refused: %d)", k,
		testutil.Lazy(func() store.Code { return o.here(t, k) }),
		testutil.Lazy(func() int { f.kindMu.Lock(); defer f.kindMu.Unlock(); return f.olderRefused }))
	if b, err := w.read(k, 4096); err == nil {
		t.Errorf("%s read on w after its removal (%d bytes)", k, len(b))
	}
	f.kindMu.Lock()
	refused := f.olderRefused
	f.kindMu.Unlock()
	if refused != 0 {
		t.Errorf("%d messages sent that an older release's decoders refuse", refused)
	}
	if w.c.Stats().OlderKinds == 0 && o.c.Stats().OlderKinds == 0 {
		t.Error("no message counted as sent in the kind an older release knows")
	}
}

// TestOlderMarkPerRun: a member that answered it serves no kind with
// removal ages is sent the older kinds in that run only, and for
// olderRecheck at most: a restart (another epoch) or the time passing
// tries the newer kind again. One that serves neither kind (its store
// across hosts stopped) is not taken for an older release.
func TestOlderMarkPerRun(t *testing.T) {
	f := newNet(t, []string{"w", "o"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	c, o := f.node("w").c, f.node("o")
	o.c.Close()
	if _, err := c.dropAged("o", [][]byte{[]byte("k")}, []uint32{1}, time.Now().Add(time.Second)); !notServed(err) {
		t.Fatalf("a drop to a member serving no kind: %v, want not served", err)
	}
	if c.older("o", o.Epoch(), kindDropAges) {
		t.Fatal("a member serving no kind taken for an older release")
	}
	if c.older("o", 7, kindDropAges) {
		t.Fatal("o taken for an older release before it said so")
	}
	c.olderRelease("o", 7, kindDropAges, errors.New("no handler"))
	if !c.older("o", 7, kindDropAges) || c.older("o", 8, kindDropAges) {
		t.Fatalf("older at run 7: %v (want true), at run 8: %v (want false)", c.older("o", 7, kindDropAges), c.older("o", 8, kindDropAges))
	}
	if c.older("o", 7, kindPull) {
		t.Fatal("o, older for the kinds with ages, taken for one without the numbered pull too")
	}
	c.mmu.Lock()
	c.members["o"].older[famAges].at = time.Now().Add(-olderRecheck)
	c.mmu.Unlock()
	if c.older("o", 7, kindDropAges) {
		t.Fatal("o still taken for an older release after olderRecheck")
	}
}
