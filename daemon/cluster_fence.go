package daemon

import (
	"context"

	"github.com/tensorcast/tensorcast/directory/etcd"
	"github.com/tensorcast/tensorcast/store/cluster"
)

// etcdFence is the etcd directory as the store across hosts' shard claims
// (cluster.Fence): claims are taken under this daemon's member lease and
// followed through the directory's own watch.
type etcdFence struct {
	dir   *etcd.Dir
	epoch uint64
}

func (f etcdFence) Watch(fn func([]cluster.ShardClaim)) {
	if fn == nil {
		f.dir.WatchShards(nil)
		return
	}
	f.dir.WatchShards(func(cs []etcd.ShardClaim) { fn(claimsOf(cs)) })
}

func (f etcdFence) Take(ctx context.Context, shards []int, expect []uint64) ([]cluster.ShardClaim, error) {
	won, err := f.dir.ClaimShards(ctx, f.epoch, shards, expect)
	return claimsOf(won), err
}

func (f etcdFence) Release(ctx context.Context, shards []int, gens []uint64) error {
	return f.dir.ReleaseShards(ctx, shards, gens)
}

func (f etcdFence) Refresh(ctx context.Context, shards []int) error {
	return f.dir.RefreshShards(ctx, shards)
}

func (f etcdFence) Current() bool { return f.dir.ShardsCurrent() }

func claimsOf(cs []etcd.ShardClaim) []cluster.ShardClaim {
	out := make([]cluster.ShardClaim, len(cs))
	for i, c := range cs {
		out[i] = cluster.ShardClaim{Shard: c.Shard, Home: c.Home, Epoch: c.Epoch, Gen: c.Gen}
	}
	return out
}
