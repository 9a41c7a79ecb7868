package xfer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/loghist"
)

// Per-transport meters: what the engine saw each transport do, recorded on
// the dispatch and completion paths and folded by Engine.TransportStats
// (metrics scrapes, tcctl). A meter is split into meterShards shards, one
// per group of batch slots, so that completions of different clients'
// batches on different cores do not share a cache line; each record is a
// few uncontended atomic adds, never a lock or an allocation. A task's
// start is its submit call's clock reading (the one its deadline is taken
// from), so dispatch reads no clock; its end is read once per Done, or once
// per submit call for the tasks that end inside it.

// MaxErrorCodes bounds the codes Config.ErrorCode may return.
const MaxErrorCodes = 16

// maxMeters bounds the distinct transport names metered; further names
// share the last meter, named "other".
const maxMeters = 16

const meterShards = 8

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
	// Done, in nanoseconds; its count is Requests. A call's tasks share
	// its start: the clock reading it takes for its deadlines, before it
	// resolves and routes them.
	Latency loghist.Snapshot
}

// meterShard is one shard of a transport's counters.
type meterShard struct {
	dispatched atomic.Uint64 // tasks handed to Submit, less those it refused
	refused    atomic.Uint64
	bytes      atomic.Uint64
	errs       [MaxErrorCodes]atomic.Uint64
	lat        loghist.Hist // one count per Done: the number of ended tasks
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

// meterCache is one submitter's (a batch slot's or a stream's) last
// transport and its meter, so that a dispatch group to the transport of the
// one before skips the lookup by name. It is guarded by the submitter's
// lock; it keeps that transport reachable until another replaces it.
type meterCache struct {
	tr Transport
	m  *meter
}

// shard returns the shard i of tr's meter; nil without the meters.
func (c *meterCache) shard(mt *meterTable, tr Transport, i uint32) *meterShard {
	if !metersOn {
		return nil
	}
	if c.m == nil || c.tr != tr {
		c.tr, c.m = tr, mt.get(tr.Name())
	}
	return &c.m.shards[i%meterShards]
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

// sent counts n tasks handed to the transport's Submit.
func (s *meterShard) sent(n uint64) {
	if metersOn {
		s.dispatched.Add(n)
	}
}

// refuse moves n tasks the transport's Submit refused from dispatched to
// refused.
func (s *meterShard) refuse(n uint64) {
	if metersOn && n > 0 {
		s.dispatched.Add(-n)
		s.refused.Add(n)
	}
}

// ended records the Done of a task the meter shard ms dispatched at start
// (on the meter clock), read here once per Done.
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
	d := e.meterNow() - start
	if d < 0 {
		d = 0
	}
	ms.lat.Record(uint64(d))
}

// meterRun meters, in the submit call's publish loop, the tasks whose Done
// came while they were being dispatched (inline completions): consecutive
// tasks of one meter shard and one dispatch time share a latency, so a run
// costs one clock reading and three atomic adds however long it is.
type meterRun struct {
	ms       *meterShard
	start    int64
	now      int64 // 0 until the first task needs it
	n, bytes uint64
}

func (r *meterRun) add(e *Engine, t *Task, n uint64, err error) {
	if !metersOn {
		return
	}
	if t.ms != r.ms || t.start != r.start {
		r.flush(e)
		r.ms, r.start = t.ms, t.start
	}
	r.n++
	r.bytes += n
	if err != nil {
		t.ms.errored(err, e.cfg.ErrorCode)
	}
}

func (r *meterRun) flush(e *Engine) {
	if !metersOn || r.n == 0 {
		return
	}
	if r.now == 0 {
		r.now = e.meterNow()
	}
	d := r.now - r.start
	if d < 0 {
		d = 0
	}
	r.ms.lat.RecordN(uint64(d), r.n)
	if r.bytes != 0 {
		r.ms.bytes.Add(r.bytes)
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
// were first dispatched to. It is meant for scrapes, not hot paths.
func (e *Engine) TransportStats() []TransportStats {
	l := e.meters.list.Load()
	if l == nil {
		return nil
	}
	out := make([]TransportStats, len(*l))
	for i, m := range *l {
		st := &out[i]
		st.Name = m.name
		// Ended counts are read before dispatched ones: every task ended
		// was dispatched first, so InFlight never goes below zero.
		for j := range m.shards {
			m.shards[j].lat.AddTo(&st.Latency)
		}
		var dispatched uint64
		for j := range m.shards {
			s := &m.shards[j]
			dispatched += s.dispatched.Load()
			st.Refused += s.refused.Load()
			st.Bytes += s.bytes.Load()
			for c := range s.errs {
				st.Errors[c] += s.errs[c].Load()
			}
		}
		st.Requests = st.Latency.Count()
		if dispatched > st.Requests {
			st.InFlight = dispatched - st.Requests
		}
	}
	return out
}
