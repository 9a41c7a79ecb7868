package control

// The daemon-wide peer calls: Peers, Rdma and Segments.

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"

	"github.com/tensorcast/tensorcast/wire"
)

func (c *conn) peers() error {
	pp := c.s.deps.Peers
	if pp == nil {
		return fmt.Errorf("%w: no peer plane configured", ErrUnavailable)
	}
	wire.SetResponse[wire.PeersResponse](&c.resp).Peers = pp.Peers()
	return nil
}

// rdmaInfo answers Rdma. It never fails: without a reporter the answer is
// "off", with the reason; an answer too long for a frame loses peers.
func (c *conn) rdmaInfo() {
	r := wire.SetResponse[wire.RDMAResponse](&c.resp)
	rep := c.s.deps.RDMA
	if rep == nil {
		*r = wire.RDMAResponse{State: wire.RDMAOff, Reason: "the daemon reports no RDMA plane"}
		return
	}
	*r = rep.RDMAInfo()
	if n := r.Fit(c.s.cfg.MaxFrame / 2); n > 0 {
		c.s.logs.rdmaCut.Event(append(c.who(), slog.Int("peers", len(r.Peers)+n), slog.Int("sent", len(r.Peers)))...)
	}
}

// segmentsList reports the segments exported by the connection's tenant
// and the remote segments its tenant's connections opened; a connection
// in no tenant (the daemon's admin) is told every one.
func (c *conn) segmentsList() {
	tenant := c.tenantName()
	out := c.s.exports.List(nil, tenant)
	c.s.mu.Lock()
	conns := make([]*conn, 0, len(c.s.conns))
	for sc := range c.s.conns {
		if tenant == "" || sc.tenantName() == tenant {
			conns = append(conns, sc)
		}
	}
	c.s.mu.Unlock()
	for _, sc := range conns {
		out = sc.ss.Remotes(out)
	}
	slices.SortFunc(out, func(a, b wire.SegmentInfo) int {
		if d := bytes.Compare(a.Peer, b.Peer); d != 0 {
			return d
		}
		return bytes.Compare(a.Name, b.Name)
	})
	wire.SetResponse[wire.SegmentsResponse](&c.resp).Segments = out
}
