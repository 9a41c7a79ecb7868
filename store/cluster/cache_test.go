package cluster

import (
	"fmt"
	"testing"
	"time"
)

// TestAnswers: a home's answer is kept for the staleness budget, never a
// miss, dropped on demand, and a full cache starts over.
func TestAnswers(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAnswers(2*time.Second, 3)
	hs := []Holder{{ID: "d1", Epoch: 1}}
	a.put([]byte("k"), hs, now)
	a.put([]byte("miss"), nil, now)
	if got, ok := a.get([]byte("k"), now.Add(2*time.Second)); !ok || got[0] != hs[0] {
		t.Fatalf("within the budget: %v %v", got, ok)
	}
	if _, ok := a.get([]byte("k"), now.Add(2*time.Second+1)); ok {
		t.Fatal("an answer older than the budget was used")
	}
	if _, ok := a.get([]byte("miss"), now); ok {
		t.Fatal("a miss was cached")
	}
	a.drop([][]byte{[]byte("k")})
	if _, ok := a.get([]byte("k"), now); ok {
		t.Fatal("a dropped answer was used")
	}
	for i := range 4 {
		a.put(fmt.Appendf(nil, "k%d", i), hs, now)
	}
	if len(a.m) != 1 {
		t.Fatalf("%d answers kept in a cache of 3 after a fourth", len(a.m))
	}
	if off := newAnswers(-1, 3); func() bool { off.put([]byte("k"), hs, now); _, ok := off.get([]byte("k"), now); return ok }() {
		t.Fatal("a cache with no budget kept an answer")
	}
}
