package tcp

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// countedEntry is a dueHeap entry that counts how often its due time is
// read.
type countedEntry struct {
	due   int64
	slot  int32
	reads *int
}

func (e *countedEntry) dueAt() int64    { *e.reads++; return e.due }
func (e *countedEntry) dueSlot() *int32 { return &e.slot }

// TestDueHeap: random pushes and removals against a sorted reference; the
// minimum is always the earliest entry, every slot names its entry's
// index, removal of an entry not in the heap does nothing, and looking
// for what is due reads one entry when nothing is.
func TestDueHeap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	reads := 0
	var h dueHeap[*countedEntry]
	in := map[*countedEntry]bool{}
	all := make([]*countedEntry, 500)
	for i := range all {
		all[i] = &countedEntry{due: rng.Int64N(1000), reads: &reads}
	}
	check := func() {
		t.Helper()
		if h.len() != len(in) {
			t.Fatalf("heap holds %d, reference %d", h.len(), len(in))
		}
		for i, e := range h.es {
			if int(e.slot) != i+1 || !in[e] {
				t.Fatalf("entry at %d has slot %d (in reference: %v)", i, e.slot, in[e])
			}
		}
		if h.len() == 0 {
			return
		}
		least := int64(math.MaxInt64)
		for e := range in {
			least = min(least, e.due)
		}
		if h.min().due != least {
			t.Fatalf("min %d, want %d", h.min().due, least)
		}
	}
	for step := 0; step < 20000; step++ {
		e := all[rng.IntN(len(all))]
		switch {
		case in[e]:
			if !h.remove(e) {
				t.Fatal("remove of an entry in the heap failed")
			}
			delete(in, e)
			if e.slot != 0 {
				t.Fatalf("removed entry keeps slot %d", e.slot)
			}
		case rng.IntN(4) == 0:
			if h.remove(e) {
				t.Fatal("remove of an entry not in the heap succeeded")
			}
		default:
			e.due = rng.Int64N(1000)
			h.push(e)
			in[e] = true
		}
		check()
	}
	// Popping in order yields the reference sorted.
	var want []int64
	for e := range in {
		want = append(want, e.due)
	}
	slices.Sort(want)
	for i := 0; h.len() > 0; i++ {
		e := h.min()
		if e.due != want[i] {
			t.Fatalf("pop %d: %d, want %d", i, e.due, want[i])
		}
		h.remove(e)
	}
	// Nothing due: one look at the minimum, however many entries wait.
	for _, e := range all {
		e.due = 1000 + rng.Int64N(1000)
		h.push(e)
	}
	reads = 0
	if now := int64(999); h.min().dueAt() <= now {
		t.Fatal("an entry is due early")
	}
	if reads != 1 {
		t.Fatalf("looking for due entries read %d entries", reads)
	}
	h.reset()
	for _, e := range all {
		if e.slot != 0 {
			t.Fatal("reset left a slot set")
		}
	}
}

// TestExpireLocked: the reaper's decisions on one connection's due
// requests. A notification past its deadline is taken out alone; a request
// past RequestTimeout dooms the connection; a data request past its task's
// deadline dooms it only when the connection has been silent for
// stallGrace, and is otherwise looked at again later; requests not yet
// due are not touched.
func TestExpireLocked(t *testing.T) {
	const rt = 30 * time.Second
	base := time.Now().UnixNano()
	type req struct {
		kind     pendKind
		sent     int64 // offset from base
		deadline int64 // notification deadline or task deadline, offset from base
	}
	cases := []struct {
		name  string
		reqs  []req
		now   int64 // offset from base
		quiet int64 // offset from base: the last traffic the reaper saw
		// wantWhy is part of the drop reason ("" none); wantLate the
		// notifications taken out; wantLeft the requests left in the table.
		wantWhy  string
		wantLate int
		wantLeft int
	}{
		{"nothing due", []req{{pkWrite, 0, int64(time.Hour)}, {pkNotify, 0, int64(time.Hour)}}, int64(time.Second), 0, "", 0, 2},
		{"notification past its deadline", []req{{pkNotify, 0, int64(time.Second)}, {pkRead, 0, int64(time.Hour)}},
			int64(2 * time.Second), int64(2 * time.Second), "", 1, 1},
		{"no answer within RequestTimeout", []req{{pkOpen, 0, 0}}, int64(rt) + 1, int64(rt), "no answer within", 0, 1},
		{"data past its deadline on a silent connection", []req{{pkWrite, 0, int64(time.Second)}},
			int64(time.Second + stallGrace + 1), 0, "nothing received", 0, 1},
		{"data past its deadline on a connection that answers", []req{{pkWrite, 0, int64(time.Second)}},
			int64(time.Second + stallGrace + 1), int64(time.Second + stallGrace), "", 0, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{cfg: Config{RequestTimeout: rt}}
			c := &conn{n: n, reqs: make(map[uint64]*pending), quiet: base}
			var pds []*pending
			for i, r := range tc.reqs {
				pd := &pending{kind: r.kind, id: uint64(i + 1), sent: base + r.sent}
				if r.kind == pkNotify {
					pd.deadline = base + r.deadline
				} else if pd.isData() {
					pd.ts = &taskState{deadline: base + r.deadline}
				}
				c.addLocked(pd)
				pds = append(pds, pd)
			}
			c.quiet = base + tc.quiet
			before := make([]int64, len(pds))
			for i, pd := range pds {
				before[i] = pd.due
			}
			now := base + tc.now
			late, why := c.expireLocked(now, nil)
			if (tc.wantWhy == "") != (why == "") || !strings.Contains(why, tc.wantWhy) {
				t.Fatalf("drop reason %q, want one with %q", why, tc.wantWhy)
			}
			if len(late) != tc.wantLate || len(c.reqs) != tc.wantLeft {
				t.Fatalf("late %d, left %d; want %d, %d", len(late), len(c.reqs), tc.wantLate, tc.wantLeft)
			}
			for _, pd := range late {
				if _, ok := c.timedOut[pd.id]; !ok || pd.dslot != 0 {
					t.Fatalf("expired notification %d: remembered %v, slot %d", pd.id, ok, pd.dslot)
				}
			}
			if c.due.len() != len(c.reqs) {
				t.Fatalf("due heap %d, table %d", c.due.len(), len(c.reqs))
			}
			for i, pd := range pds {
				if c.reqs[pd.id] == nil {
					continue
				}
				if why == "" && pd.due <= now {
					t.Fatalf("request %d left due at %d, now %d: the next tick would spin on it", pd.id, pd.due-base, tc.now)
				}
				if before[i] > now && pd.due != before[i] {
					t.Fatalf("request %d was not due and was touched", pd.id)
				}
			}
		})
	}
}

// TestDueForFarDeadlines: deadlines near the end of time do not wrap into
// the past.
func TestDueForFarDeadlines(t *testing.T) {
	n := &Node{cfg: Config{RequestTimeout: time.Duration(math.MaxInt64)}}
	c := &conn{n: n, reqs: make(map[uint64]*pending)}
	pd := &pending{kind: pkWrite, id: 1, sent: time.Now().UnixNano(), ts: &taskState{deadline: math.MaxInt64 - 5}}
	c.addLocked(pd)
	if pd.due < pd.sent {
		t.Fatalf("due %d before sent %d", pd.due, pd.sent)
	}
	if late, why := c.expireLocked(time.Now().UnixNano(), nil); len(late) != 0 || why != "" {
		t.Fatalf("expired: %d late, %q", len(late), why)
	}
}
