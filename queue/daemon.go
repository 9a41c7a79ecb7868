package queue

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/xfer"
)

// Why Take found nothing to take.
type starve uint8

var _ xfer.StreamSink = (*DaemonRing)(nil)

const (
	starveNone    starve = iota
	starveEntries        // the submission ring is empty
	starveCQ             // no completion slot is free for another request
	starveBroken         // the client wrote an invalid index
)

// DaemonRing is the daemon's side of one queue: it takes SQEs and posts
// CQEs. It keeps its own copy of the geometry and of both rings'
// authoritative indices; the shared words are only ever read as claims.
//
// Concurrency: Take, Data, Publish, Doorbell and Awake belong to
// the queue's worker (the reactor that serves it). Post may be called from
// any goroutine (it takes the completion lock). Kick and Close may be
// called from any goroutine.
type DaemonRing struct {
	mem    []byte
	g      Geometry
	w      words
	sqMask uint32
	cqMask uint32

	// WakeCounts counts the ring's system calls (atomics: read by stats).
	WakeCounts WakeCounts

	// efd is the queue's eventfd doorbell (UseEventfd), -1 without one;
	// onKick is what Kick calls besides the futex wake (set before the
	// queue is served: the worker's wake-up, which an eventfd doorbell
	// needs, since the worker then waits on no futex).
	efd    int
	onKick func()

	// Owned by the worker.
	sqHead  uint32 // next entry to take
	pubHead uint32 // the sq_head last published
	why     starve
	bell    uint32 // the sq_flags bit Doorbell set, for Awake

	closed atomic.Bool
	// broken and violations are the daemon's own record of what the client
	// did wrong. The shared state and violation words are written from
	// them for the client to read, never read back: the client can write
	// anything there.
	broken     atomic.Bool
	violations atomic.Uint32

	// cqMu guards the fields below: completions are posted from the
	// transports' goroutines.
	cqMu     sync.Mutex
	cqTail   uint32 // next CQE slot
	cqSeen   uint32 // the client's cq_head, last valid and monotonic
	inflight uint32 // taken entries whose CQE is not posted yet
	posted   uint64
}

// NewDaemonRing lays out a new queue in mem (len >= g.Size, zeroed, shared
// with the client) and returns the daemon's side.
func NewDaemonRing(mem []byte, g Geometry, id uint64) *DaemonRing {
	g.writeHeader(mem, id)
	return &DaemonRing{mem: mem[:g.Size], g: g, w: wordsOf(mem), sqMask: g.SQEntries - 1, cqMask: g.CQEntries - 1, efd: -1}
}

// UseEventfd gives the queue an eventfd doorbell, for a worker that cannot
// sleep on the sq_wake futex (io_uring without IORING_OP_FUTEX_WAIT): it
// makes the eventfd, which the ring keeps until Release, writes
// DoorbellEventfd into the header and returns a duplicate to pass to the
// client beside the memfd (the caller closes it once passed). onKick is
// then what Kick and Close call to wake the worker. Call it before the
// client maps the queue and before a worker serves it.
//
// The daemon never writes this eventfd: the client shares its file
// description and could make a write block (a full counter, O_NONBLOCK
// cleared), so the daemon's own wake-ups go through onKick.
func (r *DaemonRing) UseEventfd(onKick func()) (int, error) {
	if r.efd >= 0 {
		return -1, fmt.Errorf("%w: the queue has an eventfd doorbell already", ErrGeometry)
	}
	efd, err := newEventfd()
	if err != nil {
		return -1, err
	}
	pass, err := dupFD(efd)
	if err != nil {
		closeFD(efd) //nolint:errcheck // the dup's error is the one to report
		return -1, err
	}
	r.efd, r.onKick = efd, onKick
	r.w.doorbell.Store(DoorbellEventfd)
	return pass, nil
}

// EventfdDoorbell is the queue's eventfd doorbell (-1 without one) and
// whether the client said it rings it (bell_ack: the client's word, which
// can say anything; it decides only how this queue's own doorbells are
// heard).
func (r *DaemonRing) EventfdDoorbell() (fd int, rung bool) {
	if r.efd < 0 {
		return -1, false
	}
	return r.efd, r.w.bellAck.Load() == BellAckEventfd
}

// Geometry is the queue's geometry.
func (r *DaemonRing) Geometry() Geometry { return r.g }

// violate records an index the client wrote that the daemon refuses. The
// queue takes nothing more; what is in flight still completes. A queue
// counts one violation, when it breaks: the same bad index read again (by
// Counts, under a stats call) is not another. Any goroutine may call it.
func (r *DaemonRing) violate() {
	if r.broken.Swap(true) {
		return
	}
	r.w.violations.Store(r.violations.Add(1))
	r.w.state.Or(StateBroken)
}

// Broken reports whether the client broke the queue with an invalid index.
func (r *DaemonRing) Broken() bool { return r.broken.Load() }

// Violations is how many invalid indices the daemon refused (0 or 1: the
// first breaks the queue), counted in the daemon's memory.
func (r *DaemonRing) Violations() uint32 { return r.violations.Load() }

// cqFreeLocked is how many more requests may be in flight: completion
// slots neither holding an unreaped CQE nor reserved. r.cqMu is held.
func (r *DaemonRing) cqFreeLocked() uint32 {
	h := r.w.cqHead.Load() // acquire: the client's reaps before it
	if adv := h - r.cqSeen; adv <= r.cqTail-r.cqSeen {
		r.cqSeen = h
	} else {
		// A head behind what the client already reaped, or past what was
		// posted: refused, and the space it would free stays taken.
		r.violate()
	}
	return r.g.CQEntries - (r.cqTail - r.cqSeen) - r.inflight
}

// Take copies up to len(dst) new SQEs into dst and returns how many. Each
// taken entry has a completion slot reserved for it: the caller must Post
// exactly one CQE for every entry it took. Entries are copied with atomic
// loads before anything looks at them; their fields are still unchecked.
// Data an entry references must be copied (Data) before Publish.
func (r *DaemonRing) Take(dst []SQE) int {
	r.why = starveNone
	if r.closed.Load() || r.Broken() {
		r.why = starveBroken
		return 0
	}
	tail := r.w.sqTail.Load() // acquire: the client's entries before it
	avail := tail - r.sqHead
	if avail > r.g.SQEntries {
		r.violate()
		r.why = starveBroken
		return 0
	}
	if avail == 0 {
		r.why = starveEntries
		return 0
	}
	n := min(avail, uint32(len(dst)))
	r.cqMu.Lock()
	if free := r.cqFreeLocked(); free < n {
		n = free
	}
	r.inflight += n
	r.cqMu.Unlock()
	if r.Broken() {
		r.why = starveBroken
		r.unreserve(n)
		return 0
	}
	if n == 0 {
		r.why = starveCQ
		return 0
	}
	var raw [SQESize]byte
	for i := uint32(0); i < n; i++ {
		off := int(r.g.SQOff) + int((r.sqHead+i)&r.sqMask)*SQESize
		copySQE(&raw, r.mem[off:off+SQESize])
		DecodeSQE(&raw, &dst[i])
	}
	r.sqHead += n
	return int(n)
}

func (r *DaemonRing) unreserve(n uint32) {
	r.cqMu.Lock()
	r.inflight -= n
	r.cqMu.Unlock()
}

// Data copies the n bytes at off in the data area into dst[:n] and reports
// whether [off, off+n) lies inside the data area and fits dst.
func (r *DaemonRing) Data(dst []byte, off, n uint32) bool {
	if uint64(off)+uint64(n) > uint64(r.g.DataSize) || int(n) > len(dst) {
		return false
	}
	base := int(r.g.DataOff) + int(off)
	copy(dst[:n], r.mem[base:base+int(n)])
	return true
}

// Publish tells the client which entries were taken: their slots, and the
// data they referenced, may be reused.
func (r *DaemonRing) Publish() {
	if r.pubHead != r.sqHead {
		r.w.sqHead.Store(r.sqHead) // release: the copies above are done
		r.pubHead = r.sqHead
	}
}

// Post writes one CQE for an entry taken earlier and wakes the client if it
// sleeps. Any goroutine may call it, until the ring's memory is released.
func (r *DaemonRing) Post(c *CQE) {
	r.cqMu.Lock()
	if invariants.Enabled && (r.inflight == 0 || r.cqTail-r.cqSeen >= r.g.CQEntries) {
		r.cqMu.Unlock()
		panic("queue: invariant: a CQE posted without a reserved slot")
	}
	off := int(r.g.CQOff) + int(r.cqTail&r.cqMask)*CQESize
	c.put(r.mem[off : off+CQESize])
	r.cqTail++
	r.inflight--
	r.posted++
	r.w.cqTail.Swap(r.cqTail) // release, and a full fence before the flag's load (a swap: see ClientRing.Submit)
	emptied, tail := r.inflight == 0, r.cqTail
	r.cqMu.Unlock()
	if r.clientWants(tail, emptied) && wake(r.w.cqFlags, waitBits, r.w.cqWake) {
		r.WakeCounts.ClientWakes.Add(1)
	}
}

// StreamDone implements xfer.StreamSink: the CQE of a request a stream
// of this queue ended, with the status code of its state and error. Any
// goroutine may call it, as Post.
func (r *DaemonRing) StreamDone(ud uint64, st xfer.State, n uint64, err error) {
	r.Post(&CQE{UserData: ud, Result: n, Code: uint32(status.ForState(st, err)), State: uint8(st)})
}

// clientWants reports whether a client sleeping for completions wants to be
// woken by the CQE that moved cq_tail to tail: it sleeps for every CQE
// (FlagWaiting alone), or for a target tail has reached, or emptied says
// that no more CQEs will come until it submits. The target is the client's
// word, read after cq_tail was published; whatever it holds, the client
// is woken no later than when its queue empties.
func (r *DaemonRing) clientWants(tail uint32, emptied bool) bool {
	f := r.w.cqFlags.Load()
	if f&FlagWaiting == 0 {
		return false
	}
	if f&FlagWaitTarget == 0 || emptied {
		return true
	}
	return int32(tail-r.w.cqTarget.Load()) >= 0
}

// WakeCounts are a ring's wake-up system calls and sleeps, for stats: the
// queue makes none while both sides are busy.
type WakeCounts struct {
	ClientWakes  atomic.Uint64 // futex wakes of a client sleeping for completions
	WorkerSleeps atomic.Uint64 // sleeps of the daemon's worker with this queue's doorbell armed
}

// Counts is the ring's completion-side state: requests in flight, CQEs
// posted and not yet reaped, CQEs posted in all.
func (r *DaemonRing) Counts() (inflight, unreaped uint32, posted uint64) {
	r.cqMu.Lock()
	defer r.cqMu.Unlock()
	if !r.closed.Load() && r.mem != nil {
		r.cqFreeLocked() // read what the client reaped since the last Take
	}
	return r.inflight, r.cqTail - r.cqSeen, r.posted
}

// Idle reports whether every entry taken has its CQE posted.
func (r *DaemonRing) Idle() bool {
	r.cqMu.Lock()
	defer r.cqMu.Unlock()
	return r.inflight == 0
}

// Doorbell is the first half of the worker's sleep after a Take found
// nothing (see the package doc, "Wake-ups"): it reads the wake word, sets
// the sq_flags bit for why Take starved (FlagNeedWakeup, FlagCQWait) with a
// full fence, and checks once more. It returns the word and the value to
// wait on, and sleep true when the worker may sleep until the word changes
// from v: a client that submits or reaps after the check sees the flag and
// changes the word, so the wait ends at once. With sleep false there is
// work now (or the queue closed): nothing is set, and the worker takes
// again. A queue that takes nothing more (broken, closed) returns no word
// and sleep true: nothing on it needs the worker. Awake ends the sleep.
func (r *DaemonRing) Doorbell() (w *atomic.Uint32, v uint32, sleep bool) {
	switch r.why {
	case starveNone:
		return nil, 0, false
	case starveBroken:
		return nil, 0, true
	}
	if r.closed.Load() {
		return nil, 0, false
	}
	bit := FlagNeedWakeup
	if r.why == starveCQ {
		bit = FlagCQWait
	}
	v = r.w.sqWake.Load()
	r.w.sqFlags.Or(bit) // a full fence: the re-check below sees a submit before it
	if r.ready() || r.closed.Load() {
		r.w.sqFlags.And(^bit)
		return nil, 0, false
	}
	r.bell = bit
	r.WakeCounts.WorkerSleeps.Add(1)
	return r.w.sqWake, v, true
}

// Awake clears the flag Doorbell set, once the worker is awake: while it
// works, the client rings no doorbell.
func (r *DaemonRing) Awake() {
	if r.bell != 0 {
		r.w.sqFlags.And(^r.bell)
		r.bell = 0
	}
}

// ready reports whether Take would find something now, for the reason it
// last found nothing.
func (r *DaemonRing) ready() bool {
	switch r.why {
	case starveEntries:
		return r.w.sqTail.Load() != r.sqHead
	case starveCQ:
		r.cqMu.Lock()
		free := r.cqFreeLocked()
		r.cqMu.Unlock()
		return free > 0
	}
	return true
}

// WakeWord is the futex word the worker sleeps on: the client's doorbell,
// which Kick and Close change too. A worker that waits for something other
// than the rings (a free stream slot, which it learns of through Kick)
// reads the word, checks its condition, then waits while the word holds
// what it read, so a Kick between the check and the wait is not lost.
func (r *DaemonRing) WakeWord() *atomic.Uint32 { return r.w.sqWake }

// Kick changes the wake word and wakes whoever sleeps on it: the worker,
// if its wait on this queue is armed.
func (r *DaemonRing) Kick() {
	r.w.sqWake.Add(1)
	futexWake(r.w.sqWake)
	if r.onKick != nil {
		r.onKick()
	}
}

// Closed reports whether Close was called.
func (r *DaemonRing) Closed() bool { return r.closed.Load() }

// Close marks the queue closed for both sides: Take takes nothing more, the
// client sees StateClosed, and both sleepers are woken. Entries already
// taken still get their CQEs (Post keeps working).
func (r *DaemonRing) Close() {
	if r.closed.Swap(true) {
		return
	}
	r.w.state.Or(StateClosed)
	r.Kick()
	r.w.cqWake.Add(1)
	futexWake(r.w.cqWake)
}
