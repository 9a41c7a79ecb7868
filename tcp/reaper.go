package tcp

import (
	"fmt"
	"math"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// The reaper enforces the deadlines no frame will: handshakes that stall,
// requests a peer never answers, notifications not acknowledged in time,
// tasks that waited in a peer's queue past their deadline, connections
// that went silent with requests past their deadline. Each of these is an
// entry in a deadline heap (due.go) keyed by the moment it must be looked
// at, so a tick costs one look per peer and per connection plus one per
// entry that is due, however many requests are outstanding:
//
//   - the node's handshaking heap (under Node.mu): inbound connections not
//     yet authenticated, due HandshakeTimeout after they opened;
//   - each outbound connection's due heap (under peer.mu, beside its
//     request table): every request it carries, due when its round trip
//     reaches RequestTimeout, a notification when its ACK deadline passes,
//     a data request also when it is stallGrace past its task's deadline;
//   - each peer's queue heap (under peer.mu, pump.go): the tasks waiting in
//     its queue, due when their wait ends.

// stallGrace is how long a connection with a request past its task's
// deadline may stay silent before the reaper drops it. A peer that keeps
// answering is never dropped for deadlines alone: its late answers only
// release what the ended tasks held.
const stallGrace = time.Second

// reaperTick is how often the reaper looks at its heaps.
const reaperTick = 10 * time.Millisecond

// Why the reaper drops a connection (logged).
var (
	reasonNoAnswer = "a request got no answer within %v"
	reasonSilent   = "requests past their deadline and nothing received for %v"
)

// addSat is a+b, saturated at the largest int64 (deadlines far in the
// future must not wrap into the past).
func addSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func (pd *pending) dueAt() int64    { return pd.due }
func (pd *pending) dueSlot() *int32 { return &pd.dslot }

func (c *conn) dueAt() int64    { return c.hsDue }
func (c *conn) dueSlot() *int32 { return &c.dslot }

// dueFor is when the reaper must first look at request pd on c (unix ns):
// strictly after its deadline for a notification's ACK; strictly after
// RequestTimeout from its sending for the others, or for a data request
// strictly after stallGrace past its task's deadline and stallGrace past
// the last traffic the reaper saw on c, if that comes first. The caller
// holds the peer's mu.
func (c *conn) dueFor(pd *pending) int64 {
	if pd.kind == pkNotify {
		return addSat(pd.deadline, 1)
	}
	if pd.cb != nil { // a data exchange: its deadline, or RequestTimeout
		return min(addSat(pd.deadline, 1), addSat(addSat(pd.sent, int64(c.n.cfg.RequestTimeout)), 1))
	}
	due := addSat(addSat(pd.sent, int64(c.n.cfg.RequestTimeout)), 1)
	if pd.isData() {
		due = min(due, addSat(addSat(max(pd.ts.deadline, c.quiet), int64(stallGrace)), 1))
	}
	return due
}

// addLocked puts pd in c's request table and due heap. p.mu is held.
func (c *conn) addLocked(pd *pending) {
	c.reqs[pd.id] = pd
	pd.due = c.dueFor(pd)
	c.due.push(pd)
}

// expireLocked looks at c's requests that are due at now: a notification
// past its deadline is taken out and appended to late (the caller ends
// it); a request older than RequestTimeout, or a data request past its
// task's deadline on a connection silent for stallGrace, dooms the whole
// connection, whose drop reason it returns. A data request that is past
// its deadline on a connection that still answers is looked at again once
// the connection may have been silent for stallGrace. p.mu is held.
func (c *conn) expireLocked(now int64, late []*pending) ([]*pending, string) {
	n := c.n
	for c.due.len() > 0 {
		pd := c.due.min()
		if pd.due > now {
			break
		}
		switch {
		case pd.cb != nil && pd.receiving:
			// Its payload is still arriving past the deadline: dst
			// must not be written once done ran, so the connection goes.
			return late, "a data exchange's payload was still arriving past its deadline"
		case pd.kind == pkNotify || pd.cb != nil && now > pd.deadline:
			c.takeLocked(pd) // a data exchange's credit back with it
			c.rememberLateLocked(pd.id)
			late = append(late, pd)
		case now > addSat(pd.sent, int64(n.cfg.RequestTimeout)):
			return late, fmt.Sprintf(reasonNoAnswer, n.cfg.RequestTimeout)
		case pd.isData() && now > addSat(pd.ts.deadline, int64(stallGrace)) && now > addSat(c.quiet, int64(stallGrace)):
			// The peer has stopped answering: it may keep the connection
			// open, stopped or wedged.
			return late, fmt.Sprintf(reasonSilent, stallGrace)
		default:
			c.due.remove(pd)
			pd.due = c.dueFor(pd)
			c.due.push(pd)
		}
	}
	return late, ""
}

// rememberLateLocked notes that an answer to request id no longer
// matters, so that one arriving later is dropped rather than taken for a
// protocol error (bounded). p.mu is held.
func (c *conn) rememberLateLocked(id uint64) {
	if len(c.timedOut) >= 4096 {
		return
	}
	if c.timedOut == nil {
		c.timedOut = make(map[uint64]struct{})
	}
	c.timedOut[id] = struct{}{}
}

// reaper runs the node's deadlines (see above), token renewals and the
// refusal log's flush, every reaperTick until Close.
func (n *Node) reaper() {
	defer close(n.reaperDone)
	tick := time.NewTicker(reaperTick)
	defer tick.Stop()
	var late []*pending
	var stuck []*conn
	var peers []*peer
	var renewed time.Time
	for {
		select {
		case <-n.done:
			return
		case <-tick.C:
		}
		now := time.Now()
		ns := now.UnixNano()
		if now.Sub(renewed) >= renewCheckEvery {
			renewed = now
			n.renewDue(n.tokenNow())
		}
		n.refusals.flush(n.log, now)
		n.mu.Lock()
		for n.handshaking.len() > 0 && n.handshaking.min().hsDue <= ns {
			c := n.handshaking.min()
			n.handshaking.remove(c)
			stuck = append(stuck, c)
			n.refusals.note(n.log, "handshake timed out", now, "remote", c.remote)
		}
		peers = peers[:0]
		for _, p := range n.peers {
			peers = append(peers, p)
		}
		n.mu.Unlock()
		for _, p := range peers {
			n.expireQueued(p, ns)
			p.mu.Lock()
			for _, c := range p.sess {
				if c.dropping {
					continue
				}
				if rx := c.rxEvents.Load(); rx != c.seenRx || c.quiet == 0 {
					c.seenRx, c.quiet = rx, ns
				}
				var why string
				if late, why = c.expireLocked(ns, late); why != "" {
					c.dropping = true
					stuck = append(stuck, c)
					p.errs.Add(1)
					n.log.Warn("dropping peer connection", "peer", p.id, "reason", why)
				}
			}
			p.mu.Unlock()
		}
		for _, c := range stuck {
			_ = c.g.Close()
		}
		for _, pd := range late {
			if pd.cb != nil {
				pd.finish(0, fmt.Errorf("%w: no answer before the deadline", xfer.ErrTimeout))
				continue
			}
			pd.finish(0, fmt.Errorf("%w: notification not acknowledged before its deadline", xfer.ErrTimeout))
		}
		clear(late)
		clear(stuck)
		late, stuck = late[:0], stuck[:0]
	}
}
