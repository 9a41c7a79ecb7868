package session

// What a closing session gives back: Close frees its queues, store
// handles, peers, batches, segments and pool blocks.

import (
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/peer"
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
				c.wait(id, deadline, c.h.Closing, false) //nolint:errcheck // Free below says how it ended
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
	// A block that peer requests or transfers still move bytes in goes
	// back to the pool when the last of them ends, not here: the pool may
	// hand it to another client at once, whose memory their bytes would
	// then land in.
	late := c.lateBlocks()
	var freer xfer.Freer
	if p != nil {
		freer = lateFreer{pool: p, late: late}
	}
	inFlight := c.blocks.Abandon(func(off, _ uint64) bool {
		if b := late[off]; b != nil {
			b.owed.Add(1) // the transfers' last drop; none runs before Abandon returns
		}
		return true
	}, freer, c.log)
	for i := range c.blocks.Len() {
		off, _ := c.blocks.Block(i)
		switch {
		case late[off] != nil, inFlight[off]:
			// A peer request stalled inside it past ReleaseWait, or a
			// transfer abandoned with the connection still moves bytes in
			// it: the last of them to end frees it.
			c.h.warns().lingeringBlock.Event(append(c.who(), slog.Uint64("offset", off))...)
		default:
			if err := p.Free(off); err != nil {
				c.log.Warn("freeing a pool block of a closed connection failed", "offset", off, "err", err)
			}
		}
	}
	c.blocks.Reset()
	for _, b := range late {
		b.done() // Close's own share: every other party is counted now
	}
	c.log.Debug("connection resources released")
}

// lateBlock is a pool block of a closed session that peer requests (of
// exports that ended while they were still in it) and maybe transfers
// still move bytes in: the last of them to end gives it back to the pool.
type lateBlock struct {
	off  uint64
	pool xfer.Freer
	log  *slog.Logger
	// owed counts who is still in the block: each lingering export over
	// it until its last peer request ends, its transfers until their last
	// drop, and Close until it has counted the others.
	owed atomic.Int32
}

// done is the end of one party in b; the last frees it.
func (b *lateBlock) done() {
	if b.owed.Add(-1) != 0 {
		return
	}
	if err := b.pool.Free(b.off); err != nil {
		b.log.Warn("freeing a pool block of a closed connection after its last peer request failed", "offset", b.off, "err", err)
	}
}

// lateBlocks are the session's pool blocks that a lingering export (one
// whose peer requests outlived its End) covers, by offset, each owed to
// Close and to each such export over it, which hands back its share when
// its last peer request ends. Nil when there are none. Close calls it,
// after the exports ended.
func (c *Session) lateBlocks() map[uint64]*lateBlock {
	c.lingering = slices.DeleteFunc(c.lingering, func(e *peer.Export) bool { return !e.Busy() })
	if len(c.lingering) == 0 {
		return nil
	}
	lingering := c.lingering
	c.lingering = nil
	late := make(map[uint64]*lateBlock)
	for i := range c.blocks.Len() {
		off, size := c.blocks.Block(i)
		for _, e := range lingering {
			if !e.Overlaps(c.poolID(), off, size) {
				continue
			}
			b := late[off]
			if b == nil {
				b = &lateBlock{off: off, pool: c.pool, log: c.log}
				b.owed.Store(1) // Close's
				late[off] = b
			}
			b.owed.Add(1)
			e.OnDrained(b.done)
		}
	}
	return late
}

// lateFreer frees the blocks a closed session's transfers leave to their
// last drop (xfer.Blocks.Abandon): at once, or, for a block peer requests
// may still be in, when the last of those ends too.
type lateFreer struct {
	pool xfer.Freer
	late map[uint64]*lateBlock // not changed once Abandon runs
}

func (f lateFreer) Free(off uint64) error {
	if b := f.late[off]; b != nil {
		b.done() // says its own failure
		return nil
	}
	return f.pool.Free(off)
}
