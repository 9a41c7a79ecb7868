package plane

import (
	"slices"
	"strings"

	"github.com/tensorcast/tensorcast/wire"
)

// RDMAOff is the RDMA report of a daemon whose peer plane runs no RDMA,
// saying why (control.RDMAReporter).
type RDMAOff string

// NoPlane is the report of a daemon without a peer plane.
const NoPlane RDMAOff = "no peer plane (peer_listen is not set): RDMA is set up over it"

// RDMAInfo reports RDMA off, and why.
func (r RDMAOff) RDMAInfo() wire.RDMAResponse {
	return wire.RDMAResponse{State: wire.RDMAOff, Reason: string(r)}
}

// RDMAInfo is what `tcctl rdma` shows (control.RDMAReporter): the RDMA
// plane's device, port and GID, the pools' registration and each peer's
// link; or, without an RDMA plane, whether RDMA is off or unavailable and
// why.
func (p *Plane) RDMAInfo() wire.RDMAResponse {
	switch {
	case p.rdma != nil:
		return p.rdma.info()
	case p.rdmaOff:
		return wire.RDMAResponse{State: wire.RDMAOff, Reason: p.noRDMA}
	}
	return wire.RDMAResponse{State: wire.RDMAUnavailable, Reason: p.noRDMA}
}

// info reports the plane: its device and registration, and every peer the
// peer plane knows or the RDMA plane has a link, an accepting transport or
// a logged choice for. Not a hot path: it allocates.
func (p *rdmaPlane) info() wire.RDMAResponse {
	a := p.dev.Addr()
	out := wire.RDMAResponse{
		State: wire.RDMAEnabled, Device: p.dev.Name(), Port: uint32(p.dev.Port()),
		GID: a.GID.String(), GIDIndex: uint32(a.GIDIndex), MTU: uint32(a.MTU.Bytes()), LID: a.LID,
	}
	for _, reg := range p.pools {
		out.PoolRegistered += reg.Size()
		out.PoolMRs += uint32(reg.Chunks())
	}
	byID := map[string]*wire.RDMAPeer{}
	peer := func(id string) *wire.RDMAPeer {
		e := byID[id]
		if e == nil {
			e = &wire.RDMAPeer{ID: id}
			byID[id] = e
		}
		return e
	}
	for _, s := range p.node.Peers() {
		peer(s.ID)
	}
	said := map[string]string{}
	p.mu.Lock()
	for id, ap := range p.accepted {
		e := peer(id)
		e.Accepting, e.AcceptedEpoch = true, ap.epoch
	}
	for id, tr := range p.said {
		said[id] = tr
		peer(id)
	}
	p.mu.Unlock()
	links := *p.links.Load()
	for id, l := range links {
		e := peer(id)
		e.Link, e.Epoch = "up", l.epoch
		e.QueuePairs = uint32(p.qps)
		e.Segments = uint32(len(*l.segs.Load()))
	}
	for id, e := range byID {
		// Requests go to tcp until the worker has chosen rdma for the peer.
		e.Transport = "tcp"
		if said[id] == "rdma" && e.Link == "up" {
			e.Transport = "rdma"
		}
		if e.Link == "" {
			e.Link = "none"
			if said[id] == "tcp" {
				e.Link = "failed" // retried after linkRetry
			}
		}
		out.Peers = append(out.Peers, *e)
	}
	slices.SortFunc(out.Peers, func(x, y wire.RDMAPeer) int { return strings.Compare(x.ID, y.ID) })
	return out
}
