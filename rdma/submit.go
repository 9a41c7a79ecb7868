package rdma

// The data path: Submit plans each task into work requests and posts them
// on a queue pair that is up (postTo); the poller reaps completions and ends
// tasks in order (pollLoop, handle).

import (
	"fmt"
	"runtime"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// Submit posts tasks in order, spreading them over the queue pairs that
// are up, and returns how many it dispatched (see xfer.Transport). A task
// that fails validation is dispatched and ended at once with an error
// wrapping xfer.ErrInvalid or ErrNotRegistered, one that carries a
// notification with xfer.ErrNoNotify (the caller sends notifications on
// its peer channel). When every queue pair is
// full or down it waits up to SubmitWait, then returns ErrQueueFull (or
// ErrQPDown). Called from a completion callback (on the poller), it can
// only take what fits at once: the room it would wait for is freed by
// that same poller.
func (t *Transport) Submit(tasks []*xfer.Task) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("rdma: %w", xfer.ErrClosed)
	}
	n := 0
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for n < len(tasks) {
		progress, anyUp := false, false
		for range t.qps {
			q := t.qps[t.rr.Add(1)%uint32(len(t.qps))]
			k, up, err := t.postTo(q, tasks[n:])
			n += k
			anyUp = anyUp || up
			if err != nil {
				return n, err
			}
			if k > 0 {
				progress = true
				break
			}
		}
		if progress || n == len(tasks) {
			continue
		}
		if t.closed.Load() {
			return n, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		}
		if timer == nil {
			timer = time.NewTimer(t.cfg.SubmitWait)
		}
		select {
		case <-t.room:
		case <-t.stop:
			return n, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		case <-timer.C:
			if !anyUp {
				return n, ErrQPDown
			}
			return n, ErrQueueFull
		}
	}
	return n, nil
}

// postTo posts a prefix of tasks on q as one linked list. It returns how
// many tasks it dispatched and whether q was up.
func (t *Transport) postTo(q *queuePair, tasks []*xfer.Task) (int, bool, error) {
	var invalid []doneTask
	q.mu.Lock()
	if q.state != qpUp {
		closed := q.state == qpClosed
		q.mu.Unlock()
		if closed {
			return 0, false, fmt.Errorf("rdma: %w", xfer.ErrClosed)
		}
		return 0, false, nil
	}
	buf := q.v.WorkRequests()
	free := len(q.slots) - int(q.head-q.tail)
	nw, taken := 0, 0
	for _, tk := range tasks {
		// The keys ride on the task's segments (xfer.SlotRDMA).
		lk, rk := KeysOf(tk.Local), KeysOf(tk.Target)
		var err error
		plan := q.plan[:0]
		switch {
		case tk.Notify != nil:
			// Notifications travel on the peer channel (the daemon's
			// link sends them once the WRITE completed), never here.
			err = xfer.ErrNoNotify
		case lk == nil || lk.remote:
			err = fmt.Errorf("%w: local segment %d carries no local keys", ErrNotRegistered, tk.Req.Local)
		case rk == nil || !rk.remote:
			err = fmt.Errorf("%w: target segment %d carries no remote keys", ErrNotRegistered, tk.Req.Target)
		default:
			plan, err = planTask(plan, tk, &lk.t, &rk.t, t.cfg.MaxMessage)
			if err == nil && len(plan) > len(q.slots) {
				err = fmt.Errorf("%w: %d bytes need %d work requests; a send queue holds %d",
					xfer.ErrInvalid, tk.Req.Length, len(plan), len(q.slots))
			}
		}
		if err != nil {
			invalid = append(invalid, doneTask{t: tk, err: err})
			taken++
			continue
		}
		if len(plan) > free-nw {
			break // no room: the rest stays with the caller or another queue pair
		}
		for i := range plan {
			seq := q.head + uint64(nw+i)
			plan[i].id = uint64(q.idx)<<seqBits | seq&(1<<seqBits-1)
			q.slots[seq&q.mask] = slot{task: tk, first: i == 0, last: i == len(plan)-1}
		}
		copy(buf[nw:], plan)
		nw += len(plan)
		taken++
	}
	if nw > 0 {
		markSignals(buf[:nw], t.cfg.SignalEvery)
		posted, err := q.v.Post(nw)
		if err != nil {
			// The provider took buf[:posted]. Fail the queue pair so those
			// flush; end the rest here: the task cut in two ends with its
			// last posted piece, the ones not posted at all right away.
			_ = q.v.Fail()
			q.state = qpDown
			perr := fmt.Errorf("%w: ibv_post_send: %v", ErrQPDown, err)
			for i := posted; i < nw; i++ {
				s := &q.slots[(q.head+uint64(i))&q.mask]
				if s.first && s.task != nil {
					invalid = append(invalid, doneTask{t: s.task, err: perr})
				}
				if i == posted && !s.first && posted > 0 {
					p := &q.slots[(q.head+uint64(i-1))&q.mask]
					p.last, p.err = true, perr
				}
				*s = slot{}
			}
			nw = posted
		}
		q.head += uint64(nw)
	}
	q.mu.Unlock()
	for _, d := range invalid {
		d.t.Done(0, d.err)
	}
	return taken, true, nil
}

// pollLoop is the poller: it takes completions in batches, retires the
// work they cover and ends tasks; when the queue is empty it arms the
// completion channel and sleeps on it.
func (t *Transport) pollLoop() {
	defer t.wg.Done()
	var idle time.Time // when the queue was first seen empty; zero while busy
	for {
		n, err := t.cq.Poll(t.wcs)
		if err != nil {
			t.log.Error("rdma: ibv_poll_cq failed; stopping the poller", "err", err)
			return
		}
		if n > 0 {
			t.handle(t.wcs[:n])
			idle = time.Time{}
			continue
		}
		if t.cfg.PollSpin > 0 {
			now := time.Now()
			if idle.IsZero() {
				idle = now
			}
			if now.Sub(idle) < t.cfg.PollSpin {
				runtime.Gosched()
				continue
			}
			idle = time.Time{}
		}
		if err := t.cq.Arm(); err != nil {
			t.log.Error("rdma: ibv_req_notify_cq failed; stopping the poller", "err", err)
			return
		}
		// A completion that arrived before arming raised no event.
		if n, _ = t.cq.Poll(t.wcs); n > 0 {
			t.handle(t.wcs[:n])
			continue
		}
		ok, err := t.cq.Wait()
		if err != nil {
			t.log.Error("rdma: completion channel failed; stopping the poller", "err", err)
			return
		}
		if !ok {
			return
		}
	}
}

// handle retires what a batch of completions covers and ends the tasks
// whose last work request it retired.
func (t *Transport) handle(wcs []WorkCompletion) {
	done := t.done[:0]
	for i := range wcs {
		c := &wcs[i]
		qi := int(c.id >> seqBits)
		if qi >= len(t.qps) {
			continue
		}
		q := t.qps[qi]
		q.mu.Lock()
		seq := q.tail + ((c.id&(1<<seqBits-1) - q.tail) & (1<<seqBits - 1))
		if seq >= q.head {
			q.mu.Unlock() // already retired (forced): stale
			continue
		}
		st := WCStatus(c.status)
		var werr error
		if st != WCSuccess {
			werr = q.errs.get(st, c.vendor)
			if q.state == qpUp {
				q.state = qpDown
			}
		}
		// RC completes in order: everything before seq finished without
		// error (errors always complete, signalled or not).
		for ; q.tail <= seq; q.tail++ {
			s := &q.slots[q.tail&q.mask]
			if s.first {
				q.curErr = nil
			}
			if q.tail == seq && werr != nil && q.curErr == nil {
				q.curErr = werr
			}
			if s.err != nil && q.curErr == nil {
				q.curErr = s.err
			}
			if s.probe != nil {
				s.probe <- q.curErr
			} else if s.last {
				var n uint64
				if q.curErr == nil {
					n = s.task.Req.Length
				}
				done = append(done, doneTask{t: s.task, n: n, err: q.curErr})
			}
			*s = slot{}
		}
		if q.state == qpDown && q.tail == q.head {
			select {
			case t.reconnect <- q.idx:
			default:
			}
		}
		q.mu.Unlock()
	}
	for i := range done {
		done[i].t.Done(done[i].n, done[i].err)
		done[i] = doneTask{}
	}
	t.done = done[:0]
	t.pokeRoom()
}

func (t *Transport) pokeRoom() {
	select {
	case t.room <- struct{}{}:
	default:
	}
}
