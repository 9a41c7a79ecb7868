package cluster

import (
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// cachedHolders is the ids of key's holders in n's cache of home answers
// (nil when none is cached and fresh).
func cachedHolders(n *fakeNode, key string) []string {
	hs, ok := n.c.answers.get([]byte(key), time.Now())
	if !ok {
		return nil
	}
	ids := make([]string, len(hs))
	for i, h := range hs {
		ids[i] = h.ID
	}
	slices.Sort(ids)
	return ids
}

// TestPushedAnswers: a reader that asked a home about a key is pushed the
// home's fresh answer when the key's holders change (a second copy), and
// told to forget it when the key is removed; a push from a daemon that is
// not the key's home is refused and changes nothing.
func TestPushedAnswers(t *testing.T) {
	ids := []string{"a", "h", "r"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour, Staleness: 10 * time.Second, Push: true})
	a, h, r := f.node("a"), f.node("h"), f.node("r")
	key := keyHomedOn(f, a, "push", "h")
	other := keyHomedOn(f, a, "push/other", "h")
	a.put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a"}) }, "a's copy announced")

	found := []bool{false}
	r.c.Present([][]byte{[]byte(key)}, found)
	if !found[0] || !slices.Equal(cachedHolders(r, key), []string{"a"}) {
		t.Fatalf("r's lookup: found %v, cached %v", found[0], cachedHolders(r, key))
	}
	// A second copy: h's index changes, and r asked about the key.
	h.put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(cachedHolders(r, key), []string{"a", "h"}) },
		"r's cached answer updated by h's push (it has %v)", testutil.Lazy(func() []string { return cachedHolders(r, key) }))
	if r.c.push.taken.Load() == 0 || h.c.push.sent.Load() == 0 {
		t.Fatalf("pushes: h sent %d, r took %d", h.c.push.sent.Load(), r.c.push.taken.Load())
	}

	// A push from a, which is not the key's home, is refused.
	refused := r.c.push.refused.Load()
	msg, n := encodePush([]pushEntry{{key: []byte(other), gen: a.Epoch(), holders: []Holder{{ID: "a", Epoch: a.Epoch(), Tier: TierL1, Size: 1, CRC: 1}}}})
	if n != 1 {
		t.Fatal(n)
	}
	if _, err := a.ExchangeAt("r", r.Epoch(), kindPush, msg, time.Second); err != nil {
		t.Fatal(err)
	}
	if r.c.push.refused.Load() != refused+1 || cachedHolders(r, other) != nil {
		t.Fatalf("a push from a daemon not home of the key: refused %d (before %d), cached %v", r.c.push.refused.Load(), refused, cachedHolders(r, other))
	}

	// The key removed: r forgets its answer (misses are not cached).
	if code, err := removeOn(t, a, key); err != nil {
		t.Fatalf("remove: %v %v", code, err)
	}
	// Within 5 s: well before its cached answer (10 s) would expire.
	testutil.Eventually(t, 5*time.Second, func() bool { return cachedHolders(r, key) == nil }, "r told to forget the removed key")
}
