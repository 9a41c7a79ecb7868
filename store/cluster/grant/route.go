package grant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Renewals and releases of another daemon's handles travel to their issuer
// as exchanges of the peer channel (tcp.Node.ExchangeAt), addressed to the
// epoch the token names: an issuer that restarted does not run them, and
// the caller is refused (fail closed).
//
// Request (little-endian):
//
//	u8 version (1)   u8 op (1 renew, 2 release)   u32 ttl_ms (renew)
//	u8 scope length, scope   token (the rest)
//
// Answer: u8 code (the control protocol's status code); after OK to a
// renewal, u64 expiry (unix ms) and the new token (the rest). The code
// carries the issuer's verdict (PERMISSION_DENIED for an expired token,
// say) to the client as the issuer's own client would see it.

// ExchangeKind is the kind of the handle exchanges.
const ExchangeKind = "grant.handle/1"

const (
	routeVersion = 1
	opRenew      = 1
	opRelease    = 2
)

// Exchanger is the peer channel as the router uses it:
// (*tcp.Node).ExchangeAt.
type Exchanger func(peerID string, epoch uint64, kind string, req []byte, timeout time.Duration) ([]byte, error)

// PeerRouter is the Router over the peer channel.
type PeerRouter struct {
	Exchange Exchanger
	// Timeout bounds one exchange (0: the channel's request timeout).
	Timeout time.Duration
}

var _ Router = PeerRouter{}

// maxRouteTTLms is the largest ttl a route message carries (its u32 of
// milliseconds: about 49.7 days).
const maxRouteTTLms = time.Duration(math.MaxUint32)

func encodeRoute(op byte, t Token, token []byte, ttl time.Duration) []byte {
	b := make([]byte, 0, 7+len(t.Scope)+len(token))
	b = append(b, routeVersion, op)
	// The issuer bounds the ttl by its own MaxTTL; one past what the field
	// holds asks for the most it can, never a wrapped few milliseconds.
	b = binary.LittleEndian.AppendUint32(b, uint32(min(ttl/time.Millisecond, maxRouteTTLms)))
	b = append(b, byte(len(t.Scope)))
	b = append(b, t.Scope...)
	return append(b, token...)
}

// call makes one exchange with t's issuer, in t's epoch, and returns the
// answer's body after an OK code.
func (r PeerRouter) call(op byte, t Token, token []byte, ttl time.Duration) ([]byte, error) {
	ans, err := r.Exchange(t.Issuer, t.Epoch, ExchangeKind, encodeRoute(op, t, token, ttl), r.Timeout)
	switch {
	case errors.Is(err, tcp.ErrStaleEpoch):
		return nil, fmt.Errorf("%w: %q no longer runs epoch %#x: %v", ErrForeignEpoch, t.Issuer, t.Epoch, err)
	case errors.Is(err, tcp.ErrUnknownPeer):
		return nil, fmt.Errorf("%w: %q: %v", ErrUnknownIssuer, t.Issuer, err)
	case err != nil:
		return nil, fmt.Errorf("handle %d at its issuer %q: %w", t.ID, t.Issuer, err)
	case len(ans) == 0:
		return nil, fmt.Errorf("%w: handle %d: an empty answer from %q", xfer.ErrUnavailable, t.ID, t.Issuer)
	}
	if c := wire.Code(ans[0]); c != tcproto.CodeOK {
		return nil, fmt.Errorf("%w: handle %d: its issuer %q answered %s", status.CategoryOf(c), t.ID, t.Issuer, c)
	}
	return ans[1:], nil
}

// Renew implements Router.
func (r PeerRouter) Renew(t Token, token []byte, ttl time.Duration) (Handle, error) {
	body, err := r.call(opRenew, t, token, ttl)
	if err != nil {
		return Handle{}, err
	}
	if len(body) < 8 || len(body) > 8+MaxTokenLen {
		return Handle{}, fmt.Errorf("%w: a renewal answer of %d bytes from %q", xfer.ErrUnavailable, len(body), t.Issuer)
	}
	return Handle{Token: append([]byte(nil), body[8:]...), Issuer: t.Issuer, ID: t.ID, Keys: int(t.Keys),
		Expiry: time.UnixMilli(int64(binary.LittleEndian.Uint64(body)))}, nil
}

// Release implements Router.
func (r PeerRouter) Release(t Token, token []byte) error {
	_, err := r.call(opRelease, t, token, 0)
	return err
}

// ServeHandles is the issuer's side of the handle exchanges, to register
// with (*tcp.Node).Handle(ExchangeKind, ...): it answers from the Handles
// of the request's scope (byScope returns nil for a scope it has none of).
// A request that does not decode is an error (the peer channel answers it
// as failed); every verdict on the token is a code in the answer.
func ServeHandles(byScope func(scope string) *Handles) func(from string, epoch uint64, req []byte) ([]byte, error) {
	return func(from string, _ uint64, req []byte) ([]byte, error) {
		if len(req) < 7 || req[0] != routeVersion || (req[1] != opRenew && req[1] != opRelease) {
			return nil, fmt.Errorf("%w: a handle exchange of %d bytes from %s", xfer.ErrInvalid, len(req), from)
		}
		sl := int(req[6])
		if len(req) < 7+sl {
			return nil, fmt.Errorf("%w: a handle exchange of %d bytes with a scope of %d from %s", xfer.ErrInvalid, len(req), sl, from)
		}
		op, ttl := req[1], time.Duration(binary.LittleEndian.Uint32(req[2:]))*time.Millisecond
		scope, token := string(req[7:7+sl]), req[7+sl:]
		h := byScope(scope)
		if h == nil {
			return []byte{byte(tcproto.CodePERMISSION_DENIED)}, nil // no such store here: the token is not ours
		}
		t, err := h.opened(token)
		if err != nil {
			return []byte{byte(status.CodeOf(err))}, nil
		}
		// What a peer's client changed here is recorded here too, naming
		// the peer: a release at the level of the calls' audit, a renewal
		// (a keep-alive) one below.
		if op == opRelease {
			err := h.releaseOwn(t)
			if err == nil {
				h.cfg.Log.Info("retention handle released for a peer", "peer", from, "handle", t.ID, "issuer", t.Issuer, "keys", t.Keys)
			}
			return []byte{byte(status.CodeOf(err))}, nil
		}
		hd, err := h.renewOwn(t, ttl)
		if err != nil {
			return []byte{byte(status.CodeOf(err))}, nil
		}
		h.cfg.Log.Debug("retention handle renewed for a peer", "peer", from, "handle", t.ID, "issuer", t.Issuer, "keys", t.Keys,
			"expiry", hd.Expiry)
		out := make([]byte, 0, 9+len(hd.Token))
		out = append(out, byte(tcproto.CodeOK))
		out = binary.LittleEndian.AppendUint64(out, uint64(hd.Expiry.UnixMilli()))
		return append(out, hd.Token...), nil
	}
}
