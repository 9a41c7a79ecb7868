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
