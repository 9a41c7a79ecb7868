package control

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

// blockClasses returns the pool's block sizes, smallest first, when the
// pool reports them.
func blockClasses(p any) []uint64 {
	s, ok := p.(interface{ Stats() shm.PoolStats })
	if !ok {
		return nil
	}
	cl := s.Stats().Classes
	out := make([]uint64, len(cl))
	for i := range cl {
		out[i] = cl[i].BlockSize
	}
	return out
}
