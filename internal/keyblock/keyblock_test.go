package keyblock

import (
	"bytes"
	"fmt"
	"testing"
)

func batch() [][]byte {
	keys := [][]byte{nil, []byte("a"), {}}
	for i := range 200 {
		keys = append(keys, fmt.Appendf(nil, "layer/%d/block/%d", i%7, i))
	}
	return keys
}

// Clone's copies hold the keys' bytes, are not the caller's memory, and
// an append to one leaves the next as it was.
func TestClone(t *testing.T) {
	keys := batch()
	out := Clone(keys)
	if len(out) != len(keys) {
		t.Fatalf("%d copies of %d keys", len(out), len(keys))
	}
	for i := range keys {
		if !bytes.Equal(out[i], keys[i]) {
			t.Fatalf("copy %d = %q, want %q", i, out[i], keys[i])
		}
	}
	keys[5][0] ^= 0xff
	if out[5][0] == keys[5][0] {
		t.Fatal("a copy changed with the caller's key")
	}
	want := string(out[6])
	_ = append(out[5], "overwrite"...)
	if string(out[6]) != want {
		t.Fatalf("append to one copy wrote over the next: %q, want %q", out[6], want)
	}
}

// Strings names each key by its bytes.
func TestStrings(t *testing.T) {
	keys := batch()
	out := Strings(keys)
	for i := range keys {
		if out[i] != string(keys[i]) {
			t.Fatalf("string %d = %q, want %q", i, out[i], keys[i])
		}
	}
	keys[7][0] ^= 0xff
	if out[7] == string(keys[7]) {
		t.Fatal("a string changed with the caller's key")
	}
}

// Both allocate twice a batch, whatever its size.
func TestAllocations(t *testing.T) {
	keys := batch()
	if n := testing.AllocsPerRun(50, func() { Clone(keys) }); n != 2 {
		t.Errorf("Clone: %v allocations for %d keys, want 2", n, len(keys))
	}
	if n := testing.AllocsPerRun(50, func() { Strings(keys) }); n != 2 {
		t.Errorf("Strings: %v allocations for %d keys, want 2", n, len(keys))
	}
}

// An arena's copies hold the keys' bytes, are not the caller's memory,
// are never written over by later copies, and cost an allocation a block
// (a key past a block's size has one of its own).
func TestArena(t *testing.T) {
	var a Arena
	keys := batch()
	var got, want [][]byte
	for range 100 {
		for _, k := range keys {
			got, want = append(got, a.Copy(k)), append(want, bytes.Clone(k))
		}
		keys[4][0]++ // the caller reuses its memory
	}
	for i, g := range got {
		if !bytes.Equal(g, want[i]) {
			t.Fatalf("copy %d = %q, want %q", i, g, want[i])
		}
	}
	big := bytes.Repeat([]byte("k"), arenaBlock+1)
	if g := a.Copy(big); !bytes.Equal(g, big) {
		t.Fatal("a key past a block's size not copied whole")
	}
	k := []byte("layer/3/block/12345")
	if n := testing.AllocsPerRun(1000, func() { a.Copy(k) }); n > 0.01 {
		t.Errorf("%v allocations a copy of %d bytes, want about 1 per %d bytes", n, len(k), arenaBlock)
	}
}
