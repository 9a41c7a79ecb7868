package session

// What a closing session gives back: Close frees its queues, store
// handles, peers, batches, segments and pool blocks.

import (
	"errors"
	"log/slog"
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
func (c *Session) Close() {
	// Queues first: their workers resolve the segments and blocks released
	// below, and what they have in flight ends Canceled with its CQE.
	c.qmu.Lock()
	queues := c.queues
	c.queues = map[uint64]*cqueue{}
	c.qmu.Unlock()
	for _, q := range queues {
		q.close()
	}
	c.closeStore() // its pins, leases and reservations; no queue can use it any more
	c.releasePeers()
	e := c.h.Engine
	deadline := time.Now().Add(c.h.ReleaseWait)
	for id := range c.batches {
		err := e.Free(id)
		if errors.Is(err, ErrBatchBusy) {
			if !c.h.closing() {
				c.wait(id, deadline, c.h.Closing) //nolint:errcheck // Free below says how it ended
			}
			err = e.Free(id)
			if errors.Is(err, ErrBatchBusy) {
				c.h.warns().abandonedBatch.Event(append(c.who(), slog.Uint64("batch", uint64(id)))...)
				e.Abandon(id)
				err = nil
			}
		}
		if err != nil {
			c.log.Warn("freeing a batch of a closed connection failed", "batch", id, "err", err)
		}
	}
	clear(c.batches)
	c.mu.Lock()
	bufs, files := c.buffers, c.files
	c.buffers, c.files = map[xfer.SegmentID]Buffer{}, map[xfer.SegmentID]FileSegment{}
	c.segGen.Add(1)
	c.mu.Unlock()
	reg := c.h.Registry
	for id, b := range bufs {
		reg.Remove(id)
		if err := b.Close(); err != nil {
			c.log.Warn("closing a buffer of a closed connection failed", "segment", id, "err", err)
		}
	}
	for id, f := range files {
		reg.Remove(id)
		if err := f.Close(); err != nil {
			c.log.Warn("closing a file of a closed connection failed", "segment", id, "err", err)
		}
	}
	p := c.pool
	exported := func(off, size uint64) bool { return c.exported(c.poolID(), off, size) }
	var freer xfer.Freer
	if p != nil {
		freer = p
	}
	inFlight := c.blocks.Abandon(func(off, size uint64) bool { return !exported(off, size) }, freer, c.log)
	for i := range c.blocks.Len() {
		off, size := c.blocks.Block(i)
		switch {
		case exported(off, size):
			// A peer request stalled inside it past ReleaseWait; handing
			// the block to another client could let its bytes land there.
			c.log.Error("leaving a pool block allocated: a peer request still holds it", "offset", off)
		case inFlight[off]:
			// A transfer abandoned with the connection still moves bytes
			// in it; the last one to end frees it.
			c.h.warns().lingeringBlock.Event(append(c.who(), slog.Uint64("offset", off))...)
		default:
			if err := p.Free(off); err != nil {
				c.log.Warn("freeing a pool block of a closed connection failed", "offset", off, "err", err)
			}
		}
	}
	c.blocks.Reset()
	c.log.Debug("connection resources released")
}
