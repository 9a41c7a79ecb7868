package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestUnclaimOnlyByReader: a claim the home handed one reader is released
// only by that reader: an unclaim of it from another daemon is refused
// (the error names the claim's holder) and releases nothing, not even the
// sender's own claims sent with it; the reader's own unclaim ends it.
func TestUnclaimOnlyByReader(t *testing.T) {
	ids := []string{"h", "r", "x"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	const key = "unclaim/key"
	f.node("h").put(t, key, value(key, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) },
		"the holder announced (home knows %v)", testutil.Lazy(func() []string { return f.holders(key) }))
	home := f.node(f.node("h").c.Home([]byte(key)))
	r, x := f.node("r"), f.node("x")
	dl := time.Now().Add(time.Minute)
	mine := home.c.claimHere(r.id, r.epoch, [][]byte{[]byte(key)}, dl)
	theirs := home.c.claimHere(x.id, x.epoch, [][]byte{[]byte(key)}, dl)
	if mine[0].claim == 0 || theirs[0].claim == 0 {
		t.Fatalf("no claims handed: %+v %+v", mine[0], theirs[0])
	}
	for _, req := range [][]uint64{{mine[0].claim}, {theirs[0].claim, mine[0].claim}} {
		_, err := x.ExchangeAt(home.id, home.epoch, kindUnclaim, encodeClaims(req), time.Second)
		if err == nil || !strings.Contains(err.Error(), "claim held by another reader") {
			t.Fatalf("x releasing %v (r's claim among them): %v, want refused", req, err)
		}
	}
	if cs := home.c.ReadClaims(); cs.Outstanding != 2 || cs.Foreign != 2 {
		t.Fatalf("after the refused releases: %+v, want 2 outstanding, 2 refused", cs)
	}
	for _, p := range []struct {
		n  *fakeNode
		id uint64
	}{{r, mine[0].claim}, {x, theirs[0].claim}} {
		if _, err := p.n.ExchangeAt(home.id, home.epoch, kindUnclaim, encodeClaims([]uint64{p.id}), time.Second); err != nil {
			t.Fatalf("%s releasing its claim: %v", p.n.id, err)
		}
	}
	if cs := home.c.ReadClaims(); cs.Outstanding != 0 {
		t.Fatalf("after the readers' releases: %+v, want none outstanding", cs)
	}
}
