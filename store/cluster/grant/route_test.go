package grant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// fakeChannel is the peer channel between daemons in one process: an
// exchange reaches the issuer's ServeHandles when it runs the epoch asked
// for, as tcp.Node.ExchangeAt does.
type fakeChannel map[string]struct {
	epoch uint64
	serve func(from string, epoch uint64, req []byte) ([]byte, error)
}

func (f fakeChannel) exchange(peer string, epoch uint64, kind string, req []byte, _ time.Duration) ([]byte, error) {
	p, ok := f[peer]
	switch {
	case kind != ExchangeKind:
		return nil, fmt.Errorf("kind %q: %w", kind, tcp.ErrNoHandler)
	case !ok:
		return nil, fmt.Errorf("%q: %w", peer, tcp.ErrUnknownPeer)
	case epoch != 0 && epoch != p.epoch:
		return nil, fmt.Errorf("%q: %w", peer, tcp.ErrStaleEpoch)
	}
	ans, err := p.serve("caller", 1, append([]byte(nil), req...))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", tcp.ErrExchange, err)
	}
	return ans, nil
}

func serveOne(h *Handles) func(string, uint64, []byte) ([]byte, error) {
	return ServeHandles(func(scope string) *Handles {
		if scope == h.cfg.Scope {
			return h
		}
		return nil
	})
}

// Renewals and releases at a daemon that did not issue the handle travel
// to the issuer over the peer channel; the issuer's verdicts come back
// with their codes; an issuer that restarted or is gone refuses.
func TestRouteOverPeerChannel(t *testing.T) {
	clk := newClock()
	pa := newCountPinner()
	var logBuf bytes.Buffer
	a := newIssuer(t, "a", 7, clk, pa, func(c *HandlesConfig) {
		c.Scope, c.Log = "default", slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ch := fakeChannel{}
	ch["a"] = struct {
		epoch uint64
		serve func(string, uint64, []byte) ([]byte, error)
	}{7, serveOne(a)}
	b := newIssuer(t, "b", 9, clk, newCountPinner(), func(c *HandlesConfig) {
		c.Scope, c.Members, c.Router = "default", members{"a": 7}, PeerRouter{Exchange: ch.exchange}
	})
	hd, err := a.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	hd2, err := b.Renew(hd.Token, time.Minute)
	if err != nil {
		t.Fatalf("routed renew: %v", err)
	}
	if hd2.ID != hd.ID || hd2.Issuer != "a" || !hd2.Expiry.After(hd.Expiry) {
		t.Fatalf("renewed %+v from %+v", hd2, hd)
	}
	if _, err := b.Verify(hd2.Token, keys("k")); err != nil {
		t.Fatalf("the renewed token at b: %v", err)
	}
	clk.Advance(30 * time.Second)
	if pa.count("k") != 1 {
		t.Fatal("the routed renewal did not keep the issuer's pin")
	}
	if _, err := b.Release(hd2.Token); err != nil {
		t.Fatalf("routed release: %v", err)
	}
	if pa.count("k") != 0 {
		t.Fatal("the routed release left the issuer's pin")
	}
	// The issuer records what the peer's client did to its handle.
	for _, want := range []string{
		`level=DEBUG msg="retention handle renewed for a peer" peer=caller handle=1 issuer=a keys=1 `,
		`level=INFO msg="retention handle released for a peer" peer=caller handle=1 issuer=a keys=1`,
	} {
		if !strings.Contains(logBuf.String(), want) {
			t.Errorf("the issuer's log lacks %q:\n%s", want, logBuf.String())
		}
	}
	// The issuer's verdict, with its category: released already.
	if _, err := b.Release(hd2.Token); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("routed second release: %v, want PERMISSION_DENIED", err)
	}
	if _, err := b.Renew(hd2.Token, time.Minute); !errors.Is(err, xfer.ErrPermission) {
		t.Fatalf("routed renew of a released handle: %v, want PERMISSION_DENIED", err)
	}

	// The issuer restarted: the exchange is not run in its new epoch.
	hd3, err := a.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e := ch["a"]
	e.epoch = 8
	ch["a"] = e
	if _, err := b.Renew(hd3.Token, time.Minute); !errors.Is(err, ErrForeignEpoch) {
		t.Fatalf("issuer restarted: %v, want ErrForeignEpoch", err)
	}
	delete(ch, "a")
	if _, err := b.Release(hd3.Token); !errors.Is(err, ErrUnknownIssuer) {
		t.Fatalf("issuer gone: %v, want ErrUnknownIssuer", err)
	}
	if pa.count("k") != 1 {
		t.Fatal("a refused route changed the issuer's pins")
	}
}

// The issuer's side refuses what is not its own: a token of another
// issuer is never routed on (FAILED_PRECONDITION), one of a scope it has
// no store of is PERMISSION_DENIED, a request that does not decode fails.
func TestServeHandlesRefusals(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, "a", 7, clk, newCountPinner(), func(c *HandlesConfig) { c.Scope = "default" })
	c := newIssuer(t, "c", 3, clk, newCountPinner(), func(c *HandlesConfig) { c.Scope = "default" })
	serve := serveOne(a)
	other, err := c.Issue(keys("k"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := openToken(other.Token, clusterKey)
	ans, err := serve("b", 1, encodeRoute(opRelease, tok, other.Token, 0))
	if err != nil || len(ans) != 1 || !errors.Is(status.CategoryOf(codeOfByte(ans[0])), xfer.ErrPrecondition) {
		t.Fatalf("another issuer's token: %v, %v; want FAILED_PRECONDITION", ans, err)
	}
	tok.Scope = "tenant-x"
	ans, err = serve("b", 1, encodeRoute(opRelease, tok, other.Token, 0))
	if err != nil || len(ans) != 1 || !errors.Is(status.CategoryOf(codeOfByte(ans[0])), xfer.ErrPermission) {
		t.Fatalf("a scope without a store: %v, %v; want PERMISSION_DENIED", ans, err)
	}
	for _, bad := range [][]byte{nil, {1}, {2, 1, 0, 0, 0, 0, 0}, {1, 3, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0, 9, 'x'}} {
		if _, err := serve("b", 1, bad); !errors.Is(err, xfer.ErrInvalid) {
			t.Errorf("request %v: %v, want ErrInvalid", bad, err)
		}
	}
	if st := c.Stats(); st.Live != 1 {
		t.Fatal("c's handle changed")
	}
}

// FuzzServeHandles: whatever a peer sends, the issuer's side answers a
// code or an error, never panics, and never releases a handle it is not
// shown a valid token of.
func FuzzServeHandles(f *testing.F) {
	clk := newClock()
	p := newCountPinner()
	h, err := NewHandles(HandlesConfig{DaemonID: "a", Epoch: 7, Key: clusterKey, Pinner: p, Clock: clk})
	if err != nil {
		f.Fatal(err)
	}
	hd, err := h.Issue(keys("k"), time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	tok, _ := openToken(hd.Token, clusterKey)
	f.Add(encodeRoute(opRenew, tok, hd.Token, time.Minute))
	f.Add(encodeRoute(opRelease, tok, hd.Token[:len(hd.Token)-1], 0))
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0})
	serve := ServeHandles(func(string) *Handles { return h })
	f.Fuzz(func(t *testing.T, req []byte) {
		ans, err := serve("peer", 1, req)
		if err == nil && len(ans) == 0 {
			t.Fatal("no answer and no error")
		}
		if p.count("k") == 1 {
			return
		}
		if !bytes.Contains(req, hd.Token) {
			t.Fatalf("the handle went on a request without its token: %x", req)
		}
		if hd, err = h.Issue(keys("k"), time.Hour); err != nil { // released rightly: the next input gets a new one
			t.Fatal(err)
		}
	})
}

func codeOfByte(b byte) tcproto.Code { return tcproto.Code(b) }

// A renewal's answer from the issuer is a token the client goes on with:
// it must be the handle's, signed by the cluster, or the renewal is
// refused (UNAVAILABLE: the client's token stays as good as it was),
// never handed on as a success. An answer of an expiry and no token, a
// token cut short, and the token of another handle of the issuer are each
// refused; the expiry answered is the signed token's.
func TestRouteRenewalAnswerChecked(t *testing.T) {
	clk := newClock()
	a := newIssuer(t, "a", 7, clk, newCountPinner(), func(c *HandlesConfig) { c.Scope = "default" })
	hd, err := a.Issue(keys("k"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := a.Issue(keys("other"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	serve := serveOne(a)
	var lie func(ans []byte) []byte
	ch := fakeChannel{}
	ch["a"] = struct {
		epoch uint64
		serve func(string, uint64, []byte) ([]byte, error)
	}{7, func(from string, epoch uint64, req []byte) ([]byte, error) {
		ans, err := serve(from, epoch, req)
		if err != nil || lie == nil {
			return ans, err
		}
		return lie(ans), nil
	}}
	b := newIssuer(t, "b", 9, clk, newCountPinner(), func(c *HandlesConfig) {
		c.Scope, c.Members, c.Router = "default", members{"a": 7}, PeerRouter{Exchange: ch.exchange}
	})
	for name, f := range map[string]func(ans []byte) []byte{
		"no token":       func(ans []byte) []byte { return ans[:9] },
		"a token cut":    func(ans []byte) []byte { return ans[:len(ans)-1] },
		"another handle": func(ans []byte) []byte { return append(ans[:9:9], other.Token...) },
	} {
		lie = f
		if got, err := b.Renew(hd.Token, time.Minute); !errors.Is(err, xfer.ErrUnavailable) {
			t.Errorf("%s: renewed to %+v, %v; want UNAVAILABLE", name, got, err)
		}
	}
	lie = func(ans []byte) []byte { // an expiry that is not the token's
		binary.LittleEndian.PutUint64(ans[1:], uint64(clk.Now().Add(24*time.Hour).UnixMilli()))
		return ans
	}
	got, err := b.Renew(hd.Token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Add(time.Minute); !got.Expiry.Equal(want) {
		t.Fatalf("renewed to %v, the token says %v", got.Expiry, want)
	}
}

// TestRouteTTLNotWrapped: a renewal asked for longer than the route
// message's field holds asks the issuer for the most it holds (which the
// issuer bounds by its MaxTTL), never for the wrapped remainder; an issuer
// whose MaxTTL a routed renewal could not carry is refused at its start.
func TestRouteTTLNotWrapped(t *testing.T) {
	// 2^32 ms + 5 ms would wrap to 5 ms.
	ask := time.Duration(1<<32+5) * time.Millisecond
	b := encodeRoute(opRenew, Token{Scope: "s"}, []byte("tok"), ask)
	if got := time.Duration(binary.LittleEndian.Uint32(b[2:])) * time.Millisecond; got != maxRouteTTLms*time.Millisecond {
		t.Fatalf("a renewal of %v carries %v, want %v", ask, got, maxRouteTTLms*time.Millisecond)
	}
	_, err := NewHandles(HandlesConfig{DaemonID: "a", Epoch: 7, Key: clusterKey, Pinner: newCountPinner(),
		MaxTTL: maxRouteTTLms*time.Millisecond + time.Millisecond})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewHandles with a MaxTTL past the route's field: %v, want ErrInvalid", err)
	}
}
