package tcp

// dueEntry is an element of a dueHeap: it tells its due time and keeps the
// heap's index of it, so that it can be taken out from anywhere in
// O(log n) when it ends before it is due.
type dueEntry interface {
	comparable
	// dueAt is when the entry is due (unix ns). It must not change while
	// the entry is in a heap (take it out, change it, push it again).
	dueAt() int64
	// dueSlot is where the heap keeps 1 + the entry's index; 0 while the
	// entry is in no heap, so a zeroed (pooled) entry is out of every heap.
	dueSlot() *int32
}

// dueHeap is a min-heap of entries by due time. The reaper looks only at
// its minimum, and pops only what is due, so its work is proportional to
// what expires rather than to what is outstanding. The zero value is an
// empty heap; it is not safe for concurrent use (each heap says which lock
// guards it). Its slice is kept across uses, so the steady state does not
// allocate.
type dueHeap[E dueEntry] struct{ es []E }

func (h *dueHeap[E]) len() int { return len(h.es) }

// min returns the entry due first; the heap must not be empty.
func (h *dueHeap[E]) min() E { return h.es[0] }

// push adds e, which must be in no heap.
func (h *dueHeap[E]) push(e E) {
	h.es = append(h.es, e)
	i := len(h.es) - 1
	*e.dueSlot() = int32(i + 1)
	h.up(i)
}

// remove takes e out of the heap; it reports false (and does nothing) when
// e is not in it.
func (h *dueHeap[E]) remove(e E) bool {
	s := *e.dueSlot()
	if s <= 0 || int(s) > len(h.es) || h.es[s-1] != e {
		return false
	}
	i, last := int(s-1), len(h.es)-1
	if i != last {
		h.swap(i, last)
	}
	var zero E
	h.es[last] = zero
	h.es = h.es[:last]
	*e.dueSlot() = 0
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	return true
}

// reset empties the heap, marking every entry as out of it.
func (h *dueHeap[E]) reset() {
	var zero E
	for i, e := range h.es {
		*e.dueSlot() = 0
		h.es[i] = zero
	}
	h.es = h.es[:0]
}

func (h *dueHeap[E]) less(i, j int) bool { return h.es[i].dueAt() < h.es[j].dueAt() }

func (h *dueHeap[E]) swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	*h.es[i].dueSlot() = int32(i + 1)
	*h.es[j].dueSlot() = int32(j + 1)
}

func (h *dueHeap[E]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h *dueHeap[E]) down(i int) bool {
	i0, n := i, len(h.es)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > i0
}
