package grant

import (
	"errors"
	"testing"
	"time"
)

var clusterKey = []byte("the cluster's token key, 32 bytes")

func newIssuer(t *testing.T, id string, epoch uint64, clk testClock, p Pinner, mod func(*HandlesConfig)) *Handles {
	t.Helper()
	cfg := HandlesConfig{DaemonID: id, Epoch: epoch, Key: clusterKey, Pinner: p, Clock: clk, MaxTTL: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewHandles(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// A handle pins its keys until released; its token verifies at its
// issuer with its keys, and not with others.
func TestHandleIssueVerifyRelease(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	ks := keys("k1", "k2")
	hd, err := h.Issue(ks, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if p.count("k1") != 1 || p.count("k2") != 1 {
		t.Fatalf("pins after issue: k1 %d, k2 %d", p.count("k1"), p.count("k2"))
	}
	tok, err := h.Verify(hd.Token, ks)
	if err != nil || tok.Issuer != "a" || tok.Epoch != 7 || tok.ID != hd.ID || tok.Keys != 2 {
		t.Fatalf("Verify: %+v, %v", tok, err)
	}
	if _, err := h.Verify(hd.Token, keys("k1", "k3")); !errors.Is(err, ErrKeysMismatch) {
		t.Fatalf("Verify with other keys: %v, want ErrKeysMismatch", err)
	}
	if hd.Issuer != "a" {
		t.Fatalf("issued by %q", hd.Issuer)
	}
	if rel, err := h.Release(hd.Token); err != nil || rel.ID != hd.ID || rel.Issuer != "a" || rel.Keys != 2 {
		t.Fatalf("release: %+v, %v; want what the token names", rel, err)
	}
	if p.count("k1") != 0 || p.count("k2") != 0 {
		t.Fatal("pins left after release")
	}
	if _, err := h.Verify(hd.Token, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("Verify after release: %v, want ErrExpired", err)
	}
	if _, err := h.Release(hd.Token); !errors.Is(err, ErrExpired) {
		t.Fatalf("second release: %v, want ErrExpired", err)
	}
	if st := h.Stats(); st.Issued != 1 || st.Released != 1 || st.Live != 0 || st.Keys != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Forged tokens are refused everywhere: a flipped bit anywhere, a token
// signed with another key, a truncated one, garbage.
func TestHandleForgedRefused(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	hd, err := h.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := range hd.Token {
		bad := append([]byte(nil), hd.Token...)
		bad[i] ^= 0x01
		if _, err := h.Verify(bad, nil); !errors.Is(err, ErrForged) {
			t.Fatalf("bit flipped in byte %d: %v, want ErrForged", i, err)
		}
		if _, err := h.Renew(bad, time.Minute); !errors.Is(err, ErrForged) {
			t.Fatalf("renew with byte %d flipped: %v, want ErrForged", i, err)
		}
		if _, err := h.Release(bad); !errors.Is(err, ErrForged) {
			t.Fatalf("release with byte %d flipped: %v, want ErrForged", i, err)
		}
	}
	other := newIssuer(t, "a", 7, clk, p, func(c *HandlesConfig) { c.Key = []byte("another cluster's key, 32 bytes!") })
	fake, err := other.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string][]byte{
		"other key": fake.Token, "truncated": hd.Token[:len(hd.Token)-1], "empty": nil,
		"garbage": []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
	} {
		if _, err := h.Verify(tok, nil); !errors.Is(err, ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
		if _, err := h.Release(tok); !errors.Is(err, ErrForged) {
			t.Errorf("%s release: %v, want ErrForged", name, err)
		}
	}
	if p.count("k") != 2 {
		t.Fatalf("k has %d pins, want 2 (the two handles)", p.count("k"))
	}
	if st := h.Stats(); st.Refused == 0 {
		t.Fatal("refusals not counted")
	}
}

// An expired handle's pins go by themselves, and its token is refused
// at the issuer and elsewhere; a renewal keeps it alive past its first
// expiry, and the older token stays valid until its own expiry.
func TestHandleExpiryAndRenew(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	b := newIssuer(t, "b", 9, clk, newCountPinner(), func(c *HandlesConfig) { c.Members = members{"a": 7} })
	hd, err := h.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Second)
	hd2, err := h.Renew(hd.Token, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if hd2.ID != hd.ID || !hd2.Expiry.After(hd.Expiry) {
		t.Fatalf("renewed %+v from %+v", hd2, hd)
	}
	clk.Advance(6 * time.Second) // past the first expiry
	if p.count("k") != 1 {
		t.Fatal("renewed handle released at its first expiry")
	}
	if _, err := h.Verify(hd.Token, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("old token past its expiry: %v, want ErrExpired", err)
	}
	if _, err := h.Verify(hd2.Token, nil); err != nil {
		t.Fatalf("renewed token: %v", err)
	}
	if _, err := b.Verify(hd2.Token, nil); err != nil {
		t.Fatalf("renewed token at another daemon: %v", err)
	}
	clk.Advance(15 * time.Second)
	if p.count("k") != 0 {
		t.Fatal("expired handle still pins its key")
	}
	if _, err := h.Verify(hd2.Token, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("at the issuer after expiry: %v, want ErrExpired", err)
	}
	if _, err := b.Verify(hd2.Token, nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("elsewhere after expiry: %v, want ErrExpired", err)
	}
	if _, err := h.Renew(hd2.Token, time.Minute); !errors.Is(err, ErrExpired) {
		t.Fatalf("renew after expiry: %v, want ErrExpired", err)
	}
	if st := h.Stats(); st.Expired != 1 || st.Renewed != 1 || st.Live != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A token of an issuer that restarted (another epoch) is refused: at the
// restarted issuer itself, and at a daemon that knows its new epoch. A
// token of an issuer the membership does not know (gone, or uncertain) is
// refused.
func TestHandleForeignEpochAndUnknownIssuer(t *testing.T) {
	clk := newClock()
	old := newIssuer(t, "a", 7, clk, newCountPinner(), nil)
	hd, err := old.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	restarted := newIssuer(t, "a", 8, clk, newCountPinner(), nil)
	if _, err := restarted.Verify(hd.Token, nil); !errors.Is(err, ErrForeignEpoch) {
		t.Fatalf("at the restarted issuer: %v, want ErrForeignEpoch", err)
	}
	if _, err := restarted.Renew(hd.Token, time.Minute); !errors.Is(err, ErrForeignEpoch) {
		t.Fatalf("renew at the restarted issuer: %v, want ErrForeignEpoch", err)
	}
	if _, err := restarted.Release(hd.Token); !errors.Is(err, ErrForeignEpoch) {
		t.Fatalf("release at the restarted issuer: %v, want ErrForeignEpoch", err)
	}
	b := newIssuer(t, "b", 1, clk, newCountPinner(), func(c *HandlesConfig) { c.Members = members{"a": 8} })
	if _, err := b.Verify(hd.Token, nil); !errors.Is(err, ErrForeignEpoch) {
		t.Fatalf("elsewhere, issuer in a new epoch: %v, want ErrForeignEpoch", err)
	}
	c := newIssuer(t, "c", 1, clk, newCountPinner(), func(c *HandlesConfig) { c.Members = members{"b": 1} })
	if _, err := c.Verify(hd.Token, nil); !errors.Is(err, ErrUnknownIssuer) {
		t.Fatalf("issuer not a member: %v, want ErrUnknownIssuer", err)
	}
	lone := newIssuer(t, "d", 1, clk, newCountPinner(), nil)
	if _, err := lone.Verify(hd.Token, nil); !errors.Is(err, ErrUnknownIssuer) {
		t.Fatalf("no membership: %v, want ErrUnknownIssuer", err)
	}
}

// Renewals and releases happen only at the issuer: another daemon
// refuses them without a route, and with one they reach the issuer,
// which is the one whose pins change.
func TestHandleRenewReleaseOnlyAtIssuer(t *testing.T) {
	clk := newClock()
	pa, pb := newCountPinner(), newCountPinner()
	a := newIssuer(t, "a", 7, clk, pa, nil)
	noRoute := newIssuer(t, "b", 9, clk, pb, func(c *HandlesConfig) { c.Members = members{"a": 7} })
	hd, err := a.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noRoute.Renew(hd.Token, time.Minute); !errors.Is(err, ErrNotIssuer) {
		t.Fatalf("renew at a non-issuer: %v, want ErrNotIssuer", err)
	}
	if _, err := noRoute.Release(hd.Token); !errors.Is(err, ErrNotIssuer) {
		t.Fatalf("release at a non-issuer: %v, want ErrNotIssuer", err)
	}
	routed := newIssuer(t, "b", 9, clk, pb, func(c *HandlesConfig) {
		c.Members, c.Router = members{"a": 7}, routeTo{"a": a}
	})
	hd2, err := routed.Renew(hd.Token, time.Minute)
	if err != nil {
		t.Fatalf("routed renew: %v", err)
	}
	if st := a.Stats(); st.Renewed != 1 {
		t.Fatalf("the issuer counted %d renewals", st.Renewed)
	}
	clk.Advance(30 * time.Second) // past the first expiry: the renewal held
	if pa.count("k") != 1 {
		t.Fatal("the routed renewal did not extend the issuer's handle")
	}
	if _, err := routed.Release(hd2.Token); err != nil {
		t.Fatalf("routed release: %v", err)
	}
	if pa.count("k") != 0 || pb.calls() != 0 {
		t.Fatalf("after routed release: issuer pins %d, other daemon pinned %d times", pa.count("k"), pb.calls())
	}
	// An issuer that cannot be reached: the release fails, named.
	gone := newIssuer(t, "b", 9, clk, pb, func(c *HandlesConfig) { c.Members, c.Router = members{"a": 7}, routeTo{} })
	if _, err := gone.Release(hd2.Token); err == nil {
		t.Fatal("release routed to an unreachable issuer succeeded")
	}
}

func TestHandleLimits(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, func(c *HandlesConfig) { c.MaxHandles, c.MaxKeys = 2, 3 })
	if _, err := h.Issue(keys("a", "b", "c", "d"), time.Minute); !errors.Is(err, ErrTooManyKeys) {
		t.Fatalf("4 keys, limit 3: %v", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := h.Issue(keys("a"), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.Issue(keys("a"), time.Minute); !errors.Is(err, ErrHandleLimit) {
		t.Fatalf("3rd handle, limit 2: %v", err)
	}
	if p.count("a") != 2 {
		t.Fatalf("a refused issue pinned: %d pins", p.count("a"))
	}
	for name, f := range map[string]func() error{
		"no keys":   func() error { _, err := h.Issue(nil, time.Minute); return err },
		"empty key": func() error { _, err := h.Issue(keys(""), time.Minute); return err },
		"zero ttl":  func() error { _, err := h.Issue(keys("a"), 0); return err },
		"long ttl":  func() error { _, err := h.Issue(keys("a"), 2*time.Hour); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// A key that cannot be pinned: nothing held, the error says why.
	p.missing["gone"] = true
	h2 := newIssuer(t, "a", 7, clk, p, nil)
	if _, err := h2.Issue(keys("x", "gone"), time.Minute); err == nil || p.count("x") != 0 {
		t.Fatalf("issue of a missing key: %v, x pins %d", err, p.count("x"))
	}
	if st := h2.Stats(); st.Live != 0 {
		t.Fatalf("a failed issue left %d live", st.Live)
	}
}

// Close gives back every handle's pins.
func TestHandlesClose(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	hd, err := h.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	if p.count("k") != 0 {
		t.Fatal("Close kept pins")
	}
	if _, err := h.Release(hd.Token); !errors.Is(err, ErrClosed) {
		t.Fatalf("release after Close: %v, want ErrClosed", err)
	}
	if _, err := h.Issue(keys("k"), time.Minute); !errors.Is(err, ErrClosed) {
		t.Fatalf("issue after Close: %v, want ErrClosed", err)
	}
	clk.Advance(time.Hour) // no timer left to release twice
}

// A token is good only in its scope (its tenant's store): another scope of
// the same daemon refuses it for everything.
func TestHandleScope(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, "d", 7, clk, newCountPinner(), func(c *HandlesConfig) { c.Scope = "tenant-a" })
	b := newIssuer(t, "d", 7, clk, newCountPinner(), func(c *HandlesConfig) { c.Scope = "tenant-b" })
	hd, err := a.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := a.Verify(hd.Token, nil); err != nil || tok.Scope != "tenant-a" {
		t.Fatalf("in its scope: %+v, %v", tok, err)
	}
	if _, err := b.Verify(hd.Token, nil); !errors.Is(err, ErrForged) {
		t.Fatalf("verify in another scope: %v, want ErrForged", err)
	}
	if _, err := b.Renew(hd.Token, time.Minute); !errors.Is(err, ErrForged) {
		t.Fatalf("renew in another scope: %v, want ErrForged", err)
	}
	if _, err := b.Release(hd.Token); !errors.Is(err, ErrForged) {
		t.Fatalf("release in another scope: %v, want ErrForged", err)
	}
}

// A renewal extends the pins first; when they cannot be extended the
// renewal is refused and the handle keeps its expiry.
func TestHandleRenewExtendsPins(t *testing.T) {
	clk, p := newClock(), newCountPinner()
	h := newIssuer(t, "a", 7, clk, p, nil)
	hd, err := h.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Renew(hd.Token, time.Minute); err != nil || p.extends != 1 {
		t.Fatalf("renew: %v, %d extends", err, p.extends)
	}
	p.extendErr = errors.New("holder gone")
	hd2, err := h.Issue(keys("j"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Renew(hd2.Token, time.Minute); err == nil {
		t.Fatal("a renewal whose pins could not be extended succeeded")
	}
	clk.Advance(10 * time.Second)
	if p.count("j") != 0 || p.count("k") != 1 {
		t.Fatalf("j %d pins (want its first expiry kept), k %d", p.count("j"), p.count("k"))
	}
}

// gatePinner pins through countPinner once gate is closed, saying on
// entered that a Pin waits.
type gatePinner struct {
	*countPinner
	entered chan struct{}
	gate    chan struct{}
}

func (g gatePinner) Pin(keys [][]byte, ttl time.Duration) (Hold, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.countPinner.Pin(keys, ttl)
}

// A table closed while an issue or a create pins: the call fails with
// ErrClosed and gives its pins back.
func TestClosedWhilePinning(t *testing.T) {
	clk := newClock()
	g := gatePinner{newCountPinner(), make(chan struct{}), make(chan struct{})}
	h := newIssuer(t, "a", 7, clk, g, nil)
	l := newLeaseTable(t, clk, g, nil)
	errs := make(chan error, 2)
	go func() { _, err := h.Issue(keys("k"), time.Minute); errs <- err }()
	<-g.entered
	go func() { _, err := l.Create("op", keys("k"), time.Minute); errs <- err }()
	<-g.entered
	h.Close()
	l.Close()
	close(g.gate)
	for i := 0; i < 2; i++ {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Fatalf("a call closed while pinning: %v, want ErrClosed", err)
		}
	}
	if g.count("k") != 0 {
		t.Fatalf("%d pins left after the tables closed", g.count("k"))
	}
}
