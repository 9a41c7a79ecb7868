package link

import (
	"sync/atomic"

	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// rdmaStats are the links' counters for `tcctl stats`: which
// transport carried the requests to remote segments, and what the links
// set up and tore down.
type rdmaStats struct {
	tasks       atomic.Uint64 // requests posted on rdma links
	bytes       atomic.Uint64 // their bytes
	toTCP       atomic.Uint64 // requests to remote segments sent to tcp instead
	unavailable atomic.Uint64 // requests failed: their segment is rdma-only and rdma could not carry them
	refused     atomic.Uint64 // requests the segment's rights refused
	notified    atomic.Uint64 // notifications delivered after an rdma WRITE
	notifyFail  atomic.Uint64 // notifications refused or unanswered (their tasks failed)
	linksMade   atomic.Uint64
	linksClosed atomic.Uint64
	revoked     atomic.Uint64 // export registrations revoked at unexport
	exportsBusy atomic.Uint64 // peers' requests for an export's registration answered busy (busyAnswer)
	ownerBusy   atomic.Uint64 // busy answers this daemon's requests for a peer's export got (askRegion)
	peerBusy    atomic.Uint64 // link exchanges a peer with no exchange handler free refused (asked again)
}

// posted counts n tasks of bytes handed to a link's rdma transport.
func (s *rdmaStats) posted(n int, bytes uint64) {
	s.tasks.Add(uint64(n))
	s.bytes.Add(bytes)
}

// lengths is the bytes of ts's requests.
func lengths(ts []*xfer.Task) uint64 {
	var b uint64
	for _, t := range ts {
		b += t.Req.Length
	}
	return b
}

// Counters appends the links' counters and gauges to dst (tcctl stats).
func (p *Links) Counters(dst []wire.Counter) []wire.Counter {
	s := &p.stats
	p.exports.mu.Lock()
	exports := len(p.exports.m)
	p.exports.mu.Unlock()
	bufs := p.locals.registered()
	return append(dst,
		wire.Counter{Name: "rdma.links", Value: uint64(len(*p.links.Load()))},
		wire.Counter{Name: "rdma.links_made", Value: s.linksMade.Load()},
		wire.Counter{Name: "rdma.links_closed", Value: s.linksClosed.Load()},
		wire.Counter{Name: "rdma.tasks", Value: s.tasks.Load()},
		wire.Counter{Name: "rdma.bytes", Value: s.bytes.Load()},
		wire.Counter{Name: "rdma.to_tcp", Value: s.toTCP.Load()},
		wire.Counter{Name: "rdma.unavailable", Value: s.unavailable.Load()},
		wire.Counter{Name: "rdma.refused", Value: s.refused.Load()},
		wire.Counter{Name: "rdma.notified", Value: s.notified.Load()},
		wire.Counter{Name: "rdma.notify_failed", Value: s.notifyFail.Load()},
		wire.Counter{Name: "rdma.exports_registered", Value: uint64(exports)},
		wire.Counter{Name: "rdma.exports_revoked", Value: s.revoked.Load()},
		wire.Counter{Name: "rdma.exports_busy", Value: s.exportsBusy.Load()},
		wire.Counter{Name: "rdma.owner_busy", Value: s.ownerBusy.Load()},
		wire.Counter{Name: "rdma.link_peer_busy", Value: s.peerBusy.Load()},
		wire.Counter{Name: "rdma.buffers_registered", Value: uint64(bufs)},
	)
}
