package tcp

// The requests this node sends and the answers it awaits: the pending
// record, roundTrip for the control requests, and matching a response frame
// to its request (handleResponse).

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

type pendKind uint8

const (
	pkRead pendKind = iota + 1
	pkWrite
	pkOpen
	pkNotify
	pkExchange
)

// pending is one request on the wire, registered in its connection's
// table until answered. Data requests and notifications are pooled: one
// reference belongs to the frame's write (writer.go), one to whoever ends
// the request. A WRITE's frame carries the task's memory, and a peer may
// answer before the frame is all written (once it has the header): its
// slice ends only when both are done, at the last reference's release
// (see finish).
type pending struct {
	node     *Node
	kind     pendKind
	id       uint64
	ts       *taskState
	loff     uint64 // offset in ts.local
	n        uint32
	sent     int64 // unix ns, for RequestTimeout
	deadline int64 // unix ns, notifications
	due      int64 // unix ns: when the reaper looks at it (reaper.go); guarded by the peer's mu
	dslot    int32 // its slot in its connection's due heap
	hdr      [hdrLen]byte
	bufs     [3][]byte
	refs     atomic.Int32
	// iov is what of bufs is still to be written and wnext the next frame
	// in its connection's write queue (writer.go); guarded by the
	// connection's wmu while queued.
	iov   [][]byte
	wnext *pending
	// meta is a notification's frame metadata, kept across the pool's
	// reuses.
	meta []byte
	// A WRITE's end (finish), kept for the last reference's release:
	// ended is set when it came, with the bytes moved and err.
	ended bool
	moved uint64

	// open and exchange requests
	doneCh chan struct{}
	err    error
	size   uint64
	token  []byte // the token; for an exchange, the answer's body
	status uint16 // exchange: the answer's status

	// data exchanges (dataexch.go): cb receives the answer (set: a data
	// exchange, ended by deadline, a unix ns); the payload lands in dst
	// (got bytes). receiving is set, under the peer's mu, once its
	// payload is arriving: from then on only the payload's end or the
	// connection's close ends it.
	cb        ExchangeDone
	dst       []byte
	got       int
	receiving bool
	peerID    string
	xkind     string
	epoch     uint64
}

func (pd *pending) isData() bool { return pd.kind == pkRead || pd.kind == pkWrite }

// credit is what pd holds of its connection's and peer's flow-control
// windows: a data request's bytes, or the payload a data exchange's answer
// may bring (its dst). Other requests hold none.
func (pd *pending) credit() int64 {
	switch {
	case pd.isData():
		return int64(pd.n)
	case pd.cb != nil:
		return int64(len(pd.dst))
	}
	return 0
}

func (pd *pending) release() {
	if pd.refs.Add(-1) != 0 || !pd.isData() && pd.kind != pkNotify {
		return
	}
	ts, ended, moved, err := pd.ts, pd.ended, pd.moved, pd.err
	n, meta := pd.node, pd.meta[:0]
	*pd = pending{node: n, meta: meta}
	n.pendPool.Put(pd)
	if ended {
		ts.part(moved, err)
	}
}

// finish ends a request taken out of its connection's table. A WRITE's
// slice ends when its frame's write is done too: its writer may still be
// sending the task's memory, which the task's Done gives back to the
// caller, so the end waits in pd for whichever reference goes last.
func (pd *pending) finish(moved uint64, err error) {
	switch pd.kind {
	case pkWrite:
		pd.ended, pd.moved, pd.err = true, moved, err
		pd.release()
	case pkRead:
		ts := pd.ts
		pd.release()
		ts.part(moved, err)
	case pkNotify:
		ts := pd.ts
		pd.release()
		ts.complete(err)
	case pkOpen, pkExchange:
		if pd.cb != nil {
			pd.finishData(err)
			return
		}
		pd.err = err
		close(pd.doneCh)
	}
}

// roundTrip sends one control request (h with meta) to p and waits up to
// timeout for its answer, which it returns. On timeout it takes the request
// back and returns nil; with dropLate, the id is remembered so that an
// answer arriving later is dropped rather than taken for a protocol error.
func (n *Node) roundTrip(p *peer, kind pendKind, h header, meta []byte, timeout time.Duration, dropLate bool) (*pending, error) {
	pd := &pending{node: n, kind: kind, doneCh: make(chan struct{})}
	pd.refs.Store(2)
	c, err := n.register(p, pd)
	if err != nil {
		return nil, err
	}
	h.id, h.metaLen = pd.id, uint16(len(meta))
	putHeader(pd.hdr[:], &h)
	pd.bufs[0], pd.bufs[1] = pd.hdr[:], meta
	c.send(pd, 2)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-pd.doneCh:
	case <-timer.C:
		p.mu.Lock()
		if c.reqs[pd.id] == pd {
			c.takeLocked(pd)
			if dropLate {
				c.rememberLateLocked(pd.id)
			}
			p.mu.Unlock()
			return nil, nil
		}
		p.mu.Unlock()
		<-pd.doneCh
	}
	return pd, nil
}

func statusErr(st uint16) error {
	switch st {
	case stPermission:
		return fmt.Errorf("%w: refused by the segment's owner", xfer.ErrPermission)
	case stInvalid:
		return fmt.Errorf("%w: rejected by the segment's owner", xfer.ErrInvalid)
	case stNotFound:
		return ErrNotFound
	}
	return fmt.Errorf("tcp: request failed on the peer (status %d)", st)
}

// handleResponse matches an answer to the request it names. Whoever takes
// a request out of its connection's table (this function, a broken
// connection, the reaper) ends it, exactly once.
func (c *conn) handleResponse(h *header, meta []byte) error {
	p := c.peer
	p.mu.Lock()
	pd := c.reqs[h.id]
	if pd == nil {
		_, late := c.timedOut[h.id]
		delete(c.timedOut, h.id)
		p.mu.Unlock()
		if late && h.payloadLen() == 0 {
			return nil
		}
		if late && h.typ == tExchResp {
			// A data exchange's answer after its deadline: its payload
			// is read and dropped (its buffer is the asker's again).
			c.rx = rxState{left: int(h.n)}
			return nil
		}
		return fmt.Errorf("%w: answer (type %d) names unknown request %d", ErrProtocol, h.typ, h.id)
	}
	var want frameType
	switch pd.kind {
	case pkRead:
		want = tReadResp
	case pkWrite:
		want = tWriteResp
	case pkOpen:
		want = tOpenResp
	case pkNotify:
		want = tNotifyAck
	case pkExchange:
		want = tExchResp
	}
	if h.typ != want {
		p.mu.Unlock()
		return fmt.Errorf("%w: answer type %d to request %d, expected type %d", ErrProtocol, h.typ, h.id, want)
	}
	if h.status == stOK && (h.typ == tReadResp || h.typ == tWriteResp) && h.n != pd.n {
		p.mu.Unlock()
		return fmt.Errorf("%w: answer to request %d counts %d bytes, request had %d", ErrProtocol, h.id, h.n, pd.n)
	}
	if h.typ == tExchResp && h.payloadLen() > 0 {
		if pd.cb == nil || int64(h.n) > int64(len(pd.dst)) {
			p.mu.Unlock()
			return fmt.Errorf("%w: answer to exchange %d carries %d payload bytes, %d asked for", ErrProtocol, h.id, h.n, len(pd.dst))
		}
		// Stays registered until the payload is in (a broken
		// connection fails it), and the reaper no longer takes it.
		pd.receiving = true
		p.mu.Unlock()
		pd.status = h.status
		pd.token = append([]byte(nil), meta...)
		pd.got = int(h.n)
		c.rx = rxState{left: int(h.n), dst: pd.dst[:h.n], p: pd}
		return nil
	}
	if h.typ == tReadResp && h.status == stOK {
		// Stays registered until the payload is in, so a broken
		// connection still fails it.
		p.mu.Unlock()
		c.rx = rxState{left: int(h.n), dst: pd.ts.local[pd.loff : pd.loff+uint64(pd.n)], p: pd}
		if sum := pd.ts.t.Sum; sum != nil && pd.loff == 0 && int(pd.n) == len(pd.ts.local) {
			c.rx.sum = sum // one slice is the whole READ: its crc32c is the task's
		}
		return nil
	}
	c.takeLocked(pd)
	p.mu.Unlock()
	switch h.typ {
	case tOpenResp:
		if h.status != stOK {
			pd.finish(0, statusErr(h.status))
			return nil
		}
		pd.size = h.arg
		pd.token = append([]byte(nil), meta...)
		pd.finish(0, nil)
	case tExchResp:
		pd.status = h.status
		pd.token = append([]byte(nil), meta...)
		pd.finish(0, nil)
	case tNotifyAck:
		var err error
		if time.Now().UnixNano() > pd.deadline {
			err = fmt.Errorf("%w: notification acknowledged after its deadline", xfer.ErrTimeout)
		} else if h.status != stOK {
			err = fmt.Errorf("%w (status %d)", ErrNotifyRejected, h.status)
			if h.status == stPermission {
				err = fmt.Errorf("%w: %w", xfer.ErrPermission, err)
			}
		}
		pd.finish(0, err)
	default:
		if h.status != stOK {
			pd.finish(0, statusErr(h.status))
		} else {
			pd.finish(uint64(pd.n), nil)
		}
	}
	return nil
}

// takeLocked removes pd from its connection and returns its credit. The
// caller holds c.peer.mu.
func (c *conn) takeLocked(pd *pending) {
	delete(c.reqs, pd.id)
	c.due.remove(pd)
	if cr := pd.credit(); cr > 0 {
		c.inflight -= cr
		c.peer.inflight -= cr
		c.peer.wakeLocked()
	}
}
