package rdma

// Completions polled by the reactor that posted: each queue pair has its
// own completion queue, and whoever posted its work (a reactor worker, or
// the transport itself for work no reactor posted) reaps it. See the
// package doc, "Who reaps".

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// noHome is the owner of a queue pair whose completions the transport's
// own goroutine for it reaps.
const noHome = 0

// Homes are the reapers of the daemon's reactor workers, one per worker:
// Home(i) for worker i, which a task submitted by that worker names as its
// xfer.Task.Home (i+1, with or without xfer.HomeOwnThread). Every
// transport made with Config.Homes posts such a task on a queue pair whose
// completions that worker reaps in its own loop.
type Homes struct {
	homes []*Home
}

// NewHomes makes the reapers of n workers. spin is how long a worker
// with RDMA work in flight keeps polling after its last post or
// completion before it sleeps (0: Config.PollSpin's default; negative:
// not at all).
func NewHomes(n int, spin time.Duration) *Homes {
	if spin == 0 {
		spin = DefaultConfig().PollSpin
	}
	hs := &Homes{homes: make([]*Home, n)}
	for i := range hs.homes {
		hs.homes[i] = &Home{id: uint32(i) + 1, wcs: make([]WorkCompletion, DefaultConfig().PollBatch), spin: spin}
	}
	return hs
}

// Len is how many homes there are.
func (hs *Homes) Len() int {
	if hs == nil {
		return 0
	}
	return len(hs.homes)
}

// Home is worker i's reaper (i in [0, Len)).
func (hs *Homes) Home(i int) *Home { return hs.homes[i] }

// of is the home a task's Home names, nil for none (0, or a reactor this
// set does not have).
func (hs *Homes) of(h uint32) *Home {
	h &^= xfer.HomeOwnThread
	if hs == nil || h == 0 || int(h) > len(hs.homes) {
		return nil
	}
	if hm := hs.homes[h-1]; !hm.stopped.Load() {
		return hm
	}
	return nil
}

// Home reaps, on one reactor worker's thread, the completion queues of the
// queue pairs that worker posted on. It implements reactor.Reaper: the
// worker calls Reap after each pass, Sleep before it sleeps and Fired when
// a poll Sleep armed on its ring ended; when the worker cannot poll (it
// runs its own thread), the transports' goroutines call the wake Bind gave
// when a completion event comes for it while it sleeps.
type Home struct {
	id uint32

	wake atomic.Pointer[func()]
	// polls: the worker's sleep polls the completion channels of the queue
	// pairs it owns on its ring (Bind); their goroutines then leave the
	// channels alone. Cleared when such a poll fails.
	polls atomic.Bool
	// last is when the worker last posted or reaped (UnixNano): it keeps
	// polling for its spin after that before it sleeps. gap is the
	// average time from one of those to the next completion (ns, an
	// exponentially weighted mean; worker-owned).
	last atomic.Int64
	spin time.Duration
	gap  int64

	// mu guards adds: queue pairs claimed for this home, which Reap moves
	// into qps (postTo may run on another thread than the worker's).
	mu      sync.Mutex
	adds    []*queuePair
	changed atomic.Bool

	// reaping guards the fields below: the worker's thread holds it while
	// it reaps, prepares its sleep or hears a poll fire. A Done that
	// submits again and waits for room (Submit reaps meanwhile) finds it
	// held and does not reap inside a reap, nor from another thread.
	reaping sync.Mutex
	qps     []*watch // the queue pairs this home owns (or did, until Reap sees otherwise)
	slots   []*watch // by slot: what a poll's token names
	free    []uint16
	cancels []uint32 // tokens of polls of watches gone, cancelled at the next Sleep
	wcs     []WorkCompletion
	done    []doneTask

	// reaped counts completions reaped here, polled the polls that fired,
	// woken the wake-ups from transports' goroutines (tests, stats).
	reaped, polled, woken atomic.Uint64
	// stopped: the worker is gone (Stop); its tasks are reaped by the
	// transports' goroutines.
	stopped atomic.Bool
}

// watch is a queue pair a home owns, with the state of the poll of its
// completion channel on the worker's ring.
type watch struct {
	q    *queuePair
	slot uint16
	gen  uint8
	// polling: a poll of q's channel is on the ring. fired: one fired
	// since the last Reap, which takes q's events.
	polling, fired bool
}

// token names w's poll: its slot and generation (24 bits, as
// reactor.Reaper allows).
func (w *watch) token() uint32 { return uint32(w.slot)<<8 | uint32(w.gen) }

// maxWatches bounds the queue pairs one home watches by poll; more are
// watched by their goroutines.
const maxWatches = 1 << 16

// Waits is what a reactor worker's sleep lends a Home to wait on (its
// io_uring ring; reactor.ReaperWaits): a one-shot poll of a file for
// POLLIN whose end reaches Home.Fired with the token, and the cancel of
// one. It is an alias of an interface literal, so that Home implements
// reactor.Reaper without either package importing the other.
type Waits = interface {
	PollWait(fd int, token uint32)
	CancelWait(token uint32) bool
}

// Bind sets the worker's wake-up, which any goroutine may call: it ends
// the worker's sleep, or its next one. polls says the worker's Sleep
// passes Waits on which the home polls the completion channels itself.
func (h *Home) Bind(wake func(), polls bool) {
	h.wake.Store(&wake)
	h.mu.Lock()
	if !polls {
		h.unpollLocked()
	}
	h.polls.Store(polls)
	h.mu.Unlock()
}

// Stop hands every queue pair this home owns back to its transport's
// goroutine (the worker stops): what it had in flight is reaped there, and
// nothing is claimed for the home again. Polls still on the ring end with
// it.
func (h *Home) Stop() {
	h.stopped.Store(true)
	h.reaping.Lock()
	defer h.reaping.Unlock()
	h.apply()
	for _, w := range h.qps {
		q := w.q
		q.mu.Lock()
		mine := q.owner == h.id
		q.mu.Unlock()
		if mine {
			q.t.adopt(q)
		}
	}
	for len(h.qps) > 0 {
		h.drop(0)
	}
	h.cancels = h.cancels[:0]
}

// Reaped is how many completions this home reaped.
func (h *Home) Reaped() uint64 { return h.reaped.Load() }

// Polled is how many polls of a completion channel on the worker's ring
// fired.
func (h *Home) Polled() uint64 { return h.polled.Load() }

// Woken is how many times a transport's goroutine woke the worker for
// this home (a completion event it took, or a queue pair taken back).
func (h *Home) Woken() uint64 { return h.woken.Load() }

func (h *Home) kick() {
	h.woken.Add(1)
	if w := h.wake.Load(); w != nil {
		(*w)()
	}
}

// watches reports whether q's channel is the home's to watch (its worker
// polls it) rather than q's goroutine's.
func (h *Home) watches(q *queuePair) bool { return h.polls.Load() && q.chfd >= 0 }

// claim records that q's completions are h's to reap from now on (q.mu
// held, by postTo), and reports whether h watches q's channel. polls
// changes only under h.mu, so a change after the claim finds q among adds
// or qps, and wakes its goroutine (unpollLocked).
func (h *Home) claim(q *queuePair) bool {
	h.mu.Lock()
	h.adds = append(h.adds, q)
	h.changed.Store(true)
	w := h.watches(q)
	h.mu.Unlock()
	return w
}

// unpollLocked turns the home's polling off (h.mu held): the goroutines of
// every queue pair it owns or is claiming are woken, and watch their
// channels from then on. It reports whether polling was on.
func (h *Home) unpollLocked() bool {
	if !h.polls.Swap(false) {
		return false
	}
	for _, w := range h.qps {
		w.q.cq.Wake()
	}
	for _, q := range h.adds {
		q.cq.Wake()
	}
	return true
}

func (h *Home) apply() {
	h.mu.Lock()
	for _, q := range h.adds {
		found := false
		for _, w := range h.qps {
			found = found || w.q == q
		}
		if !found {
			h.qps = append(h.qps, h.newWatch(q))
		}
	}
	clear(h.adds)
	h.adds = h.adds[:0]
	h.changed.Store(false)
	h.mu.Unlock()
}

func (h *Home) newWatch(q *queuePair) *watch {
	var w *watch
	if n := len(h.free); n > 0 {
		w = h.slots[h.free[n-1]]
		h.free = h.free[:n-1]
	} else {
		w = &watch{slot: uint16(len(h.slots))}
		if len(h.slots) < maxWatches {
			h.slots = append(h.slots, w)
		} else if h.unpollLocked() {
			// No token left for its poll: the goroutines watch every
			// channel of this home from now on (w is in no slot, so
			// nothing ever names it).
			q.t.log.Error("rdma: a reactor worker owns too many queue pairs to poll their completion channels; their goroutines watch them",
				"home", h.id, "queue_pairs", len(h.slots))
			q.cq.Wake()
		}
	}
	w.q = q
	return w
}

// drop forgets h.qps[i]: its poll, if on the ring, is cancelled at the
// next Sleep, and fires (if ever) for a generation gone.
func (h *Home) drop(i int) {
	w := h.qps[i]
	if w.polling {
		h.cancels = append(h.cancels, w.token())
	}
	w.q, w.polling, w.fired = nil, false, false
	if int(w.slot) < len(h.slots) && h.slots[w.slot] == w {
		w.gen++
		h.free = append(h.free, w.slot)
	}
	h.qps[i] = h.qps[len(h.qps)-1]
	h.qps[len(h.qps)-1] = nil
	h.qps = h.qps[:len(h.qps)-1]
}

// Reap takes what completed on the queue pairs this home owns and ends
// their tasks (their Done runs here, on the worker's thread). It reports
// whether it reaped anything.
func (h *Home) Reap() bool {
	if !h.reaping.TryLock() {
		return false // within a reap (a Done that submits), or another thread
	}
	defer h.reaping.Unlock()
	return h.reapLocked()
}

func (h *Home) reapLocked() bool {
	if h.changed.Load() {
		h.apply()
	}
	did := false
	for i := 0; i < len(h.qps); i++ {
		w := h.qps[i]
		q := w.q
		if w.fired {
			// Its poll fired: take the channel's events (else the
			// channel stays readable and the next poll fires at once),
			// then poll the queue to empty below.
			w.fired = false
			q.t.takeEvents(q, h.id)
		}
		n, owned := q.t.reapQP(q, h.id, h.wcs, &h.done, true)
		if !owned {
			// Claimed by another home, or taken back by the transport
			// (bringUp, Close): not this worker's to look at.
			h.drop(i)
			i--
			continue
		}
		if n > 0 {
			did = true
			h.reaped.Add(uint64(n))
		}
	}
	if did {
		now := time.Now().UnixNano()
		if g := now - h.last.Load(); g > 0 {
			h.gap += (g - h.gap) / 8
		}
		h.last.Store(now)
	}
	return did
}

// maxSpin bounds how long a worker keeps polling for a completion it
// expects soon (twice the usual gap, see Home.budget); longer waits are
// slept through, since their wake-up costs little beside them. On a slow
// fabric (Soft-RoCE under emulation: a wake-up 50-100 µs, a round trip
// 150-250 µs) a bound of 500 µs was below twice the gap a sleeping worker
// measures (the gap includes its own wake-up), so it slept at every
// completion and never learnt the shorter gap polling gives.
const maxSpin = time.Millisecond

// budget is how long the worker polls after its last post or completion
// before it sleeps: its spin, or twice the usual gap when that is longer
// and within maxSpin (a round trip at low depth then ends while it
// polls; a stream of long transfers sleeps between completions).
func (h *Home) budget() int64 {
	if h.spin < 0 {
		return 0
	}
	b := int64(h.spin)
	if g := 2 * h.gap; g > b && g <= int64(maxSpin) {
		b = g
	}
	return b
}

// Sleep prepares the worker's sleep: false while work it posted is in
// flight and it reaped or posted less than its budget ago (it polls
// again instead), or when completions came while it armed the completion
// queues. Otherwise every queue pair with its work in flight is armed
// (ibv_req_notify_cq) and, with ws (the worker's ring), its completion
// channel is polled there, once, until that poll fires: the next
// completion raises an event, the event makes the channel readable and
// the readable channel ends the worker's sleep, with no other thread
// between. Without ws, the event wakes the worker through the queue
// pair's goroutine. After arming it polls each queue once more: a
// completion that came before the arm raised no event.
func (h *Home) Sleep(ws Waits) bool {
	if !h.reaping.TryLock() {
		return false
	}
	defer h.reaping.Unlock()
	if h.changed.Load() {
		h.apply()
	}
	if ws != nil {
		for len(h.cancels) > 0 && ws.CancelWait(h.cancels[len(h.cancels)-1]) {
			h.cancels = h.cancels[:len(h.cancels)-1]
		}
	}
	busy := false
	for _, w := range h.qps {
		q := w.q
		q.mu.Lock()
		busy = busy || (q.owner == h.id && q.head != q.tail)
		q.mu.Unlock()
	}
	if !busy {
		return true
	}
	if time.Now().UnixNano()-h.last.Load() < h.budget() {
		return false
	}
	poll := ws != nil && h.polls.Load()
	for _, w := range h.qps {
		q := w.q
		q.mu.Lock()
		var err error
		mine := q.owner == h.id && q.head != q.tail
		if mine && !q.armedFor {
			if err = q.cq.Arm(); err == nil {
				q.armedFor = true
			}
		}
		q.mu.Unlock()
		if err != nil {
			// Nothing would wake the worker: it keeps polling instead.
			if q.pollErrs.Add(1) == 1 {
				q.t.log.Error("rdma: ibv_req_notify_cq failed; the worker polls instead of sleeping", "qp", q.idx, "err", err)
			}
			return false
		}
		if mine && poll && !w.polling && q.chfd >= 0 {
			// The channel stays q's while the poll is armed: a
			// transport closing takes q back (adopt) and wakes this
			// worker, whose next Reap drops q and whose next Sleep
			// cancels the poll.
			w.polling = true
			ws.PollWait(q.chfd, w.token())
		}
	}
	// A completion that came before arming raised no event.
	return !h.reapLocked()
}

// Fired implements reactor.Reaper: the poll armed with token ended with
// res (the channel's revents, or a negative errno). The next Reap takes
// the channel's events and polls the queue. A poll that fails (a kernel
// that cannot poll the channel) turns the home's polling off: the queue
// pairs' goroutines watch their channels again and wake the worker, as
// for a worker on its own thread.
func (h *Home) Fired(token uint32, res int32) {
	h.reaping.Lock()
	defer h.reaping.Unlock()
	slot, gen := token>>8, uint8(token)
	if int(slot) >= len(h.slots) || h.slots[slot].gen != gen || h.slots[slot].q == nil {
		return // a poll of a queue pair dropped since
	}
	w := h.slots[slot]
	w.polling, w.fired = false, true
	h.polled.Add(1)
	if res >= 0 || res == -int32(syscall.ECANCELED) {
		return
	}
	q := w.q
	q.mu.Lock()
	mine := q.owner == h.id && !q.destroyed
	q.mu.Unlock()
	if !mine {
		return // a queue pair closed under the poll: nothing wrong with polling
	}
	h.mu.Lock()
	off := h.unpollLocked()
	h.mu.Unlock()
	if off {
		q.t.log.Error("rdma: polling a completion channel on the reactor's ring failed; the queue pairs' goroutines watch the channels of this worker's queue pairs from now on",
			"home", h.id, "qp", q.idx, "errno", -res)
	}
}

// takeEvents takes the events of q's channel when who owns q (q.mu held
// across, so that only q's reaper takes them). The arm they answer is
// spent: the reaper arms again before its next sleep.
func (t *Transport) takeEvents(q *queuePair, who uint32) {
	q.mu.Lock()
	if q.owner != who || q.destroyed {
		q.mu.Unlock()
		return
	}
	n, err := q.cq.TakeEvents()
	if n > 0 {
		q.armedFor = false
	}
	q.mu.Unlock()
	if err != nil {
		t.pollFailed(q, err)
	}
}

// reapQP polls q's completion queue when who owns q and retires what it
// covers, ending the tasks whose last work request it retired (outside
// q.mu). With busyOnly it does not poll a queue pair with nothing posted.
// It reports how many completions it took and whether who owns q.
func (t *Transport) reapQP(q *queuePair, who uint32, wcs []WorkCompletion, done *[]doneTask, busyOnly bool) (int, bool) {
	q.mu.Lock()
	if q.owner != who || q.destroyed {
		q.mu.Unlock()
		return 0, false
	}
	if busyOnly && q.head == q.tail {
		q.mu.Unlock()
		return 0, true
	}
	n, err := q.cq.Poll(wcs)
	if err != nil {
		q.mu.Unlock()
		t.pollFailed(q, err)
		return 0, true
	}
	if n > 0 {
		q.armedFor = false
	}
	d := (*done)[:0]
	for i := range wcs[:n] {
		d = t.retireLocked(q, &wcs[i], d)
	}
	q.mu.Unlock()
	for i := range d {
		d[i].t.Done(d[i].n, d[i].err)
		d[i] = doneTask{}
	}
	*done = d[:0]
	if n > 0 {
		t.pokeRoom()
	}
	return n, true
}

// pollFailed handles ibv_poll_cq failing on q: the queue pair is failed
// and handed to the transport's goroutine, which retries and, if the
// completion queue stays broken, leaves q's work to the drain's bound.
func (t *Transport) pollFailed(q *queuePair, err error) {
	if q.pollErrs.Add(1) == 1 {
		t.log.Error("rdma: ibv_poll_cq failed; failing the queue pair", "qp", q.idx, "err", err)
	}
	_ = q.v.Fail()
	t.adopt(q)
}

// adopt takes q's reaping back from any reactor: the transport's
// goroutine for q reaps from now on (it is woken to look at once).
//
// The home that owned q is woken too: its next Reap drops q and its next
// Sleep cancels the poll of q's channel it may have on its ring.
func (t *Transport) adopt(q *queuePair) {
	q.mu.Lock()
	prev := q.owner
	q.owner = noHome
	q.armedFor = false
	q.mu.Unlock()
	q.cq.Wake()
	if h := t.homes.of(prev); h != nil {
		h.kick()
	}
}
