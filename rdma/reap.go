package rdma

// Completions polled by the reactor that posted: each queue pair has its
// own completion queue, and whoever posted its work (a reactor worker, or
// the transport itself for work no reactor posted) reaps it. See the
// package doc, "Who reaps".

import (
	"sync"
	"sync/atomic"
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
// worker calls Reap after each pass and Sleep before it sleeps; the
// transports' goroutines call the wake Bind gave when a completion event
// comes for it while it sleeps.
type Home struct {
	id uint32

	wake atomic.Pointer[func()]
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
	// it reaps or prepares its sleep. A Done that submits again and waits
	// for room (Submit reaps meanwhile) finds it held and does not reap
	// inside a reap, nor from another thread.
	reaping sync.Mutex
	qps     []*queuePair
	wcs     []WorkCompletion
	done    []doneTask

	// reaped counts completions reaped here (tests, stats).
	reaped atomic.Uint64
	// stopped: the worker is gone (Stop); its tasks are reaped by the
	// transports' goroutines.
	stopped atomic.Bool
}

// Bind sets the worker's wake-up, which any goroutine may call: it ends
// the worker's sleep, or its next one.
func (h *Home) Bind(wake func()) { h.wake.Store(&wake) }

// Stop hands every queue pair this home owns back to its transport's
// goroutine (the worker stops): what it had in flight is reaped there, and
// nothing is claimed for the home again.
func (h *Home) Stop() {
	h.stopped.Store(true)
	h.reaping.Lock()
	defer h.reaping.Unlock()
	h.apply()
	for _, q := range h.qps {
		q.mu.Lock()
		mine := q.owner == h.id
		q.mu.Unlock()
		if mine {
			q.t.adopt(q)
		}
	}
	clear(h.qps)
	h.qps = h.qps[:0]
}

// Reaped is how many completions this home reaped.
func (h *Home) Reaped() uint64 { return h.reaped.Load() }

func (h *Home) kick() {
	if w := h.wake.Load(); w != nil {
		(*w)()
	}
}

// claim records that q's completions are h's to reap from now on (q.mu
// held, by postTo).
func (h *Home) claim(q *queuePair) {
	h.mu.Lock()
	h.adds = append(h.adds, q)
	h.changed.Store(true)
	h.mu.Unlock()
}

func (h *Home) apply() {
	h.mu.Lock()
	for _, q := range h.adds {
		found := false
		for _, p := range h.qps {
			found = found || p == q
		}
		if !found {
			h.qps = append(h.qps, q)
		}
	}
	clear(h.adds)
	h.adds = h.adds[:0]
	h.changed.Store(false)
	h.mu.Unlock()
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
		q := h.qps[i]
		n, owned := q.t.reapQP(q, h.id, h.wcs, &h.done, true)
		if !owned {
			// Claimed by another home, or taken back by the transport
			// (bringUp, Close): not this worker's to look at.
			h.qps[i] = h.qps[len(h.qps)-1]
			h.qps[len(h.qps)-1] = nil
			h.qps = h.qps[:len(h.qps)-1]
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
// slept through, since their wake-up costs little beside them.
const maxSpin = 500 * time.Microsecond

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
// queues. Otherwise every queue pair with its work in flight is armed, so
// that the next completion wakes the worker through the transport's
// goroutine for that queue pair.
func (h *Home) Sleep() bool {
	if !h.reaping.TryLock() {
		return false
	}
	defer h.reaping.Unlock()
	if h.changed.Load() {
		h.apply()
	}
	busy := false
	for _, q := range h.qps {
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
	for _, q := range h.qps {
		q.mu.Lock()
		var err error
		if q.owner == h.id && q.head != q.tail && !q.armedFor {
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
	}
	// A completion that came before arming raised no event.
	return !h.reapLocked()
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
func (t *Transport) adopt(q *queuePair) {
	q.mu.Lock()
	q.owner = noHome
	q.mu.Unlock()
	q.cq.Wake()
}
