package control

import "github.com/tensorcast/tensorcast/wire"

// RDMAReporter reports the daemon's RDMA plane, or why it has none. It is
// called once per Rdma request, from the connection's goroutine.
type RDMAReporter interface {
	RDMAInfo() wire.RDMAResponse
}

// rdmaInfo answers Rdma. It never fails: without a reporter the answer is
// "off", with the reason.
func (c *conn) rdmaInfo() {
	r := wire.SetResponse[wire.RDMAResponse](&c.resp)
	rep := c.s.deps.RDMA
	if rep == nil {
		*r = wire.RDMAResponse{State: wire.RDMAOff, Reason: "the daemon reports no RDMA plane"}
		return
	}
	info := rep.RDMAInfo()
	if len(info.Reason) > wire.MaxRDMAReason {
		info.Reason = info.Reason[:wire.MaxRDMAReason]
	}
	// Keep the answer well inside a frame: drop peers past the budget.
	budget := c.s.cfg.MaxFrame/2 - 256 - len(info.Reason) - len(info.Device) - len(info.GID)
	for i, p := range info.Peers {
		budget -= len(p.ID) + len(p.Transport) + len(p.Link) + 96
		if budget < 0 {
			c.log.Warn("rdma answer cut short", "peers", len(info.Peers), "sent", i)
			info.Peers = info.Peers[:i]
			break
		}
	}
	*r = info
}
