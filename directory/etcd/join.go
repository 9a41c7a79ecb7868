package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorcast/tensorcast/directory"
)

// maxTxnOps bounds the operations of one catalog transaction (etcd
// refuses more than 128 by default).
const maxTxnOps = 64

// Join registers this daemon as m and starts keeping its lease alive:
// under the lease of this daemon's Claim when it made one and still holds
// it, else under a new lease. It fails, and the daemon must not start,
// when etcd does not answer within DialTimeout or when another live daemon
// holds m.ID: a holder whose lease lapses within JoinWait (this daemon's
// previous run, crashed) is waited for; one that renews its lease is not
// displaced, and the error says who it is. Join returns once the cache
// has its first listing.
func (d *Dir) Join(ctx context.Context, m directory.Member) error {
	if d.closed.Load() {
		return directory.ErrClosed
	}
	if m.ID != d.cfg.Self {
		return fmt.Errorf("%w: joining as %q, the directory was opened for %q", directory.ErrInvalid, m.ID, d.cfg.Self)
	}
	if !d.joined.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: joined already", directory.ErrInvalid)
	}
	m.Started = d.cfg.Clock().UnixMilli()
	lease, until, claimed, err := d.registerClaimed(ctx, m)
	if err == nil && !claimed {
		lease, _, until, err = d.register(ctx, m, false)
	}
	if err != nil {
		d.joined.Store(false)
		return err
	}
	d.smu.Lock()
	d.self, d.lease = m, lease
	d.smu.Unlock()
	d.heldUntil(until)
	_ = d.static.Update(directory.Peer{ID: m.ID, Epoch: m.Epoch})
	d.log.Info("joined the directory", "id", m.ID, "epoch", fmt.Sprintf("%#x", m.Epoch), "addr", m.Addr,
		"caps", m.Caps, "lease", fmt.Sprintf("%x", int64(lease)), "lease_ttl", d.cfg.LeaseTTL.String())
	d.wg.Add(1)
	go d.keeper(lease)
	// The first listing, so that lookups right after start are hits.
	t := time.NewTimer(d.cfg.DialTimeout)
	defer t.Stop()
	select {
	case <-d.primed:
	case <-t.C: // the feed goes on; lookups fall back until it lists
	case <-ctx.Done():
	}
	return nil
}

// register creates m's key under a new lease, by a transaction that
// succeeds only if nobody holds the key. With takeover, a key held with
// m's own epoch (this run's registration under a lease the client gave up
// on) is moved to the new lease; old is then that lease, which the caller
// revokes once the catalog moved too. until is how long the new lease is
// held at least (see grant).
func (d *Dir) register(ctx context.Context, m directory.Member, takeover bool) (lease, old clientv3.LeaseID, until time.Time, err error) {
	val, err := directory.EncodeMember(m)
	if err != nil {
		return 0, 0, time.Time{}, err
	}
	key := d.memberKey(m.ID)
	grant := func() (err error) {
		lease, until, err = d.grant(ctx)
		return err
	}
	// drop revokes the lease granted for an attempt that did not use it.
	drop := func() {
		d.revoke(lease)
		lease = 0
	}
	fail := func(err error) (clientv3.LeaseID, clientv3.LeaseID, time.Time, error) {
		if lease != 0 {
			drop()
		}
		return 0, 0, time.Time{}, err
	}
	deadline := time.Now().Add(d.cfg.JoinWait)
	for {
		// A lease per attempt: one granted before a wait would lapse
		// during it.
		if err := grant(); err != nil {
			return 0, 0, time.Time{}, err
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).
			Else(clientv3.OpGet(key)).
			Commit()
		cancel()
		if err != nil {
			return fail(fmt.Errorf("%w: cannot register in etcd at %v: %v", directory.ErrUnavailable, d.cfg.Endpoints, err))
		}
		if resp.Succeeded {
			return lease, 0, until, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			drop()
			continue // deleted between the compare and the read
		}
		kv := kvs[0]
		holder, herr := directory.DecodeMember(kv.Value)
		if takeover && herr == nil && holder.Epoch == m.Epoch {
			rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
			d.requests.Add(1)
			tr, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
				Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).
				Commit()
			cancel()
			if err != nil {
				return fail(fmt.Errorf("%w: cannot register in etcd at %v: %v", directory.ErrUnavailable, d.cfg.Endpoints, err))
			}
			if tr.Succeeded {
				return lease, clientv3.LeaseID(kv.Lease), until, nil
			}
			drop()
			continue
		}
		drop()
		if !time.Now().Before(deadline) {
			return fail(d.inUse(ctx, holder, herr, kv))
		}
		// Wait for the holder's key to go (its lease lapsing), at most
		// until the deadline.
		if err := d.awaitDelete(ctx, key, resp.Header.Revision, deadline); err != nil {
			return fail(err)
		}
	}
}

// awaitDelete waits until key is deleted after rev, or the deadline.
func (d *Dir) awaitDelete(ctx context.Context, key string, rev int64, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(clientv3.WithRequireLeader(ctx), deadline)
	defer cancel()
	for resp := range d.cli.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut()) {
		if err := resp.Err(); err != nil {
			return nil // try the transaction again; it says what is wrong
		}
		for _, e := range resp.Events {
			if e.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// inUse says who holds the id.
func (d *Dir) inUse(ctx context.Context, holder directory.Member, herr error, kv *mvccpb.KeyValue) error {
	left := "unknown"
	rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	d.requests.Add(1)
	if ttl, err := d.cli.TimeToLive(rctx, clientv3.LeaseID(kv.Lease)); err == nil && ttl.TTL >= 0 {
		left = (time.Duration(ttl.TTL) * time.Second).String()
	}
	cancel()
	if herr != nil {
		return fmt.Errorf("%w: %q is registered in etcd (%s) by a record that does not decode (%v), and its lease (%s left) was renewed for longer than %v",
			directory.ErrIDInUse, d.cfg.Self, d.memberKey(d.cfg.Self), herr, left, d.cfg.JoinWait)
	}
	return fmt.Errorf("%w: %q is held by the daemon at %s (epoch %#x, registered %s), whose lease (%s left) was renewed for longer than %v; stop it, or give this daemon another daemon_id",
		directory.ErrIDInUse, holder.ID, holder.Addr, holder.Epoch, holder.StartedAt().UTC().Format(time.RFC3339), left, d.cfg.JoinWait)
}

// keeper keeps the registration: it renews the lease every half TTL,
// writes the catalog when it changes, and when the lease is lost (etcd
// unreachable for longer than its TTL, or revoked) registers again with
// the same epoch and writes the whole catalog under the new lease.
//
// A renewal is one request (etcd's client would keep a stream and renew
// every third of the TTL). Half the TTL is left for a renewal that fails
// to be tried again (resume: every RetryEvery until etcd answers), which
// is longer than the staleness budget past which this daemon refuses to
// act as a home anyway.
func (d *Dir) keeper(lease clientv3.LeaseID) {
	defer d.wg.Done()
	var retry <-chan time.Time
	if d.publish(lease) > 0 {
		retry = time.After(d.cfg.RetryEvery)
	}
	// The first renewal at once: the lease may be the claim's, granted a
	// while before Join.
	renew := time.NewTimer(0)
	defer renew.Stop()
	for {
		select {
		case <-renew.C:
		case <-d.kick:
			if d.publish(lease) > 0 && retry == nil {
				retry = time.After(d.cfg.RetryEvery)
			}
			continue
		case <-retry:
			retry = nil
			if d.publish(lease) > 0 {
				retry = time.After(d.cfg.RetryEvery)
			}
			continue
		case <-d.ctx.Done():
			return
		}
		ttl, err := d.renew(lease)
		if err == nil {
			renew.Reset(renewEvery(ttl))
			continue
		}
		if d.ctx.Err() != nil {
			return
		}
		fate := leaseGone
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			d.log.Warn("directory keep-alives ended: a lease renewal failed (etcd unreachable, or the lease was revoked); checking the lease",
				"lease_ttl", d.cfg.LeaseTTL.String(), "err", err)
			fate = d.resume(lease)
		}
		switch fate {
		case leaseKept:
			renew.Reset(renewEvery(d.cfg.LeaseTTL))
			continue
		case leaseClosed:
			return
		}
		d.log.Warn("directory registration lost: etcd no longer holds its lease; registering again",
			"lease_ttl", d.cfg.LeaseTTL.String())
		d.pmu.Lock()
		clear(d.applied)
		d.pmu.Unlock()
		lease = d.reregister()
		if lease == 0 {
			return
		}
		renew.Reset(renewEvery(d.cfg.LeaseTTL))
	}
}

// renewEvery is the time from one renewal of a lease of ttl to the next:
// half of it (at least 100ms).
func renewEvery(ttl time.Duration) time.Duration {
	return max(ttl/2, 100*time.Millisecond)
}

// renew renews the lease once; it returns the TTL etcd granted, or why
// not (rpctypes.ErrLeaseNotFound: etcd no longer holds it).
func (d *Dir) renew(lease clientv3.LeaseID) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.DialTimeout)
	defer cancel()
	d.requests.Add(1)
	d.renewals.Add(1)
	sent := d.cfg.Clock()
	resp, err := d.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), lease)
	if err != nil {
		return 0, err
	}
	ttl := time.Duration(resp.TTL) * time.Second
	d.heldUntil(sent.Add(ttl))
	return ttl, nil
}

// heldUntil records the least time etcd holds the registration's lease
// without another renewal: a renewal's TTL counted from before it was
// sent. Past it, etcd may have let the lease lapse and handed this
// daemon's shard claims to another home, whatever the watch said last
// (ShardsCurrent).
func (d *Dir) heldUntil(t time.Time) { d.leaseUntil.Store(t.UnixNano()) }

type leaseFate int

const (
	leaseKept leaseFate = iota
	leaseGone
	leaseClosed
)

// resume asks etcd, until it answers or the directory closes, whether it
// still holds the lease whose keep-alives ended. An etcd restart renews
// every lease it had (as any leader change does), so when the keep-alives
// ended because etcd itself was down, the registration stands as it was
// once etcd answers again within the lease's TTL: keeping it spares etcd
// a new lease, a member write and the whole catalog from every daemon at
// once, just as it comes back. A lease etcd let lapse (this daemon was cut
// off while etcd ran on) is gone: the caller registers again.
func (d *Dir) resume(lease clientv3.LeaseID) leaseFate {
	for {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		sent := d.cfg.Clock()
		resp, err := d.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), lease)
		cancel()
		switch {
		case err == nil:
			d.heldUntil(sent.Add(time.Duration(resp.TTL) * time.Second))
			d.log.Info("etcd answered and still holds the directory lease; the registration stands",
				"lease", fmt.Sprintf("%x", int64(lease)))
			return leaseKept
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return leaseGone
		case d.ctx.Err() != nil:
			return leaseClosed
		}
		d.log.Debug("directory lease check failed; trying again", "err", err)
		if !d.wait(d.cfg.RetryEvery) {
			return leaseClosed
		}
	}
}

// reregister registers this run again until it succeeds or the
// directory closes (0).
func (d *Dir) reregister() clientv3.LeaseID {
	d.smu.Lock()
	m := d.self
	d.smu.Unlock()
	conflictSaid := false
	for {
		lease, old, until, err := d.register(d.ctx, m, true)
		if err == nil {
			d.smu.Lock()
			d.lease = lease
			if d.state == directory.StateConflict {
				d.state, d.since = directory.StateUp, d.cfg.Clock()
			}
			d.smu.Unlock()
			d.heldUntil(until)
			// Move the catalog before the old lease goes, so that peers do
			// not see the exports disappear.
			d.publish(lease)
			if old != 0 && old != lease {
				rctx, cancel := context.WithTimeout(d.ctx, d.cfg.DialTimeout)
				d.requests.Add(1)
				_, _ = d.cli.Revoke(rctx, old)
				cancel()
			}
			d.log.Info("registered in the directory again", "id", m.ID, "epoch", fmt.Sprintf("%#x", m.Epoch),
				"lease", fmt.Sprintf("%x", int64(lease)))
			return lease
		}
		if d.ctx.Err() != nil {
			return 0
		}
		if errors.Is(err, directory.ErrIDInUse) {
			d.smu.Lock()
			d.state, d.since = directory.StateConflict, d.cfg.Clock()
			d.smu.Unlock()
			if !conflictSaid {
				d.log.Error("another daemon registered this daemon's id while it was away; this daemon stays out of the directory until that one leaves", "err", err)
				conflictSaid = true
			}
		}
		if !d.wait(d.cfg.RetryEvery) {
			return 0
		}
	}
}

// poke wakes the keeper.
func (d *Dir) poke() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// epoch is this daemon's epoch (from Join, or the transports' Update).
func (d *Dir) epoch() uint64 {
	d.smu.Lock()
	e := d.self.Epoch
	d.smu.Unlock()
	if e == 0 {
		if p, ok := d.static.Lookup(d.cfg.Self); ok {
			e = p.Epoch
		}
	}
	return e
}

// Exported records that this daemon exports name (size bytes, rights) and
// has the keeper publish it in the catalog. It never waits on etcd.
func (d *Dir) Exported(name string, size uint64, rights uint8) {
	d.pmu.Lock()
	d.gen++
	d.desired[name] = directory.Export{Owner: d.cfg.Self, Name: name, Size: size, Rights: rights, Epoch: d.epoch(), Generation: d.gen}
	d.pmu.Unlock()
	d.poke()
}

// Unexported records that name is no longer exported; the keeper removes
// it from the catalog. It never waits on etcd.
func (d *Dir) Unexported(name string) {
	d.pmu.Lock()
	delete(d.desired, name)
	d.pmu.Unlock()
	d.poke()
}

// publish brings the catalog in etcd to what this daemon exports, under
// lease, in transactions of at most maxTxnOps; it returns how many
// changes are still not written.
func (d *Dir) publish(lease clientv3.LeaseID) int {
	type change struct {
		name string
		exp  directory.Export
		del  bool
		op   clientv3.Op
	}
	var todo []change
	d.pmu.Lock()
	for name, e := range d.desired {
		if d.applied[name] == e.Generation {
			continue
		}
		val, err := directory.EncodeExport(e)
		if err != nil {
			d.log.Warn("export not published in the directory", "name", name, "err", err)
			d.applied[name] = e.Generation // it cannot be written; do not try again
			continue
		}
		todo = append(todo, change{name: name, exp: e, op: clientv3.OpPut(d.exportKey(d.cfg.Self, name), string(val), clientv3.WithLease(lease))})
	}
	for name := range d.applied {
		if _, ok := d.desired[name]; !ok {
			todo = append(todo, change{name: name, del: true, op: clientv3.OpDelete(d.exportKey(d.cfg.Self, name))})
		}
	}
	d.pmu.Unlock()
	left := len(todo)
	for len(todo) > 0 {
		n := min(len(todo), maxTxnOps)
		ops := make([]clientv3.Op, n)
		for i := range n {
			ops[i] = todo[i].op
		}
		rctx, cancel := context.WithTimeout(d.ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		_, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).Then(ops...).Commit()
		cancel()
		if err != nil {
			d.log.Debug("catalog write failed; retrying", "err", err)
			return left
		}
		d.pmu.Lock()
		for _, c := range todo[:n] {
			if c.del {
				if _, again := d.desired[c.name]; !again {
					delete(d.applied, c.name)
				}
			} else if d.desired[c.name].Generation == c.exp.Generation {
				d.applied[c.name] = c.exp.Generation
			}
		}
		d.pmu.Unlock()
		todo, left = todo[n:], left-n
	}
	return 0
}
