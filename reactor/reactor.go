package reactor

import (
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/uring"
	"github.com/tensorcast/tensorcast/xfer"
)

// MaxWorkers bounds Config.Workers.
const MaxWorkers = 256

// Config sizes a Pool.
type Config struct {
	// Workers is the number of workers; 0 means one per CPU the process
	// may run on (runtime.NumCPU, which honours the CPU affinity mask).
	Workers int
}

// WorkersFor is the number of workers cfg asks for, after its default.
func (c Config) WorkersFor() int {
	if c.Workers == 0 {
		return runtime.NumCPU()
	}
	return c.Workers
}

// Validate checks cfg.
func (c Config) Validate() error {
	if c.Workers < 0 || c.Workers > MaxWorkers {
		return fmt.Errorf("%w: %d workers (want 0 for one per CPU, or 1..%d)", ErrConfig, c.Workers, MaxWorkers)
	}
	return nil
}

// Queue is one client queue as its worker serves it. Every method runs on
// the worker's thread.
type Queue interface {
	// Serve runs one bounded pass: take the queue's new entries, submit
	// them, post what is answered at once. It reports whether it did any
	// work.
	Serve() bool
	// Doorbell prepares the worker's sleep after a pass that did nothing:
	// the futex word whose change must end the sleep and the value it
	// holds now (w nil: nothing on this queue needs the worker), and sleep
	// false when work came meanwhile (the worker then does not sleep,
	// and calls no Awake). See queue.DaemonRing.Doorbell.
	Doorbell() (w *atomic.Uint32, v uint32, sleep bool)
	// Awake ends a sleep Doorbell agreed to.
	Awake()
}

// Host is a transport whose rings can host workers (*uring.Transport).
type Host interface {
	Rings() int
	Host(i int, g uring.Guest) (wake func(), err error)
	// Wakeable reports whether a hosted worker's sleep ends on its
	// queues' doorbells; without it (io_uring before IORING_OP_FUTEX_WAIT)
	// the workers run on their own threads.
	Wakeable() bool
}

// Pool is the daemon's set of workers.
type Pool struct {
	log     *slog.Logger
	workers []*Worker
	hosted  bool
	// mu guards the workers' loads (Attach balances by them).
	mu sync.Mutex
}

// New starts cfg's workers. With host (nil for none) and as many rings as
// workers, each worker is the guest of its ring; otherwise each runs its
// own thread.
func New(cfg Config, host Host, log *slog.Logger) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := cfg.WorkersFor()
	if host != nil && host.Rings() != n {
		return nil, fmt.Errorf("%w: %d workers on a transport of %d rings", ErrConfig, n, host.Rings())
	}
	if host != nil && !host.Wakeable() {
		// A hosted worker would sleep past its doorbells, looking at its
		// queues once a millisecond: a queue at depth 1 would wait that
		// long per request. On its own thread it sleeps in futex_waitv
		// and hands file requests to the rings' pollers, as before
		// reactors.
		log.Warn("reactor: io_uring lacks IORING_OP_FUTEX_WAIT (Linux 6.7): workers run on their own threads and hand file requests to the rings",
			"workers", n)
		host = nil
	}
	p := &Pool{log: log, hosted: host != nil}
	for i := 0; i < n; i++ {
		w := newWorker(i)
		p.workers = append(p.workers, w)
		if p.hosted {
			wake, err := host.Host(i, w)
			if err != nil {
				p.Close()
				return nil, fmt.Errorf("reactor: worker %d on ring %d: %w", i, i, err)
			}
			w.wake = wake
			continue
		}
		if err := w.startThread(); err != nil {
			p.Close()
			return nil, err
		}
	}
	log.Info("reactor: workers ready", "workers", n, "on_uring_rings", p.hosted)
	return p, nil
}

// Workers is how many workers the pool has.
func (p *Pool) Workers() int { return len(p.workers) }

// Home is what a queue served by worker w sets as its tasks' Home
// (xfer.Task.Home): w plus one, so that the rdma transport posts them on a
// queue pair w reaps (AddReaper) and, when w is the guest of ring w, the
// ring's transport submits them to that ring; with xfer.HomeOwnThread
// when w runs its own thread (no ring is w's then).
func (p *Pool) Home(w int) uint32 {
	if p.hosted {
		return uint32(w) + 1
	}
	return (uint32(w) + 1) | xfer.HomeOwnThread
}

// Pick chooses the worker for a new queue: the one serving the fewest.
// It counts the queue as that worker's until Detach; the caller then
// calls Attach with it.
func (p *Pool) Pick() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	best := 0
	for i, w := range p.workers {
		if w.load < p.workers[best].load {
			best = i
		}
	}
	p.workers[best].load++
	return best
}

// Attach gives q to worker w (from Pick), which serves it from its next
// pass until Detach. It fails with ErrStopped when the worker stopped.
func (p *Pool) Attach(w int, q Queue) error {
	if err := p.workers[w].attach(q); err != nil {
		p.unload(w)
		return err
	}
	return nil
}

// Detach takes q back from worker w and returns once the worker no longer
// touches it; at once when the worker has stopped. It must not be called
// on the worker's own thread.
func (p *Pool) Detach(w int, q Queue) {
	p.workers[w].detach(q)
	p.unload(w)
}

func (p *Pool) unload(w int) {
	p.mu.Lock()
	p.workers[w].load--
	p.mu.Unlock()
}

// Stats are a worker's counters.
type Stats struct {
	Queues int    // queues served now
	Passes uint64 // passes of its loop
	Sleeps uint64 // sleeps it agreed to
}

// Stats returns one Stats per worker.
func (p *Pool) Stats() []Stats {
	out := make([]Stats, len(p.workers))
	for i, w := range p.workers {
		w.mu.Lock()
		out[i].Queues = w.attached
		w.mu.Unlock()
		out[i].Passes, out[i].Sleeps = w.passes.Load(), w.sleeps.Load()
	}
	return out
}

// Close stops the workers that run their own threads and waits for them.
// Hosted workers stop with their rings (when the transport closes).
func (p *Pool) Close() {
	for _, w := range p.workers {
		if w.thread != nil {
			w.stopThread()
		}
	}
}

// Worker is one reactor: the queues it serves and its sleep. It is the
// guest of a ring (uring.Guest) or runs its own thread (thread.go).
type Worker struct {
	id   int
	wake func() // wakes the worker's thread when it sleeps

	// mu guards the fields below.
	mu       sync.Mutex
	adds     []Queue
	drops    []drop
	stopped  bool
	attached int // queues attached and not detached
	load     int // guarded by Pool.mu: queues picked for this worker

	// changed says adds or drops wait for the worker's next pass.
	changed atomic.Bool

	// addReapers wait for the worker's next pass (AddReaper, reap.go).
	addReapers []Reaper

	// Owned by the worker's thread.
	queues  []*served
	reapers []Reaper
	// free are slots of served that fired the futex waits of queues gone.
	slots  []*served
	free   []uint16
	sleepy []*served // the queues whose Doorbell agreed to this sleep

	passes, sleeps atomic.Uint64

	thread *thread // the own thread, nil when hosted
}

// drop is a Detach waiting for the worker.
type drop struct {
	q    Queue
	done chan struct{}
}

// served is a queue on its worker, with the state of its armed wait.
type served struct {
	q    Queue
	slot uint16
	gen  uint16
	// armed: a futex wait on word for value val is in the kernel.
	armed bool
	word  *atomic.Uint32
	val   uint32
}

var _ uring.Guest = (*Worker)(nil)

func newWorker(id int) *Worker { return &Worker{id: id} }

func (w *Worker) attach(q Queue) error {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return fmt.Errorf("%w: worker %d", ErrStopped, w.id)
	}
	w.adds = append(w.adds, q)
	w.attached++
	w.changed.Store(true)
	w.mu.Unlock()
	w.wake()
	return nil
}

func (w *Worker) detach(q Queue) {
	d := drop{q: q, done: make(chan struct{})}
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.drops = append(w.drops, d)
	w.changed.Store(true)
	w.mu.Unlock()
	w.wake()
	<-d.done
}

// apply takes the attaches and detaches other goroutines asked for.
func (w *Worker) apply() {
	w.mu.Lock()
	adds, drops := w.adds, w.drops
	w.adds, w.drops = nil, nil
	w.takeReapers()
	w.changed.Store(false)
	for _, q := range adds {
		s := w.slot()
		s.q = q
		w.queues = append(w.queues, s)
	}
	for _, d := range drops {
		for i, s := range w.queues {
			if s.q != d.q {
				continue
			}
			// A wait still armed fires later (a closing queue's Kick
			// wakes it) and finds the slot's generation moved on.
			s.q = nil
			s.gen++
			s.armed, s.word = false, nil
			w.free = append(w.free, s.slot)
			w.queues = append(w.queues[:i], w.queues[i+1:]...)
			w.attached--
			break
		}
	}
	w.mu.Unlock()
	for _, d := range drops {
		close(d.done)
	}
}

// slot takes a free served record.
func (w *Worker) slot() *served {
	if n := len(w.free); n > 0 {
		s := w.slots[w.free[n-1]]
		w.free = w.free[:n-1]
		return s
	}
	s := &served{slot: uint16(len(w.slots))}
	w.slots = append(w.slots, s)
	return s
}

// Serve implements uring.Guest: one pass over the worker's queues.
func (w *Worker) Serve() bool {
	w.passes.Add(1)
	if w.changed.Load() {
		w.apply()
	}
	did := false
	for _, s := range w.queues {
		if s.q.Serve() {
			did = true
		}
	}
	if w.reap() {
		did = true
	}
	return did
}

// Sleep implements uring.Guest: every queue's doorbell, armed on ws.
func (w *Worker) Sleep(ws uring.Waits) bool {
	if w.changed.Load() || !w.reapersSleep() {
		return false
	}
	w.sleepy = w.sleepy[:0]
	for _, s := range w.queues {
		word, v, ok := s.q.Doorbell()
		if !ok {
			for _, t := range w.sleepy {
				t.q.Awake()
			}
			w.sleepy = w.sleepy[:0]
			return false
		}
		w.sleepy = append(w.sleepy, s)
		if word == nil || (s.armed && s.word == word && s.val == v) {
			continue // nothing to wait for, or armed already
		}
		if s.armed {
			// The word moved past the value armed without a wake-up
			// reaching the wait yet (one is on its way, or the client
			// wrote the word and rang nobody): a second wait would pile
			// up in the kernel, so this sleep stays short instead.
			ws.Soon()
			continue
		}
		s.armed, s.word, s.val = true, word, v
		ws.FutexWait(word, v, uint32(s.slot)<<16|uint32(s.gen))
	}
	w.sleeps.Add(1)
	return true
}

// Awake implements uring.Guest.
func (w *Worker) Awake() {
	for _, s := range w.sleepy {
		if s.q != nil {
			s.q.Awake()
		}
	}
	w.sleepy = w.sleepy[:0]
}

// Fired implements uring.Guest: the wait armed with token ended.
func (w *Worker) Fired(token uint32) {
	slot, gen := token>>16, uint16(token)
	if int(slot) < len(w.slots) && w.slots[slot].gen == gen {
		w.slots[slot].armed = false
	}
}

// Stop implements uring.Guest: the ring stopped, and the worker with it.
func (w *Worker) Stop() {
	w.mu.Lock()
	w.stopped = true
	drops := w.drops
	w.adds, w.drops = nil, nil
	w.mu.Unlock()
	w.queues = nil
	w.stopReapers()
	for _, d := range drops {
		close(d.done)
	}
}
