package rdma

// The data path: Submit plans each task into work requests and posts them
// on a queue pair that is up (postTo); the queue pair's reaper (reap.go: the
// reactor that posted, or the queue pair's goroutine, pollLoop) reaps
// completions and ends tasks in order (retireLocked).

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
// ErrQPDown). Called from a completion callback on a queue pair's
// goroutine, it waits only for room other reapers free: that queue pair's
// own frees none meanwhile.
//
// Tasks whose Home names one of Config.Homes were submitted by that
// reactor worker, on its thread: they go to a queue pair that worker
// reaps (one it owns, or one with nothing posted, which it then claims;
// failing both, one another reaper owns), and while it waits for room it
// reaps its own completions.
func (t *Transport) Submit(tasks []*xfer.Task) (int, error) {
	if t.closed.Load() {
		return 0, fmt.Errorf("rdma: %w", xfer.ErrClosed)
	}
	if len(tasks) == 0 {
		return 0, nil
	}
	home := t.homes.of(tasks[0].Home)
	who := uint32(noHome)
	if home != nil {
		who = home.id
		home.last.Store(time.Now().UnixNano())
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
		// First the queue pairs this submitter reaps or may claim, then
		// any with room.
		for pass := 0; pass < 2 && !progress; pass++ {
			for range t.qps {
				q := t.qps[t.rr.Add(1)%uint32(len(t.qps))]
				k, up, err := t.postTo(q, tasks[n:], who, pass == 1)
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
		if home != nil && home.Reap() {
			continue // room this worker made itself
		}
		var tick <-chan time.Time
		if home != nil {
			// The room may be this worker's own to reap: look again soon.
			tick = time.After(homeWaitTick)
		}
		select {
		case <-t.room:
		case <-tick:
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

// homeWaitTick is how often a reactor worker waiting in Submit for room
// reaps its own queue pairs.
const homeWaitTick = 50 * time.Microsecond

// postTo posts a prefix of tasks on q as one linked list, for reaper who
// (a Home's id, or noHome). Unless shared, it posts only on a queue pair who
// owns or that has nothing posted (who then claims it). It returns how
// many tasks it dispatched and whether q was up.
func (t *Transport) postTo(q *queuePair, tasks []*xfer.Task, who uint32, shared bool) (int, bool, error) {
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
	if q.owner != who && q.head != q.tail && !shared {
		q.mu.Unlock()
		return 0, true, nil // another reaper's work is in flight here
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
			plan, err = planTask(plan, tk, &lk.t, &rk.t, t.cfg.MaxMessage, len(q.slots))
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
	if nw > 0 && q.owner != who && q.head == q.tail {
		t.claimLocked(q, who)
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

// claimLocked makes who q's reaper (q.mu held, nothing posted on q).
//
// Who watches q's channel changes with it: q's goroutine, unless q's
// owner is a home whose worker polls the channel on its ring
// (Home.watches). When that changes, the goroutine is woken to wait
// again, with or without the channel. Until it has, it may still take an
// event meant for the home: it then wakes the home, as it does for a
// worker that cannot poll, so no completion waits for a wake-up nobody
// sends.
func (t *Transport) claimLocked(q *queuePair, who uint32) {
	prev := t.homes.of(q.owner)
	q.owner = who
	q.armedFor = false
	was := prev != nil && prev.watches(q)
	h := t.homes.of(who)
	now := h != nil && h.claim(q)
	if was != now {
		q.cq.Wake()
	}
	if h != nil {
		return
	}
	// q's goroutine may sleep on the channel unarmed (it was a reactor's):
	// the next completion must raise an event.
	if err := q.cq.Arm(); err != nil {
		t.log.Error("rdma: ibv_req_notify_cq failed", "qp", q.idx, "err", err)
	}
}

// pollLoop is q's goroutine. While no reactor owns q it is q's reaper: it
// takes completions in batches and ends tasks; when the queue is empty it
// spins for PollSpin, then arms the completion channel and sleeps on it.
// While a reactor whose worker cannot poll the channel on its ring owns q,
// it only sleeps on the channel, which that reactor arms before it sleeps,
// and wakes the reactor when an event comes. While a reactor that polls
// the channel itself owns q, it sleeps until woken (adopt, a claim, Close)
// and leaves the channel to that reactor.
func (t *Transport) pollLoop(q *queuePair) {
	defer t.wg.Done()
	wcs := make([]WorkCompletion, t.cfg.PollBatch)
	done := make([]doneTask, 0, t.cfg.PollBatch)
	var idle time.Time // when the queue was first seen empty; zero while busy
	for {
		n, mine := t.reapQP(q, noHome, wcs, &done, false)
		if n > 0 {
			idle = time.Time{}
			continue
		}
		if mine && t.cfg.PollSpin > 0 && q.busy() {
			now := time.Now()
			if idle.IsZero() {
				idle = now
			}
			if now.Sub(idle) < t.cfg.PollSpin {
				runtime.Gosched()
				continue
			}
		}
		idle = time.Time{}
		if mine {
			if err := q.cq.Arm(); err != nil {
				t.log.Error("rdma: ibv_req_notify_cq failed; stopping the poller", "qp", q.idx, "err", err)
				return
			}
			// A completion that arrived before arming raised no event.
			if n, _ = t.reapQP(q, noHome, wcs, &done, false); n > 0 {
				continue
			}
		}
		watch := mine
		if !mine {
			q.mu.Lock()
			h := t.homes.of(q.owner)
			watch = h == nil || !h.watches(q)
			q.mu.Unlock()
		}
		ok, err := q.cq.Wait(watch)
		if err != nil {
			t.log.Error("rdma: completion channel failed; stopping the poller", "qp", q.idx, "err", err)
			return
		}
		if !ok {
			select {
			case <-t.stop:
				return
			default:
				continue // woken to look (adopt)
			}
		}
		q.mu.Lock()
		owner := q.owner
		q.armedFor = false
		q.mu.Unlock()
		if h := t.homes.of(owner); h != nil {
			h.kick()
		}
	}
}

// busy reports whether q has work posted.
func (q *queuePair) busy() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head != q.tail
}

// retireLocked retires what completion c covers on q (q.mu held) and
// appends the tasks whose last work request it retired to done.
func (t *Transport) retireLocked(q *queuePair, c *WorkCompletion, done []doneTask) []doneTask {
	if int(c.id>>seqBits) != q.idx {
		return done // not q's: cannot happen with a completion queue per queue pair
	}
	seq := q.tail + ((c.id&(1<<seqBits-1) - q.tail) & (1<<seqBits - 1))
	if seq >= q.head {
		return done // already retired (forced): stale
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
	q.drainedLocked()
	if q.state == qpDown && q.tail == q.head {
		select {
		case t.reconnect <- q.idx:
		default:
		}
	}
	return done
}

func (t *Transport) pokeRoom() {
	select {
	case t.room <- struct{}{}:
	default:
	}
}
