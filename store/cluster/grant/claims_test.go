package grant

import (
	"errors"
	"sync"
	"testing"
	"time"
)

// 64 readers of one hot key with 2 replicas: no holder ever has more
// readers of the key than it admits, the readers spread over both
// replicas, and every reader finishes (a refused one waits for a release,
// never for time).
func TestClaimsHotKeyNeverOverLimit(t *testing.T) {
	clk := newClock()
	const limit, readers = 4, 64
	c := NewClaims(ClaimsConfig{MaxPerKey: limit, Clock: clk})
	defer c.Close()
	key := []byte("hot/prefix/0001")
	holders := []string{"daemon-a", "daemon-b"}

	var mu sync.Mutex // guards the fields below
	reading := map[string]int{}
	maxSeen := map[string]int{}
	released := make(chan struct{}) // closed and replaced at each release
	var refused int

	var wg sync.WaitGroup
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				wait := released
				mu.Unlock()
				cl, err := c.Acquire(rd, key, holders, clk.Now().Add(time.Minute))
				if errors.Is(err, ErrBusy) {
					mu.Lock()
					refused++
					mu.Unlock()
					<-wait // a release happened since we looked: try again
					continue
				}
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				reading[cl.Holder]++
				if reading[cl.Holder] > maxSeen[cl.Holder] {
					maxSeen[cl.Holder] = reading[cl.Holder]
				}
				if n := c.Readers(cl.Holder, key); n > limit {
					t.Errorf("%s has %d readers of the key, admits %d", cl.Holder, n, limit)
				}
				mu.Unlock()
				// The read happens here.
				mu.Lock()
				reading[cl.Holder]--
				close(released)
				released = make(chan struct{})
				if err := c.Release(rd, cl.ID); err != nil {
					t.Errorf("Release: %v", err)
				}
				mu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	for _, h := range holders {
		if maxSeen[h] > limit {
			t.Errorf("%s had %d concurrent readers, admits %d", h, maxSeen[h], limit)
		}
	}
	st := c.Stats()
	if st.Granted != readers || st.Outstanding != 0 {
		t.Errorf("stats %+v: want %d granted, 0 outstanding", st, readers)
	}
	if st.Refused != uint64(refused) {
		t.Errorf("stats say %d refused, the readers saw %d", st.Refused, refused)
	}
}

// A hot key fills the least loaded replica first, and once every replica
// is at its limit the next reader is refused with ErrBusy, counted.
func TestClaimsSpreadAndRefuse(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{MaxPerKey: 2, Clock: clk})
	defer c.Close()
	key, hs := []byte("k"), []string{"a", "b", "c"}
	dl := clk.Now().Add(time.Second)
	got := map[string]int{}
	for i := 0; i < 6; i++ {
		cl, err := c.Acquire(rd, key, hs, dl)
		if err != nil {
			t.Fatalf("reader %d: %v", i, err)
		}
		got[cl.Holder]++
		// Least loaded first: after 3 readers each holder has one.
		if i == 2 && (got["a"] != 1 || got["b"] != 1 || got["c"] != 1) {
			t.Fatalf("after 3 readers: %v, want one each", got)
		}
	}
	if _, err := c.Acquire(rd, key, hs, dl); !errors.Is(err, ErrBusy) {
		t.Fatalf("7th reader of 3 holders admitting 2: %v, want ErrBusy", err)
	}
	// Another key has room on the same holders.
	if _, err := c.Acquire(rd, []byte("other"), hs, dl); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if st := c.Stats(); st.Refused != 1 || st.Outstanding != 7 {
		t.Fatalf("stats %+v: want 1 refused, 7 outstanding", st)
	}
}

// Equally loaded holders are picked by rendezvous over the key: the same
// key picks the same holder whatever order the holders are named in.
func TestClaimsRendezvousTieBreak(t *testing.T) {
	clk := newClock()
	for i := 0; i < 32; i++ {
		key := []byte{byte(i), 'k'}
		c1 := NewClaims(ClaimsConfig{Clock: clk})
		c2 := NewClaims(ClaimsConfig{Clock: clk})
		a, err1 := c1.Acquire(rd, key, []string{"x", "y", "z"}, clk.Now().Add(time.Second))
		b, err2 := c2.Acquire(rd, key, []string{"z", "x", "y"}, clk.Now().Add(time.Second))
		c1.Close()
		c2.Close()
		if err1 != nil || err2 != nil || a.Holder != b.Holder {
			t.Fatalf("key %q: %q (%v) and %q (%v)", key, a.Holder, err1, b.Holder, err2)
		}
	}
}

// A claim nobody releases ends at its deadline; releasing it afterwards is
// ErrClaimNotFound, and its place is free again.
func TestClaimsExpireAtDeadline(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{MaxPerKey: 1, Clock: clk})
	defer c.Close()
	key := []byte("k")
	cl, err := c.Acquire(rd, key, []string{"a"}, clk.Now().Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(rd, key, []string{"a"}, clk.Now().Add(time.Second)); !errors.Is(err, ErrBusy) {
		t.Fatalf("second reader: %v, want ErrBusy", err)
	}
	clk.Advance(time.Second)
	if c.Readers("a", key) != 1 {
		t.Fatal("claim ended before its deadline")
	}
	clk.Advance(time.Second)
	if n := c.Readers("a", key); n != 0 {
		t.Fatalf("%d readers after the deadline", n)
	}
	if err := c.Release(rd, cl.ID); !errors.Is(err, ErrClaimNotFound) {
		t.Fatalf("release after expiry: %v, want ErrClaimNotFound", err)
	}
	if _, err := c.Acquire(rd, key, []string{"a"}, clk.Now().Add(time.Second)); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if st := c.Stats(); st.Expired != 1 {
		t.Fatalf("stats %+v: want 1 expired", st)
	}
}

// MaxPerHolder bounds a holder's readers over all its keys.
func TestClaimsPerHolderLimit(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{MaxPerKey: 4, MaxPerHolder: 3, Clock: clk})
	defer c.Close()
	dl := clk.Now().Add(time.Second)
	for i := 0; i < 3; i++ {
		if cl, err := c.Acquire(rd, []byte{byte('a' + i)}, []string{"h", "g"}, dl); err != nil || cl.Holder != "h" && cl.Holder != "g" {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, err := c.Acquire(rd, []byte{byte('x' + i)}, []string{"h", "g"}, dl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Acquire(rd, []byte("z"), []string{"h", "g"}, dl); !errors.Is(err, ErrBusy) {
		t.Fatalf("a 7th reader of holders admitting 3 each: %v, want ErrBusy", err)
	}
}

func TestClaimsBadArguments(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{Clock: clk, MaxTTL: time.Minute})
	for name, f := range map[string]func() error{
		"no key":        func() error { _, err := c.Acquire(rd, nil, []string{"a"}, clk.Now().Add(time.Second)); return err },
		"no holders":    func() error { _, err := c.Acquire(rd, []byte("k"), nil, clk.Now().Add(time.Second)); return err },
		"past deadline": func() error { _, err := c.Acquire(rd, []byte("k"), []string{"a"}, clk.Now()); return err },
		"far deadline": func() error {
			_, err := c.Acquire(rd, []byte("k"), []string{"a"}, clk.Now().Add(time.Hour))
			return err
		},
	} {
		if err := f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	c.Close()
	if _, err := c.Acquire(rd, []byte("k"), []string{"a"}, clk.Now().Add(time.Second)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// Claims released before their deadline, and handles renewed again and
// again, leave no record per call behind: the deadlines kept stay in
// proportion to what is live, and the live ones still end on time.
func TestDeadlinesStayBounded(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{Clock: clk})
	defer c.Close()
	held, err := c.Acquire(rd, []byte("held"), []string{"a"}, clk.Now().Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10000; i++ {
		cl, err := c.Acquire(rd, []byte("k"), []string{"a", "b"}, clk.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(rd, cl.ID); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	n := len(c.sched.heap)
	c.mu.Unlock()
	if n > 2+64 {
		t.Fatalf("%d deadlines kept for 1 claim outstanding", n)
	}
	clk.Advance(time.Minute)
	if err := c.Release(rd, held.ID); !errors.Is(err, ErrClaimNotFound) {
		t.Fatalf("the claim kept through the tidying did not expire: %v", err)
	}

	p := newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	hd, err := h.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if hd, err = h.Renew(hd.Token, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	n = len(h.sched.heap)
	h.mu.Unlock()
	if n > 2+64 {
		t.Fatalf("%d deadlines kept for 1 live handle", n)
	}
	clk.Advance(time.Minute)
	if p.count("k") != 0 {
		t.Fatal("the renewed handle did not expire after the tidying")
	}
}

// rd is the reader the claims tests take their claims for.
var rd = Reader{ID: "reader", Epoch: 1}

// A release is obeyed only from the reader that took the claim: another
// daemon, or the same daemon in another run, is refused
// (ErrNotClaimHolder) and releases nothing, even the claims of its batch
// that are its own; the holder's release then ends them.
func TestClaimsReleaseOnlyByHolder(t *testing.T) {
	clk := newClock()
	c := NewClaims(ClaimsConfig{MaxPerKey: 1, Clock: clk})
	defer c.Close()
	other := Reader{ID: "intruder", Epoch: 1}
	restarted := Reader{ID: rd.ID, Epoch: rd.Epoch + 1}
	dl := clk.Now().Add(time.Minute)
	mine, err := c.Acquire(rd, []byte("k"), []string{"a"}, dl)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := c.Acquire(other, []byte("j"), []string{"a"}, dl)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Reader{other, restarted} {
		if err := c.Release(r, mine.ID); !errors.Is(err, ErrNotClaimHolder) {
			t.Fatalf("release of %s's claim by %+v: %v, want ErrNotClaimHolder", rd.ID, r, err)
		}
	}
	// A batch with one foreign claim changes nothing, its own included.
	if err := c.Release(other, theirs.ID, mine.ID); !errors.Is(err, ErrNotClaimHolder) {
		t.Fatalf("mixed batch: %v, want ErrNotClaimHolder", err)
	}
	if c.Readers("a", []byte("k")) != 1 || c.Readers("a", []byte("j")) != 1 {
		t.Fatal("a refused release ended a claim")
	}
	if _, err := c.Acquire(rd, []byte("k"), []string{"a"}, dl); !errors.Is(err, ErrBusy) {
		t.Fatalf("the key's place was freed by a refused release: %v", err)
	}
	if st := c.Stats(); st.Outstanding != 2 || st.Foreign != 3 {
		t.Fatalf("stats %+v: want 2 outstanding, 3 foreign releases", st)
	}
	if err := c.Release(rd, mine.ID); err != nil {
		t.Fatalf("release by its reader: %v", err)
	}
	if err := c.Release(other, theirs.ID); err != nil {
		t.Fatalf("release by its reader: %v", err)
	}
	if st := c.Stats(); st.Outstanding != 0 {
		t.Fatalf("stats %+v: want none outstanding", st)
	}
}
