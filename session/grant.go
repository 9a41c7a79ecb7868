package session

import (
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
)

// Retention handles and placement leases on the socket. They belong to the
// tenant's store, not to the connection: a handle outlives the connection
// that asked for it (its token is the capability; whoever holds it renews
// or releases it), a lease is joined by operation id from any connection,
// and both end by themselves at their expiry.

// Every token fits a message.
const _ = uint(wire.MaxHandleToken - grant.MaxTokenLen)

// SetGrants makes the handles and leases of the session's tenant (nil:
// none, and their calls answer UNAVAILABLE). It is called once, with
// SetTenant, before the first handler.
func (c *Session) SetGrants(g *grant.Grants) { c.grants = g }

func (c *Session) grantsOf() (*grant.Grants, error) {
	switch {
	case c.pool == nil:
		return nil, errNoPool
	case c.grants == nil:
		return nil, fmt.Errorf("%w: this daemon grants no handles or leases (no store)", ErrUnavailable)
	}
	return c.grants, nil
}

// grantCounters appends the tenant's handles' and leases' figures to dst,
// for Stats.
func (c *Session) grantCounters(dst []wire.Counter) []wire.Counter {
	if c.grants == nil {
		return dst
	}
	hs, ls := c.grants.Handles.Stats(), c.grants.Leases.Stats()
	for _, f := range [...]struct {
		name string
		v    uint64
	}{
		{"handles_live", hs.Live}, {"handle_keys", hs.Keys}, {"handles_issued", hs.Issued}, {"handles_renewed", hs.Renewed},
		{"handles_released", hs.Released}, {"handles_expired", hs.Expired}, {"handles_refused", hs.Refused},
		{"placement_leases_live", ls.Live}, {"placement_lease_keys", ls.Keys}, {"placement_leases_created", ls.Created},
		{"placement_leases_joined", ls.Joined}, {"placement_leases_refused", ls.Refused},
		{"placement_leases_released", ls.Released}, {"placement_leases_expired", ls.Expired},
	} {
		dst = append(dst, wire.Counter{Name: f.name, Value: f.v})
	}
	if p := c.grants.Pins; p != nil {
		ps := p.Stats()
		dst = append(dst, wire.Counter{Name: "grant_pinned_bytes", Value: ps.Pinned},
			wire.Counter{Name: "grant_pin_limit_bytes", Value: ps.Limit}, wire.Counter{Name: "grant_pin_limit", Value: ps.Refused})
	}
	return dst
}

func unixMS(t time.Time) uint64 { return uint64(t.UnixMilli()) }

func ttlOf(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// The calls' audit: the control server audits each with the request's
// audit keys; the session adds what it granted or gave back, under the
// same request id, its logger naming the tenant: a handle's id, issuer
// and number of keys, a lease's operation id and number of keys, and for
// an issue or a create the first key. A renewal, a keep-alive, is
// recorded one level below the others, as its audit record is.

// HandleIssue issues a retention handle on the request's keys.
func (c *Session) HandleIssue(ctx *wire.Context, m *wire.HandleIssueRequest, r *wire.Response) error {
	g, err := c.grantsOf()
	if err != nil {
		return err
	}
	h, err := g.Handles.Issue(m.Keys, ttlOf(m.TTLMS))
	if err != nil {
		return err
	}
	c.log.Info("retention handle issued", "request_id", ctx.RequestID, "handle", h.ID, "issuer", h.Issuer, "keys", h.Keys,
		"first_key", string(m.Keys[0]), "expiry", h.Expiry)
	a := wire.SetResponse[wire.HandleIssueResponse](r)
	a.Token, a.HandleID, a.ExpiryUnixMS = h.Token, h.ID, unixMS(h.Expiry)
	return nil
}

// HandleRenew renews a retention handle at its issuer.
func (c *Session) HandleRenew(ctx *wire.Context, m *wire.HandleRenewRequest, r *wire.Response) error {
	g, err := c.grantsOf()
	if err != nil {
		return err
	}
	h, err := g.Handles.Renew(m.Token, ttlOf(m.TTLMS))
	if err != nil {
		return err
	}
	c.log.Debug("retention handle renewed", "request_id", ctx.RequestID, "handle", h.ID, "issuer", h.Issuer, "keys", h.Keys,
		"expiry", h.Expiry)
	a := wire.SetResponse[wire.HandleRenewResponse](r)
	a.Token, a.ExpiryUnixMS = h.Token, unixMS(h.Expiry)
	return nil
}

// HandleRelease releases a retention handle at its issuer.
func (c *Session) HandleRelease(ctx *wire.Context, m *wire.HandleReleaseRequest, r *wire.Response) error {
	g, err := c.grantsOf()
	if err != nil {
		return err
	}
	t, err := g.Handles.Release(m.Token)
	if err != nil {
		return err
	}
	c.log.Info("retention handle released", "request_id", ctx.RequestID, "handle", t.ID, "issuer", t.Issuer, "keys", t.Keys)
	wire.SetResponse[wire.HandleReleaseResponse](r)
	return nil
}

// LeaseCreate creates (or joins) a placement lease.
func (c *Session) LeaseCreate(ctx *wire.Context, m *wire.LeaseCreateRequest, r *wire.Response) error {
	g, err := c.grantsOf()
	if err != nil {
		return err
	}
	l, err := g.Leases.Create(string(m.OpID), m.Keys, ttlOf(m.TTLMS))
	if err != nil {
		return err
	}
	c.log.Info("placement lease created", "request_id", ctx.RequestID, "op", string(m.OpID), "keys", l.Keys,
		"first_key", string(m.Keys[0]), "joined", l.Joined, "expiry", l.Expiry)
	a := wire.SetResponse[wire.LeaseCreateResponse](r)
	a.ExpiryUnixMS, a.Joined = unixMS(l.Expiry), l.Joined
	return nil
}

// LeaseRelease releases a placement lease.
func (c *Session) LeaseRelease(ctx *wire.Context, m *wire.LeaseReleaseRequest, r *wire.Response) error {
	g, err := c.grantsOf()
	if err != nil {
		return err
	}
	l, err := g.Leases.Release(string(m.OpID))
	if err != nil {
		return err
	}
	c.log.Info("placement lease released", "request_id", ctx.RequestID, "op", string(m.OpID), "keys", l.Keys)
	wire.SetResponse[wire.LeaseReleaseResponse](r)
	return nil
}
