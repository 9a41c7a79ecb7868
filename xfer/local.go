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
	// workers.
	InlineBytes int64
	// Workers is the number of copy goroutines (default GOMAXPROCS).
	Workers int
	// ChunkBytes: the worker path splits a request into chunks of at most
	// this size so that one large request spreads over the workers (default
	// 1 MiB: Go's copy streams chunks that large past the cache, which is
	// what a copy bigger than the cache wants).
	ChunkBytes int
	// QueueLen is how many chunks may wait for a worker; a Submit that
	// finds the queue full copies the chunk itself (default 64 per worker).
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
// Goroutines: Workers copy goroutines, started by NewLocal and owned by the
// Local. Close stops them: it refuses new Submits, closes the chunk queue,
// and waits until the workers have copied (and completed) every chunk
// already queued.
type Local struct {
	inline  uint64
	chunk   uint64
	workers int
	log     *slog.Logger
	queue   chan localChunk

	// mu guards closed. Submit holds it shared while it queues chunks, so
	// Close (which holds it exclusively to set closed and close the queue)
	// never closes the queue under a sender.
	mu     sync.RWMutex
	closed bool

	wg     sync.WaitGroup // the workers
	faults atomic.Uint64  // tasks ended by ErrFault
}

// localChunk is one piece of a task for a worker: Length bytes at offset
// off of the task's request.
type localChunk struct {
	t      *Task
	off, n uint64
}

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
// chunks queued for the workers, which the submitting goroutine helps copy
// (it never waits for queue room).
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
	// Queue the chunks for the workers, then help them: the submitting
	// goroutine copies queued chunks itself until it has done as many as it
	// queued or the queue is empty. A wake-up of a worker costs tens of
	// microseconds here, so a lone large request is mostly copied by its
	// submitter, and a large batch spreads over every core. A full queue is
	// not waited on: the chunk is copied here instead.
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	// The call's first chunk is kept back and copied here: a send to an
	// idle worker hands the chunk straight to it, and a call of one chunk
	// would then pay a cross-CPU wake-up for nothing.
	var first localChunk
	queued := 0
	for _, t := range tasks {
		if _, _, err := checkedSpans(t, 0, t.Req.Length); err != nil {
			t.Done(0, err)
			continue
		}
		// t may end (and be reused) as soon as its last chunk is queued,
		// so the loop reads nothing of t after that.
		length := t.Req.Length
		atomic.StoreUint64(&t.Tag, (length+l.chunk-1)/l.chunk)
		for off := uint64(0); off < length; off += l.chunk {
			c := localChunk{t: t, off: off, n: min(l.chunk, length-off)}
			if first.t == nil {
				first = c
				continue
			}
			select {
			case l.queue <- c:
				queued++
			default:
				l.runChunk(c)
			}
		}
	}
	if first.t != nil {
		l.runChunk(first)
	}
	for ; queued > 0; queued-- {
		select {
		case c := <-l.queue:
			l.runChunk(c)
		default:
			return len(tasks), nil
		}
	}
	return len(tasks), nil
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

// worker copies queued chunks until Close closes the queue. The last chunk
// of a task to finish ends the task.
func (l *Local) worker() {
	defer l.wg.Done()
	debug.SetPanicOnFault(true)
	for c := range l.queue {
		l.runChunk(c)
	}
}

// runChunk copies one chunk; the last chunk of a task to finish ends the
// task. The goroutine has SetPanicOnFault on.
func (l *Local) runChunk(c localChunk) {
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

// Close refuses new work, lets the workers finish every queued chunk (so
// every dispatched task gets its Done) and stops them. It is idempotent and
// safe to call concurrently with Submit.
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
