package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorcast/tensorcast/directory"
)

// The claim. A daemon's registration names its peer address and epoch,
// which it knows only once its peer plane listens; but a daemon refused
// for a held id should not listen at all, not even briefly. So the id is
// claimed first: claims/<id> is created, under a lease of its own, by a
// transaction that succeeds only while nobody holds the id (no member key)
// and nobody else is starting with it (no claim key). Join then writes the
// member key under the claim's lease and deletes the claim in one
// transaction that checks the claim is still this daemon's. A claim is not
// kept alive: a daemon that dies while starting leaves it to lapse within
// the TTL, and one whose start-up outlasted it registers as without one.

// claimRecord is the value of a claim key: who is starting with the id,
// for the refusal of another.
type claimRecord struct {
	ID      string `json:"id"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Started int64  `json:"started"` // unix milliseconds
}

func (d *Dir) claimKey(id string) string { return d.cfg.Prefix + "claims/" + id }

// Claim reserves this daemon's id before its peer plane listens. It fails
// with directory.ErrIDInUse, as Join would, when another live daemon holds
// the id (a holder that lapses within JoinWait, this daemon's crashed
// previous run, is waited for), or when another daemon starting with the
// id keeps it claimed for longer than JoinWait; with
// directory.ErrUnavailable when etcd does not answer.
func (d *Dir) Claim(ctx context.Context) error {
	if d.closed.Load() {
		return directory.ErrClosed
	}
	if !d.claimed.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: claimed already", directory.ErrInvalid)
	}
	host, _ := os.Hostname()
	val, err := json.Marshal(claimRecord{ID: d.cfg.Self, Host: host, PID: os.Getpid(), Started: d.cfg.Clock().UnixMilli()})
	if err != nil {
		return err
	}
	mkey, ckey := d.memberKey(d.cfg.Self), d.claimKey(d.cfg.Self)
	deadline := time.Now().Add(d.cfg.JoinWait)
	for {
		lease, until, err := d.grant(ctx)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).
			If(clientv3.Compare(clientv3.CreateRevision(mkey), "=", 0), clientv3.Compare(clientv3.CreateRevision(ckey), "=", 0)).
			Then(clientv3.OpPut(ckey, string(val), clientv3.WithLease(lease))).
			Else(clientv3.OpGet(mkey), clientv3.OpGet(ckey)).
			Commit()
		cancel()
		if err != nil {
			d.revoke(lease)
			return fmt.Errorf("%w: cannot claim the id in etcd at %v: %v", directory.ErrUnavailable, d.cfg.Endpoints, err)
		}
		if resp.Succeeded {
			d.smu.Lock()
			d.lease, d.claimRev, d.claimUntil = lease, resp.Header.Revision, until
			d.smu.Unlock()
			return nil
		}
		d.revoke(lease)
		member := resp.Responses[0].GetResponseRange().GetKvs()
		claim := resp.Responses[1].GetResponseRange().GetKvs()
		key := mkey
		switch {
		case len(member) > 0:
			if !time.Now().Before(deadline) {
				holder, herr := directory.DecodeMember(member[0].Value)
				return d.inUse(ctx, holder, herr, member[0])
			}
		case len(claim) > 0:
			key = ckey
			if !time.Now().Before(deadline) {
				var c claimRecord
				_ = json.Unmarshal(claim[0].Value, &c)
				return fmt.Errorf("%w: %q is claimed by another daemon starting with it (host %q, pid %d, since %s) for longer than %v; stop it, or give this daemon another daemon_id",
					directory.ErrIDInUse, d.cfg.Self, c.Host, c.PID, time.UnixMilli(c.Started).UTC().Format(time.RFC3339), d.cfg.JoinWait)
			}
		default:
			continue // gone between the compare and the read
		}
		if err := d.awaitDelete(ctx, key, resp.Header.Revision, deadline); err != nil {
			return err
		}
	}
}

// registerClaimed registers m under the claim's lease, deleting the
// claim, if the claim is still this daemon's and nobody registered the id
// meanwhile; ok is false (and the claim's lease revoked) when not, and the
// caller registers as without a claim. until is how long the lease is
// held at least (its grant's, see grant).
func (d *Dir) registerClaimed(ctx context.Context, m directory.Member) (lease clientv3.LeaseID, until time.Time, ok bool, err error) {
	d.smu.Lock()
	lease, rev, until := d.lease, d.claimRev, d.claimUntil
	d.smu.Unlock()
	if lease == 0 || rev == 0 {
		return 0, time.Time{}, false, nil
	}
	val, err := directory.EncodeMember(m)
	if err != nil {
		return 0, time.Time{}, false, err
	}
	mkey, ckey := d.memberKey(m.ID), d.claimKey(m.ID)
	rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	defer cancel()
	d.requests.Add(1)
	resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).
		If(clientv3.Compare(clientv3.CreateRevision(mkey), "=", 0), clientv3.Compare(clientv3.CreateRevision(ckey), "=", rev)).
		Then(clientv3.OpPut(mkey, string(val), clientv3.WithLease(lease)), clientv3.OpDelete(ckey)).
		Commit()
	d.smu.Lock()
	d.claimRev = 0
	d.smu.Unlock()
	if err == nil && resp.Succeeded {
		return lease, until, true, nil
	}
	// The claim lapsed (its lease is gone, so the put fails), or someone
	// took the id since.
	d.log.Warn("the id's claim did not last until registration; registering without it", "id", m.ID,
		"lease_ttl", d.cfg.LeaseTTL.String(), "err", err)
	d.revoke(lease)
	d.smu.Lock()
	d.lease = 0
	d.smu.Unlock()
	return 0, time.Time{}, false, nil
}

// grant grants a registration lease of LeaseTTL. until is the least time
// etcd holds it without a renewal: the TTL granted, counted from before
// the request went (etcd counts it from when it granted).
func (d *Dir) grant(ctx context.Context) (lease clientv3.LeaseID, until time.Time, err error) {
	rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	defer cancel()
	d.requests.Add(1)
	sent := d.cfg.Clock()
	g, err := d.cli.Grant(clientv3.WithRequireLeader(rctx), int64(d.cfg.LeaseTTL/time.Second))
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("%w: cannot register in etcd at %v: %v", directory.ErrUnavailable, d.cfg.Endpoints, err)
	}
	return g.ID, sent.Add(time.Duration(g.TTL) * time.Second), nil
}

// revoke revokes a lease that is not used (bounded by DialTimeout).
func (d *Dir) revoke(lease clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.Background(), d.cfg.DialTimeout)
	defer cancel()
	d.requests.Add(1)
	_, _ = d.cli.Revoke(rctx, lease)
}
