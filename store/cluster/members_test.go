package cluster

import (
	"log/slog"
	"testing"
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
