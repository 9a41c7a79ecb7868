package xfer

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// BatchID names a live batch of one engine. Zero is never a valid id. The
// low 32 bits are the batch's slot, the high 32 bits its generation, so an
// id is not handed out again soon after its batch is freed.
type BatchID uint64

// Config sizes an engine. Zero fields take their defaults.
type Config struct {
	MaxBatches       int           // live batches per engine (default 4096)
	MaxBatchCapacity int           // tasks per batch (default 65536)
	DefaultTimeout   time.Duration // deadline when a submit names none (default 30s)
	// ErrorCode sorts a task's error into one of MaxErrorCodes codes for
	// the per-transport error counters (TransportStats.Errors); it runs on
	// the completion path of failed tasks only. Nil counts every error
	// under code 0.
	ErrorCode func(error) int
}

// Defaults of Config.
const (
	DefaultMaxBatches       = 4096
	DefaultMaxBatchCapacity = 65536
	DefaultTimeout          = 30 * time.Second
)

func (c Config) withDefaults() Config {
	if c.MaxBatches <= 0 {
		c.MaxBatches = DefaultMaxBatches
	}
	if c.MaxBatches > 1<<31 {
		c.MaxBatches = 1 << 31
	}
	if c.MaxBatchCapacity <= 0 {
		c.MaxBatchCapacity = DefaultMaxBatchCapacity
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	return c
}

// Router picks the transport that moves a request between two resolved
// segments. It runs once per request on the submit path and must not
// allocate. The transports it returns must be comparable (pointer types):
// the engine groups a submit's tasks by transport with ==.
type Router interface {
	Route(local, target Segment) (Transport, error)
}

// SubmitOptions are the per-call parameters of Engine.Submit.
type SubmitOptions struct {
	// Deadline ends every task of the call that is still live at that time
	// in StateTimeout. Zero means now + Config.DefaultTimeout.
	Deadline time.Time
	// Resolver maps the requests' segment ids (typically the caller's own
	// segments plus the pool). It is required.
	Resolver Resolver
	// Notify is positional with the requests: Notify[i] is the
	// notification reqs[i] carries to the target's subscribed client (see
	// Task.Notify), nil for none. An empty Notify means none for the whole
	// call; otherwise its length must equal len(reqs) (ErrInvalid for the
	// whole call). The engine hands each slice to the task as it is: the
	// caller must not change or reuse its bytes until the task has ended.
	Notify [][]byte
	// Sums is positional with the requests like Notify: Task.Sum of
	// request i is &Sums[i] (see Sum), zeroed at submit. Empty: none
	// asked for; otherwise its length must equal len(reqs). The caller
	// keeps it until the tasks have ended.
	Sums []Sum
}

// TaskStatus is one task's state as Engine.Status reports it. Transferred
// and Err are set once the task is terminal.
type TaskStatus struct {
	State       State
	Transferred uint64
	Err         error
}

// BatchSummary counts a batch's tasks by state. Total is the number of
// tasks submitted so far (refused requests included: each request of an
// accepted call takes one task index, and a refused one is Failed at once).
type BatchSummary struct {
	Total, Waiting, Pending, Completed, Failed, Timeout, Canceled int
	Transferred                                                   uint64
}

// EngineStats are an engine's counters. Task counts by terminal state and
// Bytes are cumulative since NewEngine; Waiting and Pending are current.
type EngineStats struct {
	BatchesLive     int // allocated and not yet freed
	BatchesRetiring int // freed or abandoned, still owed a Done by a transport
	Streams         int // open streams (client queues)
	Waiting         int64
	Pending         int64
	Completed       uint64
	Failed          uint64
	Timeout         uint64
	Canceled        uint64
	Bytes           uint64 // bytes the transports reported moved by ended tasks
	Violations      uint64 // Transport contract violations seen
}

// Engine runs the batch lifecycle: AllocateBatch, Submit, Status /
// BatchStatus / Wait, Free (or Abandon). It owns no goroutines; deadline
// timers are runtime timers stopped by Free, Abandon and Close.
//
// Concurrency: every method is safe for concurrent use. Calls on one batch
// are serialized by that batch's lock; nothing on the submit path takes an
// engine-wide lock. Completions (Task.Done) take no lock at all.
type Engine struct {
	cfg    Config
	router Router
	log    *slog.Logger

	closed     atomic.Bool
	violations atomic.Uint64
	streamSeq  atomic.Uint32 // streams opened, to spread them over meter shards
	// meters are the per-transport counters (meter.go).
	meters meterTable

	// slots holds one batch object per slot ever used; a slot's object is
	// reused by every batch allocated in it. Its length is fixed.
	slots []atomic.Pointer[batch]

	// mu guards the fields below.
	mu        sync.Mutex
	freeSlots []uint32 // recycled slots, reused LIFO
	nextSlot  uint32   // slots[nextSlot:] were never used
	live      int      // allocated, not freed
	retiring  int      // freed, still owed a Done
	retired   counts   // totals of recycled batches and closed streams
	streams   map[*Stream]struct{}

	// waitParked, when set (by tests, before the engine is used), is
	// called by Wait each time it has put itself on a batch's waiters,
	// just before it sleeps.
	waitParked func(BatchID)
	// clock, when set (by tests, before the engine is used), replaces
	// time.Now for the submit calls, the deadline checks and the meters.
	clock func() time.Time
	// sample, when set (by tests, before the engine is used), replaces
	// the meters' sampler: it says whether each submit call that
	// dispatches is timed (meter.go).
	sample func() bool
}

// counts are the cumulative per-state totals kept per batch and retired
// into the engine when a batch is recycled.
type counts struct {
	completed, failed, timeout, canceled, bytes uint64
}

func (c *counts) add(o counts) {
	c.completed += o.completed
	c.failed += o.failed
	c.timeout += o.timeout
	c.canceled += o.canceled
	c.bytes += o.bytes
}

// NewEngine returns an engine that routes requests with router and logs
// lifecycle events (contract violations, Close) to log. A nil router
// refuses every request with ErrNotSupported; a nil log discards.
func NewEngine(cfg Config, router Router, log *slog.Logger) *Engine {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &Engine{
		cfg:    cfg,
		router: router,
		log:    log,
		slots:  make([]atomic.Pointer[batch], cfg.MaxBatches),
	}
}

// AllocateBatch reserves a batch of up to capacity tasks. capacity must be
// in 1..Config.MaxBatchCapacity (ErrInvalid). It fails with ErrBatchLimit
// when Config.MaxBatches batches are live and ErrClosed after Close. A
// recycled batch's task table is reused, so steady-state allocation does
// not allocate memory.
func (e *Engine) AllocateBatch(capacity int) (BatchID, error) {
	if capacity <= 0 || capacity > e.cfg.MaxBatchCapacity {
		return 0, ErrInvalid
	}
	e.mu.Lock()
	if e.closed.Load() {
		e.mu.Unlock()
		return 0, ErrClosed
	}
	var idx uint32
	switch {
	case len(e.freeSlots) > 0:
		idx = e.freeSlots[len(e.freeSlots)-1]
		e.freeSlots = e.freeSlots[:len(e.freeSlots)-1]
	case int(e.nextSlot) < len(e.slots):
		idx = e.nextSlot
		e.nextSlot++
	default:
		e.mu.Unlock()
		return 0, ErrBatchLimit
	}
	e.live++
	e.mu.Unlock()

	b := e.slots[idx].Load()
	if b == nil {
		b = &batch{e: e, idx: idx}
		b.mc.seed(uint64(idx))
		e.slots[idx].Store(b)
	}
	b.mu.Lock()
	b.reset(capacity)
	id := b.id
	b.mu.Unlock()
	return id, nil
}

// lock finds the live batch id names and returns it locked.
func (e *Engine) lock(id BatchID) (*batch, error) {
	idx := uint64(id)&0xffffffff - 1
	if id == 0 || idx >= uint64(len(e.slots)) {
		return nil, ErrBatchNotFound
	}
	b := e.slots[idx].Load()
	if b == nil {
		return nil, ErrBatchNotFound
	}
	b.mu.Lock()
	if b.id != id {
		b.mu.Unlock()
		return nil, ErrBatchNotFound
	}
	return b, nil
}

// Submit appends len(reqs) tasks to batch id and dispatches them to the
// transports the Router picks, grouped by transport, in request order.
//
// results must have len(reqs). results[i] is nil when reqs[i] was accepted,
// or the typed error that refused it (ErrBadOp, ErrZeroLength,
// ErrNoSegment, ErrOutOfBounds, or the Router's error). Every request of an
// accepted call takes the next task index of the batch, refused ones too
// (they are Failed at once), so task i of the call is Status(id, start+i)
// where start is BatchSummary.Total before the call.
//
// Before dispatch each task gets its effective deadline (opts.Deadline, or
// now + Config.DefaultTimeout) in Task.Deadline, its notification, if
// any, in Task.Notify and its Sum, if asked for, in Task.Sum; they are
// cleared when the batch's slot is reused.
//
// A returned error is for the whole call: ErrBatchNotFound, ErrBatchFull
// (over capacity), ErrClosed, ErrInvalid (len(results) != len(reqs),
// len(opts.Notify) or len(opts.Sums) neither 0 nor len(reqs), or no Resolver), ErrTimeout (the deadline already passed) leave the batch
// unchanged. ErrTransport (a transport broke the dispatch contract) means
// every task of the call has already ended Failed and been rolled back; the
// results then stay as they were filled.
//
// Tasks a transport refused at dispatch (Transport.Submit returned n <
// len) stay accepted and end Failed with the transport's error.
func (e *Engine) Submit(id BatchID, reqs []Request, opts SubmitOptions, results []error) error {
	if len(results) != len(reqs) || len(opts.Notify) != 0 && len(opts.Notify) != len(reqs) ||
		len(opts.Sums) != 0 && len(opts.Sums) != len(reqs) {
		return ErrInvalid
	}
	b, err := e.lock(id)
	if err != nil {
		return err
	}
	defer b.mu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	if len(reqs) == 0 {
		return nil
	}
	if len(reqs) > b.capacity-b.used {
		return ErrBatchFull
	}
	if opts.Resolver == nil {
		return ErrInvalid
	}
	// The clock is read once per call: every task carries its deadline,
	// and the meters take it as the tasks' dispatch time.
	now := e.now()
	deadline := opts.Deadline
	if deadline.IsZero() {
		deadline = now.Add(e.cfg.DefaultTimeout)
	} else if !deadline.After(now) {
		return ErrTimeout
	}
	return b.submit(reqs, opts.Resolver, opts.Notify, opts.Sums, deadline, now, results)
}

// Status reports task i of batch id in O(1). ErrBatchNotFound for an
// unknown batch, ErrInvalid for an index outside 0..Total-1.
func (e *Engine) Status(id BatchID, i int) (TaskStatus, error) {
	b, err := e.lock(id)
	if err != nil {
		return TaskStatus{}, err
	}
	defer b.mu.Unlock()
	if i < 0 || i >= b.used {
		return TaskStatus{}, ErrInvalid
	}
	t := &b.tasks[i]
	s := State(t.state.Load())
	if !s.Terminal() {
		if s == stateEnding {
			s = StatePending
		}
		return TaskStatus{State: s}, nil
	}
	return TaskStatus{State: s, Transferred: t.n, Err: t.err}, nil
}

// BatchStatus summarizes batch id in O(1).
func (e *Engine) BatchStatus(id BatchID) (BatchSummary, error) {
	b, err := e.lock(id)
	if err != nil {
		return BatchSummary{}, err
	}
	defer b.mu.Unlock()
	return b.summary(), nil
}

// Wait blocks until no task of batch id is Waiting or Pending, then
// returns its summary. It does not poll: it sleeps on a channel that the
// completion bringing the batch's live count to zero signals. A zero
// deadline waits without limit; when the deadline passes first, Wait
// returns the current summary and ErrTimeout and the tasks are unchanged.
// If the batch is freed meanwhile, Wait returns ErrBatchNotFound. Wake
// channels and timers are pooled, so a Wait that sleeps does not allocate
// in the steady state either.
func (e *Engine) Wait(id BatchID, deadline time.Time) (BatchSummary, error) {
	var ch chan struct{}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
			timerPool.Put(timer)
		}
		if ch != nil {
			wakePool.Put(ch) // empty: see below
		}
	}()
	for {
		b, err := e.lock(id)
		if err != nil {
			return BatchSummary{}, err
		}
		// Lock order: b.mu, then b.waitMu.
		b.waitMu.Lock()
		if b.live.Load() == 0 {
			b.waitMu.Unlock()
			s := b.summary()
			b.mu.Unlock()
			return s, nil
		}
		if ch == nil {
			ch = wakePool.Get().(chan struct{})
		}
		b.waiters = append(b.waiters, ch)
		b.waitMu.Unlock()
		b.mu.Unlock()
		if e.waitParked != nil {
			e.waitParked(id)
		}

		if deadline.IsZero() {
			<-ch // wakeWaiters took ch off the list and sent once
			continue
		}
		if timer == nil {
			d := time.Until(deadline)
			if d <= 0 {
				b.unwait(ch)
				return e.timedOut(id)
			}
			if t, ok := timerPool.Get().(*time.Timer); ok {
				timer = t
				timer.Reset(d)
			} else {
				timer = time.NewTimer(d)
			}
		}
		select {
		case <-ch:
		case <-timer.C:
			b.unwait(ch)
			return e.timedOut(id)
		}
	}
}

// Pools of Wait's wake channels (capacity 1, always put back empty) and
// deadline timers (put back stopped).
var (
	wakePool  = sync.Pool{New: func() any { return make(chan struct{}, 1) }}
	timerPool sync.Pool
)

func (e *Engine) timedOut(id BatchID) (BatchSummary, error) {
	s, err := e.BatchStatus(id)
	if err != nil {
		return s, err
	}
	return s, ErrTimeout
}

// Free releases batch id. It fails with ErrBatchBusy, changing nothing,
// while any task is Waiting or Pending. A freed batch's id is invalid at
// once; its task memory is reused only after every transport that still
// owes a Done for it (a task that timed out or was canceled) has called it.
func (e *Engine) Free(id BatchID) error {
	b, err := e.lock(id)
	if err != nil {
		return err
	}
	if b.live.Load() > 0 {
		b.mu.Unlock()
		return ErrBatchBusy
	}
	release := b.retire()
	b.mu.Unlock()
	if release {
		b.release()
	}
	return nil
}

// Abandon is for a client that went away: every live task of batch id ends
// Canceled (its transport is asked to Cancel) and the batch is freed; its
// memory is reused once the transports have called every Done they owe.
// An unknown id is ignored.
func (e *Engine) Abandon(id BatchID) {
	b, err := e.lock(id)
	if err != nil {
		return
	}
	b.cancelPending(ErrCanceled)
	release := b.retire()
	b.mu.Unlock()
	if release {
		b.release()
	}
}

// AbandonThen is Abandon, and then released runs once no transport owes a
// Done for a task of the batch: from then on no transport touches the
// memory the tasks named (a READ that timed out can no longer land in
// its destination, which the caller may now reuse). released runs before
// AbandonThen returns when nothing is owed, else on the goroutine of the
// last late Done. It never runs for a batch a transport broke the
// dispatch contract on: that transport may still hold tasks it disowned,
// so the memory they name must be taken as lost. false: id is unknown
// (released never runs).
func (e *Engine) AbandonThen(id BatchID, released func()) bool {
	b, err := e.lock(id)
	if err != nil {
		return false
	}
	b.cancelPending(ErrCanceled)
	b.released = released
	release := b.retire()
	b.mu.Unlock()
	if release {
		b.release()
	}
	return true
}

// Close stops the engine: new AllocateBatch and Submit calls fail with
// ErrClosed, every Pending task ends Canceled (error ErrClosed) and its
// transport is asked to Cancel it, and deadline timers are stopped. Waiting
// tasks only exist inside a Submit call, which Close waits out (a Submit
// blocks no longer than its transports' queueing). Close does not wait for
// the transports' outstanding Done calls: the owner closes the transports
// after the engine, and Transport.Close returns once they are all made.
// Batches stay readable (Status, Wait) and must still be freed. Close is
// idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed.Swap(true) {
		e.mu.Unlock()
		return nil
	}
	n := int(e.nextSlot)
	e.mu.Unlock()
	canceled := 0
	for i := 0; i < n; i++ {
		b := e.slots[i].Load()
		if b == nil {
			continue
		}
		b.mu.Lock()
		if b.id != 0 {
			canceled += b.cancelPending(ErrClosed)
			b.disarm()
		}
		b.mu.Unlock()
	}
	e.mu.Lock()
	streams := make([]*Stream, 0, len(e.streams))
	for st := range e.streams {
		streams = append(streams, st)
	}
	e.mu.Unlock()
	for _, st := range streams {
		canceled += int(st.live.Load())
		st.Close(ErrClosed)
	}
	e.log.Info("xfer engine closed", "canceled_tasks", canceled, "streams", len(streams))
	return nil
}

// addStream registers an open stream for Close and Stats; false once the
// engine is closed.
func (e *Engine) addStream(s *Stream) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return false
	}
	if e.streams == nil {
		e.streams = make(map[*Stream]struct{})
	}
	e.streams[s] = struct{}{}
	return true
}

// removeStream retires a closed stream's counters into the engine's.
func (e *Engine) removeStream(s *Stream) {
	st := s.Stats()
	e.mu.Lock()
	if _, ok := e.streams[s]; ok {
		delete(e.streams, s)
		e.retired.add(counts{completed: st.Completed, failed: st.Failed, timeout: st.Timeout, canceled: st.Canceled, bytes: st.Bytes})
	}
	e.mu.Unlock()
}

// Stats returns the engine's counters. It walks every slot and is meant for
// metrics scrapes, not hot paths.
func (e *Engine) Stats() EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := EngineStats{
		BatchesLive:     e.live,
		BatchesRetiring: e.retiring,
		Completed:       e.retired.completed,
		Failed:          e.retired.failed,
		Timeout:         e.retired.timeout,
		Canceled:        e.retired.canceled,
		Bytes:           e.retired.bytes,
		Violations:      e.violations.Load(),
	}
	for i := 0; i < int(e.nextSlot); i++ {
		b := e.slots[i].Load()
		if b == nil {
			continue
		}
		c := b.counts()
		s.Waiting += b.cnt[StateWaiting].Load()
		s.Pending += b.cnt[StatePending].Load()
		s.Completed += c.completed
		s.Failed += c.failed
		s.Timeout += c.timeout
		s.Canceled += c.canceled
		s.Bytes += c.bytes
	}
	for st := range e.streams {
		c := st.Stats()
		s.Streams++
		s.Pending += c.Live
		s.Completed += c.Completed
		s.Failed += c.Failed
		s.Timeout += c.Timeout
		s.Canceled += c.Canceled
		s.Bytes += c.Bytes
	}
	return s
}

// Outstanding counts, by transport, the dispatched tasks whose Done has
// not arrived yet, those of freed and abandoned batches included (a task
// the engine already ended by its deadline, Abandon or Close is still
// outstanding until its transport lets go of it). The transports are the
// Router's, as it returned them. It walks every slot and task: it is for
// shutdown (what a drain would abandon) and diagnostics, not hot paths.
func (e *Engine) Outstanding() map[Transport]int {
	e.mu.Lock()
	n := int(e.nextSlot)
	e.mu.Unlock()
	out := make(map[Transport]int)
	for i := 0; i < n; i++ {
		b := e.slots[i].Load()
		if b == nil {
			continue
		}
		b.mu.Lock()
		if b.owed.Load()&(freedBit-1) != 0 {
			for j := range b.tasks[:b.used] {
				if t := &b.tasks[j]; t.outstanding() && t.tr != nil {
					out[t.tr]++
				}
			}
		}
		b.mu.Unlock()
	}
	return out
}

// recycle returns b's slot to the free list once it is freed and owes no
// Done. Exactly one caller gets here per freed batch (see batch.release).
func (e *Engine) recycle(b *batch) {
	e.mu.Lock()
	e.retired.add(b.counts())
	b.clearCounts()
	e.retiring--
	e.freeSlots = append(e.freeSlots, b.idx)
	e.mu.Unlock()
}

// violation records how tr broke the Transport contract in a Submit call
// of size tasks, if it did. A second Done was counted by the completer
// that refused it (claimDone).
func (e *Engine) violation(tr Transport, d Dispatched, size int) {
	if d.Kept() {
		return
	}
	if d.Broke != SecondDone {
		e.violations.Add(1)
	}
	e.log.Error("xfer: transport contract violation; failing the whole call",
		"transport", transportName(tr), "violation", d.Broke.String(), "n", d.N, "len", size)
}

// taskOwner is the owner of an engine task, a batch or a Stream, as the
// completion path (Engine.done) sees it.
type taskOwner interface {
	// end moves t from state from to the terminal state to with result
	// (err, n). It reports false when another party moved t out of from
	// first.
	end(t *Task, from, to State, err error, n uint64) bool
	// park hands the result of a Done that came while t's submit call
	// still dispatches it (stateDispatching) to that call. It reports
	// false when t is no longer in that state.
	park(t *Task, err error, n uint64) bool
}

// What Engine.done did with a Done.
type doneResult uint8

const (
	doneRefused doneResult = iota // not owed (Task.ClaimDone): touched nothing
	doneEnded                     // ended the Pending task
	doneParked                    // parked the result for the submit call
	doneLate                      // the task had already ended: released it only
)

// done is the completion path of the tasks of a batch or a Stream: it
// releases what was taken for t exactly once (the Done the transport owed
// does it) and ends t with (n, err) through its owner o, or parks the
// result for its submit call, unless a deadline, Abandon or Close ended t
// first. A Done that was not owed is counted, and logged unless its
// Dispatch call reports it.
func (e *Engine) done(o taskOwner, t *Task, n uint64, err error) doneResult {
	if c := t.ClaimDone(); c != DoneOwed {
		e.violations.Add(1)
		if c == DoneLate {
			e.log.Error("xfer: transport contract violation: Done for a task it does not own",
				"transport", transportName(t.tr))
		}
		return doneRefused
	}
	// The meter is read before the task can end: a parked task is metered
	// by its submit call, the others here, and once a task has ended its
	// memory may be taken again.
	ms, start := t.ms, t.start
	t.releaseSegs()
	for {
		if o.end(t, StatePending, finalState(err), err, n) {
			e.ended(ms, start, n, err)
			return doneEnded
		}
		if o.park(t, err, n) {
			return doneParked
		}
		if s := State(t.state.Load()); s != StatePending && s != stateDispatching {
			e.ended(ms, start, n, err) // a late Done
			return doneLate
		}
	}
}
