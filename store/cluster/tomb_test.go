package cluster

import (
	"fmt"
	"testing"
	"time"
)

func TestTombs(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tb := newTombs(3, time.Minute)
	h := Holder{ID: "d3", Epoch: 9, Tier: TierL1, Size: 4096, CRC: 0xabc}
	tb.add([]byte("a"), h, t0)
	// Another holder, other bytes (a put after the removal), or a key
	// never removed: not removed.
	if tb.removed([]byte("a"), "d2", 4096, 0xabc, t0) || tb.removed([]byte("b"), "d3", 4096, 0xabc, t0) {
		t.Fatal("removed for another holder or key")
	}
	if !tb.removed([]byte("a"), "d3", 4096, 0xabc, t0) {
		t.Fatal("the removed copy re-announced was not answered removed")
	}
	if tb.removed([]byte("a"), "d3", 4096, 0xabc, t0) || tb.live() != 0 {
		t.Fatal("a tombstone answered twice")
	}
	tb.add([]byte("a"), h, t0)
	if tb.removed([]byte("a"), "d3", 4096, 0xdef, t0) || tb.live() != 0 {
		t.Fatal("a copy of other bytes was answered removed, or its tombstone stayed")
	}
	// Bounded: the oldest goes first.
	for i := range 5 {
		tb.add(fmt.Appendf(nil, "k%d", i), h, t0.Add(time.Duration(i)*time.Second))
	}
	if tb.live() != 3 || tb.evicted.Load() != 2 {
		t.Fatalf("%d live, %d evicted; want 3, 2", tb.live(), tb.evicted.Load())
	}
	if tb.removed([]byte("k0"), "d3", 4096, 0xabc, t0) || !tb.removed([]byte("k2"), "d3", 4096, 0xabc, t0) {
		t.Fatal("eviction did not take the oldest")
	}
	// By age: past the TTL they go.
	if tb.removed([]byte("k3"), "d3", 4096, 0xabc, t0.Add(2*time.Minute)) || tb.live() != 0 || tb.expired.Load() != 2 {
		t.Fatalf("after the TTL: %d live, %d expired", tb.live(), tb.expired.Load())
	}
	// An eviction announced by the holder spends its tombstone.
	tb.add([]byte("z"), h, t0)
	tb.forget([]byte("z"), "d3")
	if tb.live() != 0 {
		t.Fatal("forget left the tombstone")
	}
}
