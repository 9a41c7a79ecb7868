// Package keyblock copies a batch of keys in one allocation, not one per
// key: the store's and the cluster's per-batch paths (a fetch's keys, a
// hold's readers, a pin's keys) name hundreds of keys a call, and an
// allocation each is most of what such a call allocates.
//
// The copies share their block, so any one kept keeps the whole batch's:
// use them where the batch's own life bounds theirs, and copy a key on
// its own (strings.Clone, bytes.Clone) where it outlives the batch.
package keyblock

import "strings"

// Clone copies keys into one block. Each copy's capacity is its length:
// an append to one never writes over the next.
func Clone(keys [][]byte) [][]byte {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		buf = append(buf, k...)
		out[i] = buf[len(buf)-len(k) : len(buf) : len(buf)]
	}
	return out
}

// Strings returns keys as strings made in one block.
func Strings(keys [][]byte) []string {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	var b strings.Builder
	b.Grow(n)
	for _, k := range keys {
		b.Write(k)
	}
	all := b.String()
	out := make([]string, len(keys))
	at := 0
	for i, k := range keys {
		out[i] = all[at : at+len(k)]
		at += len(k)
	}
	return out
}

// arenaBlock is the size of an Arena's blocks: about 400 keys of 40
// bytes an allocation.
const arenaBlock = 16 << 10

// Arena copies keys one at a time into shared blocks, for a queue that
// takes keys one call at a time and lets them go a batch at a time: a key
// costs an allocation only when a block fills. A copy is never written
// over (the next goes past its end), and keeps its block alive. The zero
// value is ready; it is not safe for concurrent use.
type Arena struct {
	buf []byte
}

// Copy returns a copy of k in the arena (capacity its length).
func (a *Arena) Copy(k []byte) []byte {
	if cap(a.buf)-len(a.buf) < len(k) {
		a.buf = make([]byte, 0, max(arenaBlock, len(k)))
	}
	a.buf = append(a.buf, k...)
	return a.buf[len(a.buf)-len(k) : len(a.buf) : len(a.buf)]
}
