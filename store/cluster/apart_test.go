package cluster

import (
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
