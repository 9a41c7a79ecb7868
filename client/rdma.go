package client

import (
	"slices"

	"github.com/tensorcast/tensorcast/wire"
)

// RDMAInfo is the daemon's RDMA plane: the device, port and GID in use,
// the pool's registration and each peer's transport and link; or, when
// the daemon moves nothing by RDMA, State says off or unavailable and
// Reason why.
type RDMAInfo = wire.RDMAResponse

// RDMAPeer is one peer as the daemon's RDMA plane sees it.
type RDMAPeer = wire.RDMAPeer

// RDMA states.
const (
	RDMAOff         = wire.RDMAOff
	RDMAUnavailable = wire.RDMAUnavailable
	RDMAEnabled     = wire.RDMAEnabled
)

// RDMA reports the daemon's RDMA plane. A daemon without one answers with
// State off or unavailable and the reason, not an error.
func (c *Client) RDMA(opts ...CallOption) (RDMAInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.RDMARequest](c.start(opts))
	r, err := call[wire.RDMAResponse](c, noFD, nil)
	if err != nil {
		return RDMAInfo{}, err
	}
	// The decoder copied the strings; the peers slice is its own and is
	// reused by the next answer, so the caller gets a copy.
	info := *r
	info.Peers = slices.Clone(r.Peers)
	return info, nil
}
