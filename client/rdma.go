package client

import (
	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
)

// RDMAInfo is the daemon's RDMA plane: the device, port and GID in use,
// the pool's registration and each peer's transport and link; or, when
// the daemon moves nothing by RDMA, State says off or unavailable and
// Reason why.
type RDMAInfo = control.RDMAInfo

// RDMAPeer is one peer as the daemon's RDMA plane sees it.
type RDMAPeer = control.RDMAPeer

// RDMA states.
const (
	RDMAOff         = control.RDMAOff
	RDMAUnavailable = control.RDMAUnavailable
	RDMAEnabled     = control.RDMAEnabled
)

// RDMA reports the daemon's RDMA plane. A daemon without one answers with
// State off or unavailable and the reason, not an error.
func (c *Client) RDMA(opts ...CallOption) (RDMAInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start(tcproto.RequestBodyRdmaRequest, opts)
	if err := c.roundTrip(tcproto.ResponseBodyRdmaResponse, -1, nil); err != nil {
		return RDMAInfo{}, err
	}
	// The decoder copied the strings and made the peers slice: nothing
	// here aliases the client's buffers.
	return c.resp.RDMA, nil
}
