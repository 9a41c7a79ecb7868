package cluster

import (
	"fmt"
	"testing"
	"time"
)

// TestPutsApartNotes: puts are noted only while a member is away and for
// the ttl after the last came back; a note says whether the value was put
// after a given time, goes with its key's eviction, with age, and, past
// the bound, oldest first (counted).
func TestPutsApartNotes(t *testing.T) {
	const ttl = time.Minute
	p := newPutsApart(3, ttl)
	t0 := time.Unix(1_700_000_000, 0)
	if p.noting(t0) {
		t.Fatal("noting before any member was away")
	}
	p.setApart(true, t0)
	if !p.noting(t0.Add(time.Hour)) {
		t.Fatal("not noting while a member is away")
	}
	p.setApart(false, t0.Add(time.Second))
	if !p.noting(t0.Add(ttl)) || p.noting(t0.Add(time.Second+ttl)) {
		t.Fatal("noting should last the ttl after the last member came back, and no longer")
	}
	p.setApart(false, t0.Add(2*time.Second)) // all back still: the end stays
	if p.noting(t0.Add(time.Second + ttl)) {
		t.Fatal("a view change with every member up moved the end of noting")
	}

	for i, k := range []string{"a", "b", "c"} {
		if p.put([]byte(k), t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("table full at %s", k)
		}
	}
	if !p.after([]byte("b"), t0) || p.after([]byte("b"), t0.Add(time.Second)) || p.after([]byte("x"), t0) {
		t.Fatal("after: b was put at t0+1s, x never")
	}
	p.forget([]byte("b"))
	if p.after([]byte("b"), t0) || p.len() != 2 {
		t.Fatalf("b forgotten: after %v, %d notes", p.after([]byte("b"), t0), p.len())
	}
	// Put again: the newer time counts, and its older mark is stale.
	p.put([]byte("a"), t0.Add(3*time.Second))
	if !p.after([]byte("a"), t0.Add(2*time.Second)) {
		t.Fatal("a put again: its newer time does not count")
	}
	if p.put([]byte("d"), t0.Add(4*time.Second)) || p.len() != 3 {
		t.Fatalf("a, c and d noted: full early (%d notes)", p.len())
	}
	// Over the bound: the oldest live note goes (c; a's and b's first
	// marks are stale), counted.
	if !p.put([]byte("e"), t0.Add(5*time.Second)) || p.over.Load() != 1 || p.after([]byte("c"), t0) || p.len() != 3 {
		t.Fatalf("over the bound: c should go, counted (over %d, %d notes)", p.over.Load(), p.len())
	}
	p.put([]byte("f"), t0.Add(3*time.Second+ttl))
	if p.after([]byte("a"), t0) || !p.after([]byte("d"), t0) || !p.after([]byte("e"), t0) || !p.after([]byte("f"), t0) {
		t.Fatal("a's note, a ttl old, should have gone with age, d's, e's and f's stayed")
	}
}

// TestPutsApartOrderBounded: keys put and then removed here (forgotten),
// some put again first, while a member is away leave stale marks in the
// table's order while the table itself stays far from full (the soak's
// clients put and remove at 1.5k a second). The marks are dropped once
// they pass twice the bound, so the table's memory follows the bound, not
// the rate of puts times the ttl; the live notes stay, in order, and past
// the bound the oldest live one still goes first.
func TestPutsApartOrderBounded(t *testing.T) {
	const max, n, kept = 8, 10_000, 5
	p := newPutsApart(max, time.Hour)
	t0 := time.Unix(1_700_000_000, 0)
	p.setApart(true, t0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	key := func(i int) []byte { return []byte(fmt.Sprintf("k%d", i)) }
	for i := range n {
		p.put(key(i), at(i))
		if i < n-kept { // the last kept keys stay
			if i%2 == 1 {
				p.put(key(i), at(i)) // put again: its first mark is stale
			}
			p.forget(key(i)) // removed here
		}
		if m := len(p.fifo) - p.head; m > 2*max+1 {
			t.Fatalf("after %d puts the order holds %d marks for %d notes, bound %d", i+1, m, p.len(), max)
		}
	}
	if p.len() != kept || p.over.Load() != 0 {
		t.Fatalf("%d notes (want %d), %d pushed out (want 0)", p.len(), kept, p.over.Load())
	}
	for i := n - 1; i >= n-2*kept; i-- {
		if want := i >= n-kept; p.after(key(i), t0) != want {
			t.Fatalf("k%d noted %v, want %v", i, !want, want)
		}
	}
	// Filled to the bound, then one more: the oldest live note goes.
	for i := n; i < n+max-kept+1; i++ {
		p.put(key(i), at(i))
	}
	if p.len() != max || p.over.Load() != 1 || p.after(key(n-kept), t0) || !p.after(key(n-kept+1), t0) {
		t.Fatalf("over the bound: k%d should have gone first (%d notes, %d pushed out)", n-kept, p.len(), p.over.Load())
	}
	// A key noted again at the bound takes no more room: nothing goes.
	p.put(key(n-1), at(n+max))
	if p.len() != max || p.over.Load() != 1 || !p.after(key(n-kept+1), t0) {
		t.Fatalf("a key put again at the bound pushed another out (%d notes, %d pushed out)", p.len(), p.over.Load())
	}
}
