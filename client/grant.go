package client

import (
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/wire"
)

// Retention handles, placement leases and the daemon's mode (seed 003).
// Both handles and leases belong to the daemon's store, not to this
// connection: they outlive it, and end when released or at their expiry.

// Handle is a retention handle: its token (the capability: whoever holds
// it renews or releases it, at the daemon that issued it), its id and its
// expiry.
type Handle struct {
	Token  []byte
	ID     uint64
	Expiry time.Time
}

// Lease is a placement lease's expiry; Joined says an earlier create with
// the same operation id made it (nothing was pinned again).
type Lease struct {
	Expiry time.Time
	Joined bool
}

// ModeInfo is the daemon's mode, its budget (remote gets in flight; bytes
// per second served to other hosts, 0 for no bound) and its counters.
type ModeInfo = wire.ModeResponse

func ttlMS(ttl time.Duration) (uint32, error) {
	ms := ttl / time.Millisecond
	if ms <= 0 || ms > 1<<32-1 {
		return 0, fmt.Errorf("%w: ttl %v (1ms..%v)", ErrInvalidArgument, ttl, time.Duration(1<<32-1)*time.Millisecond)
	}
	return uint32(ms), nil
}

func fromUnixMS(ms uint64) time.Time { return time.UnixMilli(int64(ms)) }

// HandleIssue asks for a retention handle that keeps keys from eviction
// for ttl: every key is pinned, or none (a key that is not stored fails
// the call with ErrNotFound).
func (c *Client) HandleIssue(keys [][]byte, ttl time.Duration, opts ...CallOption) (Handle, error) {
	if err := checkKeys(keys, len(keys)); err != nil {
		return Handle{}, err
	}
	ms, err := ttlMS(ttl)
	if err != nil {
		return Handle{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.HandleIssueRequest](c.start(opts)) = wire.HandleIssueRequest{Keys: keys, TTLMS: ms}
	r, err := call[wire.HandleIssueResponse](c, noFD, nil)
	if err != nil {
		return Handle{}, err
	}
	return Handle{Token: append([]byte(nil), r.Token...), ID: r.HandleID, Expiry: fromUnixMS(r.ExpiryUnixMS)}, nil
}

// HandleRenew extends the handle of token to ttl from now, at its issuer
// (a daemon that did not issue it routes the call there, or refuses it
// with ErrFailedPrecondition). A token that is forged, expired, released
// or of an issuer that restarted is ErrPermissionDenied. The answer has
// the renewed token, which is to be used from now on.
func (c *Client) HandleRenew(token []byte, ttl time.Duration, opts ...CallOption) (Handle, error) {
	if len(token) == 0 || len(token) > wire.MaxHandleToken {
		return Handle{}, fmt.Errorf("%w: a token of %d bytes", ErrInvalidArgument, len(token))
	}
	ms, err := ttlMS(ttl)
	if err != nil {
		return Handle{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.HandleRenewRequest](c.start(opts)) = wire.HandleRenewRequest{Token: token, TTLMS: ms}
	r, err := call[wire.HandleRenewResponse](c, noFD, nil)
	if err != nil {
		return Handle{}, err
	}
	return Handle{Token: append([]byte(nil), r.Token...), Expiry: fromUnixMS(r.ExpiryUnixMS)}, nil
}

// HandleRelease gives back the pins of the handle of token, at its issuer.
// A handle released or expired already is ErrPermissionDenied.
func (c *Client) HandleRelease(token []byte, opts ...CallOption) error {
	if len(token) == 0 || len(token) > wire.MaxHandleToken {
		return fmt.Errorf("%w: a token of %d bytes", ErrInvalidArgument, len(token))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.HandleReleaseRequest](c.start(opts)).Token = token
	_, err := call[wire.HandleReleaseResponse](c, noFD, nil)
	return err
}

// LeaseCreate pins keys where they are for ttl under operation id op. A
// create retried with the same op and keys (in the same order) joins the
// first lease (Lease.Joined); the same op with other keys, or of a lease
// released lately, is ErrFailedPrecondition.
func (c *Client) LeaseCreate(op []byte, keys [][]byte, ttl time.Duration, opts ...CallOption) (Lease, error) {
	if len(op) == 0 || len(op) > wire.MaxOpID {
		return Lease{}, fmt.Errorf("%w: an operation id of %d bytes (1..%d)", ErrInvalidArgument, len(op), wire.MaxOpID)
	}
	if err := checkKeys(keys, len(keys)); err != nil {
		return Lease{}, err
	}
	ms, err := ttlMS(ttl)
	if err != nil {
		return Lease{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.LeaseCreateRequest](c.start(opts)) = wire.LeaseCreateRequest{OpID: op, Keys: keys, TTLMS: ms}
	r, err := call[wire.LeaseCreateResponse](c, noFD, nil)
	if err != nil {
		return Lease{}, err
	}
	return Lease{Expiry: fromUnixMS(r.ExpiryUnixMS), Joined: r.Joined}, nil
}

// LeaseRelease gives back the pins of the lease of operation id op (nil
// when it ended already; ErrNotFound when op names no lease).
func (c *Client) LeaseRelease(op []byte, opts ...CallOption) error {
	if len(op) == 0 || len(op) > wire.MaxOpID {
		return fmt.Errorf("%w: an operation id of %d bytes (1..%d)", ErrInvalidArgument, len(op), wire.MaxOpID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.LeaseReleaseRequest](c.start(opts)).OpID = op
	_, err := call[wire.LeaseReleaseResponse](c, noFD, nil)
	return err
}

// Mode shows the daemon's mode and its budget.
func (c *Client) Mode(opts ...CallOption) (ModeInfo, error) { return c.mode("", opts) }

// SetMode changes the daemon's mode (local-first, budgeted-hybrid,
// global-governed) and shows it. Only root or the daemon's user may
// (ErrPermissionDenied).
func (c *Client) SetMode(mode string, opts ...CallOption) (ModeInfo, error) {
	if mode == "" || len(mode) > wire.MaxModeName {
		return ModeInfo{}, fmt.Errorf("%w: mode %q", ErrInvalidArgument, mode)
	}
	return c.mode(mode, opts)
}

func (c *Client) mode(set string, opts []CallOption) (ModeInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.ModeRequest](c.start(opts)).Set = set
	r, err := call[wire.ModeResponse](c, noFD, nil)
	if err != nil {
		return ModeInfo{}, err
	}
	return *r, nil
}
