package tcp

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// The peer's queue and its pump. A task the submitting goroutine could not
// send whole (no session, or no room in the flow-control window) waits in
// its peer's list, oldest first; the peer's pump, a goroutine the node
// starts on the peer's first use, dials the session when there is none and
// sends the listed tasks as room frees. A task leaves the list when it is
// sent whole, when its wait expires (the reaper: its deadline, or
// RequestTimeout after it was queued), when it is canceled, when the dial
// it waited for failed, or when the node closes. Ending a waiting task only
// gives up its unsent slices: the ones already on the wire still end it,
// so no Done comes while a connection may still touch its memory.
//
// peer.queued holds every task from its first queueing until it leaves
// the pump, listed or not: the pump takes the list's head out (listed
// false) while it sends, and puts it back in front when the window fills.
// Cancel of a task the pump holds sets canceled, which the pump acts on
// when it puts the task down.

// enqueueLocked appends ts to p's list; force (a task partly sent already)
// skips the MaxQueued bound. A task that cannot wait (the node is closed,
// the list is full) is ended here. The pump is started or woken. p.mu is
// held; ending a task takes no lock the caller holds (its Done reaches
// the engine, which takes none).
func (n *Node) enqueueLocked(p *peer, ts *taskState, force bool) {
	var err error
	switch {
	case n.closed.Load():
		err = xfer.ErrClosed
	case !force && len(p.queued) >= n.cfg.MaxQueued:
		err = fmt.Errorf("%w: %d tasks wait for peer %s already", ErrBacklog, len(p.queued), p.id)
	}
	if err != nil {
		ts.stopSending(err)
		return
	}
	if _, ok := p.queued[ts.t]; !ok {
		p.queued[ts.t] = ts
	}
	ts.expires = min(ts.deadline, time.Now().Add(n.cfg.RequestTimeout).UnixNano())
	ts.listed, ts.prev, ts.next = true, p.tail, nil
	if p.tail != nil {
		p.tail.next = ts
	} else {
		p.head = ts
	}
	p.tail = ts
	p.waits.push(ts)
	n.startPumpLocked(p)
}

// pushFrontLocked puts back the task the pump held. p.mu is held.
func (p *peer) pushFrontLocked(ts *taskState) {
	ts.listed, ts.prev, ts.next = true, nil, p.head
	if p.head != nil {
		p.head.prev = ts
	} else {
		p.tail = ts
	}
	p.head = ts
	p.waits.push(ts)
}

// unlinkLocked takes a listed ts out of the list and out of queued. p.mu
// is held.
func (p *peer) unlinkLocked(ts *taskState) {
	p.takeLocked(ts)
	delete(p.queued, ts.t)
}

// takeLocked takes a listed ts out of the list; it stays in queued (the
// pump holds it). p.mu is held.
func (p *peer) takeLocked(ts *taskState) {
	if ts.prev != nil {
		ts.prev.next = ts.next
	} else {
		p.head = ts.next
	}
	if ts.next != nil {
		ts.next.prev = ts.prev
	} else {
		p.tail = ts.prev
	}
	ts.prev, ts.next, ts.listed = nil, nil, false
	p.waits.remove(ts)
}

// startPumpLocked starts p's pump if it does not run, and wakes it. p.mu is
// held.
func (n *Node) startPumpLocked(p *peer) {
	if !p.pumping {
		n.lifeMu.RLock()
		if !n.closed.Load() {
			p.pumping = true
			n.pumpWG.Add(1)
			go n.pump(p)
		}
		n.lifeMu.RUnlock()
	}
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// pump is p's sender: it dials when the peer has no session and a task or
// a caller of ensureSession wants one, and sends the listed tasks in order
// as the window allows. It returns when the node closes.
func (n *Node) pump(p *peer) {
	defer n.pumpWG.Done()
	for {
		select {
		case <-n.done:
			return
		default:
		}
		p.mu.Lock()
		ts := p.head
		if ts != nil {
			p.takeLocked(ts)
		}
		seen := p.changes
		if len(p.sess) == 0 && (ts != nil || p.wantDial) {
			if ts != nil {
				p.pushFrontLocked(ts)
			}
			p.wantDial = false
			p.mu.Unlock()
			n.dialFor(p)
			continue
		}
		if p.wantDial {
			// Someone else's dial brought the session up.
			p.wantDial = false
			p.dialEndedLocked(nil)
		}
		p.mu.Unlock()
		if ts == nil {
			select {
			case <-p.kick:
			case <-n.done:
				return
			}
			continue
		}
		st := n.sendSome(ts)
		if n.pumpTried != nil {
			n.pumpTried(p, st)
		}
		p.mu.Lock()
		var giveUp error
		switch {
		case st == sentAll:
		case ts.canceled:
			giveUp = fmt.Errorf("%w: while waiting for peer %s", xfer.ErrCanceled, p.id)
		case time.Now().UnixNano() >= ts.expires:
			giveUp = fmt.Errorf("%w: no room toward peer %s before the task's deadline", xfer.ErrTimeout, p.id)
		}
		if st == sentAll || giveUp != nil {
			// The sender's hold keeps ts (and its task) ours until this
			// drops it.
			delete(p.queued, ts.t)
			p.mu.Unlock()
			ts.stopSending(giveUp)
			continue
		}
		p.pushFrontLocked(ts)
		if len(p.sess) == 0 {
			p.mu.Unlock()
			continue // the next turn dials
		}
		if p.changes != seen {
			// Credit freed, or a connection came or went, while sendSome
			// ran without p.mu: nobody waited on wake then, so that
			// wake-up went to no one. Try again now.
			p.mu.Unlock()
			continue
		}
		// No room, or only connections being dropped: wait until credit
		// frees or a connection closes.
		wake := p.wakeChanLocked()
		p.mu.Unlock()
		select {
		case <-wake:
		case <-n.done:
			return
		}
	}
}

// dialFor runs a dial for p on its pump, tells the callers of
// ensureSession how it went and, when it failed, fails the tasks that
// waited for it.
func (n *Node) dialFor(p *peer) {
	err := n.dial(p)
	p.mu.Lock()
	p.dialEndedLocked(err)
	var failed []*taskState
	if err != nil {
		for ts := p.head; ts != nil; ts = p.head {
			p.unlinkLocked(ts)
			failed = append(failed, ts)
		}
	}
	p.mu.Unlock()
	if len(failed) > 0 {
		n.unsessioned.Event(slog.String("peer", p.id), slog.Int("tasks", len(failed)), slog.Any("err", err))
	}
	for _, ts := range failed {
		ts.stopSending(err)
	}
}

// dialEndedLocked wakes the callers of ensureSession waiting for a dial.
// p.mu is held.
func (p *peer) dialEndedLocked(err error) {
	p.dialErr = err
	if p.sessWait != nil {
		close(p.sessWait)
		p.sessWait = nil
	}
}

// ensureSession makes sure the peer has outbound connections, asking its
// pump to dial when it has none, and waits for that dial (concurrent
// callers share one). It is for calls that need an answer from the peer
// (Open, Exchange, token renewal), never for Submit. Close ends the wait,
// and so does timeout (xfer.ErrTimeout; the dial goes on for the next
// caller): an exchange with a short timeout does not wait out a dial to
// a peer that accepts connections and does not answer (stopped, wedged),
// HandshakeTimeout.
func (n *Node) ensureSession(p *peer, timeout time.Duration) error {
	p.mu.Lock()
	if len(p.sess) > 0 {
		p.mu.Unlock()
		return nil
	}
	if n.closed.Load() {
		p.mu.Unlock()
		return xfer.ErrClosed
	}
	if p.sessWait == nil {
		p.sessWait = make(chan struct{})
	}
	ch := p.sessWait
	p.wantDial = true
	n.startPumpLocked(p)
	p.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-n.done:
		return xfer.ErrClosed
	case <-timer.C:
		return fmt.Errorf("%w: no session with peer %s within %v (dialing it)", xfer.ErrTimeout, p.id, timeout)
	}
	p.mu.Lock()
	live, err := len(p.sess) > 0, p.dialErr
	p.mu.Unlock()
	switch {
	case live:
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("%w: the session with peer %s closed as it opened", ErrConnLost, p.id)
}

// expireQueued ends the listed tasks of p whose wait is over (the reaper
// calls it every tick; it looks only at the tasks that are due).
func (n *Node) expireQueued(p *peer, now int64) {
	var late []*taskState
	p.mu.Lock()
	for p.waits.len() > 0 && p.waits.min().expires <= now {
		ts := p.waits.min()
		p.unlinkLocked(ts)
		late = append(late, ts)
	}
	p.mu.Unlock()
	for _, ts := range late {
		ts.stopSending(fmt.Errorf("%w: waited for peer %s (a session or flow-control room) past the task's deadline",
			xfer.ErrTimeout, p.id))
	}
}

// failQueued ends every listed task of every peer with err (Close, after
// the pumps stopped) and reports how many there were.
func (n *Node) failQueued(err error) int {
	n.mu.Lock()
	peers := make([]*peer, 0, len(n.peers))
	for _, p := range n.peers {
		peers = append(peers, p)
	}
	n.mu.Unlock()
	total := 0
	for _, p := range peers {
		var out []*taskState
		p.mu.Lock()
		for ts := p.head; ts != nil; ts = p.head {
			p.unlinkLocked(ts)
			out = append(out, ts)
		}
		clear(p.queued)
		p.dialEndedLocked(err)
		p.mu.Unlock()
		for _, ts := range out {
			ts.stopSending(err)
		}
		total += len(out)
	}
	return total
}
