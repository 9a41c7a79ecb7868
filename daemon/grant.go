package daemon

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tensorcast/tensorcast/metrics"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/tcp"
)

// handleKeyLabel names the key retention handle tokens are signed with,
// derived from the cluster key.
const handleKeyLabel = "tensorcast retention handle v1"

// openGrants makes each store's retention handles and placement leases
// (this daemon their issuer, pinning in the store; a handle's scope is its
// tenant) and the daemon's admission for remote work in store_mode. With a
// peer plane, tokens are signed with a key derived from the cluster key
// and carry the plane's epoch, so every daemon of the cluster verifies
// them; renewals and releases of other daemons' handles go to their
// issuer over the peer channel, and this daemon serves those of its own.
// Without one, tokens are signed with a key and an epoch of this run only.
// It runs after the stores and the peer plane.
func (d *Daemon) openGrants() error {
	c := &d.cfg.StoreConfig
	mode, err := grant.ParseMode(c.StoreMode)
	if err != nil {
		return fmt.Errorf("%w: store_mode: %v", ErrConfig, err)
	}
	if d.admission, err = grant.NewAdmission(mode, nil, nil); err != nil {
		return err
	}
	if len(d.stores) == 0 {
		return nil
	}
	var (
		key     []byte
		epoch   uint64
		members grant.Members
		router  grant.Router
	)
	if d.peers != nil {
		if key, err = tcp.ClusterSubkey(d.cfg.ClusterKeyFile, handleKeyLabel); err != nil {
			return err
		}
		node := d.peers.Node()
		epoch = node.Epoch()
		members = grant.DirectoryMembers{Dir: node.Directory()}
		router = grant.PeerRouter{Exchange: node.ExchangeAt}
	} else {
		key = make([]byte, 32)
		var b [8]byte
		rand.Read(key)
		for epoch == 0 {
			rand.Read(b[:])
			epoch = binary.LittleEndian.Uint64(b[:])
		}
	}
	for i, st := range d.stores {
		log := d.log.With("component", "grant", "tenant", d.names[i])
		// One budget for the tenant's handles and leases together: each
		// pins in a store session of its own, which
		// store_max_session_pinned bounds alone.
		limit := uint64(c.StoreMaxGrantPinned)
		if limit == 0 {
			limit = st.Stats().L1Capacity / 2
		}
		pins := grant.NewPinBudget(limit)
		pinner := grant.StorePinner{Store: st, Budget: pins}
		h, err := grant.NewHandles(grant.HandlesConfig{
			DaemonID: d.cfg.DaemonID, Epoch: epoch, Scope: d.names[i], Key: key, Pinner: pinner,
			Members: members, Router: router,
			MaxKeys: c.StoreMaxKeysPerCall, MaxTTL: time.Duration(c.StoreMaxLeaseTTL), Log: log,
		})
		if err != nil {
			return err
		}
		l, err := grant.NewLeases(grant.LeasesConfig{Pinner: pinner,
			MaxKeys: c.StoreMaxKeysPerCall, MaxTTL: time.Duration(c.StoreMaxLeaseTTL), Log: log})
		if err != nil {
			h.Close()
			return err
		}
		d.grants = append(d.grants, &grant.Grants{Handles: h, Leases: l, Pins: pins})
	}
	if d.peers != nil {
		// Other daemons' renewals and releases of this daemon's handles,
		// answered from the handles of the tenant the token names.
		byScope := func(scope string) *grant.Handles {
			for i, n := range d.names {
				if n == scope && i < len(d.grants) {
					return d.grants[i].Handles
				}
			}
			return nil
		}
		if err := d.peers.Node().Handle(grant.ExchangeKind, grant.ServeHandles(byScope)); err != nil {
			return err
		}
	}
	d.log.Info("retention handles and placement leases on", "issuer", d.cfg.DaemonID, "epoch", fmt.Sprintf("%#x", epoch),
		"cluster_signed", d.peers != nil, "mode", mode.String())
	return nil
}

// grantsOf is tenant i's grants, nil with store = off.
func (d *Daemon) grantsOf(i int) *grant.Grants {
	if i < len(d.grants) {
		return d.grants[i]
	}
	return nil
}

// closeGrants releases every handle's and lease's pins: after the control
// server, before the stores.
func (d *Daemon) closeGrants() {
	for _, g := range d.grants {
		g.Close()
	}
}

// collectGrants is the handles', leases' and mode's metrics source.
func (d *Daemon) collectGrants(e *metrics.Emit) {
	for i, g := range d.grants {
		tn := metrics.L("tenant", d.names[i])
		hs, ls := g.Handles.Stats(), g.Leases.Stats()
		e.Gauge("tensorcast_store_handles_live", "Retention handles live (issued by this daemon).", float64(hs.Live), tn)
		e.Gauge("tensorcast_store_handle_keys", "Keys held by live retention handles.", float64(hs.Keys), tn)
		e.Counter("tensorcast_store_handles_refused_total", "Retention handle tokens refused (forged, expired, another epoch, unknown issuer).", float64(hs.Refused), tn)
		e.Counter("tensorcast_store_handles_expired_total", "Retention handles ended by their expiry.", float64(hs.Expired), tn)
		e.Gauge("tensorcast_store_placement_leases_live", "Placement leases live.", float64(ls.Live), tn)
		e.Gauge("tensorcast_store_placement_lease_keys", "Keys held by live placement leases.", float64(ls.Keys), tn)
		e.Counter("tensorcast_store_placement_leases_joined_total", "Placement lease creates that joined an earlier one by operation id.", float64(ls.Joined), tn)
		e.Counter("tensorcast_store_placement_leases_refused_total", "Placement lease creates refused for their operation id.", float64(ls.Refused), tn)
		e.Counter("tensorcast_store_placement_leases_expired_total", "Placement leases ended by their TTL.", float64(ls.Expired), tn)
		if g.Pins != nil {
			ps := g.Pins.Stats()
			e.Gauge("tensorcast_store_grant_pinned_bytes", "Bytes of values live retention handles and placement leases hold pinned (a value under two counts twice).", float64(ps.Pinned), tn)
			e.Gauge("tensorcast_store_grant_pin_limit_bytes", "store_max_grant_pinned: the bytes a tenant's retention handles and placement leases may hold pinned in all.", float64(ps.Limit), tn)
			e.Counter("tensorcast_store_grant_pin_limit_total", "Retention handles and placement leases refused: they would pass store_max_grant_pinned.", float64(ps.Refused), tn)
		}
	}
	if a := d.admission; a != nil {
		st := a.Stats()
		e.Gauge("tensorcast_store_mode_info", "The daemon's mode (always 1).", 1, metrics.L("mode", st.Mode.String()))
		e.Counter("tensorcast_store_remote_gets_refused_total", "Remote gets refused by the mode's budget.", float64(st.GetsRefused))
		e.Counter("tensorcast_store_serves_refused_total", "Reads of other hosts refused by the mode's budget.", float64(st.ServesRefused))
	}
}
