package client

import (
	"fmt"
	"slices"

	"github.com/tensorcast/tensorcast/wire"
)

// KeyLocation is where a key lives in the store across hosts: its shard,
// the shard's home and generation as the daemon knows them, and the
// holders the home names (parallel lists: id, the epoch that announced the
// copy, tier 1 DRAM / 2 NVMe, size, crc32c).
type KeyLocation = wire.ClusterLocateResponse

// ClusterLocate asks the daemon where key lives in the store across hosts
// (it asks the key's home).
func (c *Client) ClusterLocate(key []byte, opts ...CallOption) (KeyLocation, error) {
	if len(key) == 0 || len(key) > wire.MaxStoreKey {
		return KeyLocation{}, fmt.Errorf("%w: key of %d bytes (1..%d)", ErrInvalidArgument, len(key), wire.MaxStoreKey)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.ClusterLocateRequest](c.start(opts)).Key = key
	r, err := call[wire.ClusterLocateResponse](c, noFD, nil)
	if err != nil {
		return KeyLocation{}, err
	}
	l := *r
	// The answer's lists are the decoder's storage: copied out.
	l.Holders, l.HolderEpochs, l.HolderTiers = slices.Clone(l.Holders), slices.Clone(l.HolderEpochs), slices.Clone(l.HolderTiers)
	l.HolderSizes, l.HolderCRCs = slices.Clone(l.HolderSizes), slices.Clone(l.HolderCRCs)
	return l, nil
}

// ShardTable is a page of the store across hosts' shards as the daemon
// knows them: each shard's home, rendezvous member (indexes into HomeIDs,
// wire.NoHome for none), generation and keys indexed there; and the read
// claims the daemon, as a home, has outstanding by holder.
type ShardTable = wire.ClusterShardsResponse

// ClusterShards asks the daemon about count shards from first (count 0:
// as many as one answer takes, wire.MaxShardsAnswer); ShardsTotal says how
// many there are, to page through them.
func (c *Client) ClusterShards(first, count uint32, opts ...CallOption) (ShardTable, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := wire.SetRequest[wire.ClusterShardsRequest](c.start(opts))
	q.First, q.Count = first, count
	r, err := call[wire.ClusterShardsResponse](c, noFD, nil)
	if err != nil {
		return ShardTable{}, err
	}
	t := *r
	// The answer's lists are the decoder's storage: copied out.
	t.HomeIDs, t.Homes, t.Generations = slices.Clone(t.HomeIDs), slices.Clone(t.Homes), slices.Clone(t.Generations)
	t.Rendezvous, t.Keys = slices.Clone(t.Rendezvous), slices.Clone(t.Keys)
	t.ClaimHolders, t.ClaimCounts = slices.Clone(t.ClaimHolders), slices.Clone(t.ClaimCounts)
	return t, nil
}
