package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/xfer"
)

// fetchKeys fetches keys on n and returns each key's error once every key
// has been answered; a key answered twice, or not within 10 s, fails the
// test.
func fetchKeys(t *testing.T, n *fakeNode, keys ...string) []error {
	t.Helper()
	ks := make([][]byte, len(keys))
	for i, k := range keys {
		ks[i] = []byte(k)
	}
	type answer struct {
		i   int
		err error
	}
	ch := make(chan answer, 2*len(keys))
	n.c.Fetch(ks, func(i int, err error) { ch <- answer{i, err} })
	errs := make([]error, len(keys))
	seen := make([]bool, len(keys))
	timeout := time.After(10 * time.Second)
	for range keys {
		select {
		case a := <-ch:
			if seen[a.i] {
				t.Fatalf("%s answered twice", keys[a.i])
			}
			seen[a.i], errs[a.i] = true, a.err
		case <-timeout:
			t.Fatalf("keys not all answered within 10s (answered: %v)", seen)
		}
	}
	return errs
}

// dropHere removes keys from n's store alone (their home is not told), so
// that the next fetch reads them again.
func (n *fakeNode) dropHere(t *testing.T, keys ...string) {
	t.Helper()
	ks := make([][]byte, len(keys))
	for i, k := range keys {
		ks[i] = []byte(k)
	}
	if err := n.st.RemoveHere(ks, make([]store.Code, len(keys)), nil); err != nil {
		t.Fatal(err)
	}
}

// kind is how many exchanges of kind the net has carried.
func (f *fakeNet) kind(kind string) uint64 {
	f.kindMu.Lock()
	defer f.kindMu.Unlock()
	return f.kinds[kind]
}

// heldAs waits until key's home names holder with a value of size bytes.
func (f *fakeNet) heldAs(t *testing.T, key, holder string, size uint64) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		_, hs, err := f.node(holder).c.Locate([]byte(key))
		return err == nil && slices.ContainsFunc(hs, func(h Holder) bool { return h.ID == holder && h.Size == size })
	}, "%s's copy of %s (%d bytes) announced", holder, key, size)
}

// TestQuickFetchBatch: once a reader has cached the home's answers for
// keys, a fetch of them reads each one in one exchange, and the keys it is
// home of itself (whose reads take a claim there) by a hold at the same
// time; a key whose value changed under the cached answer (another size)
// falls back to the two-step way, which asks the home and reads the new
// value. Each key is answered once.
func TestQuickFetchBatch(t *testing.T) {
	f := newQuickNet(t, []string{"a", "b"}, Config{})
	a, b := f.node("a"), f.node("b")
	// Two keys homed at a (b caches a's answers), two at b.
	var keys []string
	var stale string
	for i, at := 0, map[string]int{}; len(keys) < 4; i++ {
		k := fmt.Sprintf("q/%d", i)
		if h := b.c.Home([]byte(k)); at[h] < 2 {
			at[h]++
			keys = append(keys, k)
			if h == "a" {
				stale = k
			}
		}
	}
	vals := map[string][]byte{}
	for _, k := range keys {
		vals[k] = value(k, 4096)
		a.put(t, k, vals[k])
		f.heldAs(t, k, "a", 4096)
	}
	fetch := func(what string) {
		t.Helper()
		for i, err := range fetchKeys(t, b, keys...) {
			if err != nil {
				t.Fatalf("%s: %s: %v", what, keys[i], err)
			}
		}
		for _, k := range keys {
			// Served on b once its home has taken b's copy (unseen until
			// then: a read meanwhile would fetch again).
			testutil.Eventually(t, 10*time.Second, func() bool { return b.here(t, k) == store.OK }, "%s: b's copy of %s seen", what, k)
			if got, err := b.read(k, len(vals[k])); err != nil || !bytes.Equal(got, vals[k]) {
				t.Fatalf("%s: %s on b: %d bytes, %v; not the value put", what, k, len(got), err)
			}
		}
		b.dropHere(t, keys...)
	}
	fetch("first fetch") // asks the home: b caches its answers
	reads, holds, st := f.kind(kindRead), f.kind(kindHold), b.c.Stats()
	fetch("cached fetch")
	st2 := b.c.Stats()
	if n, q, h := f.kind(kindRead)-reads, st2.QuickReads-st.QuickReads, f.kind(kindHold)-holds; n != 2 || q != 2 || h != 1 {
		t.Errorf("cached fetch of 4 keys, 2 homed at the reader: %d one-round-trip reads asked, %d done, %d holds; want 2, 2 and 1", n, q, h)
	}
	// A key homed at a put again there with another size: b's cached
	// answer is stale.
	a.dropHere(t, stale)
	vals[stale] = value(stale+" again", 8192)
	a.put(t, stale, vals[stale])
	f.heldAs(t, stale, "a", 8192)
	fetch("fetch with a stale cached answer")
	if st3 := b.c.Stats(); st3.QuickReads-st2.QuickReads != 1 || st3.QuickFallbacks-st2.QuickFallbacks != 1 {
		t.Errorf("fetch with a stale cached answer: %d one-round-trip reads, %d fell back; want 1 and 1",
			st3.QuickReads-st2.QuickReads, st3.QuickFallbacks-st2.QuickFallbacks)
	}
}

// TestQuickFetchEndsByItsDeadline: a fetch whose one-round-trip read asks
// a holder that never answers ends by the call's deadline (Config.Timeout
// from the fetch), with an error naming the timeout: the two-step way the
// key then falls back to gets what is left of that deadline, not a new
// one.
func TestQuickFetchEndsByItsDeadline(t *testing.T) {
	const timeout = 400 * time.Millisecond
	f := newQuickNet(t, []string{"a", "b"}, Config{Timeout: timeout})
	a, b := f.node("a"), f.node("b")
	slow := "slow"
	for i := 0; b.c.Home([]byte(slow)) != "a"; i++ {
		slow = fmt.Sprintf("slow/%d", i) // homed at a: b caches a's answer
	}
	a.put(t, slow, value(slow, 4096))
	f.heldAs(t, slow, "a", 4096)
	if errs := fetchKeys(t, b, slow); errs[0] != nil {
		t.Fatal(errs[0])
	}
	b.dropHere(t, slow)
	// a answers no read by key, and its READs wait past any deadline.
	f.kindMu.Lock()
	f.mute["a"] = true
	f.kindMu.Unlock()
	f.holdReads()
	defer f.releaseReads()
	t0 := time.Now()
	err := fetchKeys(t, b, slow)[0]
	took := time.Since(t0)
	if !errors.Is(err, xfer.ErrTimeout) {
		t.Errorf("fetch from a holder that never answers: %v, want a timeout", err)
	}
	if took > timeout+timeout/2 {
		t.Errorf("fetch from a holder that never answers took %v, want it ended by its deadline (%v)", took, timeout)
	}
}
