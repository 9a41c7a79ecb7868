package cluster

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestReannounceRequestsBounded: re-announcements asked for faster than
// the walks take them (a member asking over and over, one message each)
// queue at most maxReannounceReqs; past that they are one of every key,
// which covers each request it replaced, and what comes after it adds
// nothing until the walk takes the queue.
func TestReannounceRequestsBounded(t *testing.T) {
	c := &Cluster{log: slog.New(slog.DiscardHandler), rekick: make(chan struct{}, 1)}
	for i := range 10 * maxReannounceReqs {
		shard := i
		c.reannounce(func(s int, _ string) bool { return s == shard })
		if len(c.reqs) > maxReannounceReqs {
			t.Fatalf("%d re-announcements queued after %d asked, want at most %d", len(c.reqs), i+1, maxReannounceReqs)
		}
	}
	if !c.reqsAll || len(c.reqs) != 1 {
		t.Fatalf("%d queued (all %v), want the one of every key", len(c.reqs), c.reqsAll)
	}
	for s := range 10 * maxReannounceReqs {
		if !c.reqs[0](s, "any") {
			t.Fatalf("shard %d, asked for, is not re-announced", s)
		}
	}
}

// TestARestartedHomeIsWalkedForOnce: when a home restarts, a member
// re-announces the keys it holds of the home's shards once, for the pull
// of the home's new run, not a second time on its own when it meets that
// run. The pull is held until the member's reannouncer has taken what it
// had queued, and the member's announcements until the pull is in, so
// that two walks cannot merge into one by chance.
func TestARestartedHomeIsWalkedForOnce(t *testing.T) {
	const shards = 16
	f := newNet(t, []string{"a", "b"}, Config{Shards: shards, Timeout: 10 * time.Second, ProbeEvery: time.Hour})
	a, b := f.node("a"), f.node("b")
	var keys []string // of shards a is home of
	for i := 0; len(keys) < 8; i++ {
		keys = append(keys, keyWithHomes(t, fmt.Sprintf("restart/%d", i), shards, []string{"a", "a", "b"}))
	}
	indexed := func() bool {
		for _, k := range keys {
			if !slices.Equal(f.holders(k), []string{"b"}) {
				return false
			}
		}
		return true
	}
	// walked: a has b's word that it re-announced those keys' shards to
	// a's current run.
	walked := func() bool {
		for _, k := range keys {
			if u, _ := a.c.unwalked(a.c.shardOf([]byte(k)), a.c.view.Load(), nil, time.Now()); slices.Contains(u, "b") {
				return false
			}
		}
		return true
	}
	for _, k := range keys {
		b.put(t, k, value(k, 4096))
	}
	testutil.Eventually(t, 10*time.Second, indexed, "b's copies indexed at a")
	before := b.c.c.reannounced.Load()
	pull := f.holdKind(t, "a", kindPull)
	held := f.holdKind(t, "b", kindAnnounce)
	heldAges := f.holdKind(t, "b", kindAnnounceAges)
	f.restart(t, "a")
	sent := func() bool {
		a.c.walks.mu.Lock()
		defer a.c.walks.mu.Unlock()
		return a.c.walks.asked["b"].seq != 0
	}
	testutil.Eventually(t, 10*time.Second, sent, "a's new run pulling b")
	taken := func() bool {
		b.c.mu.Lock()
		defer b.c.mu.Unlock()
		return len(b.c.reqs) == 0
	}
	testutil.Eventually(t, 10*time.Second, taken, "b's reannouncer taking what it had queued")
	pull()
	pulled := func() bool {
		b.c.walks.mu.Lock()
		defer b.c.walks.mu.Unlock()
		return b.c.walks.marks["a"].epoch == a.Epoch()
	}
	testutil.Eventually(t, 10*time.Second, pulled, "the pull of a's new run taken by b")
	held()
	heldAges()
	testutil.Eventually(t, 10*time.Second, func() bool { return indexed() && walked() },
		"b's copies indexed at a's new run, and b's word for them in")
	if n := b.c.c.reannounced.Load() - before; n != uint64(len(keys)) {
		t.Fatalf("b re-announced %d keys to a's new run, want %d: each once", n, len(keys))
	}
}
