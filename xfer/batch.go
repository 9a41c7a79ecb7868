package xfer

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// Engine-internal task states. Status reports all three as StatePending.
const (
	// stateDispatching: handed to Transport.Submit, which has not returned.
	stateDispatching State = 16 + iota
	// stateParked: the transport called Done before its Submit returned;
	// n and err hold the result, which the submitting call publishes once
	// it has checked the transport's dispatch count.
	stateParked
	// stateEnding: one goroutine won the right to end the task and is
	// writing its result; the terminal state follows.
	stateEnding
	// stateAnswered (streams only): the transport called Done before its
	// Submit returned and the sink has been told; n and err hold the
	// result, which the submitting call meters before it frees the slot.
	stateAnswered
)

// shrinkTasks: task tables up to this size are always kept for reuse.
const shrinkTasks = 4096

// freedBit is added to batch.owed when the batch is freed; the party that
// brings owed to exactly freedBit recycles the batch.
const freedBit = int64(1) << 40

// batch is one slot's batch object. It and its task table are reused by
// every batch allocated in that slot (unless tainted, see retire).
type batch struct {
	e   *Engine
	idx uint32

	// mu serializes Submit, Status, BatchStatus, Free, Abandon, the deadline
	// timers and Close's sweep on this batch, and guards the fields below
	// up to the atomics. Task.Done never takes it.
	mu       sync.Mutex
	id       BatchID // 0 while the slot is free or retiring
	gen      uint32
	capacity int
	used     int        // tasks[:used] were submitted
	tasks    []Task     // len >= capacity; tasks[i].b == this batch
	scratch  []*Task    // per-call scratch: accepted tasks, then the ones not yet grouped
	grp      []*Task    // per-call scratch: the tasks of one transport
	mc       meterCache // kept across the slot's batches
	calls    []*call    // deadline records, reused; calls[:ncalls] in use
	ncalls   int
	// tainted: a transport broke the dispatch contract on this batch, so it
	// may still hold tasks it disowned. A tainted batch object (and its
	// task table) is never reused; see retire.
	tainted bool

	// live counts Waiting and Pending tasks; the Done that brings it to 0
	// wakes waiters.
	live atomic.Int64
	// owed counts dispatched tasks whose Done has not arrived, plus freedBit
	// once the batch is freed.
	owed atomic.Int64
	// released, set by AbandonThen before the batch is freed, runs once
	// owed reaches freedBit (read by the party that brings it there).
	released func()
	// cnt counts tasks per State; terminal counts are cumulative for this
	// batch until it is recycled.
	cnt   [8]atomic.Int64
	bytes atomic.Uint64

	// waitMu guards waiters. Lock order: mu, then waitMu.
	waitMu sync.Mutex
	// waiters are the wake channels of sleeping Waits; the completion that
	// brings live to 0 sends once on each and empties the list.
	waiters []chan struct{}
}

var _ Completer = (*batch)(nil)

// reset prepares b for a new batch of capacity tasks. b.mu is held and
// the slot owes no Done.
func (b *batch) reset(capacity int) {
	// A table much larger than needed (left by an earlier big batch) is
	// dropped so that a slot does not pin its peak size forever.
	if c := cap(b.tasks); c < capacity || c > 4*capacity && c > shrinkTasks {
		b.tasks = make([]Task, capacity)
		for i := range b.tasks {
			b.tasks[i].b = b
			b.tasks[i].done = b
		}
		b.scratch = make([]*Task, 0, capacity)
		b.grp = make([]*Task, 0, capacity)
	} else {
		for i := range b.tasks[:b.used] {
			t := &b.tasks[i]
			t.Req = Request{}
			t.Local, t.Target, t.tr, t.err = nil, nil, nil, nil
			t.Tag, t.n = 0, 0
			t.Deadline, t.Notify, t.Sum = time.Time{}, nil, nil
			t.state.Store(0)
			t.owed.Store(0)
		}
	}
	b.capacity = capacity
	b.used = 0
	b.live.Store(0)
	b.owed.Store(0)
	b.gen++
	if b.gen == 0 {
		b.gen = 1
	}
	b.id = BatchID(uint64(b.gen)<<32 | uint64(b.idx) + 1)
}

// submit runs Engine.Submit once the call is checked: notify and sums are
// empty or positional with reqs, deadline is the call's effective deadline
// (never zero) and now when the clock was read. b.mu is held.
func (b *batch) submit(reqs []Request, r Resolver, notify [][]byte, sums []Sum, deadline, now time.Time, results []error) error {
	start := b.used
	end := start + len(reqs)
	b.used = end

	acc := b.scratch[:0]
	refused := 0
	for i := range reqs {
		t := &b.tasks[start+i]
		t.Req = reqs[i]
		t.Deadline = deadline
		if len(notify) != 0 {
			t.Notify = notify[i]
		}
		if len(sums) != 0 {
			sums[i] = Sum{}
			t.Sum = &sums[i]
		}
		if err := b.e.prepare(t, r); err != nil {
			results[i] = err
			t.err = err
			t.state.Store(uint32(StateFailed))
			refused++
			continue
		}
		results[i] = nil
		t.state.Store(uint32(StateWaiting))
		acc = append(acc, t)
	}
	if refused > 0 {
		b.cnt[StateFailed].Add(int64(refused))
	}
	if len(acc) == 0 {
		return nil
	}
	b.live.Add(int64(len(acc)))
	b.cnt[StateWaiting].Add(int64(len(acc)))

	// Every group of the call is metered from the call's clock reading,
	// the one its deadline was taken from, when the call is sampled.
	start0 := b.mc.start(b.e, now)
	bad := !dispatchGroups(b, acc, b.grp, start0)

	// Publish what the transports did: tasks still with a transport become
	// Pending, results parked during dispatch become terminal. After a
	// contract violation every task of the call ends Failed instead.
	stillLive := false
	// Tasks whose Done came during dispatch are metered here, in runs of
	// one transport, with one clock reading for a sampled call (meter.go).
	run := meterRun{start: start0}
	for i := start; i < end; i++ {
		t := &b.tasks[i]
		for {
			s := State(t.state.Load())
			if s == stateDispatching {
				if bad {
					if b.end(t, stateDispatching, StateFailed, ErrTransport, 0) {
						t.tr.Cancel(t)
						break
					}
					continue
				}
				if t.state.CompareAndSwap(uint32(stateDispatching), uint32(StatePending)) {
					stillLive = true
					break
				}
				continue
			}
			if s == stateParked {
				err, n := t.err, t.n
				run.add(b.e, &b.mc, t, n, err)
				if bad {
					err, n = ErrTransport, 0
				}
				b.end(t, stateParked, finalState(err), err, n)
				break
			}
			if s == stateEnding {
				// A Done is writing its result; it finishes in a few
				// instructions.
				runtime.Gosched()
				continue
			}
			break // terminal (refused, rolled back) or Pending already
		}
	}
	run.flush(b.e, &b.mc)
	if bad {
		b.tainted = true
		return ErrTransport
	}
	if stillLive {
		b.arm(start, end, deadline)
	}
	return nil
}

// prepare validates t.Req, resolves and references its segments and routes
// it. On error nothing is held.
func (e *Engine) prepare(t *Task, r Resolver) error { return e.prepareWith(t, r, nil, nil) }

// prepareWith is prepare, with the segments resolved by the caller (l and
// tg, nil for none) when r is nil.
func (e *Engine) prepareWith(t *Task, r Resolver, l, tg Segment) error {
	q := &t.Req
	if q.Op != OpRead && q.Op != OpWrite {
		return ErrBadOp
	}
	if q.Length == 0 {
		return ErrZeroLength
	}
	if r != nil {
		l, _ = r.Resolve(q.Local)
		tg, _ = r.Resolve(q.Target)
	}
	if l == nil || tg == nil {
		return ErrNoSegment
	}
	if !inBounds(q.LocalOffset, q.Length, l.Size()) || !inBounds(q.TargetOffset, q.Length, tg.Size()) {
		return ErrOutOfBounds
	}
	if e.router == nil {
		return ErrNotSupported
	}
	tr, err := e.router.Route(l, tg)
	if err != nil {
		return err
	}
	if tr == nil {
		return ErrNotSupported
	}
	if !l.Acquire() {
		return ErrNoSegment
	}
	if !tg.Acquire() {
		l.Release()
		return ErrNoSegment
	}
	t.Local, t.Target = l, tg
	t.holdL, t.holdT = false, false
	if h, ok := l.(RangeHolder); ok {
		t.holdL = h.HoldRange(q.LocalOffset, q.Length)
		if !t.holdL {
			return t.unprepare()
		}
	}
	if h, ok := tg.(RangeHolder); ok {
		t.holdT = h.HoldRange(q.TargetOffset, q.Length)
		if !t.holdT {
			return t.unprepare()
		}
	}
	t.tr = tr
	return nil
}

// unprepare undoes a prepare refused by a range holder: what was taken is
// dropped and t goes back to naming no segments.
func (t *Task) unprepare() error {
	t.releaseSegs()
	t.Local, t.Target, t.holdL, t.holdT = nil, nil, false, false
	return ErrRangeRefused
}

// releaseSegs drops what prepare took for t: held ranges, then references.
func (t *Task) releaseSegs() {
	if t.holdL {
		t.Local.(RangeHolder).DropRange(t.Req.LocalOffset, t.Req.Length)
	}
	if t.holdT {
		t.Target.(RangeHolder).DropRange(t.Req.TargetOffset, t.Req.Length)
	}
	t.Local.Release()
	t.Target.Release()
}

func inBounds(off, n, size uint64) bool { return off <= size && n <= size-off }

// groupDispatcher is a batch or a Stream, as dispatchGroups sees it.
type groupDispatcher interface {
	// dispatch hands grp, tasks all routed to tr, to it (Dispatch) and
	// rolls back what tr did not take. It reports false when tr broke the
	// dispatch contract. start is the call's meter start (0: not
	// sampled).
	dispatch(tr Transport, grp []*Task, start int64) bool
}

// dispatchGroups dispatches the accepted tasks of a submit call through
// o, one group per transport, each group in request order, with grp as
// scratch (its capacity at least len(acc)). It reorders acc: the tasks of
// the transports not yet dispatched are compacted in place (the write
// index never passes the read index). It reports false when a transport
// broke the dispatch contract.
func dispatchGroups(o groupDispatcher, acc, grp []*Task, start int64) bool {
	kept := true
	for rest := acc; len(rest) > 0; {
		tr := rest[0].tr
		g, others := grp[:0], rest[:0]
		for _, t := range rest {
			if t.tr == tr {
				g = append(g, t)
			} else {
				others = append(others, t)
			}
		}
		rest = others
		if !o.dispatch(tr, g, start) {
			kept = false
		}
	}
	return kept
}

// dispatch hands grp to tr and rolls back what tr did not take. It reports
// false when tr broke the dispatch contract. start is the call's meter
// start (0: not sampled).
func (b *batch) dispatch(tr Transport, grp []*Task, start int64) bool {
	ms := b.mc.shard(&b.e.meters, tr, b.idx)
	for _, t := range grp {
		if metersOn {
			t.ms, t.start = ms, start
		}
		t.state.Store(uint32(stateDispatching))
	}
	if v := b.cnt[StateWaiting].Add(-int64(len(grp))); invariants.Enabled && v < 0 {
		panic("xfer: invariant: waiting task count below zero")
	}
	b.cnt[StatePending].Add(int64(len(grp)))
	b.owed.Add(int64(len(grp)))

	d := Dispatch(tr, grp)
	b.e.violation(tr, d, len(grp))
	refused := 0
	for _, t := range grp[d.K:] {
		// A task not given back was ended by a Done that came for it
		// anyway (d says so): that Done released it and parked it.
		if t.Undispatched() {
			refused++
			b.owed.Add(-1)
			t.releaseSegs()
			b.end(t, stateDispatching, StateFailed, d.Err, 0)
		}
	}
	b.mc.dispatched(len(grp)-refused, refused)
	return d.Kept()
}

// end moves t from state from to the terminal state to with result (err,
// n), updating the counters and waking waiters when the batch goes idle.
// It reports false when another party ended t first.
func (b *batch) end(t *Task, from, to State, err error, n uint64) bool {
	if invariants.Enabled && !to.Terminal() {
		panic("xfer: invariant: end to a live state")
	}
	if !t.finish(from, to, err, n) {
		return false
	}
	if v := b.cnt[StatePending].Add(-1); invariants.Enabled && v < 0 {
		panic("xfer: invariant: pending task count below zero")
	}
	b.cnt[to].Add(1)
	if n != 0 {
		b.bytes.Add(n)
	}
	if v := b.live.Add(-1); v == 0 {
		b.wakeWaiters()
	} else if invariants.Enabled && v < 0 {
		panic("xfer: invariant: live task count below zero")
	}
	return true
}

// finish moves t from state from to stateEnding, writes its result and
// leaves it in state mark. It reports false when another party moved t out
// of from first.
func (t *Task) finish(from, mark State, err error, n uint64) bool {
	if !t.state.CompareAndSwap(uint32(from), uint32(stateEnding)) {
		return false
	}
	t.err, t.n = err, n
	t.state.Store(uint32(mark))
	return true
}

// park keeps the result of a Done during dispatch for the submit call,
// which publishes it once it has checked the dispatch count.
func (b *batch) park(t *Task, err error, n uint64) bool {
	return t.finish(stateDispatching, stateParked, err, n)
}

func finalState(err error) State {
	switch {
	case err == nil:
		return StateCompleted
	case errors.Is(err, ErrCanceled):
		return StateCanceled
	case errors.Is(err, ErrTimeout):
		return StateTimeout
	}
	return StateFailed
}

func (b *batch) wakeWaiters() {
	b.waitMu.Lock()
	for i, ch := range b.waiters {
		ch <- struct{}{} // capacity 1 and registered once: never blocks
		b.waiters[i] = nil
	}
	b.waiters = b.waiters[:0]
	b.waitMu.Unlock()
}

// unwait takes ch off the waiters of a Wait that gives up, and drains the
// wake-up it may already have been sent, so ch goes back to the pool empty.
func (b *batch) unwait(ch chan struct{}) {
	b.waitMu.Lock()
	for i, w := range b.waiters {
		if w == ch {
			last := len(b.waiters) - 1
			b.waiters[i] = b.waiters[last]
			b.waiters[last] = nil
			b.waiters = b.waiters[:last]
			b.waitMu.Unlock()
			return
		}
	}
	b.waitMu.Unlock()
	<-ch // wakeWaiters removed it and sent under waitMu
}

// TaskDone is the completion path of a dispatched task: it releases the
// task's refs exactly once and ends it, unless a deadline, Abandon or
// Close ended it first (a late Done then only releases). It takes no lock.
func (b *batch) TaskDone(t *Task, n uint64, err error) {
	if b.e.done(b, t, n, err) == doneRefused {
		return
	}
	v := b.owed.Add(-1)
	if v == freedBit {
		b.recycleNow()
	} else if invariants.Enabled && v&(freedBit-1) > freedBit/2 {
		panic("xfer: invariant: owed Done count below zero")
	}
}

func transportName(tr Transport) string {
	if tr == nil {
		return "unknown"
	}
	return tr.Name()
}

// cancelPending ends every Pending task Canceled with err and asks its
// transport to cancel it. b.mu is held, so no task is Waiting.
func (b *batch) cancelPending(err error) int {
	n := 0
	for i := range b.tasks[:b.used] {
		t := &b.tasks[i]
		if b.end(t, StatePending, StateCanceled, err, 0) {
			t.tr.Cancel(t)
			n++
		}
	}
	return n
}

// retire invalidates b's id and stops its timers. b.mu is held. It
// reports whether the caller must call release once it has unlocked b.mu.
//
// A tainted batch is not recycled through release: a transport that broke
// the contract may still hold tasks it disowned and call Done on them at
// any time. Its slot gets a fresh batch object at once; the old object and
// its table stay alive, garbage collected, for as long as the transport
// holds pointers into them, and such late Dones touch nothing else.
func (b *batch) retire() (release bool) {
	b.id = 0
	b.disarm()
	e := b.e
	e.mu.Lock()
	defer e.mu.Unlock()
	e.live--
	if !b.tainted {
		e.retiring++
		return true
	}
	e.retired.add(b.counts())
	// Its meter counts go to the shards first: a fold finds the fresh
	// object in the slot, not this one.
	b.mc.flush()
	// The fresh object continues the slot's generations, so no id of the
	// old one is handed out again.
	nb := &batch{e: e, idx: b.idx, gen: b.gen}
	nb.mc.seed(uint64(b.idx))
	e.slots[b.idx].Store(nb)
	e.freeSlots = append(e.freeSlots, b.idx)
	return false
}

// release marks b freed; whoever brings owed to exactly freedBit (here, or
// the last late Done) recycles the slot.
func (b *batch) release() {
	if b.owed.Add(freedBit) == freedBit {
		b.recycleNow()
	}
}

// recycleNow recycles b, which owes no Done any more, and runs the
// released callback AbandonThen left (read first: once recycled, the
// slot may be taken again at once).
func (b *batch) recycleNow() {
	fn := b.released
	b.released = nil
	b.e.recycle(b)
	if fn != nil {
		fn()
	}
}

func (b *batch) summary() BatchSummary {
	return BatchSummary{
		Total:       b.used,
		Waiting:     int(b.cnt[StateWaiting].Load()),
		Pending:     int(b.cnt[StatePending].Load()),
		Completed:   int(b.cnt[StateCompleted].Load()),
		Failed:      int(b.cnt[StateFailed].Load()),
		Timeout:     int(b.cnt[StateTimeout].Load()),
		Canceled:    int(b.cnt[StateCanceled].Load()),
		Transferred: b.bytes.Load(),
	}
}

func (b *batch) counts() counts {
	return counts{
		completed: uint64(b.cnt[StateCompleted].Load()),
		failed:    uint64(b.cnt[StateFailed].Load()),
		timeout:   uint64(b.cnt[StateTimeout].Load()),
		canceled:  uint64(b.cnt[StateCanceled].Load()),
		bytes:     b.bytes.Load(),
	}
}

func (b *batch) clearCounts() {
	for i := range b.cnt {
		b.cnt[i].Store(0)
	}
	b.bytes.Store(0)
}

// call is the deadline of one Submit call: one runtime timer for all of its
// tasks. Records are reused across calls and batches of the slot.
type call struct {
	b          *batch
	timer      *time.Timer
	start, end int       // guarded by b.mu
	due        time.Time // guarded by b.mu; carries a monotonic reading
	armed      bool      // guarded by b.mu
}

// arm starts the deadline timer of tasks[start:end] at deadline. The
// clock is read again here, after the dispatch: a transport's Submit may
// have waited for room, and the deadline is absolute, so time spent there
// shortens the timer (one already passed fires at once). b.mu is held.
func (b *batch) arm(start, end int, deadline time.Time) {
	var c *call
	if b.ncalls < len(b.calls) {
		c = b.calls[b.ncalls]
	} else {
		c = &call{b: b}
		b.calls = append(b.calls, c)
	}
	b.ncalls++
	now := b.e.now()
	d := deadline.Sub(now)
	c.start, c.end, c.due, c.armed = start, end, now.Add(d), true
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.fire)
	} else {
		c.timer.Reset(d)
	}
}

// disarm stops every deadline timer of b. b.mu is held.
func (b *batch) disarm() {
	for _, c := range b.calls[:b.ncalls] {
		if c.armed {
			c.timer.Stop()
			c.armed = false
		}
	}
	b.ncalls = 0
}

// fire ends the call's still-Pending tasks in Timeout and asks their
// transports to cancel them. A run left over from an earlier arming of the
// record finds it disarmed or not yet due and does nothing.
func (c *call) fire() {
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if !c.armed || b.e.now().Before(c.due) {
		return
	}
	c.armed = false
	for i := c.start; i < c.end; i++ {
		t := &b.tasks[i]
		if b.end(t, StatePending, StateTimeout, ErrTimeout, 0) {
			t.tr.Cancel(t)
		}
	}
}
