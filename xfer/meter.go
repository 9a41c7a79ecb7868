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
// few uncontended atomic adds, never a lock or an allocation.

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
	// Latency is dispatch to Done, in nanoseconds; its count is Requests.
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

// epoch is the origin of the engine's meter clock: monotonic nanoseconds
// since process start, one vDSO clock read (time.Since of a monotonic time
// reads only the monotonic clock).
var epoch = time.Now()

func nanotime() int64 {
	if !metersOn {
		return 0
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

// ended records the Done of a task the meter dispatched.
func (s *meterShard) ended(start int64, n uint64, err error, code func(error) int) {
	if !metersOn {
		return
	}
	if err != nil {
		s.errored(err, code)
	}
	if n != 0 {
		s.bytes.Add(n)
	}
	d := nanotime() - start
	if d < 0 {
		d = 0
	}
	s.lat.Record(uint64(d))
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

func (r *meterRun) add(t *Task, n uint64, err error, code func(error) int) {
	if !metersOn {
		return
	}
	if t.ms != r.ms || t.start != r.start {
		r.flush()
		r.ms, r.start = t.ms, t.start
	}
	r.n++
	r.bytes += n
	if err != nil {
		t.ms.errored(err, code)
	}
}

func (r *meterRun) flush() {
	if !metersOn || r.n == 0 {
		return
	}
	if r.now == 0 {
		r.now = nanotime()
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
