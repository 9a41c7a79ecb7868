package reactor

import (
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/ratelog"
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
	// Doorbell is how a client wakes a worker hosted on an io_uring ring:
	// DoorbellFutex (IORING_OP_FUTEX_WAIT on the queue's futex word),
	// DoorbellEventfd (a read of an eventfd per queue, which the client
	// writes), or DoorbellAuto ("", the default: the futex where the
	// kernel's io_uring has IORING_OP_FUTEX_WAIT, Linux 6.7, else the
	// eventfd). DoorbellFutex on a kernel without the opcode runs the
	// workers on their own threads, sleeping in futex_waitv(2).
	Doorbell string
	// Poll is how long a worker that answered its queues' last requests
	// looks for their clients' next ones before it sleeps (poll.go); 0
	// means DefaultPoll, a negative value never.
	Poll time.Duration
}

// Doorbell kinds (Config.Doorbell).
const (
	DoorbellAuto    = ""
	DoorbellFutex   = "futex"
	DoorbellEventfd = "eventfd"
)

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
	if c.Poll > MaxPoll {
		return fmt.Errorf("%w: poll %v (want at most %v, 0 for %v, or negative for none)", ErrConfig, c.Poll, MaxPoll, DefaultPoll)
	}
	switch c.Doorbell {
	case DoorbellAuto, DoorbellFutex, DoorbellEventfd:
	default:
		return fmt.Errorf("%w: doorbell %q (want %q, %q or empty for the kernel's best)", ErrConfig, c.Doorbell, DoorbellFutex, DoorbellEventfd)
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
	// Idle reports whether nothing of the queue's is in flight: every
	// request taken has been answered (the worker then may poll for the
	// next before it sleeps, poll.go).
	Idle() bool
	// EventfdDoorbell is the queue's eventfd doorbell (fd -1: none) and
	// whether its client says it rings it (see
	// queue.DaemonRing.EventfdDoorbell). A worker whose pool uses eventfd
	// doorbells waits on it instead of the futex word Doorbell returns.
	EventfdDoorbell() (fd int, rung bool)
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
	eventfd bool // hosted workers wait on their queues' eventfds
	// warns are what clients can make the workers say, rate limited:
	// a flood of queues is a line every interval, not one per queue.
	warns *warns
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
	eventfd := false
	if host != nil {
		switch {
		case cfg.Doorbell == DoorbellEventfd:
			eventfd = true
			log.Info("reactor: doorbells are eventfds (configured): workers sleep on their rings, clients write an eventfd per queue",
				"workers", n, "io_uring_futex_wait", host.Wakeable())
		case host.Wakeable():
		case cfg.Doorbell == DoorbellAuto:
			// A hosted worker cannot sleep on its queues' futex words: it
			// reads an eventfd per queue instead, which the client
			// writes when the worker sleeps.
			eventfd = true
			log.Warn("reactor: io_uring lacks IORING_OP_FUTEX_WAIT (Linux 6.7): doorbells are eventfds, workers sleep on their rings, clients write an eventfd per queue",
				"workers", n)
		default:
			// A futex doorbell asked for where the ring cannot wait on
			// one: the workers run on their own threads, sleep in
			// futex_waitv and hand file requests to the rings' pollers.
			log.Warn("reactor: io_uring lacks IORING_OP_FUTEX_WAIT (Linux 6.7) and futex doorbells are configured: workers run on their own threads and hand file requests to the rings",
				"workers", n)
			host = nil
		}
	}
	p := &Pool{log: log, hosted: host != nil, eventfd: eventfd, warns: &warns{
		unrung: ratelog.New(log, slog.LevelWarn, "reactor: a queue's client does not ring its eventfd doorbell: the worker looks at it every millisecond", 0),
		failed: ratelog.New(log, slog.LevelWarn, "reactor: a read of a queue's eventfd doorbell failed: the worker looks at that queue every millisecond instead", 0),
	}}
	poll := cfg.Poll
	switch {
	case poll == 0:
		poll = DefaultPoll
	case poll < 0:
		poll = 0
	}
	for i := 0; i < n; i++ {
		w := newWorker(i)
		w.eventfd, w.warns = eventfd, p.warns
		w.poller.limit = poll
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
	log.Info("reactor: workers ready", "workers", n, "on_uring_rings", p.hosted, "doorbell", p.doorbell(), "poll", poll)
	return p, nil
}

func (p *Pool) doorbell() string {
	if p.eventfd {
		return DoorbellEventfd
	}
	return DoorbellFutex
}

// Workers is how many workers the pool has.
func (p *Pool) Workers() int { return len(p.workers) }

// EventfdDoorbells reports whether the pool's workers wait on an eventfd
// per queue (queue.DaemonRing.UseEventfd, with Wake as its kick) rather
// than on the queues' futex words.
func (p *Pool) EventfdDoorbells() bool { return p.eventfd }

// Wake wakes worker w if it sleeps: what a queue's Kick does when the
// worker waits on its eventfd, not on its futex word. Any goroutine may
// call it.
func (p *Pool) Wake(w int) { p.workers[w].wake() }

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

// Unpick gives back a worker Pick chose for a queue that will not be
// attached after all.
func (p *Pool) Unpick(w int) { p.unload(w) }

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
	// Deaf counts sleeps bounded because a queue's eventfd doorbell could
	// not be waited on (its client does not ring it, or its read failed).
	Deaf uint64
	// Polls counts the polls before a sleep (poll.go), PollMisses those
	// that ended with nothing found, PollsCapped the idle turns that slept
	// at once because polls had taken their share of the time.
	Polls, PollMisses, PollsCapped uint64
}

// Stats returns one Stats per worker.
func (p *Pool) Stats() []Stats {
	out := make([]Stats, len(p.workers))
	for i, w := range p.workers {
		w.mu.Lock()
		out[i].Queues = w.attached
		w.mu.Unlock()
		out[i].Passes, out[i].Sleeps, out[i].Deaf = w.passes.Load(), w.sleeps.Load(), w.deaf.Load()
		out[i].Polls, out[i].PollMisses, out[i].PollsCapped = w.polls.Load(), w.pollMisses.Load(), w.pollsCapped.Load()
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
	p.warns.unrung.Stop()
	p.warns.failed.Stop()
}

// warns are a pool's rate-limited warnings.
type warns struct {
	unrung, failed *ratelog.Log
}

// Worker is one reactor: the queues it serves and its sleep. It is the
// guest of a ring (uring.Guest) or runs its own thread (thread.go).
type Worker struct {
	id      int
	wake    func() // wakes the worker's thread when it sleeps
	eventfd bool   // it waits on its queues' eventfd doorbells
	warns   *warns

	// mu guards the fields below.
	mu       sync.Mutex
	adds     []Queue
	drops    []drop
	stopped  bool
	attached int // queues attached and not detached
	load     int // guarded by Pool.mu: queues picked for this worker

	// changed says adds or drops wait for the worker's next pass.
	changed atomic.Bool

	// addReapers wait for the worker's next pass (AddReaper, reap.go);
	// nReapers counts them with those taken.
	addReapers []Reaper
	nReapers   int

	// Owned by the worker's thread.
	queues  []*served
	reapers []Reaper
	rwaits  []*reaperWaits // reapers[i]'s tokens on the ring
	// free are slots of served that fired the futex waits of queues gone.
	slots  []*served
	free   []uint16
	sleepy []*served // the queues whose Doorbell agreed to this sleep
	// cancels are the tokens of waits of queues gone, to cancel at the
	// next sleep: nothing else is sure to end them (see apply).
	cancels []uint32

	passes, sleeps, deaf atomic.Uint64
	// polls counts polls started, pollMisses those that found nothing,
	// pollsCapped the idle turns that did not poll because the window's
	// share was spent (poll.go).
	polls, pollMisses, pollsCapped atomic.Uint64
	poller                         poller

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
	// armed: a futex wait on word for value val (or a read of the
	// queue's eventfd) is in the kernel.
	armed bool
	word  *atomic.Uint32
	val   uint32
	// deaf: the queue's eventfd doorbell cannot be waited on (its client
	// does not ring it, or a read of it failed): sleeps with it are
	// bounded instead. unrung counts such sleeps, warned says it was
	// logged.
	deaf   bool
	unrung uint32
	warned bool
	// took: a pass of the queue did work (its client submitted).
	took bool
}

// maxQueues bounds the queues one worker serves: a queue's token (slot and
// generation) then never carries reaperTag.
const maxQueues = 1<<15 - 1

// token is the armed wait's token: slot and generation.
func (s *served) token() uint32 { return uint32(s.slot)<<16 | uint32(s.gen) }

var _ uring.Guest = (*Worker)(nil)

func newWorker(id int) *Worker { return &Worker{id: id, poller: poller{now: time.Now}} }

func (w *Worker) attach(q Queue) error {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return fmt.Errorf("%w: worker %d", ErrStopped, w.id)
	}
	if w.attached >= maxQueues {
		w.mu.Unlock()
		return fmt.Errorf("%w: worker %d serves %d queues already", ErrConfig, w.id, maxQueues)
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
			// A wait still armed is cancelled at the next sleep, and
			// whatever ends it finds the slot's generation moved on.
			// Nothing else would end an eventfd read (the daemon never
			// writes the eventfd), nor a futex wait the closing queue's
			// Kick missed: its client can write the word back to the
			// value armed after the Kick and before the ring submits the
			// wait, which then sleeps in the kernel for good.
			if s.armed {
				w.cancels = append(w.cancels, s.token())
			}
			s.q = nil
			s.gen++
			s.armed, s.word = false, nil
			s.deaf, s.unrung, s.warned, s.took = false, 0, false, false
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
	w.poller.passing()
	if w.changed.Load() {
		w.apply()
	}
	did := false
	for _, s := range w.queues {
		if s.q.Serve() {
			did, s.took = true, true
		}
	}
	if w.reap() {
		did = true
	}
	w.poller.served(did)
	return did
}

// Sleep implements uring.Guest: every queue's doorbell, armed on ws.
func (w *Worker) Sleep(ws uring.Waits) bool {
	if w.poll(ws) {
		return false
	}
	for len(w.cancels) > 0 && ws.CancelWait(w.cancels[len(w.cancels)-1]) {
		w.cancels = w.cancels[:len(w.cancels)-1]
	}
	if w.changed.Load() || !w.reapersSleep(ws) {
		return false
	}
	w.sleepy = w.sleepy[:0]
	deaf := false
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
		if w.eventfd {
			if word != nil && !w.armBell(s, ws) {
				deaf = true
			}
			continue
		}
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
		ws.FutexWait(word, v, s.token())
	}
	w.sleeps.Add(1)
	if deaf {
		w.deaf.Add(1)
	}
	return true
}

// unrungWarn is how many bounded sleeps a queue whose client does not
// ring its eventfd costs before the worker says so (about a second's).
const unrungWarn = 1000

// armBell arms a read of s's eventfd doorbell, unless one is armed: a
// write the client made after Doorbell's check, or before (the count
// stays in the eventfd), ends it. The futex word's value plays no part:
// the eventfd's count is what carries the doorbell.
//
// Until the client says it rings the eventfd (bell_ack, which a client
// writes before its first submit), the read is armed and the sleep is
// bounded too (Soon): a client that does not know eventfd doorbells rings
// the futex only. One that submitted without saying so is such a client,
// as is one whose read failed (deaf): its queue is looked at every
// millisecond, which costs the worker a look and that queue its latency,
// nothing more. It reports false when the sleep is bounded for such a
// queue.
func (w *Worker) armBell(s *served, ws uring.Waits) bool {
	fd, rung := s.q.EventfdDoorbell()
	if fd >= 0 && !s.deaf && !s.armed {
		s.armed = true
		ws.FDWait(fd, s.token())
	}
	if fd >= 0 && rung && !s.deaf {
		return true
	}
	ws.Soon()
	if !s.deaf && fd >= 0 && !s.took {
		return true // a new queue whose client has not said yet
	}
	if s.unrung++; s.unrung == unrungWarn && !s.warned {
		s.warned = true
		w.warns.unrung.Event(slog.Int("worker", w.id), slog.Bool("has_eventfd", fd >= 0), slog.Bool("client_rings", rung),
			slog.Bool("read_failed", s.deaf))
	}
	return false
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

// Fired implements uring.Guest: the wait armed with token ended. An
// eventfd read that failed (a kernel that answers a read of a file its
// client made non-blocking with EAGAIN at once; Linux 6.1 and 6.18 wait
// instead) would fail at every sleep: that queue's doorbell is not waited
// on again, and the worker looks at the queue every millisecond.
func (w *Worker) Fired(token uint32, res int32) {
	if token&reaperTag != 0 {
		w.reaperFired(token, res)
		return
	}
	slot, gen := token>>16, uint16(token)
	if int(slot) >= len(w.slots) || w.slots[slot].gen != gen {
		return
	}
	s := w.slots[slot]
	s.armed = false
	if w.eventfd && res < 0 && s.q != nil && !s.deaf {
		s.deaf = true
		w.warns.failed.Event(slog.Int("worker", w.id), slog.Int("errno", int(-res)))
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
