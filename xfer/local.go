package xfer

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/faultcopy"
)

// LocalConfig sizes the local transport. Zero fields take their defaults.
type LocalConfig struct {
	// InlineBytes: a Submit whose tasks move at most this many bytes in
	// total is copied on the submitting goroutine, because handing work to
	// another goroutine costs tens of microseconds and, on a small host,
	// a second copying thread adds little memory bandwidth. Default 4 MiB
	// (a 16 × 64 KiB batch measured 0.52x of copy() through the workers and
	// 0.92x inline on 2 vCPUs); a negative value sends everything to the
	// workers. It also bounds what the submitting goroutine copies of a
	// larger Submit: that goroutine is a reactor's thread, which serves
	// other clients' queues, so one request of gigabytes must not hold it.
	InlineBytes int64
	// Workers is the number of copy goroutines (default GOMAXPROCS).
	Workers int
	// ChunkBytes: the worker path splits a request into chunks of at most
	// this size so that one large request spreads over the workers (default
	// 1 MiB: Go's copy streams chunks that large past the cache, which is
	// what a copy bigger than the cache wants).
	ChunkBytes int
	// QueueLen is how many chunks may wait for a worker in the queue
	// (default 64 per worker); the chunks of a Submit that finds it full go
	// to the backlog (one entry per task), which the workers drain too.
	QueueLen int
}

// Defaults of LocalConfig.
const (
	DefaultLocalInlineBytes = 4 << 20
	DefaultLocalChunkBytes  = 1 << 20
)

// Local is the `local` transport: it copies between two MemSegments (pool
// or client memory) in this process.
//
// Client buffers are memory the client can truncate or unmap under us, so
// every copy runs with runtime/debug.SetPanicOnFault(true) and a fault ends
// the task with ErrFault instead of crashing the daemon.
//
// A Submit larger than InlineBytes is split into chunks for the workers:
// they go to a bounded queue (a channel) and, when it is full, to the
// backlog, a ring of the tasks whose remaining chunks no worker has taken
// yet. Neither path waits for room, and the submitting goroutine copies at
// most InlineBytes of the call itself.
//
// Goroutines: Workers copy goroutines, started by NewLocal and owned by the
// Local. Close stops them: it refuses new Submits, closes the chunk queue,
// and waits until the workers have copied (and completed) every chunk
// already queued and every task in the backlog.
type Local struct {
	inline  uint64
	chunk   uint64
	workers int
	log     *slog.Logger
	queue   chan localChunk
	// wake tells a worker waiting on an empty queue to look at the
	// backlog. It is never closed; Submit sends to it without waiting
	// after it adds to the backlog.
	wake chan struct{}

	// mu guards closed. Submit holds it shared while it queues chunks and
	// adds to the backlog, so Close (which holds it exclusively to set
	// closed and close the queue) never closes the queue under a sender,
	// and nothing joins the backlog once the queue is closed.
	mu     sync.RWMutex
	closed bool

	// bmu guards the backlog: ring[head], ring[head+1], … (mod len(ring),
	// a power of two), spans of them. Workers take one chunk at a time
	// from the head span and move it to the back, so the tasks in the
	// backlog share the workers chunk by chunk.
	bmu   sync.Mutex
	ring  []localSpan
	head  int
	spans int
	// backlog mirrors spans for the readers that do not take bmu.
	backlog atomic.Int64

	wg     sync.WaitGroup // the workers
	faults atomic.Uint64  // tasks ended by ErrFault

	// chunkHook, when set (tests only, before the first Submit), is called
	// before each chunk is copied, with worker false on a submitting
	// goroutine.
	chunkHook func(worker bool, n uint64)
}

// localChunk is one piece of a task for a worker: n bytes at offset off
// of the task's request.
type localChunk struct {
	t      *Task
	off, n uint64
}

// localSpan is a task in the backlog: bytes [off, end) of its request are
// not yet handed to a worker. end is a copy of the request's length: once
// the last chunk is handed off the task may end and be reused, so a span
// never reads it.
type localSpan struct {
	t        *Task
	off, end uint64
}

// localRingKeep is the largest backlog ring kept once it is empty; a larger
// one (left by a burst) is dropped.
const localRingKeep = 1024

// Task.Tag layout on the worker path: the low bits count the task's chunks
// not yet copied; localFailed records that one of them faulted.
const (
	localFailed    = uint64(1) << 63
	localCountMask = localFailed - 1
)

var _ Transport = (*Local)(nil)

// NewLocal starts a local transport and its worker goroutines.
func NewLocal(cfg LocalConfig, log *slog.Logger) *Local {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.InlineBytes == 0 {
		cfg.InlineBytes = DefaultLocalInlineBytes
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = DefaultLocalChunkBytes
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 64 * cfg.Workers
	}
	l := &Local{
		chunk:   uint64(cfg.ChunkBytes),
		workers: cfg.Workers,
		log:     log,
		queue:   make(chan localChunk, cfg.QueueLen),
		wake:    make(chan struct{}, cfg.Workers),
	}
	if cfg.InlineBytes > 0 {
		l.inline = uint64(cfg.InlineBytes)
	}
	l.wg.Add(cfg.Workers)
	for range cfg.Workers {
		go l.worker()
	}
	log.Debug("xfer local transport started", "workers", cfg.Workers,
		"inline_bytes", cfg.InlineBytes, "chunk_bytes", cfg.ChunkBytes)
	return l
}

// Name is "local".
func (l *Local) Name() string { return "local" }

// Faults is the number of tasks that ended with ErrFault.
func (l *Local) Faults() uint64 { return l.faults.Load() }

// Submit takes every task (it only refuses work once closed: 0,
// ErrClosed). A task whose segments are not MemSegments ends with
// ErrNotSupported, one out of their bounds with ErrOutOfBounds, one that
// carries a notification (Task.Notify) with ErrNoNotify, which matches
// ErrNotSupported: a local copy has nobody to deliver it to. Small
// submits are copied before Submit returns; larger ones are split into
// chunks for the workers, of which the submitting goroutine copies at most
// InlineBytes (it never waits for queue room).
func (l *Local) Submit(tasks []*Task) (int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	var total uint64
	for _, t := range tasks {
		total += t.Req.Length
		if total < t.Req.Length { // overflow: certainly not inline
			total = ^uint64(0)
			break
		}
	}
	if total <= l.inline {
		l.copyInline(tasks)
		return len(tasks), nil
	}
	// Queue the chunks for the workers and help them, up to InlineBytes
	// in all: the call's first chunk, chunks that find the queue full, and
	// queued chunks taken back. A wake-up of a worker costs tens of
	// microseconds here, so a request of a few chunks is mostly copied by
	// its submitter, and a large batch spreads over every core. What the
	// help does not cover goes to the workers, by the queue or, once it is
	// full, the backlog: the submitting goroutine is a reactor's thread,
	// and one client's request of gigabytes must not hold the other
	// clients' queues there.
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	help := l.inline
	// The call's first chunk is kept back and copied here: a send to an
	// idle worker hands the chunk straight to it, and a call of one chunk
	// would then pay a cross-CPU wake-up for nothing.
	var first localChunk
	queued, deferred := 0, false
	for _, t := range tasks {
		if _, _, err := checkedSpans(t, 0, t.Req.Length); err != nil {
			t.Done(0, err)
			continue
		}
		if t.Req.Length == 0 {
			t.Done(0, nil) // no chunk would end it
			continue
		}
		// t may end (and be reused) as soon as its last chunk is handed
		// off, so the loop reads nothing of t after that.
		length := t.Req.Length
		atomic.StoreUint64(&t.Tag, (length+l.chunk-1)/l.chunk)
		for off := uint64(0); off < length; {
			c := localChunk{t: t, off: off, n: min(l.chunk, length-off)}
			if first.t == nil && c.n <= help {
				first = c
				help -= c.n
				off += c.n
				continue
			}
			// While the backlog holds tasks, new chunks join it rather
			// than pass it in the queue.
			if l.backlog.Load() == 0 {
				select {
				case l.queue <- c:
					queued++
					off += c.n
					continue
				default:
				}
			}
			if c.n <= help {
				help -= c.n
				off += c.n
				l.runChunk(c, false)
				continue
			}
			l.addBacklog(t, off, length)
			deferred = true
			break
		}
	}
	if deferred {
		// A worker that saw the backlog empty may be waiting on an empty
		// queue.
		for range l.workers {
			select {
			case l.wake <- struct{}{}:
			default:
			}
		}
	}
	if first.t != nil {
		l.runChunk(first, false)
	}
	for ; queued > 0 && help >= l.chunk; queued-- {
		select {
		case c := <-l.queue:
			help -= c.n
			l.runChunk(c, false)
		default:
			return len(tasks), nil
		}
	}
	return len(tasks), nil
}

// addBacklog adds bytes [off, end) of t's request to the backlog. The caller
// holds mu shared.
func (l *Local) addBacklog(t *Task, off, end uint64) {
	l.bmu.Lock()
	defer l.bmu.Unlock()
	if l.spans == len(l.ring) {
		ring := make([]localSpan, max(16, 2*len(l.ring)))
		for i := range l.spans {
			ring[i] = l.ring[(l.head+i)&(len(l.ring)-1)]
		}
		l.ring, l.head = ring, 0
	}
	l.ring[(l.head+l.spans)&(len(l.ring)-1)] = localSpan{t: t, off: off, end: end}
	l.spans++
	l.backlog.Store(int64(l.spans))
}

// takeBacklog hands out the next chunk of the backlog's head task and moves
// that task to the back; false when the backlog is empty.
func (l *Local) takeBacklog() (localChunk, bool) {
	if l.backlog.Load() == 0 {
		return localChunk{}, false
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	if l.spans == 0 {
		return localChunk{}, false
	}
	mask := len(l.ring) - 1
	s := &l.ring[l.head]
	c := localChunk{t: s.t, off: s.off, n: min(l.chunk, s.end-s.off)}
	s.off += c.n
	switch {
	case s.off == s.end:
		*s = localSpan{}
		l.spans--
	case l.spans < len(l.ring):
		l.ring[(l.head+l.spans)&mask] = *s
		*s = localSpan{}
	}
	// (A full ring's head span is already at the back once head moves.)
	l.head = (l.head + 1) & mask
	if l.spans == 0 && len(l.ring) > localRingKeep {
		l.ring, l.head = nil, 0
	}
	l.backlog.Store(int64(l.spans))
	return c, true
}

func (l *Local) copyInline(tasks []*Task) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	for _, t := range tasks {
		dst, src, err := checkedSpans(t, 0, t.Req.Length)
		if err == nil {
			err = copyGuarded(dst, src)
		}
		if err != nil {
			if err == ErrFault {
				l.faults.Add(1)
			}
			t.Done(0, err)
			continue
		}
		t.Done(t.Req.Length, nil)
	}
}

// worker copies chunks from the queue and the backlog until Close has
// closed the queue and both are empty. The last chunk of a task to finish
// ends the task.
func (l *Local) worker() {
	defer l.wg.Done()
	debug.SetPanicOnFault(true)
	for {
		c, ok := l.next()
		if !ok {
			return
		}
		l.runChunk(c, true)
	}
}

// next returns a worker's next chunk: from the queue while it has one (a
// Submit puts nothing there while the backlog holds tasks, so the queue
// drains), else from the backlog, else the first that either gets. false
// once the queue is closed and the backlog empty: Close closes the queue
// only when no Submit can add to the backlog.
func (l *Local) next() (localChunk, bool) {
	for {
		select {
		case c, ok := <-l.queue:
			if !ok {
				return l.takeBacklog()
			}
			return c, true
		default:
		}
		if c, ok := l.takeBacklog(); ok {
			return c, true
		}
		// A Submit that adds to the backlog after the look above sends on
		// wake, or finds wake full of sends this worker has not yet taken.
		select {
		case c, ok := <-l.queue:
			if !ok {
				return l.takeBacklog()
			}
			return c, true
		case <-l.wake:
		}
	}
}

// runChunk copies one chunk; the last chunk of a task to finish ends the
// task. The goroutine has SetPanicOnFault on.
func (l *Local) runChunk(c localChunk, worker bool) {
	if l.chunkHook != nil {
		l.chunkHook(worker, c.n)
	}
	t := c.t
	dst, src, err := spans(t, c.off, c.n)
	if err == nil {
		err = copyGuarded(dst, src)
	}
	if err != nil {
		atomic.OrUint64(&t.Tag, localFailed)
	}
	left := atomic.AddUint64(&t.Tag, ^uint64(0))
	if left&localCountMask != 0 {
		return
	}
	if left&localFailed != 0 {
		l.faults.Add(1)
		t.Done(0, ErrFault)
	} else {
		t.Done(t.Req.Length, nil)
	}
}

// Cancel is a no-op: a local copy ends within its chunk's copy time.
func (l *Local) Cancel(*Task) {}

// Close refuses new work, lets the workers finish every queued chunk and
// every task in the backlog (so every dispatched task gets its Done) and
// stops them. It is idempotent and safe to call concurrently with Submit.
func (l *Local) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	l.wg.Wait()
	return nil
}

// checkedSpans is spans for a task as it arrives: one that carries a
// notification is refused.
func checkedSpans(t *Task, off, n uint64) (dst, src []byte, err error) {
	if t.Notify != nil {
		return nil, nil, ErrNoNotify
	}
	return spans(t, off, n)
}

// spans returns the destination and source of bytes [off, off+n) of t's
// request, checked against the segments' mappings.
func spans(t *Task, off, n uint64) (dst, src []byte, err error) {
	lm, ok := t.Local.(MemSegment)
	if !ok {
		return nil, nil, ErrNotSupported
	}
	tm, ok := t.Target.(MemSegment)
	if !ok {
		return nil, nil, ErrNotSupported
	}
	q := &t.Req
	lb, tb := lm.Bytes(), tm.Bytes()
	if q.LocalOffset > uint64(len(lb)) || q.TargetOffset > uint64(len(tb)) ||
		q.Length > uint64(len(lb))-q.LocalOffset || q.Length > uint64(len(tb))-q.TargetOffset ||
		off > q.Length || n > q.Length-off {
		return nil, nil, ErrOutOfBounds
	}
	lo, to := q.LocalOffset+off, q.TargetOffset+off
	switch q.Op {
	case OpRead:
		return lb[lo : lo+n], tb[to : to+n], nil
	case OpWrite:
		return tb[to : to+n], lb[lo : lo+n], nil
	}
	return nil, nil, ErrBadOp
}

// copyGuarded copies src to dst and turns a memory fault (the goroutine
// must have SetPanicOnFault on) into ErrFault.
func copyGuarded(dst, src []byte) error {
	if !faultcopy.Copy(dst, src) {
		return ErrFault
	}
	return nil
}
