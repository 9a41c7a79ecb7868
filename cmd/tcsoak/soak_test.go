package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDurableCheck: acknowledged slots whose bytes are in the file pass, a
// slot overwritten with other bytes is lost, an uncertain one is skipped.
func TestDurableCheck(t *testing.T) {
	dir := t.TempDir()
	du := &durable{path: filepath.Join(dir, "durable.bin"), acked: map[int64]uint32{}, uncertain: map[int64]bool{}}
	buf := make([]byte, 4*durSlot)
	for slot, seed := range []uint32{11, 12, 13, 14} {
		durPattern(buf[slot*durSlot:(slot+1)*durSlot], seed)
		du.acked[int64(slot)] = seed
	}
	durPattern(buf[1*durSlot:2*durSlot], 99) // slot 1 lost its acknowledged write
	durPattern(buf[3*durSlot:4*durSlot], 98) // slot 3 had a write out: either version
	du.uncertain[3] = true
	if err := os.WriteFile(du.path, buf, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := du.check(); err != nil {
		t.Fatal(err)
	}
	if du.checked != 3 || du.lost != 1 || len(du.lostAt) != 1 || !strings.Contains(du.lostAt[0], "slot 1") {
		t.Fatalf("checked %d, lost %d %v; want 3 checked, slot 1 lost", du.checked, du.lost, du.lostAt)
	}
}

// TestExcused: a late call to a daemon overlapping its stop window is
// excused; one to the other daemon, or outside the window, is a hang.
func TestExcused(t *testing.T) {
	t0 := time.Now()
	ws := []window{{daemon: "b", start: t0, end: t0.Add(5 * time.Second)}}
	onB, onA := &proc{d: &daemon{name: "b"}}, &proc{d: &daemon{name: "a"}}
	during := lateOp{Start: t0.Add(time.Second).UnixMilli(), End: t0.Add(12 * time.Second).UnixMilli()}
	later := lateOp{Start: t0.Add(30 * time.Second).UnixMilli(), End: t0.Add(45 * time.Second).UnixMilli()}
	if !excused(ws, onB, during) {
		t.Error("a call to b while b was stopped is not excused")
	}
	if excused(ws, onA, during) {
		t.Error("a call to a is excused by b's stop")
	}
	if excused(ws, onB, later) {
		t.Error("a call to b long after its stop is excused")
	}
}

func TestCompare(t *testing.T) {
	before := usage{FDs: 20, Goroutines: 20, Segments: 1, RSSKiB: 100 << 10}
	if got := compare("a", before, before); len(got) != 0 {
		t.Fatalf("no change reported as leaks: %v", got)
	}
	kept := before
	kept.PoolUsed, kept.StoreL1 = 1<<20, 1<<20
	if got := compare("a", before, kept); len(got) != 0 {
		t.Fatalf("pool bytes the store's values hold reported as leaks: %v", got)
	}
	after := before
	after.FDs, after.Segments, after.PoolUsed, after.StoreL1 = 40, 2, 3<<20, 1<<20
	after.StorePins, after.StoreRsv = 1, 2
	got := strings.Join(compare("a", before, after), "\n")
	for _, want := range []string{"open fds", "segments", "pool bytes held for clients", "store pins", "store reservations"} {
		if !strings.Contains(got, want) {
			t.Errorf("leak of %s not reported: %s", want, got)
		}
	}
}

// TestPutLogSnapshot: a durable put acknowledged and never removed must be
// read back; one whose remove was sent may be gone; one whose remove was
// acknowledged must stay gone; a line being written is not read.
func TestPutLogSnapshot(t *testing.T) {
	dir := t.TempDir()
	l, err := openPutLog(dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	l.put([]byte("k/kept"), 5)
	l.put([]byte("k/sent"), 6)
	l.put([]byte("k/gone"), 7)
	l.removing([][]byte{[]byte("k/sent"), []byte("k/gone")})
	l.removed([][]byte{[]byte("k/sent"), []byte("k/gone")}, []error{errStop, nil})
	// BUSY answers say nothing of a key's state, logged or not.
	l.busy("remove", []byte("k/kept"), time.Now())
	l.busy("remove", []byte("k/other"), time.Now())
	if _, err := l.f.WriteString("P k/half 9"); err != nil { // no newline yet
		t.Fatal(err)
	}
	l.f.Close()
	pc := &putCheck{dir: dir}
	snap, removed, err := pc.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if st := snap["k/kept"]; !st.put || st.removing || st.seed != 5 {
		t.Fatalf("k/kept: %+v, want an acknowledged put of seed 5", st)
	}
	if st := snap["k/sent"]; !st.removing || st.removed {
		t.Fatalf("k/sent: %+v, want a remove sent and not acknowledged", st)
	}
	if st := snap["k/gone"]; !st.removed || len(removed) != 1 || string(removed[0]) != "k/gone" {
		t.Fatalf("k/gone: %+v, removed %q; want it removed", st, removed)
	}
	if _, ok := snap["k/half"]; ok || len(snap) != 3 {
		t.Fatalf("a line without its newline was read: %v", snap)
	}
}

// TestBusyDuringReads: a BUSY answer the put log records is the
// read-back's doing only for a key a read-back call was reading at the
// time (from its start to a second after its answer); the others are the
// store's, and named.
func TestBusyDuringReads(t *testing.T) {
	dir := t.TempDir()
	l, err := openPutLog(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.UnixMilli(time.Now().UnixMilli())
	reads := []readSpan{{keys: map[string]bool{"k/1": true, "k/2": true}, start: t0, end: t0.Add(200 * time.Millisecond)}}
	l.busy("remove", []byte("k/1"), t0.Add(100*time.Millisecond))           // during the read of k/1
	l.busy("remove", []byte("k/2"), t0.Add(200*time.Millisecond+busySlack)) // its answer's slack, still
	l.busy("remove", []byte("k/3"), t0.Add(100*time.Millisecond))           // a key it did not read
	l.busy("remove", []byte("k/1"), t0.Add(-time.Millisecond))              // before the read
	l.busy("put", []byte("k/2"), t0.Add(200*time.Millisecond+2*busySlack))  // long after
	l.put([]byte("k/1"), 4)
	l.f.Close()
	bs, err := busyAnswers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 5 || bs[0].key != "k/1" || !bs[0].at.Equal(t0.Add(100*time.Millisecond)) {
		t.Fatalf("busy answers read back: %+v", bs)
	}
	during, other := busyDuringReads(bs, reads)
	if during != 2 || len(other) != 3 || other[0].key != "k/3" || other[1].key != "k/1" || other[2].key != "k/2" {
		t.Fatalf("during %d, other %+v; want k/1 and k/2 during, k/3, the early k/1 and the late k/2 not", during, other)
	}
	r := Report{Codes: map[string]uint64{kindStore + "/BUSY": 2}, BusyDuringReadBack: 2}
	if !r.Clean() {
		t.Fatal("a soak whose only BUSY answers came during its read-back is not clean")
	}
	r.Codes[kindStore+"/BUSY"] = 3
	if r.Clean() {
		t.Fatal("a soak with a BUSY answer counted and not logged is clean")
	}
	r.Codes[kindStore+"/BUSY"], r.BusyOther = 2, []string{"a: k/9 at 05:00:00.000"}
	if r.Clean() {
		t.Fatal("a soak with a BUSY answer of the store's own doing is clean")
	}
}

// TestXValue: an xstore value is its key's alone (the same key gives the
// same bytes, another key other bytes from the first word on), so a get
// that answered another key's value, or a stale block's, is caught.
func TestXValue(t *testing.T) {
	a, a2, b := make([]byte, xstoreVLen), make([]byte, xstoreVLen), make([]byte, xstoreVLen)
	ka := xkey(nil, "c-3", 17, 0)
	xvalue(a, ka)
	xvalue(a2, xkey(nil, "c-3", 17, 0))
	if string(a) != string(a2) {
		t.Fatal("the same key gave two values")
	}
	for _, kb := range [][]byte{xkey(nil, "c-3", 17, 1), xkey(nil, "c-3", 18, 0), xkey(nil, "d-3", 17, 0)} {
		xvalue(b, kb)
		if string(a[:8]) == string(b[:8]) {
			t.Fatalf("%s and %s share their first word", ka, kb)
		}
		for k := 8; k < len(a); k += 8 {
			if string(a[k:k+8]) == string(b[k:k+8]) {
				t.Fatalf("%s and %s share word %d", ka, kb, k/8)
			}
		}
	}
}

// TestPickWriter: a reader on c picks only d's writers, with the record
// the writer wrote last, and none before any has written.
func TestPickWriter(t *testing.T) {
	dir := t.TempDir()
	w := &worker{peer: "d", dir: dir, rng: rand.New(rand.NewPCG(1, 2))}
	if _, ok := w.pickWriter(); ok {
		t.Fatal("picked a writer before any wrote")
	}
	at := time.UnixMilli(time.Now().Add(-2 * xstoreGoneAfter).UnixMilli())
	for _, e := range []struct {
		me             string
		round, removed int
	}{{"c-1", 5, -1}, {"d-2", 7, -1}, {"d-2", 9, 3}} {
		wr := &worker{dir: dir}
		if e.removed >= 0 {
			wr.removals.add(e.removed, at)
		}
		if err := wr.writeRound(e.me, e.round); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		got, ok := w.pickWriter()
		if want := (writer{name: "d-2", last: 9, removed: 3, removedAt: at}); !ok || got != want {
			t.Fatalf("picked %+v (%v); want %+v", got, ok, want)
		}
	}
}

// TestRemovalsSettle: a writer's record names its newest removal at least
// xstoreGoneAfter old, not its newest, which a writer that removes a round
// every round always has younger than that.
func TestRemovalsSettle(t *testing.T) {
	var r removals
	t0 := time.Unix(1000, 0)
	check := func(now time.Duration, want int) {
		t.Helper()
		got, at := r.settled(t0.Add(now))
		if got != want {
			t.Fatalf("at %v: settled round %d, want %d", now, got, want)
		}
		if got >= 0 && t0.Add(now).Sub(at) < xstoreGoneAfter {
			t.Fatalf("at %v: round %d removed at %v, under %v before", now, got, at.Sub(t0), xstoreGoneAfter)
		}
	}
	check(0, -1)
	for i := range 10 { // a round removed every 200 ms
		r.add(i, t0.Add(time.Duration(i)*200*time.Millisecond))
	}
	check(900*time.Millisecond, -1)
	check(1100*time.Millisecond, 0)
	check(1500*time.Millisecond, 2)
	check(1500*time.Millisecond, 2) // asked again: the same
	check(5*time.Second, 9)
	if len(r.q) != 1 {
		t.Fatalf("%d removals kept after the last settled, want 1", len(r.q))
	}
	for i := range maxRemovals + 5 { // none old enough: bounded
		r.add(100+i, t0.Add(time.Hour))
	}
	if len(r.q) != maxRemovals {
		t.Fatalf("%d removals kept, want at most %d", len(r.q), maxRemovals)
	}
}

// TestNearApart: a removed key found again is excused when c and d were
// apart from apartGrace before the removal to the get's answer, and not
// otherwise.
func TestNearApart(t *testing.T) {
	t0 := time.UnixMilli(time.Now().UnixMilli()) // as the reports carry it
	ws := []window{{daemon: "d", start: t0, end: t0.Add(5 * time.Second), fault: "link cut"}}
	at := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	cases := []struct {
		name    string
		x       servedOp
		excused bool
		after   time.Duration // sent this long after they were together again
	}{
		{"removed while apart", servedOp{RemovedAt: at(2 * time.Second), Start: at(4 * time.Second), End: at(4100 * time.Millisecond)}, true, 0},
		{"removed soon after", servedOp{RemovedAt: at(8 * time.Second), Start: at(10 * time.Second), End: at(10100 * time.Millisecond)}, true, 5 * time.Second},
		{"apart during the get", servedOp{RemovedAt: at(-3 * time.Second), Start: at(-time.Second), End: at(time.Second)}, true, 0},
		{"long after", servedOp{RemovedAt: at(5*time.Second + apartGrace + time.Second), Start: at(30 * time.Second), End: at(31 * time.Second)}, false, 0},
		{"long before", servedOp{RemovedAt: at(-30 * time.Second), Start: at(-20 * time.Second), End: at(-19 * time.Second)}, false, 0},
	}
	for _, c := range cases {
		got, after, fault := nearApart(ws, c.x)
		if got != c.excused || after != c.after {
			t.Errorf("%s: excused %v, %v after; want %v, %v after", c.name, got, after, c.excused, c.after)
		}
		if want := map[bool]string{true: "link cut"}[c.excused]; fault != want {
			t.Errorf("%s: near the fault %q, want %q", c.name, fault, want)
		}
	}
}

// TestWorkDirMustBeNew: a working directory given is absent or empty; one
// an earlier run left is refused, naming what is there.
func TestWorkDirMustBeNew(t *testing.T) {
	dir := t.TempDir()
	if err := emptyDir(filepath.Join(dir, "new")); err != nil {
		t.Fatalf("an absent directory: %v", err)
	}
	if err := emptyDir(dir); err != nil {
		t.Fatalf("an empty directory: %v", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := emptyDir(dir); err == nil || !strings.Contains(err.Error(), "not empty") || !strings.Contains(err.Error(), "a first") {
		t.Fatalf("a directory an earlier run left: %v, want refused naming its first entry", err)
	}
}
