package bench

import (
	"fmt"
	"log/slog"

	"github.com/tensorcast/tensorcast/xfer"
)

// IO is one request the runner hands an engine. Slot names the client
// buffer it uses (0..Slots-1) and is also its identity until it completes.
type IO struct {
	Op     Op
	Slot   int
	Offset uint64 // in the worker's region of the target
	Length uint64
}

// Completion is the end of one IO.
type Completion struct {
	Slot int
	N    uint64
	Err  error
}

// EngineSpec is what a worker asks of its engine at Open.
type EngineSpec struct {
	Job      *Job
	Worker   int    // clone index within the job (numjobs)
	Slots    int    // buffers in flight at most (iodepth)
	SlotSize uint64 // bytes per buffer (the largest block size)
	Region   uint64 // bytes of target the worker addresses (size)
}

// Engine is the small interface the runner drives: open, submit requests,
// reap completions, close. One engine value serves one worker goroutine and
// is not used concurrently.
type Engine interface {
	Name() string
	Open(spec EngineSpec) error
	// Buffer is the client-side buffer of slot (SlotSize bytes): the
	// source of writes and the destination of reads.
	Buffer(slot int) []byte
	// Submit queues ios; it returns how many it took (ios[n:] were not
	// submitted) and why it stopped when n < len(ios).
	Submit(ios []IO) (n int, err error)
	// Reap waits until at least min completions are available and fills
	// out with up to len(out) of them.
	Reap(min int, out []Completion) (int, error)
	Close() error
}

// Peeker is implemented by engines whose target bytes are visible to the
// client (a mapped pool, an in-process region); verify=crc32c uses it to
// check writes where they landed.
type Peeker interface {
	Peek(off, n uint64) ([]byte, error)
}

// Synchronous is implemented by engines whose Submit completes the requests
// before it returns (fio's sync engines): their whole latency is reported as
// completion latency and no submission latency is recorded.
type Synchronous interface {
	Synchronous() bool
}

// Prefiller is implemented by engines that can lay out the target region
// faster than bs-sized requests. Prefill writes the verify pattern of seed
// over the region; when needPattern is false it may instead only make sure
// the region exists at full size.
type Prefiller interface {
	Prefill(seed uint64, needPattern bool) error
}

// Env is what engines need from the harness.
type Env struct {
	// Socket overrides every job's daemon option (set by --spawn).
	Socket string
	// PeerSocket, when set, is the daemon tcp and rdma jobs are clients
	// of (--spawn's daemon B) instead of each job's daemon option.
	PeerSocket string
	// PeerTarget is the target of tcp and rdma jobs that name none.
	PeerTarget string
	// TargetMem holds the targets this process exported (--spawn), by
	// name, as mapped here: prefill and write verification use them
	// directly. Read-only once the run starts.
	TargetMem map[string][]byte
	// RDMADevice and RDMAGID, when set, are given to perftest (-d, and -x
	// for a GID index) by rdma baselines.
	RDMADevice string
	RDMAGID    string
	Logger     *slog.Logger
}

func (e *Env) socket(j *Job) string {
	if e != nil && e.Socket != "" {
		return e.Socket
	}
	return j.Daemon
}

// EngineFactory makes an engine for one worker of job.
type EngineFactory func(env *Env, job *Job) (Engine, error)

// engines maps engine names to their factories; names without one are
// known but not available in this build.
var engines = map[string]EngineFactory{
	"mem": func(*Env, *Job) (Engine, error) { return &memEngine{}, nil },
}

// unavailable says why a known engine cannot run yet.
var unavailable = map[string]string{
	"local": "the tensorcast client library is not wired into this build",
	"uring": "the uring engine is not wired into this build",
	"tcp":   "tensorcastd does not connect to tcp peers yet (no peer configuration); a tcp job needs two connected daemons",
	"rdma":  "tensorcastd does not connect to rdma peers yet; an rdma job needs two connected daemons on an RDMA device",
}

// NewEngine makes an engine for job, or explains why it cannot.
func NewEngine(env *Env, job *Job) (Engine, error) {
	f, ok := engines[job.Engine]
	if !ok {
		why := unavailable[job.Engine]
		if why == "" {
			why = "unknown engine"
		}
		return nil, fmt.Errorf("%w: engine %q: %s", ErrEngineUnavailable, job.Engine, why)
	}
	return f(env, job)
}

// EngineAvailable reports whether NewEngine can make job's engine.
func EngineAvailable(name string) error {
	if _, ok := engines[name]; ok {
		return nil
	}
	why := unavailable[name]
	if why == "" {
		why = "unknown engine"
	}
	return fmt.Errorf("%w: engine %q: %s", ErrEngineUnavailable, name, why)
}

// memEngine copies between in-process buffers and an in-process region: the
// harness's own cost, and what its tests drive without a daemon.
type memEngine struct {
	region []byte
	bufs   [][]byte
	done   []Completion // completed, not reaped; preallocated to Slots
}

var _ Engine = (*memEngine)(nil)
var _ Peeker = (*memEngine)(nil)

func (m *memEngine) Name() string { return "mem" }

// MaxMemRegion bounds the bytes an in-process region (the mem engine, the
// memcpy reference) may take per clone.
const MaxMemRegion = 8 << 30

func (m *memEngine) Open(s EngineSpec) error {
	if s.Region > MaxMemRegion || uint64(s.Slots)*s.SlotSize > MaxMemRegion {
		return fmt.Errorf("%w: in-process region of %d bytes is more than %d", ErrBadValue, s.Region, uint64(MaxMemRegion))
	}
	m.region = make([]byte, s.Region)
	// Touch every page now so first-write faults are not measured.
	for i := 0; i < len(m.region); i += 4096 {
		m.region[i] = 1
	}
	m.bufs = make([][]byte, s.Slots)
	for i := range m.bufs {
		m.bufs[i] = make([]byte, s.SlotSize)
	}
	m.done = make([]Completion, 0, s.Slots)
	return nil
}

func (m *memEngine) Synchronous() bool { return true }

func (m *memEngine) Buffer(slot int) []byte { return m.bufs[slot] }

func (m *memEngine) Submit(ios []IO) (int, error) {
	for i, io := range ios {
		if io.Slot < 0 || io.Slot >= len(m.bufs) || io.Offset > uint64(len(m.region)) ||
			io.Length > uint64(len(m.region))-io.Offset || io.Length > uint64(len(m.bufs[io.Slot])) ||
			len(m.done) == cap(m.done) {
			return i, fmt.Errorf("%w: mem engine: request out of bounds", ErrBadValue)
		}
		buf := m.bufs[io.Slot][:io.Length]
		dst := m.region[io.Offset : io.Offset+io.Length]
		switch io.Op {
		case OpRead:
			copy(buf, dst)
		case OpWrite:
			copy(dst, buf)
		default:
			return i, fmt.Errorf("%w: mem engine: bad op", ErrBadValue)
		}
		m.done = append(m.done, Completion{Slot: io.Slot, N: io.Length})
	}
	return len(ios), nil
}

func (m *memEngine) Reap(min int, out []Completion) (int, error) {
	n := copy(out, m.done)
	m.done = append(m.done[:0], m.done[n:]...)
	return n, nil
}

func (m *memEngine) Peek(off, n uint64) ([]byte, error) {
	if off > uint64(len(m.region)) || n > uint64(len(m.region))-off {
		return nil, fmt.Errorf("%w: mem engine: peek out of bounds", ErrBadValue)
	}
	return m.region[off : off+n], nil
}

func (m *memEngine) Close() error {
	m.region, m.bufs, m.done = nil, nil, nil
	return nil
}

// Op is a request's direction, the transfer engine's own: a read moves
// target → client buffer, a write client buffer → target.
type Op = xfer.Op

// The two directions.
const (
	OpRead  = xfer.OpRead
	OpWrite = xfer.OpWrite
)
