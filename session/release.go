package session

// What a closing session gives back: Close frees its queues, store
// handles, peers, batches, segments and pool blocks.

import (
	"errors"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Close frees everything the session holds, whatever state it is in, in
// this order: its queues (their workers stopped, what they have in flight
// ended Canceled with its CQE), its store session, its peers (inbox,
// exports, remote segments), its batches (abandoning those still busy
// after ReleaseWait, or at once when the server closes: a drain gave them
// their time already), its registered segments and its pool blocks. The
// serving goroutine calls it once, after the last handler.
func (s *Session) Close() {
	// Queues first: their workers resolve the segments and blocks released
	// below, and what they have in flight ends Canceled with its CQE.
	s.qmu.Lock()
	queues := s.queues
	s.queues = map[uint64]*cqueue{}
	s.qmu.Unlock()
	for _, q := range queues {
		q.close()
	}
	s.closeStore() // its pins, leases and reservations; no queue can use it any more
	s.releasePeers()
	e := s.h.Engine
	deadline := time.Now().Add(s.h.ReleaseWait)
	for id := range s.batches {
		err := e.Free(id)
		if errors.Is(err, ErrBatchBusy) {
			if !s.h.closing() {
				s.wait(id, deadline, s.h.Closing) //nolint:errcheck // Free below says how it ended
			}
			err = e.Free(id)
			if errors.Is(err, ErrBatchBusy) {
				s.log.Warn("abandoning a busy batch of a closed connection", "batch", id)
				e.Abandon(id)
				err = nil
			}
		}
		if err != nil {
			s.log.Warn("freeing a batch of a closed connection failed", "batch", id, "err", err)
		}
	}
	clear(s.batches)
	s.mu.Lock()
	bufs, files := s.buffers, s.files
	s.buffers, s.files = map[xfer.SegmentID]Buffer{}, map[xfer.SegmentID]FileSegment{}
	s.segGen.Add(1)
	s.mu.Unlock()
	reg := s.h.Registry
	for id, b := range bufs {
		reg.Remove(id)
		if err := b.Close(); err != nil {
			s.log.Warn("closing a buffer of a closed connection failed", "segment", id, "err", err)
		}
	}
	for id, f := range files {
		reg.Remove(id)
		if err := f.Close(); err != nil {
			s.log.Warn("closing a file of a closed connection failed", "segment", id, "err", err)
		}
	}
	p := s.pool
	exported := func(i int) bool { return s.exported(s.poolID(), s.blocks.offs[i], s.blocks.sizes[i]) }
	inFlight := s.pview.close(func(off uint64) bool {
		i, _ := slices.BinarySearch(s.blocks.offs, off)
		return !exported(i)
	})
	for i, off := range s.blocks.offs {
		switch {
		case exported(i):
			// A peer request stalled inside it past ReleaseWait; handing
			// the block to another client could let its bytes land there.
			s.log.Error("leaving a pool block allocated: a peer request still holds it", "offset", off)
		case inFlight[off]:
			// A transfer abandoned with the connection still moves bytes
			// in it; the last one to end frees it.
			s.log.Warn("pool block left to its in-flight transfers; freed when they end", "offset", off)
		default:
			if err := p.Free(off); err != nil {
				s.log.Warn("freeing a pool block of a closed connection failed", "offset", off, "err", err)
			}
		}
	}
	s.blocks.reset()
	s.log.Debug("connection resources released")
}
