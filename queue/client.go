package queue

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// ClientRing is the client's side of one queue: it stages and submits SQEs
// and reaps CQEs. Its submission side (Space, Stage, Submit) and its
// completion side (Ready, Reap, Wait) may run on two goroutines at once;
// each side's calls must be serialized by the caller.
type ClientRing struct {
	mem    []byte
	g      Geometry
	id     uint64
	w      words
	sqMask uint32
	cqMask uint32
	spin   spinner
	tail   tail
	slack  time.Duration // the thread's timer slack, which a nap takes off (see tail.nap)
	// rangSeen is SubmitDoorbells at the completion side's last wait. A
	// doorbell between two waits says the daemon's worker slept: no nap.
	rangSeen uint64
	naps     napBack
	// efd is the daemon's eventfd doorbell (SetDoorbellFD), rung instead
	// of the sq_wake futex; -1 without one.
	efd int

	sqTail  uint32 // next slot to fill; entries before it up to published are staged
	pubTail uint32 // the sq_tail last published
	sqHead  uint32 // the daemon's sq_head, last read
	cqHead  uint32 // next CQE to reap

	// The data area is a byte ring: payloads are placed at dataTail and
	// freed, in submission order, as the daemon takes their entries.
	// slotData[i & sqMask] is dataTail just after entry i was staged.
	dataHead, dataTail uint64
	slotData           []uint64

	// yielded is when Wait last passed through the scheduler (see
	// yieldEvery); owned by the completion side.
	yielded time.Time

	// interrupted is set by Interrupt: Wait returns ErrClosed.
	interrupted atomic.Bool

	// Wake-up counters, for tests and tcctl: doorbells rung by Submit
	// (written by the submission side, atomic: the completion side reads
	// it, see rangSeen), and by Reap and sleeps taken in Wait (owned by the
	// completion side).
	SubmitDoorbells       atomic.Uint64
	ReapDoorbells, Sleeps uint64
	// LateWakes counts the early wake-ups of drained waits that found
	// the last completion there already (the daemon idled meanwhile).
	LateWakes uint64
	// Naps counts the timed sleeps taken before a wait asked to be woken
	// (see tail.nap).
	Naps uint64
}

// NewClientRing takes the client's side of a queue mapped at mem, after
// checking that the header describes a valid queue that fits.
func NewClientRing(mem []byte) (*ClientRing, error) {
	g, id, err := readHeader(mem)
	if err != nil {
		return nil, err
	}
	q := &ClientRing{mem: mem[:g.Size], g: g, id: id, w: wordsOf(mem), sqMask: g.SQEntries - 1, cqMask: g.CQEntries - 1,
		spin: newSpinner(spinCeiling), slack: timerSlack(), slotData: make([]uint64, g.SQEntries), efd: -1}
	q.sqHead = q.w.sqHead.Load()
	q.sqTail, q.pubTail = q.w.sqTail.Load(), q.w.sqTail.Load()
	q.cqHead = q.w.cqHead.Load()
	return q, nil
}

// Doorbell is the doorbell the daemon's header asks for: DoorbellFutex,
// or DoorbellEventfd (the eventfd passed with OpenQueue's answer, which
// SetDoorbellFD takes).
func (q *ClientRing) Doorbell() uint32 { return q.w.doorbell.Load() }

// SetDoorbellFD gives the ring the daemon's eventfd doorbell, passed with
// OpenQueue's answer beside the memfd, when Doorbell is DoorbellEventfd.
// The ring owns fd from then on (Unmap closes it) and rings it instead of
// the sq_wake futex, and says so to the daemon (bell_ack). Call it before
// the first Submit.
func (q *ClientRing) SetDoorbellFD(fd int) error {
	if d := q.Doorbell(); d != DoorbellEventfd {
		return fmt.Errorf("%w: an eventfd doorbell for a queue whose header asks for doorbell %d", ErrGeometry, d)
	}
	if q.efd >= 0 {
		return fmt.Errorf("%w: the queue has its eventfd doorbell already", ErrGeometry)
	}
	q.efd = fd
	q.w.bellAck.Store(BellAckEventfd)
	return nil
}

// ring clears bit in sq_flags and, if it was set, bumps sq_wake and wakes
// the daemon: through its eventfd when it has one, else the futex. It
// reports whether it made the system call.
func (q *ClientRing) ring(bit uint32) bool {
	if q.efd < 0 {
		return wake(q.w.sqFlags, bit, q.w.sqWake)
	}
	if q.w.sqFlags.Load()&bit == 0 || q.w.sqFlags.And(^bit)&bit == 0 {
		return false
	}
	q.w.sqWake.Add(1)
	ringEventfd(q.efd)
	return true
}

// ID is the queue's id, as OpenQueue named it.
func (q *ClientRing) ID() uint64 { return q.id }

// Geometry is the queue's geometry.
func (q *ClientRing) Geometry() Geometry { return q.g }

// Interrupt makes a Wait on another goroutine, and every later one, return
// ErrClosed: the client is tearing the queue down. It wakes the waiter
// through the completion word itself, which the client may write too.
func (q *ClientRing) Interrupt() {
	q.interrupted.Store(true)
	q.w.cqWake.Add(1)
	futexWake(q.w.cqWake)
}

// Err reports why the queue can take nothing more: ErrClosed, ErrBroken, or
// nil while it works.
func (q *ClientRing) Err() error {
	if q.interrupted.Load() {
		return ErrClosed
	}
	s := q.w.state.Load()
	switch {
	case s&StateBroken != 0:
		return ErrBroken
	case s&StateClosed != 0:
		return ErrClosed
	}
	return nil
}

// refreshHead reads the daemon's sq_head and frees the data the newly taken
// entries referenced.
func (q *ClientRing) refreshHead() {
	h := q.w.sqHead.Load() // acquire
	if h == q.sqHead || h-q.sqHead > q.sqTail-q.sqHead {
		return // nothing new (or a value that cannot be: keep the last)
	}
	q.dataHead = q.slotData[(h-1)&q.sqMask]
	q.sqHead = h
}

// Space is how many entries can be staged now.
func (q *ClientRing) Space() int {
	if q.sqTail-q.sqHead == q.g.SQEntries {
		q.refreshHead()
	}
	return int(q.g.SQEntries - (q.sqTail - q.sqHead))
}

// Stage writes e into the next free slot without publishing it. With a
// payload it copies the payload into the data area and points e at it
// (NotifyOff/NotifyLen, SQEFlagNotify). It reports false when the ring has
// no free slot, and ErrDataFull when the data area has no room for the
// payload yet (the caller submits and waits for the daemon to take what is
// staged).
func (q *ClientRing) Stage(e *SQE, payload []byte) (bool, error) {
	if q.Space() == 0 {
		return false, nil
	}
	if payload != nil {
		off, ok := q.place(len(payload))
		if !ok {
			q.refreshHead()
			if off, ok = q.place(len(payload)); !ok {
				return false, fmt.Errorf("%w: %d bytes", ErrDataFull, len(payload))
			}
		}
		copy(q.mem[int(q.g.DataOff)+int(off):], payload)
		e.Flags |= SQEFlagNotify
		e.NotifyOff, e.NotifyLen = off, uint32(len(payload))
	}
	off := int(q.g.SQOff) + int(q.sqTail&q.sqMask)*SQESize
	e.put(q.mem[off : off+SQESize])
	q.slotData[q.sqTail&q.sqMask] = q.dataTail
	q.sqTail++
	return true, nil
}

// StageData writes e into the next free slot without publishing it, with
// n contiguous bytes of the data area reserved for it (e.NotifyOff,
// e.NotifyLen; e's flags are left as they are), and returns those bytes
// for the caller to fill before Submit: a store op's key list is written
// straight into the shared memory. It reports false when the ring has no
// free slot, and ErrDataFull when the data area has no room for n bytes
// yet.
func (q *ClientRing) StageData(e *SQE, n int) ([]byte, bool, error) {
	if q.Space() == 0 {
		return nil, false, nil
	}
	off, ok := q.place(n)
	if !ok {
		q.refreshHead()
		if off, ok = q.place(n); !ok {
			return nil, false, fmt.Errorf("%w: %d bytes", ErrDataFull, n)
		}
	}
	e.NotifyOff, e.NotifyLen = off, uint32(n)
	slot := int(q.g.SQOff) + int(q.sqTail&q.sqMask)*SQESize
	e.put(q.mem[slot : slot+SQESize])
	q.slotData[q.sqTail&q.sqMask] = q.dataTail
	q.sqTail++
	base := int(q.g.DataOff) + int(off)
	return q.mem[base : base+n : base+n], true, nil
}

// place reserves n contiguous bytes of the data area at dataTail, skipping
// to the start when they would not fit before its end.
func (q *ClientRing) place(n int) (uint32, bool) {
	size := uint64(q.g.DataSize)
	if uint64(n) > size {
		return 0, false
	}
	pos := q.dataTail
	if off := pos % size; off+uint64(n) > size {
		pos += size - off
	}
	if pos+uint64(n)-q.dataHead > size {
		return 0, false
	}
	q.dataTail = pos + uint64(n)
	return uint32(pos % size), true
}

// Submit publishes the staged entries and rings the daemon's doorbell if
// it sleeps waiting for them. It returns how many entries it published.
func (q *ClientRing) Submit() int {
	n := int(q.sqTail - q.pubTail)
	if n == 0 {
		return 0
	}
	// A swap, not a store: the publication must be ordered before the
	// flag's load below (store-load), and only a read-modify-write is a
	// full fence everywhere. Under the race detector an atomic store is a
	// release only, and TestLostWakeupStress lost wake-ups with it.
	q.w.sqTail.Swap(q.sqTail)
	q.pubTail = q.sqTail
	if q.ring(FlagNeedWakeup) {
		q.SubmitDoorbells.Add(1)
	}
	return n
}

// inFlight is how many requests were submitted and not reaped: each
// entry published gets one CQE. The completion side reads the published
// sq_tail (atomic), not the submission side's own copy.
func (q *ClientRing) inFlight() int { return int(q.w.sqTail.Load() - q.cqHead) }

// Ready is how many CQEs can be reaped now.
func (q *ClientRing) Ready() int {
	n := q.w.cqTail.Load() - q.cqHead // acquire
	if n > q.g.CQEntries {
		return 0 // a daemon cannot post that many; treat as none
	}
	return int(n)
}

// Reap moves up to len(out) ready CQEs into out without waiting and
// returns how many. Reaping frees completion slots, so it rings the
// daemon if it sleeps waiting for them.
func (q *ClientRing) Reap(out []CQE) int {
	n := min(q.Ready(), len(out))
	if n == 0 {
		return 0
	}
	for i := 0; i < n; i++ {
		off := int(q.g.CQOff) + int((q.cqHead+uint32(i))&q.cqMask)*CQESize
		out[i].get(q.mem[off : off+CQESize])
	}
	q.cqHead += uint32(n)
	q.w.cqHead.Swap(q.cqHead) // release, and a full fence before the flag's load (see Submit)
	if q.ring(FlagCQWait) {
		q.ReapDoorbells++
	}
	return n
}

// spinFor spins, within the learned budget (at most spinCeiling, which
// a Wait's deadline may overrun), until min CQEs are ready.
func (q *ClientRing) spinFor(min int) bool {
	if !q.spin.begin() {
		return false
	}
	found, spun := q.spinUntil(min, q.spin.budget)
	q.spin.end(found, spun)
	return found
}

// spinTail spins until min CQEs are ready, for up to tailSpin in a
// drained wait and behindSpin in one that is not: the spin for a wait's
// last completions when they come fast (see tail).
func (q *ClientRing) spinTail(min int, drained bool) bool {
	before := q.Ready()
	found, spun := q.spinUntil(min, tailLimit(drained))
	if r := q.Ready(); found && r > before {
		q.tail.observe(spun/time.Duration(r-before), r-before)
	}
	q.tail.spun(found)
	return found
}

// spinUntil polls until min CQEs are ready or limit has passed, and
// returns whether they came and how long it polled. It reads the clock
// once every 64 polls, so a spin costs little when work is about to come.
// It does not yield: a spin is short, and runtime.Gosched with no other
// goroutine to run hands the processor to a thread the scheduler wakes
// for it (a futex wake and a futex sleep per yield), which a profile of
// tcbench at QD32 found to be a fifth of its CPU.
func (q *ClientRing) spinUntil(min int, limit time.Duration) (bool, time.Duration) {
	start := spinClock()
	for i := 1; ; i++ {
		if q.Ready() >= min {
			return true, spinClock().Sub(start)
		}
		if i&63 == 0 {
			if d := spinClock().Sub(start); d >= limit {
				return false, d
			}
		}
	}
}

// nap takes a wait's nap (see tail.nap), unless the gap says none is
// due or it would outlast deadline: napped says whether it did, found
// whether min completions were ready after it, or after the spin for the
// few still missing that are due soon.
func (q *ClientRing) nap(min int, deadline time.Time) (napped, found bool) {
	d := q.tail.nap(min-q.Ready(), q.slack)
	if d <= 0 || !deadline.IsZero() && d >= time.Until(deadline) {
		return false, false
	}
	q.naps.napped = true
	before, start := q.Ready(), spinClock()
	napSleep(d)
	q.Naps++
	r := q.Ready()
	q.tail.napped(d, spinClock().Sub(start), r-before, r >= min, r >= q.inFlight())
	if r >= min {
		return true, true
	}
	if q.tail.spinsAfterNap(min - r) {
		// Learnt as a tail spin: one that runs out (the rest came in a
		// later burst, not at the gap) backs these spins off.
		found, _ = q.spinUntil(min, behindSpin)
		q.tail.spun(found)
	}
	return true, found
}

// waitBits are the cq_flags bits of a client sleeping for a target.
const waitBits = FlagWaiting | FlagWaitTarget

// sleepSlice bounds each futex wait of a client's sleep. The Go runtime's
// monitor takes the processor of a thread that stays in one system call
// for 10 ms and then, having found work, polls every 20 µs for a
// millisecond or more: a client waiting 14 ms for each remote get of 32
// MiB spent half of its CPU in that monitor (0.042 cpu-s/GB, beside 0.006
// for a transfer's waits; BENCHMARKS.md). A sleep cut in shorter waits
// returns from each before the monitor counts it as long; the cost is one
// wake-up per slice.
const sleepSlice = 5 * time.Millisecond

// futexSleep is futexWait, or a test's (sleepOn's slices).
var futexSleep = futexWait

// sleepOn sleeps while *w == v, for at most left (negative: no limit), in
// futex waits of at most sleepSlice each: nil when woken, when *w changed
// or on a signal, as futexWait; ErrTimeout once the slices add up to left.
func sleepOn(w *atomic.Uint32, v uint32, left time.Duration) error {
	for {
		d := sleepSlice
		if left >= 0 && left < d {
			d = left
		}
		if err := futexSleep(w, v, d); err != ErrTimeout {
			return err
		}
		if left >= 0 {
			if left -= d; left <= 0 {
				return ErrTimeout
			}
		}
	}
}

// Wait waits until at least min CQEs are ready, the queue is closed or
// broken, or timeout passes (negative: no limit). With one completion
// missing it spins briefly first; then it sleeps on the completion word.
// It returns nil when min are ready, ErrTimeout, or the queue's Err (after
// which Ready may still hold the last completions).
func (q *ClientRing) Wait(min int, timeout time.Duration) error {
	if min <= 0 || q.Ready() >= min {
		return nil
	}
	if min > int(q.g.CQEntries) {
		return fmt.Errorf("%w: waiting for %d completions on a ring of %d", ErrGeometry, min, q.g.CQEntries)
	}
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	q.tail.begin()
	early := false // the last sleep was woken early for a drained wait's last completions
	// The worker is busy when no Submit since the last wait found it
	// asleep, and it is not asleep now. A doorbell after a wait that
	// napped says the nap let the worker run dry: naps back off.
	rang := q.SubmitDoorbells.Load()
	busy := q.naps.busy(rang != q.rangSeen, q.w.sqFlags.Load()&FlagNeedWakeup != 0)
	q.rangSeen = rang
	napped := false
	for {
		// The spin is for a last missing completion only. While two or
		// more are missing the daemon is known to be working on them,
		// and the client sleeps at once until all have come (the
		// target below): one sleep and one wake-up per wait, where a
		// spin through the arrivals would bill the whole wait to the
		// client's CPU; unless they come at memory speed (see tail).
		missing := min - q.Ready()
		drained := min >= q.inFlight()
		if (missing > 1 || early) && q.tail.covers(missing, drained) && q.spinTail(min, drained) {
			return nil
		}
		if missing <= 1 && !early && q.spinFor(min) {
			return nil
		}
		early = false
		if err := q.Err(); err != nil {
			return err
		}
		if now := time.Now(); now.Sub(q.yielded) >= yieldEvery {
			q.yielded = now
			runtime.Gosched()
		}
		// A nap first, once per wait, when the gap says the missing
		// completions take a while, the daemon has more to do after them
		// and its worker is busy (see tail.nap): the daemon is asked for
		// no wake-up.
		if !napped && !drained && busy {
			var found bool
			if napped, found = q.nap(min, deadline); found {
				return nil
			}
			if napped {
				continue
			}
		}
		v := q.w.cqWake.Load()
		// Woken once, by the min-th completion: the client sleeps
		// through the others (no wake-up, no spin per completion). The
		// target is written before the flags' full fence, so a daemon
		// that sees the flag sees the target too.
		// Completions that come fast, or a drained wait: woken a few
		// before the last, or one, the client spins for those (see
		// tail). Each entry published and not reaped has its CQE to
		// come or ready.
		target := uint32(min - q.tail.ahead(min-q.Ready(), drained, q.spin.budget >= spinMin))
		q.w.cqTarget.Store(q.cqHead + target)
		q.w.cqFlags.Or(waitBits) // a full fence: the re-check sees a post before it
		if q.Ready() >= min {
			q.w.cqFlags.And(^waitBits)
			return nil
		}
		if err := q.Err(); err != nil {
			q.w.cqFlags.And(^waitBits)
			return err
		}
		left := time.Duration(-1)
		if !deadline.IsZero() {
			if left = time.Until(deadline); left <= 0 {
				q.w.cqFlags.And(^waitBits)
				return ErrTimeout
			}
		}
		start, before := time.Now(), q.Ready()
		q.Sleeps++
		err := sleepOn(q.w.cqWake, v, left)
		q.w.cqFlags.And(^waitBits)
		if err != nil && err != ErrTimeout {
			return err
		}
		if r := q.Ready(); r > before {
			// The sleep covered r-before arrivals: what the spin
			// should learn is the gap between them, not the whole
			// sleep, or a wait for many would stop the spin for good.
			d := time.Since(start) / time.Duration(r-before)
			if target < uint32(min) && drained && q.tail.slow() {
				// Woken early for a drained wait's last completions
				// (the gap learnt before this sleep chose it): the
				// tail spin is for them, whatever the spin budget.
				q.tail.woke(min - r)
				if r >= min {
					q.LateWakes++
				}
				early = true
			}
			q.spin.slept(d)
			q.tail.observe(d, r-before)
			if r >= min {
				return nil
			}
		}
	}
}
