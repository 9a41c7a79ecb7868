package control

// The Stats call: the counters of the pool, engine, transports, queues,
// store and connection.

import (
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// statsCounters appends the counters of a dependency that reports stats
// (the pool's shm.PoolStats, the engine's xfer.EngineStats), as
// wire.AppendCounters names them.
func statsCounters(v any, dst []wire.Counter) []wire.Counter {
	switch s := v.(type) {
	case interface{ Stats() shm.PoolStats }:
		return wire.AppendCounters(dst, s.Stats())
	case interface{ Stats() xfer.EngineStats }:
		return wire.AppendCounters(dst, s.Stats())
	}
	return dst
}

func (c *conn) stats() {
	r := wire.SetResponse[wire.StatsResponse](&c.resp)
	if p := c.ss.Pool(); p != nil {
		r.Pool = statsCounters(p, nil)
	}
	if c.tenant == nil || c.s.isAdmin(c.cred.Uid) {
		r.Pool = c.s.tenantCounters(r.Pool)
	}
	r.Engine = statsCounters(c.s.deps.Engine, nil)
	if n, ok := c.s.deps.Registry.(interface{ Len() int }); ok {
		// Every registered segment (pools, buffers, files, remotes): what a
		// leak check compares before and after a run.
		r.Engine = append(r.Engine, wire.Counter{Name: "segments_registered", Value: uint64(n.Len())})
	}
	r.Connections = uint32(c.s.Connections())
	if f := c.s.deps.TransportStats; f != nil {
		r.Transports = f(nil)
	}
	qt := c.s.QueueTotals()
	r.Transports = append(r.Transports,
		wire.Counter{Name: "queue.open", Value: qt.Open}, wire.Counter{Name: "queue.opened", Value: qt.Opened},
		wire.Counter{Name: "queue.completions", Value: qt.Completions},
		wire.Counter{Name: "queue.client_wakes", Value: qt.ClientWakes},
		wire.Counter{Name: "queue.worker_sleeps", Value: qt.WorkerSleeps},
		wire.Counter{Name: "queue.violations", Value: qt.Violations})
	r.Connection = append(c.ss.Counters(nil, len(c.idem.order)),
		wire.Counter{Name: "idempotency_keys_forgotten", Value: c.idemForgotten})
	r.Store = c.ss.StoreFigures()
}
