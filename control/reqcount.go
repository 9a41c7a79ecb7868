package control

import (
	"sync/atomic"

	"github.com/tensorcast/tensorcast/wire"
)

// requestCounts counts the requests a server decoded, by message kind: a
// fixed array indexed by the kind byte, one atomic add per request, no lock
// and no allocation. Scrapes read it with RequestCounts.
type requestCounts [256]atomic.Uint64

func (r *requestCounts) count(k wire.RequestKind) { r[uint8(k)].Add(1) }

// RequestCount is the number of requests of one kind served so far.
type RequestCount struct {
	Kind  string // the message name, e.g. "SubmitRequest"
	Count uint64
}

// RequestCounts appends, for every request kind served at least once, its
// count to dst.
func (s *Server) RequestCounts(dst []RequestCount) []RequestCount {
	for i := range s.reqs {
		if n := s.reqs[i].Load(); n != 0 {
			dst = append(dst, RequestCount{Kind: kindName(uint8(i)), Count: n})
		}
	}
	return dst
}
