package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
)

// keyHomedOn is a key with prefix whose home is id under f's daemons.
func keyHomedOn(f *fakeNet, from *fakeNode, prefix, id string) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s/%d", prefix, i)
		if from.c.Home([]byte(k)) == id {
			return k
		}
	}
}

// removeOn removes key on n and returns its code and error.
func removeOn(t *testing.T, n *fakeNode, key string) (store.Code, error) {
	t.Helper()
	codes, errs := make([]store.Code, 1), make([]error, 1)
	if pending, err := n.st.Remove([][]byte{[]byte(key)}, codes, errs, nil, 0); err != nil || pending {
		t.Fatalf("remove %s on %s: pending %v, %v", key, n.id, pending, err)
	}
	return codes[0], errs[0]
}

// TestRemoveNotOKWhenHomeUnreachable: a remove whose key's home does not
// take the removal (it is down) does not answer OK: the other copies may
// remain, and the caller is told so (UNAVAILABLE, naming the home), not
// that the key is gone everywhere. Once the home is back, the same remove
// answers OK and the copies go.
func TestRemoveNotOKWhenHomeUnreachable(t *testing.T) {
	ids := []string{"a", "b", "h"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	a, b, h := f.node("a"), f.node("b"), f.node("h")
	key := keyHomedOn(f, a, "rm/home", "h")
	v := value(key, 4096)
	b.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"b"}) }, "b's copy announced")
	h.down.Store(true)
	code, err := removeOn(t, a, key)
	if code != store.Unavailable || !errors.Is(err, ErrHomeUnreachable) {
		t.Fatalf("remove with the home down: code %v, %v; want UNAVAILABLE naming the home", code, err)
	}
	if got, err := b.read(key, len(v)); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("b's copy: %d bytes, %v (it stays while its removal is not taken)", len(got), err)
	}
	h.down.Store(false)
	for _, n := range []*fakeNode{a, b, h} {
		n.c.probe() // the members see h back (no prober runs in this test)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		code, _ := removeOn(t, a, key)
		return code == store.OK
	}, "the remove taken once the home is back")
	testutil.Eventually(t, 10*time.Second, func() bool { _, err := b.read(key, len(v)); return err != nil }, "b's copy removed")
}

// readHeldAt starts r's read of key (value v) from holder h and returns
// once h holds it for r and its bytes wait (f.holdReads; the caller
// releases them). The channel gets the read's end: nil for the exact
// bytes.
func readHeldAt(t *testing.T, f *fakeNet, r, h *fakeNode, key string, v []byte) <-chan error {
	t.Helper()
	f.holdReads()
	got := make(chan error, 1)
	go func() {
		b, err := r.read(key, len(v))
		if err == nil && !bytes.Equal(b, v) {
			err = fmt.Errorf("%d bytes that are not the value", len(b))
		}
		got <- err
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return f.inflightNow() == 1 && h.c.Holds() == 1 }, "%s's read held at %s", r.id, h.id)
	return got
}

// TestFetchRacingRemove: a reader r fetches a key from its holder h; while
// the bytes are on their way (r holds h's copy), another daemon removes
// the key. The removal is answered OK; h's copy, pinned by r's read, goes
// when the read ends; r's copy, committed after the removal, is answered
// "removed" by the home when r announces it. Afterwards no daemon reads
// the key.
func TestFetchRacingRemove(t *testing.T) {
	ids := []string{"h", "r", "x"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	h, r, x := f.node("h"), f.node("r"), f.node("x")
	const key = "race/key"
	v := value(key, 8192)
	h.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "h's copy announced")

	got := readHeldAt(t, f, r, h, key, v)
	if code, err := removeOn(t, x, key); code != store.OK {
		t.Fatalf("remove on x: %v, %v", code, err)
	}
	f.releaseReads()
	if err := <-got; err != nil {
		t.Logf("r's read, racing the removal: %v", err) // the bytes or a miss are both right
	}
	for _, n := range []*fakeNode{h, r, x} {
		testutil.Eventually(t, 10*time.Second, func() bool { _, err := n.read(key, len(v)); return err != nil },
			"%s no longer reading the removed key (r %+v)", n.id, testutil.Lazy(r.c.Stats))
	}
	if _, hs, err := x.c.Locate([]byte(key)); err != nil || len(hs) != 0 {
		t.Errorf("its home knows holders %+v (%v), want none", hs, err)
	}
}

// TestFetchedCopyDroppedUnannounced: a reader's copy of a remote hit whose
// announcement its home does not take (the home is away) is dropped: a
// copy its home does not know of would outlive a removal. A value put
// there is kept (it is re-announced later).
func TestFetchedCopyDroppedUnannounced(t *testing.T) {
	ids := []string{"m", "r"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	m, r := f.node("m"), f.node("r")
	fetched := keyHomedOn(f, r, "unannounced/fetched", "m")
	put := keyHomedOn(f, r, "unannounced/put", "m")
	for _, k := range []string{fetched, put} {
		r.put(t, k, value(k, 4096))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"r"}) }, "%s announced", k)
	}
	m.down.Store(true)
	var es []entry
	for _, k := range []string{fetched, put} {
		tier := TierL1
		if k == fetched {
			tier |= tierFetched // as if r had fetched it
		}
		es = append(es, entry{key: []byte(k), tier: tier, size: 4096, crc: store.CRC(value(k, 4096))})
	}
	if failed := r.c.announce(es); failed != 2 {
		t.Fatalf("%d announcements failed, want both (the home is away)", failed)
	}
	if c := r.here(t, fetched); c != store.NotFound {
		t.Errorf("the fetched copy whose announcement failed: %v, want dropped", c)
	}
	if c := r.here(t, put); c != store.OK {
		t.Errorf("the value put here whose announcement failed: %v, want kept", c)
	}
}

// TestFetchedCopyUnseenUntilItsHomeTakesIt: a reader's copy of a remote
// hit is served to no reader there until the key's home has taken its
// announcement. A removal the home takes meanwhile cannot name that copy;
// were it served, a removed key would be read until the announcement got
// through (slow announcements from a daemon back from a restart did just
// that). Once through, the removed key's copy is answered "removed" and
// goes, and the other copy is served there.
func TestFetchedCopyUnseenUntilItsHomeTakesIt(t *testing.T) {
	ids := []string{"m", "h", "r"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	m, h, r := f.node("m"), f.node("h"), f.node("r")
	removed := keyHomedOn(f, r, "unseen/removed", "m")
	kept := keyHomedOn(f, r, "unseen/kept", "m")
	for _, k := range []string{removed, kept} {
		h.put(t, k, value(k, 4096))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h"}) }, "%s announced", k)
	}
	release := f.holdKind(t, "r", kindAnnounceAges)
	for _, k := range []string{removed, kept} {
		if got, err := r.read(k, 4096); err != nil || !bytes.Equal(got, value(k, 4096)) {
			t.Fatalf("r's read of %s: %d bytes, %v", k, len(got), err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return f.heldKinds() > 0 }, "r's announcements on their way")
	for _, k := range []string{removed, kept} {
		if c := r.here(t, k); c != store.NotFound {
			t.Fatalf("r's copy of %s before its home took it: %v, want unseen (NOT_FOUND)", k, c)
		}
	}
	if code, err := removeOn(t, h, removed); code != store.OK {
		t.Fatalf("remove on h: %v, %v", code, err)
	}
	if got, err := r.read(removed, 4096); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed key read on r, its copy's announcement not yet taken: %d bytes, %v; want a miss", len(got), err)
	}
	if got, err := r.read(kept, 4096); err != nil || !bytes.Equal(got, value(kept, 4096)) {
		t.Fatalf("r's read of %s again: %d bytes, %v", kept, len(got), err)
	}
	release()
	testutil.Eventually(t, 10*time.Second, func() bool { return r.here(t, kept) == store.OK }, "r's copy of %s served there", kept)
	testutil.Eventually(t, 10*time.Second, func() bool { return !r.st.HeldHere([]byte(removed)) }, "r's copy of the removed key dropped")
	if got, err := r.read(removed, 4096); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the removed key read on r: %d bytes, %v", len(got), err)
	}
	if _, hs, err := m.c.Locate([]byte(removed)); err != nil || len(hs) != 0 {
		t.Errorf("the removed key's home knows holders %+v (%v), want none", hs, err)
	}
	if st := r.st.Stats(); st.Confirmed != 1 || st.Unseen != 2 {
		t.Errorf("r's store: %d copies stored unseen, %d confirmed; want 2 (the second read of the kept key found its copy), 1", st.Unseen, st.Confirmed)
	}
}

// TestEveryHolderGoneIsAMiss: a key whose every holder the home names no
// longer has it (the home not yet told of their evictions) is a miss
// (NOT_FOUND), not a failure (UNAVAILABLE): nobody failed to give it.
func TestEveryHolderGoneIsAMiss(t *testing.T) {
	f := newNet(t, []string{"a", "b", "c"}, Config{})
	a, b := f.node("a"), f.node("b")
	const key = "gone/1"
	a.put(t, key, value(key, 5000))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a"}) },
		"the home indexing a's copy")
	// a drops its copy without telling the home.
	a.st.SetRemote(nil)
	codes := make([]store.Code, 1)
	if _, err := a.st.Remove([][]byte{[]byte(key)}, codes, nil, nil, 0); err != nil || codes[0] != store.OK {
		t.Fatalf("remove on a: %v %v", err, codes[0])
	}
	a.st.SetRemote(a.c)
	if !slices.Equal(f.holders(key), []string{"a"}) {
		t.Fatalf("the home heard of the removal: holders %v", f.holders(key))
	}
	_, err := b.read(key, 5000)
	if !errors.Is(err, store.ErrNotFound) || errors.Is(err, ErrHolderFailed) {
		t.Fatalf("read of a key no holder has: %v, want a miss", err)
	}
}

// TestRemovedWhilePinned: a key removed on a while a client of its holder
// h pins it is gone at once everywhere, h's own clients included: no get,
// exists, lookup_prefix or pin on h finds it, no other daemon reads it
// from h, h does not re-announce it, however long the pin lasts (past the
// tombstone TTL many times over). The pin's bytes stay exact until it goes,
// which frees them. A put of the key on h meanwhile is a new value that
// every daemon reads, while the old pin still reads the old bytes.
func TestRemovedWhilePinned(t *testing.T) {
	const ttl = 20 * time.Millisecond
	ids := []string{"a", "h", "x"}
	f := newNet(t, ids, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour, TombstoneTTL: ttl})
	a, h, x := f.node("a"), f.node("h"), f.node("x")
	key := keyHomedOn(f, a, "rm/pinned", "x")
	other := keyHomedOn(f, a, "rm/other", "x")
	v := value(key, 4096)
	for _, k := range []string{key, other} {
		h.put(t, k, value(k, 4096))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"h"}) }, "%s announced", k)
	}
	blocks := h.pool.Stats().Blocks
	ss := h.st.NewSession()
	defer ss.Close()
	codes := make([]store.Code, 1)
	locs := make([]store.Location, 1)
	if err := ss.GetHere([][]byte{[]byte(key)}, locs, codes, nil); err != nil || codes[0] != store.OK {
		t.Fatalf("get (a pin) on h: %v %v", err, codes[0])
	}
	if err := ss.Pin([][]byte{[]byte(key)}, 0, codes); err != nil || codes[0] != store.OK {
		t.Fatalf("pin on h: %v %v", err, codes[0])
	}
	pinned := func() []byte { return h.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length] }
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("remove on a: %v %v", code, err)
	}
	removed := time.Now()
	if n, hid := h.c.Stats().GonePinned, h.st.Stats().Hidden; n != 0 || hid != 1 {
		t.Fatalf("h keeps %d removed keys to drop later and %d hidden; want 0, 1", n, hid)
	}
	hidden := func(when string) {
		t.Helper()
		// h's own clients do not find it.
		if c := h.here(t, key); c != store.NotFound {
			t.Fatalf("%s: a get on h finds the removed key: %v", when, c)
		}
		probe := h.st.NewSession()
		defer probe.Close()
		if err := h.st.Exists([][]byte{[]byte(key)}, codes); err != nil || codes[0] != store.NotFound {
			t.Fatalf("%s: exists on h: %v %v, want NOT_FOUND", when, codes[0], err)
		}
		if n, err := probe.LookupPrefix([][]byte{[]byte(key)}, true); err != nil || n != 0 {
			t.Fatalf("%s: lookup_prefix with pin on h: %d %v, want 0", when, n, err)
		}
		if err := probe.Pin([][]byte{[]byte(key)}, 0, codes); err == nil || codes[0] != store.NotFound {
			t.Fatalf("%s: pin on h: %v %v, want NOT_FOUND", when, codes[0], err)
		}
		if got, err := h.read(key, len(v)); err == nil {
			t.Fatalf("%s: a read on h finds the removed key: %d bytes", when, len(got))
		}
		resp, err := h.c.onHold("a", a.Epoch(), encodeHold(1000, [][]byte{[]byte(key)}))
		if err != nil {
			t.Fatalf("%s: hold at h: %v", when, err)
		}
		_, hs, err := decodeHeld(resp, 1)
		if err != nil || store.Code(hs[0].code) != store.NotFound {
			t.Fatalf("%s: a hold at h answers the removed key %v (%v), want NOT_FOUND", when, store.Code(hs[0].code), err)
		}
		if h.c.Holds() != 0 {
			t.Fatalf("%s: a hold of the removed key is held", when)
		}
		before := h.c.Stats().Reannounced
		h.c.reannounce(func(int, string) bool { return true })
		testutil.Eventually(t, 10*time.Second, func() bool { return h.c.Stats().Reannounced > before }, "%s: h re-announcing", when)
		if hs := f.holders(key); len(hs) != 0 {
			t.Fatalf("%s: its home knows holders %v of the removed key", when, hs)
		}
		for _, n := range []*fakeNode{a, x} {
			if got, err := n.read(key, len(v)); err == nil {
				t.Fatalf("%s: %s reads the removed key: %d bytes", when, n.id, len(got))
			}
		}
		if !bytes.Equal(pinned(), v) {
			t.Fatalf("%s: the pinned bytes changed", when)
		}
	}
	hidden("pinned")
	// Past the tombstone TTL, many times over: still hidden, still to go.
	testutil.Eventually(t, 10*time.Second, func() bool { return time.Since(removed) > 20*ttl }, "the tombstone TTL passing")
	hidden("pinned past the tombstone TTL")
	if hid := h.st.Stats().Hidden; hid != 1 {
		t.Fatalf("past the TTL h keeps %d hidden values, want 1", hid)
	}

	// Put again on h while the old pin lasts: the new value for everyone.
	v2 := value(key+"/again", 4096)
	h.put(t, key, v2)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "the new value announced")
	for _, n := range []*fakeNode{h, a, x} {
		if got, err := n.read(key, len(v2)); err != nil || !bytes.Equal(got, v2) {
			t.Fatalf("%s reads the key put again: %d bytes, %v", n.id, len(got), err)
		}
	}
	if !bytes.Equal(pinned(), v) {
		t.Fatal("the old pin's bytes changed under the put again")
	}
	// The readers' holds of the new value at h end after their reads, on
	// goroutines of their own: they are not this test's pins.
	testutil.Eventually(t, 10*time.Second, func() bool { return h.c.Holds() == 0 && h.st.Stats().Pins == 2 },
		"a's and x's holds at h released (h's pins: %d, the test's 2 and theirs)", testutil.Lazy(func() any { return h.st.Stats().Pins }))
	// The unpins (the get's and the pin's) take the old value's pins first,
	// and the last frees it; the new value stays.
	if err := ss.Unpin([][]byte{[]byte(key), []byte(key)}, make([]store.Code, 2)); err != nil {
		t.Fatalf("unpin on h: %v", err)
	}
	if st := h.st.Stats(); st.Hidden != 0 || st.Pins != 0 {
		t.Fatalf("after the unpins: %d hidden, %d pins; want 0, 0", st.Hidden, st.Pins)
	}
	if h.c.Stats().GonePinned != 0 {
		t.Fatal("h keeps removed keys to drop later")
	}
	if got, err := h.read(key, 4096); err != nil || !bytes.Equal(got, v2) {
		t.Errorf("h's key put again: %d bytes, %v", len(got), err)
	}
	if got, err := h.read(other, 4096); err != nil || !bytes.Equal(got, value(other, 4096)) {
		t.Errorf("h's other key: %d bytes, %v", len(got), err)
	}
	// The old value's block is free: one block more than before, the new value's.
	if b := h.pool.Stats().Blocks; b != blocks {
		t.Errorf("%d pool blocks on h, want %d (the old value's freed, the new one's taken)", b, blocks)
	}
}

// heldByH makes daemons a, h and x, and a key (with prefix) whose home is
// x and whose only copy is h's, announced; it returns a, h, the key and
// its value.
func heldByH(t *testing.T, prefix string) (a, h *fakeNode, key string, v []byte) {
	t.Helper()
	f := newNet(t, []string{"a", "h", "x"}, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour})
	a, h = f.node("a"), f.node("h")
	key = keyHomedOn(f, a, prefix, "x")
	v = value(key, 4096)
	h.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "announced")
	return a, h, key, v
}

// TestRemovedWhileReadFromHolder: a key removed elsewhere while its
// holder h is answering another daemon's one-round-trip read of it
// (store.ReadHere) goes from h at once: the read keeps its bytes, pinned
// for another host, and nothing waits for it to end (the read held the
// block as I/O in flight once, and the drop had to wait, dropLater).
func TestRemovedWhileReadFromHolder(t *testing.T) {
	a, h, key, v := heldByH(t, "rm/busy")
	copying, release := make(chan struct{}), make(chan struct{})
	type copied struct {
		code  store.Code
		bytes []byte
	}
	done := make(chan copied, 1)
	go func() {
		var got []byte
		code, _ := h.st.ReadHere([]byte(key), func(val []byte) {
			close(copying)
			<-release
			got = append(got, val...)
		})
		done <- copied{code, got}
	}()
	<-copying
	code, err := removeOn(t, a, key)
	close(release)
	if code != store.OK {
		t.Fatalf("remove on a: %v %v", code, err)
	}
	if n := h.c.Stats().GonePinned; n != 0 {
		t.Errorf("h keeps %d removed keys until their I/O ends, want none", n)
	}
	if c := h.here(t, key); c != store.NotFound {
		t.Errorf("h's copy during the read: %v, want removed", c)
	}
	if got, err := a.read(key, len(v)); err == nil {
		t.Fatalf("a reads the removed key from h: %d bytes", len(got))
	}
	if c := <-done; c.code != store.OK || !bytes.Equal(c.bytes, v) {
		t.Fatalf("the read in progress: %v, %d bytes (exact %v)", c.code, len(c.bytes), bytes.Equal(c.bytes, v))
	}
}

// TestRemovedWhilePromoting: a key removed elsewhere while its holder h
// promotes it from L2 for a reader of its own (a caller's I/O in flight,
// which the store does not cut short: its Remove answers BUSY) is hidden
// from the other daemons at once, and dropped by the dropper once the
// promotion has ended (dropLater).
func TestRemovedWhilePromoting(t *testing.T) {
	f := newNetWith(t, []string{"a", "h", "x"}, Config{Shards: 16, Timeout: 2 * time.Second, ProbeEvery: time.Hour}, nil, withL2("h"))
	a, h, m := f.node("a"), f.node("h"), f.l2["h"]
	key := keyHomedOn(f, a, "rm/promote", "x")
	v := value(key, 64<<10)
	h.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "announced")
	// On L2 only: written back, then pushed out of the pool by others
	// (over the high watermark, h's eviction takes every value written
	// back: withL2).
	for i := 0; ; i++ {
		if err := h.st.Flush(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		info, err := h.st.Stat([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if !info.InL1 && info.InL2 {
			break
		}
		if i == 64 {
			t.Fatalf("the key still in h's pool after %d other values: %+v", i, info)
		}
		k := fmt.Sprintf("rm/fill/%d", i)
		h.put(t, k, value(k, 64<<10))
	}

	m.holdReads.Store(true)
	ss := h.st.NewSession()
	defer ss.Close()
	got := make(chan store.Code, 1)
	go func() {
		locs, codes := make([]store.Location, 1), make([]store.Code, 1)
		if _, err := ss.Get([][]byte{[]byte(key)}, locs, codes, nil, nil, 0); err != nil {
			t.Errorf("get on h: %v", err)
		}
		got <- codes[0]
	}()
	select {
	case <-m.tr.Holding():
	case <-time.After(10 * time.Second):
		t.Fatal("the promotion's read was not held")
	}
	code, err := removeOn(t, a, key)
	m.holdReads.Store(false)
	if code != store.OK {
		m.tr.Finish()
		t.Fatalf("remove on a: %v %v", code, err)
	}
	if n := h.c.Stats().GonePinned; n != 1 {
		t.Errorf("h keeps %d removed keys until their I/O ends, want 1", n)
	}
	if got, err := a.read(key, len(v)); err == nil {
		t.Errorf("a reads the removed key from h: %d bytes", len(got))
	}
	m.tr.Finish()
	if c := <-got; c != store.OK && c != store.NotFound {
		t.Fatalf("h's reader whose promotion the removal met: %v", c)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h.here(t, key) == store.NotFound && h.c.Stats().GonePinned == 0 },
		"h dropping the removed key once its promotion ended")
}

// TestDropLater: a key whose drop met a caller's I/O in flight on its
// holder (a copy out, a promotion) is dropped by the dropper once the
// store takes it, and only the record named goes: a value put again
// since, with the same bytes, is another record and stays (as when the
// put came between the dropper's look and its removal).
func TestDropLater(t *testing.T) {
	a, h, key, v := heldByH(t, "rm/later")
	old, ok := h.st.RecordHere([]byte(key))
	if !ok {
		t.Fatal("no record of the key on h")
	}
	h.c.dropLater([][]byte{[]byte(key)}, []store.RecordID{old})
	testutil.Eventually(t, 10*time.Second, func() bool { return h.here(t, key) == store.NotFound && h.c.Stats().GonePinned == 0 },
		"h dropping the key")

	// Put again with the same bytes; a retry naming the old record leaves it.
	h.put(t, key, v)
	h.c.dropLater([][]byte{[]byte(key)}, []store.RecordID{old})
	testutil.Eventually(t, 10*time.Second, func() bool { return h.c.Stats().GonePinned == 0 }, "the dropper done")
	if got, err := a.read(key, len(v)); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("the key put again, read on a: %d bytes, %v", len(got), err)
	}
	if c := h.here(t, key); c != store.OK {
		t.Fatalf("the key put again on h: %v", c)
	}
}

// announcedAll waits until n's announcer has sent all it had queued.
func (n *fakeNode) announcedAll(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, func() bool {
		n.c.mu.Lock()
		defer n.c.mu.Unlock()
		return len(n.c.pending) == 0 && !n.c.sending
	}, "%s's announcements all sent", n.id)
}

// TestRemovalsUnderReaders: a writer on w puts rounds of keys and removes
// each round some rounds later, while readers on r fetch keys of recent
// rounds (and of some just removed), keeping copies of their hits. Every
// fetch, announcement and removal races every other. Once all is quiet, no
// removed key is stored on either daemon, and no home lists a holder of
// one: a fetched copy announced while its removal was under way was either
// dropped by the removal or answered "removed", and the writer's own
// announcement of a put still queued when the put was removed did not
// index a copy that is no longer there.
func TestRemovalsUnderReaders(t *testing.T) {
	f := newQuickNet(t, []string{"w", "r"}, Config{Shards: 64, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	w, r := f.node("w"), f.node("r")
	const keys, live, size, rounds = 4, 8, 4096, 1500
	key := func(round, i int) string { return fmt.Sprintf("ur/%d/%d", round, i) }
	var last atomic.Int64
	last.Store(-1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var hits, misses atomic.Uint64
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for {
				select {
				case <-stop:
					return
				default:
				}
				l := last.Load()
				if l < 0 {
					runtime.Gosched()
					continue
				}
				k := key(int(max(0, l-int64(rng.IntN(live+4)))), rng.IntN(keys))
				v, err := r.read(k, size)
				switch {
				case err == nil && !bytes.Equal(v, value(k, size)):
					t.Errorf("%s read on r: %d bytes that are not its value", k, len(v))
				case err == nil:
					hits.Add(1)
				default:
					misses.Add(1)
				}
			}
		}()
	}
	var removed []string
	for round := range rounds {
		for i := range keys {
			w.put(t, key(round, i), value(key(round, i), size))
		}
		last.Store(int64(round))
		if old := round - live; old >= 0 {
			for i := range keys {
				// A reader's hold pins w's copy while its bytes are read
				// (FAILED_PRECONDITION): asked again, as a client would.
				for {
					code, err := removeOn(t, w, key(old, i))
					if code == store.OK {
						break
					}
					if code != store.FailedPrecondition && code != store.Busy {
						t.Fatalf("remove %s on w: %v, %v", key(old, i), code, err)
					}
					runtime.Gosched()
				}
				removed = append(removed, key(old, i))
			}
		}
	}
	close(stop)
	wg.Wait()
	if hits.Load() == 0 {
		t.Fatalf("r read no key of w's (%d misses): nothing raced", misses.Load())
	}
	w.announcedAll(t)
	r.announcedAll(t)
	// A removal whose drop found a copy with a reader's I/O in flight
	// here (a local read copying it out) drops it once that I/O ends, by
	// the dropper's next try (dropLater, at most a second apart): the home
	// has forgotten the copy already, and it is hidden from the other
	// daemons meanwhile. Checked before that, such a copy looked left
	// behind (once in CI: removed, still stored on r, no holder at its
	// home).
	for _, n := range []*fakeNode{w, r} {
		testutil.Eventually(t, 10*time.Second, func() bool { return n.c.GonePinned() == 0 },
			"%s: removed copies with I/O in flight dropped (%d left)", n.id, testutil.Lazy(n.c.GonePinned))
	}
	stale := 0
	for _, k := range removed {
		for _, n := range []*fakeNode{w, r} {
			if code := n.here(t, k); code != store.NotFound {
				t.Errorf("%s, removed, still stored on %s (%v)", k, n.id, code)
			}
			home := w.c.Home([]byte(k))
			if n.id == home {
				if hs := n.c.idx.get(n.c.shardOf([]byte(k)), []byte(k), nil); len(hs) > 0 {
					if stale++; stale <= 5 {
						t.Errorf("%s, removed, has holders %+v at its home %s", k, hs, home)
					}
				}
			}
		}
	}
	if stale > 5 {
		t.Errorf("%d removed keys with holders at their homes in all", stale)
	}
	t.Logf("%d keys removed; r's reads: %d hits, %d misses", len(removed), hits.Load(), misses.Load())
}

// TestLatestOnlyKeepsEachKeysLastState: of a batch's entries with one key,
// only the last queued goes (a put followed by its removal is the removal;
// an eviction followed by a new put is the put), the others in order.
func TestLatestOnlyKeepsEachKeysLastState(t *testing.T) {
	e := func(k string, tier uint8) entry { return entry{key: []byte(k), tier: tier} }
	batch := []entry{e("a", TierL1), e("b", TierL1), e("a", tierGone), e("c", tierGone), e("b", TierL2), e("c", TierL1|tierFetched)}
	got := latestOnly(batch)
	var s []string
	for _, x := range got {
		s = append(s, fmt.Sprintf("%s:%d", x.key, x.tier))
	}
	if want := []string{"a:0", "b:2", "c:129"}; !slices.Equal(s, want) {
		t.Fatalf("latestOnly: %v, want %v", s, want)
	}
	one := []entry{e("a", TierL1), e("b", TierL1)}
	if got := latestOnly(one); len(got) != 2 {
		t.Fatalf("a batch without repeats lost entries: %d", len(got))
	}
}

// TestLatestOnlyWithKeysOfOneHash: when keys share a hash, latestOnly
// still keeps each key's last state, never one key's for another's; and a
// batch of keys that share none keeps its repeats' last states allocating
// a map, not a name per key.
func TestLatestOnlyWithKeysOfOneHash(t *testing.T) {
	e := func(k string, tier uint8) entry { return entry{key: []byte(k), tier: tier} }
	states := func() []entry {
		return []entry{e("a", TierL1), e("b", TierL1), e("a", tierGone), e("c", tierGone), e("b", TierL2), e("d", TierL1)}
	}
	want := []string{"a:0", "c:0", "b:2", "d:1"}
	names := func(got []entry) []string {
		var s []string
		for _, x := range got {
			s = append(s, fmt.Sprintf("%s:%d", x.key, x.tier))
		}
		return s
	}
	if got := names(latestOnly(states())); !slices.Equal(got, want) {
		t.Fatalf("latestOnly: %v, want %v", got, want)
	}
	hash := keyHash
	t.Cleanup(func() { keyHash = hash })
	keyHash = func(key []byte) uint64 { return uint64(len(key)) } // every key of one byte: one hash
	if got := names(latestOnly(states())); !slices.Equal(got, want) {
		t.Fatalf("latestOnly with every key's hash the same: %v, want %v", got, want)
	}
	keyHash = hash
	batch := make([]entry, 256)
	for i := range batch {
		batch[i] = entry{key: fmt.Appendf(nil, "layer/7/block/%d", i%200), tier: TierL1}
	}
	work := make([]entry, len(batch))
	allocs := testing.AllocsPerRun(20, func() {
		copy(work, batch)
		if n := len(latestOnly(work)); n != 200 {
			t.Fatalf("%d entries kept, want 200", n)
		}
	})
	if allocs > 3 {
		t.Errorf("%v allocations for a batch of %d entries, want a map's few", allocs, len(batch))
	}
}

// TestNoFetchedCopyPastTheAnnouncementBound: while the announcements
// waiting to be sent fill Config.MaxPending, a remote get is BUSY and
// keeps no copy (its announcement could not be queued, and a copy its home
// does not know of would outlive a removal); once they drain it reads.
func TestNoFetchedCopyPastTheAnnouncementBound(t *testing.T) {
	for _, quick := range []bool{false, true} {
		t.Run(fmt.Sprintf("quick=%v", quick), func(t *testing.T) {
			cfg := Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour, MaxPending: 4}
			var f *fakeNet
			if quick {
				f = newQuickNet(t, []string{"w", "r"}, cfg)
			} else {
				f = newNet(t, []string{"w", "r"}, cfg)
			}
			w, r := f.node("w"), f.node("r")
			const key = "bound/1"
			v := value(key, 4096)
			w.put(t, key, v)
			testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"w"}) }, "w's copy announced")
			if quick {
				if _, err := r.read(key, len(v)); err != nil { // fills r's cache of home answers
					t.Fatal(err)
				}
				removeHereOnly(t, r, key)
				r.announcedAll(t)
			}
			// r's announcer is held sending another key's announcement, so
			// the fillers below stay queued until the test takes them back:
			// a wake-up left from the set-up (the fetch kicks once it has
			// answered) would otherwise let it take them meanwhile.
			other := keyHomedOn(f, r, "bound/other", "w")
			release := f.holdKind(t, "r", kindAnnounceAges)
			r.put(t, other, value(other, 64))
			testutil.Eventually(t, 10*time.Second, func() bool {
				if f.heldKinds() == 0 {
					return false
				}
				r.c.mu.Lock()
				defer r.c.mu.Unlock()
				return len(r.c.pending) == 0 && r.c.sending
			}, "r's announcer held in the announcement of %s", other)
			r.c.mu.Lock()
			held := r.c.pending
			for range cfg.MaxPending {
				r.c.pending = append(r.c.pending, entry{key: []byte("bound/filler"), tier: TierL1, size: 1})
			}
			r.c.mu.Unlock()
			_, err := r.read(key, len(v))
			if !errors.Is(err, ErrBusy) {
				t.Fatalf("remote get with the announcements backlogged: %v, want BUSY", err)
			}
			if code := r.here(t, key); code != store.NotFound {
				t.Fatalf("a copy kept past the bound: %v", code)
			}
			r.c.mu.Lock()
			r.c.pending = held
			r.c.mu.Unlock()
			release()
			if got, err := r.read(key, len(v)); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("remote get once drained: %d bytes, %v", len(got), err)
			}
		})
	}
}

// removeHereOnly removes n's own copy of key, no other (as a home's drop).
func removeHereOnly(t *testing.T, n *fakeNode, key string) {
	t.Helper()
	codes := make([]store.Code, 1)
	if err := n.st.RemoveHere([][]byte{[]byte(key)}, codes, nil); err != nil || codes[0] != store.OK {
		t.Fatalf("RemoveHere %s on %s: %v, %v", key, n.id, err, codes[0])
	}
}

// TestRemoveOnAHolderOtherHostsRead: a key removed on its holder h while
// another daemon's read holds h's copy is removed (OK), not refused as
// pinned: a read of another host is no caller's pin. The read still gets
// the exact bytes it was given (or a miss), and afterwards no daemon has
// the key. A pin of one of h's own clients still refuses the removal
// (FAILED_PRECONDITION), the other host's read there or not.
func TestRemoveOnAHolderOtherHostsRead(t *testing.T) {
	f := newNet(t, []string{"h", "r"}, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	h, r := f.node("h"), f.node("r")
	for _, clientPin := range []bool{false, true} {
		key := fmt.Sprintf("held/%v", clientPin)
		v := value(key, 8192)
		h.put(t, key, v)
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "h's copy announced")
		ss := h.st.NewSession()
		if clientPin {
			codes := make([]store.Code, 1)
			if _, err := ss.Get([][]byte{[]byte(key)}, make([]store.Location, 1), codes, nil, nil, 0); err != nil || codes[0] != store.OK {
				t.Fatalf("pin on h: %v %v", err, codes[0])
			}
		}
		got := readHeldAt(t, f, r, h, key, v)
		code, err := removeOn(t, h, key)
		if clientPin && code != store.FailedPrecondition {
			t.Fatalf("remove on h of a key h's client pins: %v, %v; want FAILED_PRECONDITION", code, err)
		}
		if !clientPin && code != store.OK {
			t.Fatalf("remove on h of a key only r's read holds: %v, %v; want OK", code, err)
		}
		f.releaseReads()
		if err := <-got; err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("r's read, racing the removal: %v; want the bytes or a miss", err)
		}
		if err := ss.Close(); err != nil {
			t.Fatal(err)
		}
		if clientPin {
			continue
		}
		for _, n := range []*fakeNode{h, r} {
			testutil.Eventually(t, 10*time.Second, func() bool { _, err := n.read(key, len(v)); return err != nil },
				"%s no longer reading the removed key", n.id)
		}
		// r releases its hold at h once its read ends, in an exchange of
		// its own.
		testutil.Eventually(t, 10*time.Second, func() bool { st := h.st.Stats(); return st.Hidden == 0 && st.Pins == 0 },
			"h after the read with nothing hidden or pinned (%+v)", testutil.Lazy(h.st.Stats))
	}
}

// TestRemovedWhileApartStaysRemoved: r fetched keys of w's (one homed at
// w, one at r) and holds copies; w and r are cut apart, each becomes home
// of every shard in its own view, and w removes both keys (OK). w never
// heard of r's copy of the key homed at r, yet once they are together
// again and r's copy is dropped, neither daemon reads either key, and the
// key's home names no holder: w's removal left a tombstone for each member
// away, which drops r's copy when r is back, and w tells the home, once
// the tombstone is handed or spent, that it holds the key no more. (A read
// that reaches r's copy after they meet and before the drop still finds
// it: the window the soak excuses near a cut.)
func TestRemovedWhileApartStaysRemoved(t *testing.T) {
	f := newNet(t, []string{"w", "r"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	w, r := f.node("w"), f.node("r")
	var keys []string
	for _, home := range []string{"w", "r"} {
		k := keyHomedOn(f, w, "apart/"+home, home)
		keys = append(keys, k)
		w.put(t, k, value(k, 4096))
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"w"}) }, "w's copy of %s announced", k)
		if _, err := r.read(k, 4096); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(k), []string{"r", "w"}) }, "r's copy of %s announced", k)
	}
	probe := func() { w.c.probe(); r.c.probe() }
	f.partition("w", "r", true)
	testutil.Eventually(t, 10*time.Second, func() bool { probe(); return len(w.c.Members()) == 1 && len(r.c.Members()) == 1 }, "w and r apart")
	for _, k := range keys {
		if code, err := removeOn(t, w, k); code != store.OK {
			t.Fatalf("remove %s on w while apart: %v, %v", k, code, err)
		}
	}
	if c := r.here(t, keys[1]); c != store.OK {
		t.Fatalf("r's copy of %s while apart: %v (the case this test is for did not happen)", keys[1], c)
	}
	f.partition("w", "r", false)
	testutil.Eventually(t, 10*time.Second, func() bool {
		probe()
		return len(w.c.Members()) == 2 && len(r.c.Members()) == 2 && r.here(t, keys[1]) == store.NotFound
	}, "together again, and r's copy of %s dropped (on r: %v)", keys[1], testutil.Lazy(func() store.Code { return r.here(t, keys[1]) }))
	for _, k := range keys {
		for _, n := range []*fakeNode{w, r} {
			if b, err := n.read(k, 4096); err == nil {
				t.Errorf("%s read on %s (%d bytes) after its removal, once w and r are together again", k, n.id, len(b))
			}
		}
		// Nor does its home name a holder (Exists and LookupPrefix would
		// count the key): not r, whose copy went, nor w, which removed its
		// own while r's index still named it.
		testutil.Eventually(t, 10*time.Second, func() bool { _, hs, err := r.c.Locate([]byte(k)); return err == nil && len(hs) == 0 },
			"%s's home naming no holder (it names %v)", k, testutil.Lazy(func() []string { return f.holders(k) }))
	}
}

// TestPutAfterRemovalWhileApartStays: w and r are cut apart, and w,
// standing in as home of keys whose home is r, removes three of them. It
// knows no copy of two (its tombstones for r cover whatever value r has
// then) and its own of the third (covering that value's bytes). r had put
// the first before those removals; it removes its own copy of the third
// and puts it again, the same bytes, and puts the second, both after
// them. Once the two are together again and every tombstone is spent, the
// value put before the removal is gone, and the two put after it stay: on
// r, read byte-exact from w, named by their home. (Without the removal's
// time on its tombstone, both went: acknowledged puts lost.)
func TestPutAfterRemovalWhileApartStays(t *testing.T) {
	f := newNet(t, []string{"w", "r"}, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour})
	w, r := f.node("w"), f.node("r")
	before := keyHomedOn(f, w, "apart/before", "r")
	fresh := keyHomedOn(f, w, "apart/fresh", "r")
	again := keyHomedOn(f, w, "apart/again", "r")
	w.put(t, again, value(again, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(again), []string{"w"}) }, "w's copy announced")
	if _, err := r.read(again, 4096); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(again), []string{"r", "w"}) }, "r's copy announced")
	probe := func() { w.c.probe(); r.c.probe() }
	f.partition("w", "r", true)
	testutil.Eventually(t, 10*time.Second, func() bool { probe(); return len(w.c.Members()) == 1 && len(r.c.Members()) == 1 }, "w and r apart")

	r.put(t, before, value(before, 4096))
	for _, k := range []string{before, fresh, again} {
		if code, err := removeOn(t, w, k); code != store.OK {
			t.Fatalf("remove %s on w while apart: %v, %v", k, code, err)
		}
	}
	removed := time.Now()
	// A put after the removals, by more than a message's rounding of
	// their time (whole milliseconds, rounded towards later).
	testutil.Eventually(t, 10*time.Second, func() bool { return time.Since(removed) > 20*time.Millisecond }, "a moment passing")
	if code, err := removeOn(t, r, again); code != store.OK {
		t.Fatalf("remove %s on r while apart: %v, %v", again, code, err)
	}
	r.put(t, again, value(again, 4096))
	r.put(t, fresh, value(fresh, 4096))

	f.partition("w", "r", false)
	testutil.Eventually(t, 10*time.Second, func() bool {
		probe()
		// w's tombstones handed to r, naming r's copies. One of the key
		// dropped may stay (handed twice, the second after the drop: no
		// copy announces it again); it is harmless, and ages out.
		mine, _ := r.c.tombs.of("r", 16)
		return len(w.c.Members()) == 2 && len(r.c.Members()) == 2 && w.c.tombs.live() == 0 &&
			!slices.ContainsFunc(mine, func(k []byte) bool { return string(k) != before }) && r.here(t, before) == store.NotFound
	}, "together again, w's tombstones for r spent, and r's value put before the removal dropped (w's %d tombstones, r's %q; %s on r: %v)",
		testutil.Lazy(func() int { return w.c.tombs.live() }), testutil.Lazy(func() [][]byte { ks, _ := r.c.tombs.of("r", 16); return ks }),
		before, testutil.Lazy(func() store.Code { return r.here(t, before) }))
	for _, n := range []*fakeNode{w, r} {
		if b, err := n.read(before, 4096); err == nil {
			t.Errorf("%s read on %s (%d bytes): it was put before its removal", before, n.id, len(b))
		}
	}
	for _, k := range []string{fresh, again} {
		if c := r.here(t, k); c != store.OK {
			t.Errorf("r's value of %s, put after its removal: %v, want it kept", k, c)
			continue
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return slices.Contains(f.holders(k), "r") },
			"%s's home naming r (it names %v)", k, testutil.Lazy(func() []string { return f.holders(k) }))
		// A copy fetched within two timeouts of a removal of its key is
		// taken for one read before it (tomb.go) and dropped: w's read
		// misses until then.
		var b []byte
		testutil.Eventually(t, 10*time.Second, func() bool { var err error; b, err = w.read(k, 4096); return err == nil },
			"%s read on w", k)
		if !bytes.Equal(b, value(k, 4096)) {
			t.Errorf("%s read on w: %d bytes, not r's value put after the removal", k, len(b))
		}
	}
}

// TestRemoveNeverRefusedForOtherHostsReads: holds of another daemon's
// reads come and go on h's key (taken, then released, as fast as they
// can) while h's client puts and removes it. A remove there never
// answers FAILED_PRECONDITION: every pin the key carries in any moment is
// a hold's, none a client's. The store counts a hold's pins under the
// same shard lock as the pins themselves, so no removal falls between a
// hold's pin and its count, or between its count's end and its unpin.
func TestRemoveNeverRefusedForOtherHostsReads(t *testing.T) {
	f := newNet(t, []string{"h", "r"}, Config{Shards: 16, Timeout: 5 * time.Second, ProbeEvery: time.Hour})
	h, r := f.node("h"), f.node("r")
	const key = "held/churn"
	k := [][]byte{[]byte(key)}
	v := value(key, 4096)
	h.put(t, key, v)
	stop := make(chan struct{})
	var holdErr error
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := h.c.onHold("r", r.Epoch(), encodeHold(1000, k))
				if err != nil {
					holdErr = err
					return
				}
				id, _, err := decodeHeld(resp, 1)
				if err != nil {
					holdErr = err
					return
				}
				if id != 0 {
					h.c.endHold(id, "r", r.Epoch(), false)
				}
			}
		}()
	}
	refused := 0
	const rounds = 4000
	for i := 0; i < rounds && refused == 0; i++ {
		code, err := removeOn(t, h, key)
		switch code {
		case store.OK:
		case store.FailedPrecondition:
			refused++
			t.Errorf("remove %d of %d on h, only r's holds pinning the key: %v", i, rounds, err)
			continue
		default:
			t.Fatalf("remove %d on h: %v, %v", i, code, err)
		}
		h.put(t, key, v)
	}
	close(stop)
	wg.Wait()
	if holdErr != nil {
		t.Fatal(holdErr)
	}
	if st := h.st.Stats(); st.Pins != 0 {
		t.Errorf("h after the holds: %d pins, want none", st.Pins)
	}
}

// TestOversizedRemoveRefused: a remove or a drop of more keys than a
// conforming sender puts in one message (maxMsgKeys), which the codec
// takes but whose answer may not fit an exchange, is refused whole before
// anything is removed: the key it names stays.
func TestOversizedRemoveRefused(t *testing.T) {
	f := newNet(t, []string{"a", "b"}, Config{Shards: 16, Timeout: 3 * time.Second, ProbeEvery: time.Hour})
	a, b := f.node("a"), f.node("b")
	keys := make([][]byte, maxMsgKeys+1)
	ages := make([]uint32, len(keys))
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "over/%03d", i)
	}
	for i := range keys {
		a.put(t, string(keys[i]), value(string(keys[i]), 1024))
	}
	for name, call := range map[string]func() ([]byte, error){
		"remove":         func() ([]byte, error) { return a.c.onRemove("b", b.Epoch(), encodeKeys(keys)) },
		"drop":           func() ([]byte, error) { return a.c.onDrop("b", b.Epoch(), encodeKeys(keys)) },
		"drop with ages": func() ([]byte, error) { return a.c.onDropAges("b", b.Epoch(), encodeDrop(keys, ages)) },
	} {
		if _, err := call(); !errors.Is(err, ErrMessage) {
			t.Errorf("%s of %d keys: %v, want ErrMessage", name, len(keys), err)
		}
		for _, k := range keys {
			if code := a.here(t, string(k)); code != store.OK {
				t.Fatalf("%s of %d keys, refused: %s is %v here, want OK", name, len(keys), k, code)
			}
		}
	}
}

// newHomeOfHeldCopies builds a, b and x; a and b put the same value of a
// key whose home is x, then x goes and a becomes the key's home while b's
// announcements to it are held (until release). It returns the key, its
// value, and release.
func newHomeOfHeldCopies(t *testing.T, opts ...func(*fakeNet)) (f *fakeNet, key string, v []byte, release func()) {
	return newHomeOfHeldCopiesWith(t, Config{}, opts...)
}

// newHomeOfHeldCopiesWith is newHomeOfHeldCopies with cfg's TombstoneTTL.
func newHomeOfHeldCopiesWith(t *testing.T, cfg Config, opts ...func(*fakeNet)) (f *fakeNet, key string, v []byte, release func()) {
	t.Helper()
	ids := []string{"a", "b", "x"}
	const shards = newHomeShards
	key = newHomeKey(t, "newhome/rm")
	f = newNetWith(t, ids, Config{Shards: shards, Timeout: 2 * time.Second, ProbeEvery: 20 * time.Millisecond,
		TombstoneTTL: cfg.TombstoneTTL}, nil, opts...)
	a, b, x := f.node("a"), f.node("b"), f.node("x")
	for _, n := range []*fakeNode{a, b, x} {
		testutil.Eventually(t, 10*time.Second, seesKey(n, key, false, ids...), "%s seeing every member", n.id)
	}
	v = value(key, 4096)
	a.put(t, key, v)
	b.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a", "b"}) },
		"both copies announced to x (it names %v)", testutil.Lazy(func() []string { return f.holders(key) }))
	held := f.holdKind(t, "b", kindAnnounce)
	heldAges := f.holdKind(t, "b", kindAnnounceAges)
	x.down.Store(true)
	for _, n := range []*fakeNode{a, b} {
		testutil.Eventually(t, 10*time.Second, seesKey(n, key, false, "a", "b"), "%s seeing x gone", n.id)
	}
	return f, key, v, func() { held(); heldAges() }
}

// newHomeShards and newHomeKey: a key whose home is x among a, b and x,
// and a among a and b (newHomeOfHeldCopies).
const newHomeShards = 64

func newHomeKey(t *testing.T, prefix string) string {
	return keyWithHomes(t, prefix, newHomeShards, []string{"x", "a", "b", "x"}, []string{"a", "a", "b"})
}

// TestRemovedAtANewHomeBeforeAHolderReannounced: x is the home of a key a
// and b both hold. x goes; the key's new home, a, knows only its own copy
// until b re-announces its own, which is held back. A remove of the key
// on a meanwhile must not leave b's copy behind: once b's re-announcement
// arrives, the key is a miss on both and its home names no holder.
func TestRemovedAtANewHomeBeforeAHolderReannounced(t *testing.T) {
	removedAtANewHomeBeforeAHolderReannounced(t, Config{})
}

// removedAtANewHomeBeforeAHolderReannounced is that test with cfg's
// TombstoneTTL.
func removedAtANewHomeBeforeAHolderReannounced(t *testing.T, cfg Config) {
	t.Helper()
	f, key, v, release := newHomeOfHeldCopiesWith(t, cfg)
	a, b := f.node("a"), f.node("b")
	code, err := removeOn(t, a, key)
	release()
	if code != store.OK {
		t.Fatalf("remove on a, the new home, before b re-announced: %v %v; want OK (b takes the drop)", code, err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return b.here(t, key) == store.NotFound },
		"b's copy dropped (on b: %v)", testutil.Lazy(func() store.Code { return b.here(t, key) }))
	for _, n := range []*fakeNode{a, b} {
		if got, err := n.read(key, len(v)); err == nil {
			t.Errorf("%s reads the removed key: %d bytes", n.id, len(got))
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { _, hs, err := a.c.Locate([]byte(key)); return err == nil && len(hs) == 0 },
		"its home naming no holder (%v)", testutil.Lazy(func() []string { return f.holders(key) }))
}

// TestRemoveAtANewHomeWithAMemberSilent: the same, with b not answering
// the drop: its copy may remain, so the remove is not OK; and since the
// home never knew that copy's value, it leaves no tombstone that could
// take a value b puts after the removal. The same remove sent again once
// b answers is OK, and b's copy is gone.
func TestRemoveAtANewHomeWithAMemberSilent(t *testing.T) {
	f, key, _, release := newHomeOfHeldCopies(t)
	a, b := f.node("a"), f.node("b")
	silent := f.silence(t, "b")
	code, err := removeOn(t, a, key)
	if code == store.OK {
		t.Fatalf("remove on a with b silent: OK; want a code saying a copy may remain")
	}
	t.Logf("remove on a with b silent: %v %v", code, err)
	if ks, _ := a.c.tombs.of("b", 16); len(ks) != 0 {
		t.Fatalf("a tombstoned %q of b's: a value it never knew", ks)
	}
	silent()
	release()
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("the same remove with b answering: %v %v", code, err)
	}
	if c := b.here(t, key); c != store.NotFound {
		t.Fatalf("b's copy after the remove answered OK: %v", c)
	}
}

// TestRemoveAtANewHomeLongAfterTheGainBeforeAWalk: a new home asks every
// member that has not said its re-announcement is done, however long ago
// it gained the shard. Here the time a tombstone lives (after which a
// home asked only the holders its index names, whatever the members had
// re-announced) is over at once, and b's re-announcement is held: the
// remove on a must still drop b's copy.
func TestRemoveAtANewHomeLongAfterTheGainBeforeAWalk(t *testing.T) {
	removedAtANewHomeBeforeAHolderReannounced(t, Config{TombstoneTTL: time.Nanosecond})
}

// walkedAt waits until n, home of key's shard, takes every member up as
// having re-announced its copies of that shard.
func walkedAt(t *testing.T, n *fakeNode, key string) {
	t.Helper()
	s := n.c.shardOf([]byte(key))
	ask := func() []string {
		u, _ := n.c.unwalked(s, n.c.view.Load(), nil, time.Now())
		return u
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return len(ask()) == 0 },
		"%s taking every member's walk of shard %d as done (still to say: %v)", n.id, s, testutil.Lazy(ask))
}

// dropsSent is how many drops (of either kind) the daemons sent.
func (f *fakeNet) dropsSent() uint64 {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	return f.kinds[kindDrop] + f.kinds[kindDropAges]
}

// TestAWalkReportedEndsTheNewHomesAskingEveryMember: once b says its
// re-announcement of the shards a gained is done, a removal at a asks
// only the holders a's index names: a key a alone holds is dropped with
// no message to b, and a key b holds too is still dropped on b.
func TestAWalkReportedEndsTheNewHomesAskingEveryMember(t *testing.T) {
	f, key, _, release := newHomeOfHeldCopies(t)
	a, b := f.node("a"), f.node("b")
	if n := a.c.Stats().Rebuilding; n == 0 {
		t.Fatal("a counts no shard rebuilding while b's re-announcement is held")
	}
	release()
	walkedAt(t, a, key)
	testutil.Eventually(t, 10*time.Second, func() bool { return a.c.Stats().Rebuilding == 0 },
		"a counting no shard rebuilding once b re-announced (%d)", testutil.Lazy(func() int { return a.c.Stats().Rebuilding }))
	if code, err := removeOn(t, a, key); code != store.OK {
		t.Fatalf("remove of a key a and b hold, after b's walk: %v %v", code, err)
	}
	if c := b.here(t, key); c != store.NotFound {
		t.Fatalf("b's copy after the remove answered OK: %v", c)
	}
	if n, u := removeOwn(t, f, "newhome/own"); n != 0 || u != 0 {
		t.Fatalf("a removal at a after every walk sent %d drops, %d to members its index does not name; want none", n, u)
	}
}

// removeOwn puts on a a key of a shard a gained (newHomeKey) that a alone
// holds, removes it on a, and returns how many drops the daemons sent
// meanwhile and how many of a's asked members its index did not name.
func removeOwn(t *testing.T, f *fakeNet, prefix string) (drops, unnamed uint64) {
	t.Helper()
	a := f.node("a")
	own := newHomeKey(t, prefix)
	a.put(t, own, value(own, 4096))
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(own), []string{"a"}) },
		"a's copy indexed (%v)", testutil.Lazy(func() []string { return f.holders(own) }))
	d0, u0 := f.dropsSent(), a.c.c.removeAsksUnnamed.Load()
	if code, err := removeOn(t, a, own); code != store.OK {
		t.Fatalf("remove of a key a alone holds: %v %v", code, err)
	}
	return f.dropsSent() - d0, a.c.c.removeAsksUnnamed.Load() - u0
}

// TestAnOlderMemberKeepsTheNewHomesWindow: a member that serves no
// numbered pull (an older release) never says its walk is done; a new
// home asks it to drop each key it removes for TombstoneTTL after the
// gain, as before the word existed.
func TestAnOlderMemberKeepsTheNewHomesWindow(t *testing.T) {
	if n := olderMemberAsked(t, Config{}, "newhome/older"); n != 1 {
		t.Fatalf("a removal at a with b on an older release asked %d members its index does not name; want 1, b", n)
	}
}

// TestAnOlderMembersWindowEnds: a member that serves no numbered pull is
// asked to drop the keys a new home removes only within TombstoneTTL of
// the gain; past it (here at once), a removal of a key the home alone
// holds asks it nothing, though it never says its walk is done.
func TestAnOlderMembersWindowEnds(t *testing.T) {
	if n := olderMemberAsked(t, Config{TombstoneTTL: time.Nanosecond}, "newhome/olderover"); n != 0 {
		t.Fatalf("a removal at a past the older member's window asked %d members its index does not name; want none", n)
	}
}

// olderMemberAsked builds newHomeOfHeldCopies with b on an older release
// (and cfg's TombstoneTTL), waits for b's copy to reach a through the
// older kind, and returns how many members a's index does not name a
// removal at a of a key a alone holds asked (removeOwn).
func olderMemberAsked(t *testing.T, cfg Config, prefix string) uint64 {
	t.Helper()
	f, key, _, release := newHomeOfHeldCopiesWith(t, cfg, func(f *fakeNet) { f.olderWire("b") })
	release()
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"a", "b"}) },
		"b's copy re-announced to a through the older kind (a names %v)", testutil.Lazy(func() []string { return f.holders(key) }))
	_, n := removeOwn(t, f, prefix)
	return n
}

// TestAWalkOfAnotherRunDoesNotCount: a member's word is for the run it
// gave it in. Once b's word is in, a takes it as from another run of b
// (as after b restarted with its store recovered from L2, which a pulls
// when it sees b back): a removal at a asks b again.
func TestAWalkOfAnotherRunDoesNotCount(t *testing.T) {
	f, key, _, release := newHomeOfHeldCopies(t)
	a := f.node("a")
	release()
	walkedAt(t, a, key)
	a.c.walks.mu.Lock()
	a.c.walks.done["b"].epoch++
	a.c.walks.mu.Unlock()
	if _, n := removeOwn(t, f, "newhome/run"); n != 1 {
		t.Fatalf("a removal at a with b's word from another run asked %d members its index does not name; want 1, b", n)
	}
}
