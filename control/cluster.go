package control

import (
	"fmt"

	"github.com/tensorcast/tensorcast/wire"
)

// clusterLocate answers tcctl cluster locate from Deps.Locate: where a key
// lives in the store across hosts. It reads nothing of the connection's
// and changes nothing.
func (c *conn) clusterLocate(m *wire.ClusterLocateRequest) error {
	loc := c.s.deps.Locate
	if loc == nil {
		return fmt.Errorf("%w: the store is this host's alone (no store across hosts)", ErrUnavailable)
	}
	w, err := loc(m.Key)
	if err != nil {
		return err
	}
	*wire.SetResponse[wire.ClusterLocateResponse](&c.resp) = w
	return nil
}

// clusterShards answers tcctl cluster shards from Deps.Shards: the shards'
// homes and generations, and the read claims outstanding. It reads nothing
// of the connection's and changes nothing.
func (c *conn) clusterShards(m *wire.ClusterShardsRequest) error {
	sh := c.s.deps.Shards
	if sh == nil {
		return fmt.Errorf("%w: the store is this host's alone (no store across hosts)", ErrUnavailable)
	}
	w, err := sh(m.First, m.Count)
	if err != nil {
		return err
	}
	*wire.SetResponse[wire.ClusterShardsResponse](&c.resp) = w
	return nil
}
