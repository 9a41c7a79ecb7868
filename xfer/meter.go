package xfer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/loghist"
)

// Per-transport meters: what the engine saw each transport do, folded by
// Engine.TransportStats at scrape time (metrics, tcctl). The hot path pays
// for them as little as it can:
//
//   - Counts (dispatched, refused, ended inside their submit call, their
//     bytes) are kept per submitter, a batch slot or a stream, in plain
//     fields beside its meterCache, under the lock that already serializes
//     its submit calls. They go to the transport's shared atomics only when
//     the submitter dispatches to another transport, its stream closes or
//     its tainted batch object is replaced, or a fold takes the
//     submitter's lock to collect them. A lone request that ends inside
//     Submit thus costs no atomic operation at all. (Fewer atomics per
//     call, an end counted without its dispatch for instance, would let a
//     fold racing an asynchronous Done see more ends than dispatches; the
//     submitter's lock orders them instead.)
//   - A Done after Submit returned (on whatever goroutine) adds to its
//     meter shard's atomics: the task's end, its bytes, its error's code.
//     A meter is split into meterShards shards, one per group of
//     submitters, so that completions on different cores do not share a
//     cache line.
//   - Latency is sampled: about one submit call in SampleEvery, picked at
//     random per submitter (see SampleEvery), times its tasks, those ending inside Submit
//     (one clock reading for the call) and those ending later (one per
//     Done) alike. A task's start is its call's clock reading, the one its
//     deadline is taken from; a task of an unsampled call carries start 0
//     and no clock is read for it. Requests, Bytes, Errors and InFlight
//     stay exact; only the histogram is a sample.
//
// The fold is exact: it reads the shards' Done counts, then takes every
// submitter's lock in turn to move its counts to the shards, then reads
// the rest. Every task whose Done it counted was dispatched before, and
// that dispatch is in a submitter's counts or already in a shard's by the
// time the submitter's lock is taken, so InFlight never goes below zero.
// The price is that a scrape waits out a submit call in progress on each
// submitter, never the other way round for longer than a few adds.

// MaxErrorCodes bounds the codes Config.ErrorCode may return.
const MaxErrorCodes = 16

// maxMeters bounds the distinct transport names metered; further names
// share the last meter, named "other".
const maxMeters = 16

const meterShards = 8

// SampleEvery: about one submit call in SampleEvery has its tasks'
// latencies recorded in TransportStats.Latency. The gaps between sampled
// calls are drawn from its submitter's pseudo-random sequence (nextGap),
// not every SampleEvery-th call, so that a client whose calls follow a
// period (a read, then a write) is sampled across its whole pattern.
const SampleEvery = 1 << sampleShift

const sampleShift = 6

// TransportStats is one transport's counters as the engine saw them.
type TransportStats struct {
	Name string
	// Requests is the number of tasks the transport ended (its Done calls),
	// Bytes the bytes those reported moved.
	Requests, Bytes uint64
	// Refused counts tasks the transport did not take at dispatch (Submit
	// returned fewer than it was given).
	Refused uint64
	// InFlight is the number of dispatched tasks whose Done has not come.
	InFlight uint64
	// Errors counts ended tasks by Config.ErrorCode of their error.
	Errors [MaxErrorCodes]uint64
	// Latency is from the submit call that dispatched the task to its
	// Done, in nanoseconds, for the tasks of a sample of the submit calls:
	// about one in SampleEvery, every task of a sampled call. Its count is
	// therefore about Requests/SampleEvery, not Requests. A call's tasks
	// share its start: the clock reading it takes for its deadlines, before
	// it resolves and routes them.
	Latency loghist.Snapshot
}

// meterShard is one shard of a transport's counters.
type meterShard struct {
	dispatched atomic.Uint64 // tasks Submit took
	refused    atomic.Uint64
	inline     atomic.Uint64 // tasks that ended inside their submit call
	done       atomic.Uint64 // tasks whose Done came after their submit call
	bytes      atomic.Uint64
	errs       [MaxErrorCodes]atomic.Uint64
	lat        loghist.Hist // the sampled calls' tasks
	_          [64]byte     // keeps the next shard's hot words off this one's lines
}

// meter is one transport name's counters.
type meter struct {
	name   string
	shards [meterShards]meterShard
}

// meterTable maps transport names to meters. Lookups read an immutable
// slice without a lock; a new name copies it.
type meterTable struct {
	list atomic.Pointer[[]*meter]
	// mu serializes additions.
	mu sync.Mutex
}

// get returns the meter of the transport named name.
func (mt *meterTable) get(name string) *meter {
	if l := mt.list.Load(); l != nil {
		for _, m := range *l {
			if m.name == name {
				return m
			}
		}
	}
	mt.mu.Lock()
	defer mt.mu.Unlock()
	var old []*meter
	if l := mt.list.Load(); l != nil {
		old = *l
	}
	for _, m := range old {
		if m.name == name {
			return m
		}
	}
	if len(old) == maxMeters {
		return old[maxMeters-1]
	}
	if len(old) == maxMeters-1 {
		name = "other"
	}
	m := &meter{name: name}
	l := append(old[:len(old):len(old)], m)
	mt.list.Store(&l)
	return m
}

// meterCache is one submitter's (a batch slot's or a stream's) meter
// state: its last transport and that transport's meter shard, so that a
// dispatch group to the transport of the one before skips the lookup by
// name; the counts of that shard not yet added to its atomics; and the
// sampler's state. It is guarded by the submitter's lock (batch.mu,
// Stream.mu); it keeps that transport reachable until another replaces
// it.
type meterCache struct {
	tr Transport
	ms *meterShard
	// Counts for ms, moved to its atomics by flush.
	sent, refused, inline, bytes uint64
	// gap is how many submit calls are left until the next sampled one;
	// rng (a 64-bit LCG) draws each gap when a call is sampled.
	gap uint32
	rng uint64
}

// shard returns the shard i of tr's meter, first flushing the counts of
// the transport before; nil without the meters.
func (c *meterCache) shard(mt *meterTable, tr Transport, i uint32) *meterShard {
	if !metersOn {
		return nil
	}
	if c.ms == nil || c.tr != tr {
		c.flush()
		c.tr, c.ms = tr, &mt.get(tr.Name()).shards[i%meterShards]
	}
	return c.ms
}

// flush adds the submitter's counts to its shard's atomics. Dispatched
// counts go first: a fold reads inline ends before dispatched ones, so
// it never sees an end without its dispatch.
func (c *meterCache) flush() {
	if !metersOn || c.ms == nil {
		return
	}
	if c.sent != 0 {
		c.ms.dispatched.Add(c.sent)
	}
	if c.refused != 0 {
		c.ms.refused.Add(c.refused)
	}
	if c.inline != 0 {
		c.ms.inline.Add(c.inline)
	}
	if c.bytes != 0 {
		c.ms.bytes.Add(c.bytes)
	}
	c.sent, c.refused, c.inline, c.bytes = 0, 0, 0, 0
}

// dispatched counts, for the group just handed to the transport of the
// current shard, the tasks it took and those it refused.
func (c *meterCache) dispatched(took, refused int) {
	if metersOn {
		c.sent += uint64(took)
		c.refused += uint64(refused)
	}
}

// seed starts the sampler's sequence for the submitter numbered i.
func (c *meterCache) seed(i uint64) {
	// splitmix64's finalizer spreads consecutive numbers over the state.
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	c.rng = z ^ z>>31
	c.nextGap()
}

// nextGap draws the calls until the next sampled one: uniform in
// 1..2*SampleEvery-1, so one call in SampleEvery is sampled on average,
// at gaps that follow no period.
func (c *meterCache) nextGap() {
	c.rng = c.rng*6364136223846793005 + 1442695040888963407
	c.gap = 1 + uint32(c.rng>>32)%(2*SampleEvery-1)
}

// start is the meter start of the submit call about to dispatch, whose
// clock reading is now: now on the meter clock (at least 1) when the
// sampler picks the call, 0 (not timed) when it does not.
func (c *meterCache) start(e *Engine, now time.Time) int64 {
	if !metersOn {
		return 0
	}
	if e.sample != nil {
		if !e.sample() {
			return 0
		}
	} else if c.gap > 1 {
		c.gap-- // the common case: one compare and one decrement
		return 0
	} else {
		c.nextGap()
	}
	return max(meterTime(now), 1)
}

// epoch is the origin of the engine's meter clock: monotonic nanoseconds
// since process start.
var epoch = time.Now()

// meterTime is t on the meter clock. t must carry a monotonic reading (as
// time.Now's do): the difference is then taken from the monotonic readings
// alone, with no clock read.
func meterTime(t time.Time) int64 { return int64(t.Sub(epoch)) }

// now is the engine's clock: time.Now, or the clock a test injected.
func (e *Engine) now() time.Time {
	if e.clock != nil {
		return e.clock()
	}
	return time.Now()
}

// meterNow reads the meter clock: one vDSO clock read (time.Since of a
// monotonic time reads only the monotonic clock), none without the meters.
func (e *Engine) meterNow() int64 {
	if !metersOn {
		return 0
	}
	if e.clock != nil {
		return meterTime(e.clock())
	}
	return int64(time.Since(epoch))
}

// ended records the Done, after its submit call, of a task the meter
// shard ms dispatched at start (on the meter clock; 0 when its call was
// not sampled, and then no clock is read).
func (e *Engine) ended(ms *meterShard, start int64, n uint64, err error) {
	if !metersOn {
		return
	}
	if err != nil {
		ms.errored(err, e.cfg.ErrorCode)
	}
	if n != 0 {
		ms.bytes.Add(n)
	}
	ms.done.Add(1)
	if start != 0 {
		d := e.meterNow() - start
		if d < 0 {
			d = 0
		}
		ms.lat.Record(uint64(d))
	}
}

// meterRun meters, in the submit call's publish loop, the tasks whose Done
// came while they were being dispatched (inline completions). All tasks of
// a call share its start, so consecutive tasks of one meter shard share a
// latency: a run of a sampled call costs one clock reading for the call
// and two atomic adds however long it is. The counts of a run on the
// submitter's current shard go to its meterCache (no atomic); those of a
// shard dispatched to earlier in the call, to that shard's atomics.
type meterRun struct {
	start    int64 // the call's meter start (0: not sampled)
	now      int64 // 0 until a sampled run needs it
	ms       *meterShard
	n, bytes uint64
}

func (r *meterRun) add(e *Engine, c *meterCache, t *Task, n uint64, err error) {
	if !metersOn {
		return
	}
	if t.ms != r.ms {
		r.flush(e, c)
		r.ms = t.ms
	}
	r.n++
	r.bytes += n
	if err != nil {
		t.ms.errored(err, e.cfg.ErrorCode)
	}
}

// flush meters the run so far.
func (r *meterRun) flush(e *Engine, c *meterCache) {
	if !metersOn || r.n == 0 {
		return
	}
	if r.start != 0 {
		if r.now == 0 {
			r.now = e.meterNow()
		}
		d := max(r.now-r.start, 0)
		r.ms.lat.RecordN(uint64(d), r.n)
	}
	if r.ms == c.ms {
		c.inline += r.n
		c.bytes += r.bytes
	} else {
		r.ms.inline.Add(r.n)
		if r.bytes != 0 {
			r.ms.bytes.Add(r.bytes)
		}
	}
	r.n, r.bytes = 0, 0
}

// errored counts one task's error under its code.
func (s *meterShard) errored(err error, code func(error) int) {
	c := 0
	if code != nil {
		c = code(err)
	}
	if c < 0 || c >= MaxErrorCodes {
		c = MaxErrorCodes - 1
	}
	s.errs[c].Add(1)
}

// TransportStats folds every transport meter, in the order the transports
// were first dispatched to. It takes every batch slot's and stream's lock
// in turn (waiting out a submit call in progress there): it is meant for
// scrapes, not hot paths.
func (e *Engine) TransportStats() []TransportStats {
	l := e.meters.list.Load()
	if l == nil {
		return nil
	}
	out := make([]TransportStats, len(*l))
	// Ends after the submit call are read before the submitters' counts
	// are collected (meter.go's header says why InFlight then never goes
	// below zero); the rest after.
	done := make([]uint64, len(*l))
	for i, m := range *l {
		for j := range m.shards {
			done[i] += m.shards[j].done.Load()
		}
	}
	e.flushMeters()
	for i, m := range *l {
		st := &out[i]
		st.Name = m.name
		var dispatched, inline uint64
		for j := range m.shards {
			s := &m.shards[j]
			inline += s.inline.Load() // before dispatched: see meterCache.flush
		}
		for j := range m.shards {
			s := &m.shards[j]
			dispatched += s.dispatched.Load()
			st.Refused += s.refused.Load()
			st.Bytes += s.bytes.Load()
			for c := range s.errs {
				st.Errors[c] += s.errs[c].Load()
			}
			s.lat.AddTo(&st.Latency)
		}
		st.Requests = done[i] + inline
		if dispatched >= st.Requests {
			st.InFlight = dispatched - st.Requests
		} else if invariants.Enabled {
			panic("xfer: invariant: a transport ended more tasks than it was given")
		}
	}
	return out
}

// flushMeters moves every submitter's meter counts to the shared shards,
// under each submitter's lock in turn. A stream closed meanwhile flushed
// its own before it left e.streams; a batch object replaced in its slot
// (tainted), before it was replaced.
func (e *Engine) flushMeters() {
	if !metersOn {
		return
	}
	e.mu.Lock()
	n := int(e.nextSlot)
	streams := make([]*Stream, 0, len(e.streams))
	for s := range e.streams {
		streams = append(streams, s)
	}
	e.mu.Unlock()
	for i := 0; i < n; i++ {
		if b := e.slots[i].Load(); b != nil {
			b.mu.Lock()
			b.mc.flush()
			b.mu.Unlock()
		}
	}
	for _, s := range streams {
		s.mu.Lock()
		s.mc.flush()
		s.mu.Unlock()
	}
}
