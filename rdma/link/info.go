package link

import (
	"slices"
	"strings"

	"github.com/tensorcast/tensorcast/wire"
)

// Info is what `tcctl rdma` shows: the device and the pools'
// registration, and every peer the tcp node knows or the links have a
// link, an accepting transport or a logged choice for. Not a hot path: it
// allocates.
func (p *Links) Info() wire.RDMAResponse {
	a := p.dev.Addr()
	out := wire.RDMAResponse{
		State: wire.RDMAEnabled, Device: p.dev.Name(), Port: uint32(p.dev.Port()),
		GID: a.GID.String(), GIDIndex: uint32(a.GIDIndex), MTU: uint32(a.MTU.Bytes()), LID: a.LID,
	}
	bytes, mrs := p.locals.pools()
	out.PoolRegistered, out.PoolMRs = bytes, uint32(mrs)
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
		e.Segments = uint32(l.resolved())
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
