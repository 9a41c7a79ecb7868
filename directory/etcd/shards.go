package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tensorcast/tensorcast/directory"
)

// Shard claims of the store across hosts (store/cluster). A home claims a
// shard by writing shards/<n> under its member lease, in a transaction
// that succeeds only while the key is at the generation the home expects
// (its mod revision, or absent): two daemons never both win one
// generation. The generation of a claim is the revision that wrote it, so
// generations only grow, and a claim whose home's lease lapses disappears
// with it. The feed (list and watch, which already follow the whole
// prefix) hands every change to the watcher the cluster registered: no
// request to etcd per store call.

// maxShardTxn bounds the shards one claim transaction takes (etcd refuses
// transactions of more than 128 operations by default).
const maxShardTxn = 64

// maxShards bounds the shard numbers a shard key may name.
const maxShards = 1 << 16

// ShardClaim is a shard's claim as the directory knows it: Home (empty:
// none) and the generation it was read or written at (Gen; for an absent
// key, the revision at which it was seen absent).
type ShardClaim struct {
	Shard int
	Home  string
	Epoch uint64
	Gen   uint64
	// unreadable marks an unclaimed shard whose key holds a record that
	// is no claim (Gen is its mod revision): a claim replaces it.
	unreadable bool
}

// shardRecord is the value of a shard key.
type shardRecord struct {
	Home  string `json:"home"`
	Epoch uint64 `json:"epoch"`
}

// shardWatch is the registered watcher and what the feed has seen.
type shardWatch struct {
	// mu guards the fields below.
	mu   sync.Mutex
	fn   func([]ShardClaim)
	seen map[int]ShardClaim
	// unreadable is, for each shard key holding a record that is no
	// claim, that record's mod revision (a claim compares it to replace
	// it). At most maxShards, as seen.
	unreadable map[int]int64
}

func (d *Dir) shardKey(s int) string { return d.cfg.Prefix + "shards/" + strconv.Itoa(s) }

// shardOf parses a key of the prefix as a shard key. Only the spelling
// shardKey writes is one: claims are compared and written on that key
// alone, so another spelling of the same number ("shards/07", a hand
// edit or another version) would be a second claim of the shard, newer
// than the real one, that no claim transaction could replace.
func (d *Dir) shardOf(key []byte) (int, bool) {
	k, ok := strings.CutPrefix(string(key), d.cfg.Prefix+"shards/")
	if !ok {
		return 0, false
	}
	s, err := strconv.Atoi(k)
	if err != nil || s < 0 || s >= maxShards || strconv.Itoa(s) != k {
		return 0, false
	}
	return s, true
}

// shardClaimOf decodes a shard key's value (what does not decode is no
// claim: it is not believed, and a claim may replace it).
func (d *Dir) shardClaimOf(s int, val []byte, rev int64) ShardClaim {
	var r shardRecord
	if err := json.Unmarshal(val, &r); err != nil || r.Home == "" || len(r.Home) > directory.MaxIDLen {
		d.refusedClaims.Event(slog.Int("shard", s), slog.Any("err", err))
		return ShardClaim{Shard: s, Gen: uint64(rev), unreadable: true}
	}
	return ShardClaim{Shard: s, Home: r.Home, Epoch: r.Epoch, Gen: uint64(rev)}
}

// shardEvents hands claims to the watcher (and keeps them for one that
// registers later). A claim older than what was seen of its shard is
// dropped: generations only grow.
func (d *Dir) shardEvents(cs []ShardClaim) {
	if len(cs) == 0 {
		return
	}
	w := &d.shards
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		w.seen, w.unreadable = map[int]ShardClaim{}, map[int]int64{}
	}
	out := cs[:0]
	for _, c := range cs {
		if old, ok := w.seen[c.Shard]; ok && old.Gen > c.Gen {
			continue
		}
		if c.unreadable {
			w.unreadable[c.Shard] = int64(c.Gen)
		} else {
			delete(w.unreadable, c.Shard)
		}
		if c.Home == "" {
			delete(w.seen, c.Shard)
		} else {
			w.seen[c.Shard] = c
		}
		out = append(out, c)
	}
	if w.fn != nil && len(out) > 0 {
		w.fn(out)
	}
}

// listedShards replaces what was seen with a listing at rev: a shard
// seen claimed (or holding a record that is no claim) and absent from the
// listing is unclaimed as of rev.
func (d *Dir) listedShards(cs []ShardClaim, rev int64) {
	w := &d.shards
	w.mu.Lock()
	listed := map[int]bool{}
	for _, c := range cs {
		listed[c.Shard] = true
	}
	for s := range w.seen {
		if !listed[s] {
			cs = append(cs, ShardClaim{Shard: s, Gen: uint64(rev)})
		}
	}
	for s := range w.unreadable {
		if !listed[s] {
			cs = append(cs, ShardClaim{Shard: s, Gen: uint64(rev)})
		}
	}
	w.mu.Unlock()
	d.shardEvents(cs)
}

// WatchShards registers fn, called with every change of the shard claims
// the feed sees (on the feed's goroutine, or a refresh's: fn must be
// quick and must not call into the directory), after it is called once
// with the claims known now.
func (d *Dir) WatchShards(fn func([]ShardClaim)) {
	w := &d.shards
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fn = fn
	if fn == nil || len(w.seen) == 0 {
		return
	}
	cs := make([]ShardClaim, 0, len(w.seen))
	for _, c := range w.seen {
		cs = append(cs, c)
	}
	fn(cs)
}

// ClaimShards claims shards for this daemon (at epoch) under its member
// lease, each expected at expect[i] (the generation of the claim it
// replaces; 0: no claim, the key absent or holding a record that is no
// claim as the feed last saw it), in transactions of at most 64 shards,
// each all or nothing. It returns the shards won with their generation
// (also handed to the watcher); the shards of a transaction that lost are
// read again, so the watcher learns who holds them. It needs Join first.
func (d *Dir) ClaimShards(ctx context.Context, epoch uint64, shards []int, expect []uint64) ([]ShardClaim, error) {
	if len(expect) != len(shards) {
		return nil, fmt.Errorf("%w: %d generations for %d shards", directory.ErrInvalid, len(expect), len(shards))
	}
	d.smu.Lock()
	lease := d.lease
	d.smu.Unlock()
	if lease == 0 || !d.joined.Load() {
		return nil, fmt.Errorf("%w: not registered in etcd: shards cannot be claimed", directory.ErrUnavailable)
	}
	val, err := json.Marshal(shardRecord{Home: d.cfg.Self, Epoch: epoch})
	if err != nil {
		return nil, err
	}
	var won []ShardClaim
	for start := 0; start < len(shards); start += maxShardTxn {
		part, exp := shards[start:min(start+maxShardTxn, len(shards))], expect[start:min(start+maxShardTxn, len(shards))]
		cmps := make([]clientv3.Cmp, len(part))
		ops := make([]clientv3.Op, len(part))
		d.shards.mu.Lock()
		for i, s := range part {
			k := d.shardKey(s)
			bad, unreadable := d.shards.unreadable[s]
			switch {
			case exp[i] == 0 && unreadable:
				// Expected absent, the record the feed saw there (no
				// claim) would fail the claim on every round, leaving
				// the shard without a home while it stays.
				cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", bad)
			case exp[i] == 0:
				cmps[i] = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
			default:
				cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", int64(exp[i]))
			}
			ops[i] = clientv3.OpPut(k, string(val), clientv3.WithLease(lease))
		}
		d.shards.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).If(cmps...).Then(ops...).Commit()
		cancel()
		if err != nil {
			return won, fmt.Errorf("%w: claiming shards in etcd: %v", directory.ErrUnavailable, err)
		}
		if !resp.Succeeded {
			if err := d.RefreshShards(ctx, part); err != nil {
				return won, err
			}
			continue
		}
		cs := make([]ShardClaim, len(part))
		for i, s := range part {
			cs[i] = ShardClaim{Shard: s, Home: d.cfg.Self, Epoch: epoch, Gen: uint64(resp.Header.Revision)}
		}
		d.shardEvents(slicesClone(cs))
		won = append(won, cs...)
	}
	return won, nil
}

// ReleaseShards gives up this daemon's claims of shards, each only while
// it is still at gens[i] (a claim taken over since is left alone): one
// transaction per 64 shards, and when one of them was taken over, one per
// shard of that part.
func (d *Dir) ReleaseShards(ctx context.Context, shards []int, gens []uint64) error {
	if len(gens) != len(shards) {
		return fmt.Errorf("%w: %d generations for %d shards", directory.ErrInvalid, len(gens), len(shards))
	}
	release := func(part []int, pg []uint64) (bool, error) {
		cmps := make([]clientv3.Cmp, len(part))
		ops := make([]clientv3.Op, len(part))
		for i, s := range part {
			k := d.shardKey(s)
			cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", int64(pg[i]))
			ops[i] = clientv3.OpDelete(k)
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
		defer cancel()
		d.requests.Add(1)
		resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return false, fmt.Errorf("%w: releasing shards in etcd: %v", directory.ErrUnavailable, err)
		}
		return resp.Succeeded, nil
	}
	for start := 0; start < len(shards); start += maxShardTxn {
		end := min(start+maxShardTxn, len(shards))
		ok, err := release(shards[start:end], gens[start:end])
		if err != nil {
			return err
		}
		if ok || end-start == 1 {
			continue
		}
		for i := start; i < end; i++ {
			if _, err := release(shards[i:i+1], gens[i:i+1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// RefreshShards reads the claims of shards from etcd (a message refused
// for a stale generation: the sender's view of them lags) and hands them
// to the watcher.
func (d *Dir) RefreshShards(ctx context.Context, shards []int) error {
	if err := d.errDown(); err != nil {
		return fmt.Errorf("%w: %v", directory.ErrUnavailable, err)
	}
	ops := make([]clientv3.Op, 0, maxShardTxn)
	for start := 0; start < len(shards); start += maxShardTxn {
		part := shards[start:min(start+maxShardTxn, len(shards))]
		ops = ops[:0]
		for _, s := range part {
			ops = append(ops, clientv3.OpGet(d.shardKey(s)))
		}
		rctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
		d.requests.Add(1)
		resp, err := d.cli.Txn(clientv3.WithRequireLeader(rctx)).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("%w: reading shard claims from etcd: %v", directory.ErrUnavailable, err)
		}
		cs := make([]ShardClaim, len(part))
		for i, s := range part {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				cs[i] = ShardClaim{Shard: s, Gen: uint64(resp.Header.Revision)}
				continue
			}
			cs[i] = d.shardClaimOf(s, kvs[0].Value, kvs[0].ModRevision)
		}
		d.shardEvents(cs)
	}
	return nil
}

// ShardsCurrent reports whether this daemon's claims can be trusted now:
// it is registered, its cache of etcd was proved current within the
// staleness budget, and its lease is still held for certain (its last
// renewal's TTL, counted from before the renewal went, has not run out).
// Past either, its lease may have lapsed unseen and another daemon may
// hold its shards: a home then refuses what it is asked, fail closed. The
// lease is checked apart from the cache's age because the budget is the
// operator's to set, longer than the TTL too, and because the last
// renewal may be up to half a TTL older than the cache's last proof.
func (d *Dir) ShardsCurrent() bool {
	return d.joined.Load() && d.cache.Age() <= d.cfg.Budget && d.cfg.Clock().UnixNano() < d.leaseUntil.Load()
}

func slicesClone(cs []ShardClaim) []ShardClaim { return append([]ShardClaim(nil), cs...) }
