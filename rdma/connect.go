package rdma

// Queue-pair lifecycle: connecting through a Peer (Connect, Accept,
// bringUp, the zero-length WRITE probe), and recovering a queue pair after an
// error (drain, forceRetire, the reconnector).

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Peer carries connection data to the other side of a queue pair: it
// hands the local ConnInfo over, the other side brings its queue pair of
// the same QPIndex up against it (Transport.Accept) and answers with its
// own. The tcp peer channel implements it between daemons; Loopback
// implements it inside one process.
type Peer interface {
	Exchange(local ConnInfo) (ConnInfo, error)
}

// Loopback is a Peer that is another transport in this process.
type Loopback struct{ T *Transport }

// Exchange brings up l.T's queue pair against local.
func (l Loopback) Exchange(local ConnInfo) (ConnInfo, error) { return l.T.Accept(local) }

// Connect brings every queue pair up against peer (which is kept for
// reconnecting after errors). Each queue pair is checked with a
// zero-length RDMA WRITE that must complete within ConnectTimeout.
func (t *Transport) Connect(peer Peer) error {
	t.mu.Lock()
	t.peer = peer
	t.mu.Unlock()
	for _, q := range t.qps {
		if err := t.bringUp(q, peer.Exchange, true); err != nil {
			return err
		}
	}
	return nil
}

// Accept brings up the queue pair remote.QPIndex against remote (the
// passive side of Peer.Exchange) and returns this side's connection data.
func (t *Transport) Accept(remote ConnInfo) (ConnInfo, error) {
	if int(remote.QPIndex) >= len(t.qps) {
		return ConnInfo{}, fmt.Errorf("%w: queue pair %d of %d", ErrConnInfo, remote.QPIndex, len(t.qps))
	}
	var local ConnInfo
	err := t.bringUp(t.qps[remote.QPIndex], func(l ConnInfo) (ConnInfo, error) {
		local = l
		return remote, nil
	}, false)
	return local, err
}

// bringUp (re)connects q: it drains whatever q still has posted, resets
// it, exchanges connection data and moves it to RTS; with probe it then
// checks the path with a zero-length WRITE.
func (t *Transport) bringUp(q *queuePair, exchange func(ConnInfo) (ConnInfo, error), probe bool) error {
	q.mu.Lock()
	switch q.state {
	case qpClosed:
		q.mu.Unlock()
		return fmt.Errorf("rdma: %w", xfer.ErrClosed)
	case qpBusy:
		q.mu.Unlock()
		return fmt.Errorf("%w: qp %d is being connected already", ErrConnect, q.idx)
	}
	wasUp := q.state == qpUp
	q.state = qpBusy
	inflight := q.head != q.tail
	q.mu.Unlock()
	// q's goroutine reaps what is left, whichever reactor posted it: one
	// that stopped must not hold the drain up.
	t.adopt(q)
	if wasUp && inflight {
		_ = q.v.Fail()
	}
	t.drain(q, time.Now().Add(t.cfg.ConnectTimeout))
	if err := q.v.Reset(); err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: reset qp %d: %v", ErrConnect, q.idx, err)
	}
	t.forceRetire(q, ErrQPDown)

	t.mu.Lock()
	local := ConnInfo{
		QPIndex: uint16(q.idx), QPN: q.v.QPN(), PSN: rand.Uint32() & 0xffffff,
		LID: t.addr.LID, MTU: t.addr.MTU, GID: t.addr.GID, Regions: append([]RemoteRegion(nil), t.exposed...),
	}
	t.mu.Unlock()
	remote, err := exchange(local)
	if err == nil {
		err = remote.validate()
	}
	if err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: exchange for qp %d: %w", ErrConnect, q.idx, err)
	}
	if err := q.v.Connect(&local, &remote); err != nil {
		t.setState(q, qpDown)
		return fmt.Errorf("%w: qp %d to %s qpn %#x: %v", ErrConnect, q.idx, remote.GID, remote.QPN, err)
	}
	t.mu.Lock()
	t.learned = remote.Regions
	t.mu.Unlock()
	q.mu.Lock()
	q.local, q.remote = local, remote
	q.mu.Unlock()
	if probe {
		if err := t.probe(q); err != nil {
			_ = q.v.Fail()
			t.setState(q, qpDown)
			return fmt.Errorf("%w: qp %d to %s: %v", ErrConnect, q.idx, remote.GID, err)
		}
	}
	t.setState(q, qpUp)
	t.pokeRoom()
	return nil
}

// probe posts a zero-length RDMA WRITE on q and waits for its completion.
func (t *Transport) probe(q *queuePair) error {
	ch := make(chan error, 1)
	q.mu.Lock()
	if q.head-q.tail >= uint64(len(q.slots)) {
		q.mu.Unlock()
		return ErrQueueFull
	}
	buf := q.v.WorkRequests()
	buf[0] = WorkRequest{id: uint64(q.idx)<<seqBits | q.head&(1<<seqBits-1), op: opWrite, signaled: 1}
	q.slots[q.head&q.mask] = slot{probe: ch, first: true, last: true}
	_, err := q.v.Post(1)
	if err == nil {
		q.head++
	}
	q.mu.Unlock()
	if err != nil {
		return err
	}
	timer := time.NewTimer(t.cfg.ConnectTimeout)
	defer timer.Stop()
	select {
	case err := <-ch:
		return err
	case <-timer.C:
		return fmt.Errorf("no answer within %v", t.cfg.ConnectTimeout)
	}
}

func (t *Transport) setState(q *queuePair, s int) {
	q.mu.Lock()
	if q.state != qpClosed {
		q.state = s
	}
	q.mu.Unlock()
}

// drain waits until q has nothing posted, or until deadline, and reports
// whether q drained. It sleeps on q.idle, which the retirement of q's last
// posted work request closes: the reaper's completion ends the wait, with
// no polling of q meanwhile.
func (t *Transport) drain(q *queuePair, deadline time.Time) bool {
	q.mu.Lock()
	if q.head == q.tail {
		q.mu.Unlock()
		return true
	}
	if q.idle == nil {
		q.idle = make(chan struct{})
	}
	idle := q.idle
	q.mu.Unlock()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-idle:
		return true
	case <-timer.C:
		return false
	}
}

// drainedLocked wakes the drain waiting for q (q.mu held), once q has
// nothing posted.
func (q *queuePair) drainedLocked() {
	if q.idle != nil && q.head == q.tail {
		close(q.idle)
		q.idle = nil
	}
}

// forceRetire ends whatever q still has posted with err. Only called with
// q in RESET (or destroyed), when the device no longer touches its work.
func (t *Transport) forceRetire(q *queuePair, err error) {
	var done []doneTask
	q.mu.Lock()
	for ; q.tail != q.head; q.tail++ {
		s := &q.slots[q.tail&q.mask]
		if s.first {
			q.curErr = nil
		}
		if s.probe != nil {
			s.probe <- err
		} else if s.last {
			done = append(done, doneTask{t: s.task, err: err})
		}
		*s = slot{}
	}
	q.drainedLocked()
	q.mu.Unlock()
	for _, d := range done {
		d.t.Done(0, d.err)
	}
}

// reconnectLoop is the reconnector: it brings queue pairs that went down
// back up through the peer, retrying with a growing pause until Close.
func (t *Transport) reconnectLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case idx := <-t.reconnect:
			t.mu.Lock()
			peer := t.peer
			t.mu.Unlock()
			if peer == nil {
				continue // the passive side: the peer reconnects through Accept
			}
			q := t.qps[idx]
			for pause := 10 * time.Millisecond; ; pause = min(2*pause, time.Second) {
				q.mu.Lock()
				down := q.state == qpDown
				q.mu.Unlock()
				if !down {
					break
				}
				err := t.bringUp(q, peer.Exchange, true)
				if err == nil {
					t.log.Info("rdma: queue pair re-established", "qp", idx)
					break
				}
				t.log.Warn("rdma: reconnecting queue pair failed", "qp", idx, "err", err)
				select {
				case <-t.stop:
					return
				case <-time.After(pause):
				}
			}
		}
	}
}

// failQP moves queue pair i to the error state, as a fatal device error
// would: its posted work flushes and it is reconnected.
func (t *Transport) failQP(i int) error { return t.qps[i].v.Fail() }
