// Package xfer is the transfer engine: segments and their Registry,
// requests, the batch lifecycle and task states (Engine), the long-lived
// task streams that serve a client's queue (Stream), the per-transport
// meters, and the Transport contract that every data path (local copy,
// io_uring, tcp, rdma) implements, with the local copy transport itself
// (Local), and the caller's side of that contract (Dispatch), through
// which batches, streams and the store hand tasks to a transport.
//
// Everything in this package is plain Go; syscalls and cgo live in the
// transport packages.
package xfer

import (
	"sync/atomic"
	"time"
)

// SegmentID names a registered segment inside one daemon. Zero is never a
// valid id.
type SegmentID uint64

// Kind says what backs a segment.
type Kind uint8

const (
	// KindPool is the daemon-owned DRAM pool (a memfd every client maps).
	KindPool Kind = iota + 1
	// KindClient is a buffer a client registered by passing its memfd.
	KindClient
	// KindFile is a file or block device on local storage.
	KindFile
	// KindRemote is a segment of a peer daemon.
	KindRemote
)

func (k Kind) String() string {
	switch k {
	case KindPool:
		return "pool"
	case KindClient:
		return "client"
	case KindFile:
		return "file"
	case KindRemote:
		return "remote"
	}
	return "unknown"
}

// Segment is a registered region that requests address by (segment, offset,
// length). Implementations are safe for concurrent use.
type Segment interface {
	ID() SegmentID
	Kind() Kind
	// Size is the segment's length in bytes; it never changes.
	Size() uint64
	// Acquire takes a reference that keeps the segment's backing (mapping,
	// file, registration) alive. It returns false once the segment is
	// closing; the caller then must not use it. Every successful Acquire is
	// matched by exactly one Release.
	Acquire() bool
	// Release drops a reference taken by Acquire.
	Release()
}

// RangeHolder is implemented by segments that need to know which byte
// ranges transfers are using: a connection's view of the pool, whose blocks
// must not be freed (and handed to another client) while a transfer still
// moves their bytes. After Acquire, the engine calls HoldRange with the
// request's range on that segment; false refuses the request (nothing is
// held then). DropRange is called exactly once for every successful
// HoldRange, just before the matching Release, possibly on a transport's
// goroutine; it must not block.
type RangeHolder interface {
	HoldRange(off, n uint64) bool
	DropRange(off, n uint64)
}

// MemSegment is a segment backed by memory mapped in this process.
type MemSegment interface {
	Segment
	// Bytes is the whole mapping. It is valid while a reference is held.
	Bytes() []byte
}

// Shrinkable is implemented by a memory segment whose owner may shrink the
// file under its mapping at any time (a client buffer whose memfd cannot be
// sealed against shrinking, see package shm): a byte of it can fault on any
// access. Every path that touches such a segment either copies through
// internal/faultcopy, so a fault ends that request with ErrFault, or lets
// the kernel touch it (io_uring, a syscall, an RDMA registration, which
// answer EFAULT); a path that can do neither for that request alone (a TCP
// stream shared with other requests) refuses it with ErrUnsealed.
type Shrinkable interface {
	Unsealed() bool
}

// IsUnsealed reports whether seg is a Shrinkable segment that is unsealed.
func IsUnsealed(seg Segment) bool {
	s, ok := seg.(Shrinkable)
	return ok && s.Unsealed()
}

// Op is the direction of a request.
type Op uint8

const (
	// OpRead moves target → local.
	OpRead Op = iota + 1
	// OpWrite moves local → target.
	OpWrite
)

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	}
	return "invalid"
}

// Request is one transfer: Length bytes between (Local, LocalOffset) and
// (Target, TargetOffset), in the direction Op names.
type Request struct {
	Op           Op
	Local        SegmentID
	LocalOffset  uint64
	Target       SegmentID
	TargetOffset uint64
	Length       uint64
}

// Sum is where a transport that reads a READ's bytes as they land (tcp:
// they come off a socket in this process) puts their crc32c, taken there,
// while they are still in the CPU's cache: a caller that must check the
// bytes (the store's reader of other hosts' values) then need not read
// them again from memory. Taken says it did, for the whole Length and the
// task's last landing of it; a transport whose bytes land by DMA (rdma),
// or a READ it cuts into pieces, leaves it false, and the caller takes the
// checksum itself. Read it only after the task has ended Completed.
type Sum struct {
	CRC   uint32
	Taken bool
}

// State is a task's state. Waiting and Pending are live; the rest are
// terminal, and every task ends in exactly one of them.
type State uint32

const (
	// StateWaiting: accepted, not yet dispatched to a transport.
	StateWaiting State = iota + 1
	// StatePending: dispatched; the transport owns it until it completes.
	StatePending
	StateCompleted
	StateFailed
	StateTimeout
	StateCanceled
)

// Terminal reports whether s is one of the end states.
func (s State) Terminal() bool { return s >= StateCompleted && s <= StateCanceled }

func (s State) String() string {
	switch s {
	case StateWaiting:
		return "waiting"
	case StatePending:
		return "pending"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	case StateTimeout:
		return "timeout"
	case StateCanceled:
		return "canceled"
	}
	return "invalid"
}

// Completer receives the end of a dispatched task. The engine implements it;
// transports only call it.
type Completer interface {
	// TaskDone is called exactly once per dispatched task, with the number of
	// bytes moved and nil or the error that ended it. It must not block; it
	// may run on the submitting goroutine (before Submit returns) or on a
	// transport's poller.
	TaskDone(t *Task, n uint64, err error)
}

// HomeOwnThread is the bit of Task.Home that says the reactor it names
// runs on its own thread rather than as a ring's guest.
const HomeOwnThread uint32 = 1 << 31

// Task is one request as a transport sees it. The engine owns the memory:
// tasks live in a batch's preallocated table and are reused, so a transport
// must not keep a *Task after it has called Done.
//
// Local and Target are resolved and referenced (Acquire) by the engine before
// dispatch and released by the engine after Done; a transport never acquires
// or releases them itself.
type Task struct {
	Req    Request
	Local  Segment
	Target Segment
	// Tag is the transport's own slot for per-task state: zero when the
	// engine dispatches a task, and never read by the engine. Its layout is the transport's,
	// documented where the transport writes it: Local's counts the chunks
	// left and a failure bit (local.go), uring's names the ring and slot
	// the task holds (uring's package doc). The tcp and rdma transports
	// keep per-task state in their own tables and leave it alone.
	Tag uint64
	// Home names the reactor whose thread submits the task (its index
	// plus one), 0 when no reactor does: a stream served by a reactor sets
	// it on every task (Stream.SetHome). A transport with a ring per
	// reactor puts the task on that reactor's ring, which the submitting
	// thread itself drives, so it never waits there for room the same
	// thread would have to make; the rdma transport posts it on a queue
	// pair whose completions that reactor reaps. HomeOwnThread is set
	// when the reactor runs on its own thread, not as a ring's guest:
	// then no ring is that reactor's (uring sees an index out of range
	// and round robins). The engine never changes it.
	Home uint32
	// Deadline is when the engine ends the task in StateTimeout if it is
	// still live. The engine always sets it (the call's deadline, or now +
	// Config.DefaultTimeout); it is zero only for a task driven without an
	// engine, and a transport then applies its own bound. A transport that
	// must wait for something before it can move the bytes (a session with
	// a peer, a memory registration) waits no longer than this, and never
	// on the submitting goroutine.
	Deadline time.Time
	// Notify is the notification a WRITE to a peer carries to the peer's
	// subscribed client, nil for none. It is an argument of the submission,
	// set by the engine before dispatch, and valid until the task's Done; a
	// transport that keeps it longer copies it. A transport that cannot
	// deliver notifications ends such a task with ErrNotSupported.
	Notify []byte
	// Sum, when not nil, asks for the crc32c of a READ's bytes as they
	// land (see Sum); set by the engine before dispatch, valid until the
	// task's Done.
	Sum *Sum

	done Completer
	// owed is the task's dispatch ledger (dispatch.go), whoever
	// dispatches it: from Dispatch until the transport's Done or the
	// caller's rollback claims it, and the claim is what releases what was
	// taken for the task, so that happens exactly once.
	owed atomic.Uint32
	// Engine-private bookkeeping (owned by package xfer's engine).
	state atomic.Uint32
	// b is the batch that owns the task; tr the transport it was routed to.
	// Both are written by the submitting goroutine before dispatch.
	b  *batch
	tr Transport
	// slot is the task's index in its Stream (stream tasks only).
	slot uint32
	// ms is the meter shard of the transport it was dispatched to, start
	// its submit call's meter clock reading, 0 when that call's latency is
	// not sampled (meter.go); written before dispatch.
	ms    *meterShard
	start int64
	// holdL and holdT say that Local / Target are RangeHolders holding the
	// request's range; release drops it before releasing the segment.
	holdL, holdT bool
	// err and n are the task's result. They are written only by the
	// goroutine that moved the state to stateEnding and read only after a
	// terminal state was loaded, so the state word orders them.
	err error
	n   uint64
}

// SetCompleter binds the task to the Completer that Done reports to. The
// engine does this for its own tasks; transport tests use it to drive a
// transport without an engine.
func (t *Task) SetCompleter(c Completer) { t.done = c }

// Completer is what Done reports to. A transport that must act after a
// task's bytes moved and before the engine sees it end (deliver a
// notification) puts its own Completer in front for the task's flight and
// restores this one before reporting.
func (t *Task) Completer() Completer { return t.done }

// Done ends a dispatched task: n bytes moved and nil, or the error that ended
// it. A transport calls it exactly once per task that Submit dispatched.
func (t *Task) Done(n uint64, err error) { t.done.TaskDone(t, n, err) }

// Transport moves the bytes of dispatched tasks.
//
// The contract:
//   - Submit dispatches tasks in order and returns n, the number it took:
//     tasks[:n] now belong to the transport, and each of them is ended by
//     exactly one call of Task.Done (possibly before Submit returns);
//     tasks[n:] were never dispatched, are untouched, and stay with the
//     caller, who releases what it took for them. err is non-nil exactly when
//     n < len(tasks) and says why dispatch stopped. n is the only boundary
//     between the completion path and the caller's rollback.
//   - Submit must not block on the network or the device beyond queueing;
//     a full queue is backpressure (it may wait for room, bounded by the
//     transport's own limits), never a silent drop.
//   - Cancel asks the transport to end a dispatched task early (a deadline
//     passed, the batch was abandoned). It may be a no-op for transports
//     whose tasks end quickly; the task still ends with exactly one Done.
//     Cancel races with the task's own completion: it may arrive after the
//     transport has called Done (the engine never reuses the Task memory
//     before Cancel returns). The transport checks that it still owns t
//     (say, the slot t.Tag names still holds t) and otherwise does nothing.
//   - Close stops new dispatch (Submit then returns 0, ErrClosed), ends every
//     dispatched task (with ErrClosed or its real result) and returns when no
//     Done is outstanding. It is safe to call more than once and concurrently
//     with Submit.
//   - A transport never panics on a bad request: validation failures end the
//     task with a typed error.
type Transport interface {
	Name() string
	Submit(tasks []*Task) (n int, err error)
	Cancel(t *Task)
	Close() error
}
