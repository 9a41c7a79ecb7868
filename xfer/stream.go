package xfer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
)

// StreamRequest is one request of a Stream: the transfer, the caller's name
// for its completion, its deadline and the notification it carries.
type StreamRequest struct {
	Req      Request
	UserData uint64
	// Deadline ends the task in StateTimeout if it is still live then.
	// Zero means Config.DefaultTimeout after the Submit. A deadline that
	// has passed when Submit takes the request (it waited for a slot)
	// refuses it with ErrTimeout: no transport is given it.
	Deadline time.Time
	// Notify is the notification a WRITE to a peer carries (nil: none).
	// Submit copies it.
	Notify []byte
	// LocalSeg and TargetSeg are the segments Req.Local and Req.Target
	// name, when the caller resolved them before Submit (both, or
	// neither: nil asks the stream's Resolver, and a request that carries
	// one only is refused ErrNoSegment). Submit acquires and holds them
	// as it would what it resolves; the caller keeps no reference of its
	// own for them.
	LocalSeg, TargetSeg Segment
}

// StreamSink receives the end of every request a Stream accepted.
type StreamSink interface {
	// StreamDone is called exactly once per accepted request, with its
	// user data, terminal state, the bytes moved and nil or the error that
	// ended it. It must not block and must not call back into the stream;
	// it may run on the submitting goroutine (inside Submit), on a
	// transport's poller or on a deadline timer.
	StreamDone(userData uint64, st State, n uint64, err error)
}

// Stream is a long-lived submission stream: the engine side of a client's
// queue. Its task slots are allocated once and recycled, so a request
// costs no batch allocation, no engine-wide lock and no allocation at all
// in the steady state. Each request ends on its own (its completion goes to
// the sink at once) and has its own deadline.
//
// A slot is reused only when both its task has ended (the sink was told)
// and the transport that had it has called Done; a transport may still
// touch a task after its deadline ended it, so until its Done the slot and
// the task's segment references stay taken.
//
// Concurrency: Submit is called by one goroutine at a time (a queue's
// worker); Close may race with it and with completions.
type Stream struct {
	e     *Engine
	r     Resolver
	sink  StreamSink
	shard uint32 // the meter shard its tasks count in
	// epoch is the zero of the slots' due times (monotonic).
	epoch time.Time

	// mu serializes Submit and Close and guards closed: Close never runs
	// while a Submit has tasks Waiting or in Transport.Submit.
	mu      sync.Mutex
	closed  atomic.Bool // set under mu; read without it by recycle
	broken  bool        // a transport broke the dispatch contract: no more slots are reused (guarded by freeMu)
	scratch []*Task     // Submit's accepted tasks
	taken   []uint32    // Submit's slots
	grp     []*Task     // Submit's tasks of one transport
	mc      meterCache  // the meter of the last transport dispatched to
	// The deadlines: one timer for the stream, armed for the earliest due
	// time among the tasks it was armed for (armed, ns since epoch; 0 when
	// it is not armed). Both under mu.
	timer *time.Timer
	armed int64

	tasks []Task
	slots []streamSlot

	// freeMu guards free, the slots ready for reuse.
	freeMu sync.Mutex
	free   []uint32

	held atomic.Int64 // slots not free
	idle chan struct{}
	once sync.Once
	// onFree is called (without locks) when a slot frees after a Submit
	// found none for some of its requests; wantFree says one did.
	onFree   func()
	wantFree atomic.Bool

	// Counters: current live tasks; cumulative ends by state and bytes.
	live  atomic.Int64
	cnt   [8]atomic.Uint64
	bytes atomic.Uint64
}

// streamSlot is a task slot's stream state beside its Task.
type streamSlot struct {
	userData uint64
	// refs: one for the end (the sink is told), one while a transport owns
	// the task; the party that brings it to zero frees the slot.
	refs   atomic.Int32
	due    atomic.Int64 // deadline, ns since the stream's epoch
	notify []byte
}

var _ Completer = (*Stream)(nil)

// NewStream opens a stream of up to capacity requests in flight at once,
// resolving segments with r (nil when every request comes resolved:
// StreamRequest.LocalSeg, TargetSeg) and reporting ends to sink. capacity
// must be in 1..Config.MaxBatchCapacity.
func (e *Engine) NewStream(capacity int, r Resolver, sink StreamSink) (*Stream, error) {
	if capacity <= 0 || capacity > e.cfg.MaxBatchCapacity || sink == nil {
		return nil, ErrInvalid
	}
	if e.closed.Load() {
		return nil, ErrClosed
	}
	s := &Stream{
		e: e, r: r, sink: sink, epoch: e.now(),
		tasks: make([]Task, capacity), slots: make([]streamSlot, capacity), free: make([]uint32, capacity),
		scratch: make([]*Task, 0, capacity), taken: make([]uint32, 0, capacity), grp: make([]*Task, 0, capacity), idle: make(chan struct{}),
	}
	for i := range s.tasks {
		s.tasks[i].done = s
		s.tasks[i].slot = uint32(i)
		s.free[i] = uint32(capacity - 1 - i)
	}
	seq := e.streamSeq.Add(1)
	s.shard = seq % meterShards
	s.mc.seed(1<<32 | uint64(seq))
	if !e.addStream(s) {
		return nil, ErrClosed
	}
	return s, nil
}

// OnFree sets f to be called when a slot frees after a Submit that had no
// slot for some of its requests, so a caller holding requests back can try
// again. f runs on whatever goroutine freed the slot, without locks, and
// must not block. Call it before the first Submit.
func (s *Stream) OnFree(f func()) { s.onFree = f }

// SetHome marks every task of the stream as submitted by reactor h (its
// index plus one; see Task.Home). Call it before the first Submit.
func (s *Stream) SetHome(h uint32) {
	for i := range s.tasks {
		s.tasks[i].Home = h
	}
}

// Free is how many requests Submit can take now.
func (s *Stream) Free() int {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	return len(s.free)
}

// Submit takes requests from reqs, as many as the stream has free slots
// for, and returns how many it took: reqs[n:] are untouched. results must
// have len(reqs); for i < n, results[i] is nil when reqs[i] was accepted
// (the sink will hear of it exactly once) or the typed error that refused
// it (ErrTimeout for a deadline passed already, ErrBadOp, ErrZeroLength,
// ErrNoSegment, ErrOutOfBounds, the Router's error; the sink never hears
// of it). A request a transport refused at
// dispatch stays accepted and ends Failed with the transport's error. When
// a transport breaks the dispatch contract, every accepted request of the
// call ends Failed with ErrTransport before Submit returns (but one its
// transport answered during the call, which the sink was told of at once)
// and the stream takes no more.
//
// A returned error is for the whole call and takes nothing: ErrClosed,
// ErrInvalid (len(results) != len(reqs)), ErrTransport (a transport broke
// the dispatch contract earlier on this stream, which is then unusable).
func (s *Stream) Submit(reqs []StreamRequest, results []error) (int, error) {
	if len(results) != len(reqs) {
		return 0, ErrInvalid
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() || s.e.closed.Load() {
		return 0, ErrClosed
	}
	s.freeMu.Lock()
	if s.broken {
		s.freeMu.Unlock()
		return 0, ErrTransport
	}
	n := min(len(reqs), len(s.free))
	if n < len(reqs) {
		s.wantFree.Store(true)
	}
	// Copied out: a refused request's slot goes back onto free below.
	slots := append(s.taken[:0], s.free[len(s.free)-n:]...)
	s.free = s.free[:len(s.free)-n]
	s.freeMu.Unlock()
	if n == 0 {
		return 0, nil
	}
	s.held.Add(int64(n))
	now := s.e.now()
	acc := s.scratch[:0]
	for i := 0; i < n; i++ {
		idx := slots[n-1-i]
		t, sl := &s.tasks[idx], &s.slots[idx]
		q := &reqs[i]
		t.Req = q.Req
		d := q.Deadline
		if d.IsZero() {
			d = now.Add(s.e.cfg.DefaultTimeout)
		} else if !d.After(now) {
			// It waited for a slot past its deadline: ended then, it is
			// carried out by nobody.
			results[i] = ErrTimeout
			s.recycle(idx)
			continue
		}
		r := s.r
		if q.LocalSeg != nil || q.TargetSeg != nil {
			r = nil
		}
		if err := s.e.prepareWith(t, r, q.LocalSeg, q.TargetSeg); err != nil {
			results[i] = err
			s.recycle(idx)
			continue
		}
		results[i] = nil
		t.Deadline = d
		sl.due.Store(int64(d.Sub(s.epoch)))
		sl.userData = q.UserData
		t.Notify = nil
		if q.Notify != nil {
			sl.notify = append(sl.notify[:0], q.Notify...)
			t.Notify = sl.notify
		}
		sl.refs.Store(1)
		t.state.Store(uint32(StateWaiting))
		acc = append(acc, t)
	}
	if len(acc) == 0 {
		return n, nil
	}
	s.live.Add(int64(len(acc)))

	start0 := s.mc.start(s.e, now) // every group is metered from the call's clock reading, when sampled
	bad := !dispatchGroups(s, acc, s.grp, start0)
	// Publish what the transports did: tasks still with a transport become
	// Pending and are armed on the stream's deadline timer; tasks answered
	// during dispatch are metered and drop their end's reference. The
	// tasks are found by the slots taken, in request order: grouping by
	// transport reordered acc in place. A slot whose request was refused is
	// free again, and its task in no state that publishing changes.
	run := meterRun{start: start0} // tasks whose Done came during dispatch (meter.go)
	// The timer is armed from the clock after the dispatch (read once, for
	// the first task left Pending): a transport's Submit may have waited
	// for room, and a deadline is absolute.
	var after time.Time
	for i := range n {
		t := &s.tasks[slots[n-1-i]]
		deadline := t.Deadline // read while the task's slot cannot be freed under us
	publish:
		for {
			switch State(t.state.Load()) {
			case stateDispatching:
				if bad {
					// A transport broke the dispatch contract in this
					// call: what it took ends Failed now, as a batch's
					// does, whatever it says of it later.
					if !s.end(t, stateDispatching, StateFailed, ErrTransport, 0) {
						continue
					}
					t.tr.Cancel(t)
					s.unref(t) // the end's
					break publish
				}
				if !t.state.CompareAndSwap(uint32(stateDispatching), uint32(StatePending)) {
					continue
				}
				if after.IsZero() {
					after = s.e.now()
				}
				s.arm(t.slot, deadline.Sub(after))
			case stateAnswered:
				run.add(s.e, &s.mc, t, t.n, t.err)
				t.state.Store(uint32(finalState(t.err)))
				s.unref(t)
			case stateEnding:
				continue // a Done is writing its result; a few instructions
			}
			break publish
		}
	}
	run.flush(s.e, &s.mc)
	if bad {
		s.freeMu.Lock()
		s.broken = true
		s.freeMu.Unlock()
	}
	return n, nil
}

// dispatch hands grp to tr and ends what tr did not take. It reports false
// when tr broke the dispatch contract; the tasks it did not take then end
// Failed with ErrTransport, and their slots are never reused (the
// transport may still call Done on them).
func (s *Stream) dispatch(tr Transport, grp []*Task, start int64) bool {
	ms := s.mc.shard(&s.e.meters, tr, s.shard)
	for _, t := range grp {
		if metersOn {
			t.ms, t.start = ms, start
		}
		s.slots[t.slot].refs.Add(1)
		t.state.Store(uint32(stateDispatching))
	}
	d := Dispatch(tr, grp)
	s.e.violation(tr, d, len(grp))
	refused := 0
	for _, t := range grp[d.K:] {
		// A task not given back was ended by a Done that came for it
		// anyway (d says so): the sink heard of it once, and the meters
		// counted it as dispatched.
		if !t.Undispatched() {
			continue
		}
		refused++
		t.releaseSegs()
		if d.Kept() {
			s.unref(t) // the transport's ref: it never had the task
		}
		s.end(t, stateDispatching, StateFailed, d.Err, 0)
		s.unref(t)
	}
	s.mc.dispatched(len(grp)-refused, refused)
	return d.Kept()
}

// arm sees that the stream's timer fires by slot idx's due time, d from
// now: it is reset only when it is not armed or armed for later, so a
// stream whose requests all have the same timeout resets it about once per
// timeout, not once per request (each reset is a lock and a heap update
// in the Go runtime). s.mu is held.
func (s *Stream) arm(idx uint32, d time.Duration) {
	due := s.slots[idx].due.Load()
	if s.armed != 0 && s.armed <= due {
		return
	}
	s.armed = due
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
		return
	}
	s.timer.Reset(d)
}

// fire is the stream's timer: it ends in Timeout every Pending task that
// is due, and arms the timer again for the earliest due time of the
// others.
func (s *Stream) fire() {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return
	}
	now := int64(s.e.now().Sub(s.epoch))
	var due []uint32
	next := int64(0)
	for i := range s.tasks {
		if State(s.tasks[i].state.Load()) != StatePending {
			continue
		}
		switch d := s.slots[i].due.Load(); {
		case d <= now:
			due = append(due, uint32(i))
		case next == 0 || d < next:
			next = d
		}
	}
	s.armed = next
	if next != 0 {
		s.timer.Reset(time.Duration(next - now))
	}
	s.mu.Unlock()
	for _, idx := range due {
		s.fireSlot(idx)
	}
}

// fireSlot ends slot idx's task in Timeout if it is still Pending and due.
func (s *Stream) fireSlot(idx uint32) {
	t, sl := &s.tasks[idx], &s.slots[idx]
	if State(t.state.Load()) != StatePending || s.e.now().Sub(s.epoch) < time.Duration(sl.due.Load()) {
		return
	}
	if s.end(t, StatePending, StateTimeout, ErrTimeout, 0) {
		t.tr.Cancel(t)
		s.unref(t)
	}
}

// TaskDone is the completion path of a dispatched task: it releases the
// task's references exactly once and ends it, unless its deadline or Close
// ended it first (a late Done then only releases).
func (s *Stream) TaskDone(t *Task, n uint64, err error) {
	switch s.e.done(s, t, n, err) {
	case doneRefused:
		return
	case doneEnded:
		s.unref(t) // the end's
	}
	s.unref(t) // the transport's
}

// park answers a Done during dispatch (a transport that copies inline) at
// once too: its CQE goes out while the rest of the call is still copying,
// so the client refills the queue meanwhile. The task keeps its end's
// reference: the submitting call meters it (without an atomic per task)
// and frees its slot. Dispatch still finds the task claimed if the
// transport then says it never took it.
func (s *Stream) park(t *Task, err error, n uint64) bool {
	return s.endAs(t, stateDispatching, finalState(err), stateAnswered, err, n)
}

// end moves t from state from to the terminal state to and tells the sink.
// It reports false when another party ended t first. The caller drops the
// end's reference (unref) once it no longer touches t.
func (s *Stream) end(t *Task, from, to State, err error, n uint64) bool {
	return s.endAs(t, from, to, to, err, n)
}

// endAs is end, leaving t in state mark (to, or stateAnswered) while it
// counts and reports terminal state to.
func (s *Stream) endAs(t *Task, from, to, mark State, err error, n uint64) bool {
	if !t.finish(from, mark, err, n) {
		return false
	}
	s.live.Add(-1)
	s.cnt[to].Add(1)
	if n != 0 {
		s.bytes.Add(n)
	}
	s.sink.StreamDone(s.slots[t.slot].userData, to, n, err)
	return true
}

// unref drops one of a slot's references; the last one frees the slot.
func (s *Stream) unref(t *Task) {
	v := s.slots[t.slot].refs.Add(-1)
	if v > 0 {
		return
	}
	if invariants.Enabled && v < 0 {
		panic("xfer: invariant: stream slot references below zero")
	}
	s.recycle(t.slot)
}

// recycle makes slot idx free again (unless the stream is broken).
func (s *Stream) recycle(idx uint32) {
	t := &s.tasks[idx]
	t.Req = Request{}
	t.Local, t.Target, t.tr, t.err, t.Notify = nil, nil, nil, nil, nil
	t.Tag, t.n, t.Deadline = 0, 0, time.Time{}
	t.state.Store(0)
	s.freeMu.Lock()
	broken := s.broken
	if !broken {
		s.free = append(s.free, idx)
	}
	s.freeMu.Unlock()
	if !broken && s.onFree != nil && s.wantFree.Load() && s.wantFree.CompareAndSwap(true, false) {
		s.onFree()
	}
	// With Close's store of closed and load of held, one of the two sees
	// the other's write: the last slot and Close cannot both miss idle.
	if s.held.Add(-1) == 0 && s.closed.Load() {
		s.once.Do(func() { close(s.idle) })
	}
}

// Close stops the stream: Submit fails with ErrClosed and every Pending
// task ends Canceled (error err, ErrCanceled when nil) with its transport
// asked to Cancel it. It does not wait for the transports' Done calls;
// Idle is closed once they have all come and no slot is held. Close is
// idempotent.
func (s *Stream) Close(err error) {
	if err == nil {
		err = ErrCanceled
	}
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return
	}
	for i := range s.tasks {
		t := &s.tasks[i]
		if State(t.state.Load()) == StatePending && s.end(t, StatePending, StateCanceled, err, 0) {
			t.tr.Cancel(t)
			s.unref(t)
		}
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	// No submit call follows: the meter counts go to the shards before
	// the stream leaves the engine's list, which a fold walks.
	s.mc.flush()
	s.mu.Unlock()
	if s.held.Load() == 0 {
		s.once.Do(func() { close(s.idle) })
	}
	s.e.removeStream(s)
}

// Idle is closed once the stream is closed and no slot is held: no
// transport holds one of its tasks and the sink will not be called again.
func (s *Stream) Idle() <-chan struct{} { return s.idle }

// StreamStats are a stream's counters: tasks live now, slots held (live
// plus ended ones a transport still owes a Done), and cumulative ends.
type StreamStats struct {
	Live, Held                           int64
	Completed, Failed, Timeout, Canceled uint64
	Bytes                                uint64
}

// Stats returns the stream's counters.
func (s *Stream) Stats() StreamStats {
	return StreamStats{
		Live: s.live.Load(), Held: s.held.Load(),
		Completed: s.cnt[StateCompleted].Load(), Failed: s.cnt[StateFailed].Load(),
		Timeout: s.cnt[StateTimeout].Load(), Canceled: s.cnt[StateCanceled].Load(),
		Bytes: s.bytes.Load(),
	}
}
