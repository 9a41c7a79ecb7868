package control

import "github.com/tensorcast/tensorcast/xfer"

// UnexportHook is told that the segment exported as name ended: the name
// is gone from the table and the peer requests in its range drained (or
// the wait for them ran out). seg is the value Lookup returned for it. The
// daemon's RDMA plane revokes the export's registration there, so that when
// UnexportSegment answers no peer can reach the range any more. It runs on
// the unexporting connection's goroutine and should return within seconds.
type UnexportHook func(name string, seg xfer.MemSegment)

// SetUnexportHook installs h (nil removes it). Exports ended before it is
// set are not reported.
func (s *Server) SetUnexportHook(h UnexportHook) {
	if h == nil {
		s.exp.onEnd.Store(nil)
		return
	}
	s.exp.onEnd.Store(&h)
}
