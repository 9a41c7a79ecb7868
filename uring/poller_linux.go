//go:build linux

package uring

// The poller: one goroutine per ring, locked to the OS thread that created
// the ring and is its single issuer. It owns the ring, runs registration
// commands, moves queued slots into the SQ and reaps CQEs, and tears the ring
// down on Close.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// slot is one task in flight on a ring. Submit fills a free slot under
// ring.mu and queues it; from then on only the poller touches the fields
// above task, until the slot is freed again under ring.mu.
type slot struct {
	addr      uintptr    // memory address of the request's first byte
	localBase uintptr    // base of the local segment's mapping
	regs      *xfer.Regs // the local segment's registrations, or nil
	off       uint64     // file offset of the request's first byte
	total     uint64
	done      uint64
	align     uint32 // the file's O_DIRECT offset alignment, 0 when buffered
	fd        int32  // file descriptor, or fixed-file index when fixedFile
	fixedFile bool
	op        uint8
	retries   uint8
	inKernel  bool   // an SQE for it is in the kernel
	ud        uint64 // that SQE's user_data (what a cancel names)

	// gen counts the tasks the slot has held; it is in every user_data
	// and cancel of the slot's task, so that a completion or a cancel
	// meant for an earlier task never reaches a later one. Submit bumps it
	// under ring.mu when it fills the slot; the poller reads it.
	gen atomic.Uint32

	canceled atomic.Bool // set by Cancel; read by the poller
	// guarded by ring.mu:
	task         *xfer.Task
	cancelQueued bool
}

type finished struct {
	idx  int32
	task *xfer.Task
	n    uint64
	err  error
}

type cmdKind uint8

const (
	cmdBuffer cmdKind = iota + 1
	cmdFile
)

// command is a registration the poller runs on the ring's issuer thread.
type command struct {
	kind  cmdKind
	idx   uint32
	iov   []unix.Iovec
	fd    int32
	reply chan error // nil: fire and forget
	after func()     // run by the poller after an asynchronous command
}

type ringSetup struct {
	err             error
	fixedBufs       bool
	fixedFiles      bool
	bufErr, fileErr error
}

// ring is one io_uring with its poller. The poller goroutine owns raw and
// every field marked poller-only; it is started by New and stopped by Close
// (closing flag + eventfd wake-up, then Close waits on exited).
type ring struct {
	t     *Transport
	id    int
	flags uint32

	tid     int    // the poller's thread, written before New returns
	efd     int    // eventfd that wakes a sleeping poller
	wakeMem []byte // one page: [0:8] the eventfd write value, [8:16] the read buffer, [16:24] the guest's eventfd reads (FDWait)

	stop   chan struct{} // closed by Close: wakes Submit waiting for room
	room   chan struct{} // the poller signals freed slots to a waiting Submit
	exited chan struct{} // closed by the poller when the ring is torn down

	slots []slot

	// mu guards the fields below, and slot.task/cancelQueued.
	mu       sync.Mutex
	free     []int32  // free slot indices (stack)
	pending  []int32  // slots queued by Submit for the poller
	cancels  []uint64 // slots Cancel asked about: cancelRef
	cmds     []*command
	sleeping bool // the poller is (about to be) waiting in the kernel
	kicked   bool // kick was called since the poller's last look: it must not sleep
	wakeSent bool // an eventfd wake-up is outstanding
	closing  bool
	waiters  int // Submit calls waiting for room
	// guest is the work the poller serves beside the ring (Host); the
	// poller takes it into host at each pass.
	guest Guest

	// failure is set once, with mu held, when the ring is declared failed
	// (fail); Submit refuses new tasks with it from then on.
	failure atomic.Pointer[ringError]

	// poller-only:
	host Guest // the guest served this pass (nil once stopped)
	// waits are the guest's SQEs (its waits and their cancels) whose CQE
	// has not been reaped: bounded by guestRoom.
	waits     int
	pollSleep bool // a guest's wait could not be armed: sleep briefly, then look
	polled    bool // the guest polls this pass (Poll): no enter without SQEs
	// unarmed are the tokens of the guest's waits this sleep could not
	// arm, reported fired when it ends.
	unarmed   []uint32
	raw       *rawRing
	work      []int32
	cwork     []uint64
	resub     []int32
	cqes      []CQE
	fin       []finished
	inflight  int // slots taken from pending and not yet finished
	inKernel  int
	wakeArmed bool
	closeErr  error
	warnedErr bool
	// enterFails counts the io_uring_enter calls in a row that failed
	// (see enterFailLimit).
	enterFails int
	// kernelCancelLogged: a request the kernel canceled unasked was
	// logged (once per ring).
	kernelCancelLogged bool

	// traceIn counts down the data SQEs until the next one to carry
	// TracedUserData (poller-only).
	traceIn uint32

	nSubmitted, nCompleted, nFailed, nResubmits, nEnters, nWakeups, nFixed, nTraced, nKernelCancels, nEnterErrors atomic.Uint64
}

func newRing(t *Transport, id int, flags uint32) *ring {
	n := int(t.cfg.Entries)
	r := &ring{
		t: t, id: id, flags: flags, efd: -1,
		stop: make(chan struct{}), room: make(chan struct{}, 1), exited: make(chan struct{}),
		slots: make([]slot, n),
		free:  make([]int32, 0, n), pending: make([]int32, 0, n), cancels: make([]uint64, 0, n),
		work: make([]int32, 0, n), cwork: make([]uint64, 0, n), resub: make([]int32, 0, n),
		cqes: make([]CQE, t.cfg.Batch), fin: make([]finished, 0, n),
	}
	for i := n - 1; i >= 0; i-- {
		r.free = append(r.free, int32(i))
	}
	r.traceIn = r.traceGap()
	return r
}

// traceGap draws how many data SQEs from this one the next traced one is:
// uniform in 1..2*TraceEvery-1, TraceEvery on average; 0 when none is.
func (r *ring) traceGap() uint32 {
	every := uint64(r.t.cfg.TraceEvery)
	if every <= 1 {
		return uint32(every)
	}
	return uint32(1 + rand.Uint64N(2*every-1))
}

// user_data of a data SQE: the slot's index in the low 32 bits, the low
// 24 bits of its generation above them, and TracedUserData when traced.
const (
	udGenShift = 32
	udGenMask  = 1<<24 - 1
)

// slotRef is slot idx at generation gen, as user_data and cancels name it.
func slotRef(idx int32, gen uint32) uint64 {
	return uint64(gen&udGenMask)<<udGenShift | uint64(uint32(idx))
}

// refSlot splits a slotRef (user_data without TracedUserData).
func refSlot(ref uint64) (idx uint64, gen uint32) {
	return ref & 0xffffffff, uint32(ref>>udGenShift) & udGenMask
}

// current reports whether ref names the task slot s holds now.
func (s *slot) current(gen uint32) bool { return s.gen.Load()&udGenMask == gen }

// userData is the user_data of slot idx's next SQE.
func (r *ring) userData(idx int32) uint64 {
	ud := slotRef(idx, r.slots[idx].gen.Load())
	if r.traceIn == 0 {
		return ud
	}
	if r.traceIn--; r.traceIn > 0 {
		return ud
	}
	r.traceIn = r.traceGap()
	r.nTraced.Add(1)
	return ud | TracedUserData
}

// run is the poller. It locks itself to its OS thread for its whole life:
// that thread creates the ring and is its single issuer.
func (r *ring) run(ready chan<- ringSetup) {
	runtime.LockOSThread()
	// The thread is never unlocked: it exits with the goroutine, taking
	// its io_uring task context with it after the ring is gone.
	defer close(r.exited)
	r.tid = unix.Gettid()
	setup := r.setup()
	if setup.err != nil {
		// New never adds this ring, so Close will not see it: release
		// what setup took here.
		if r.raw != nil {
			r.raw.close()
		}
		if r.efd >= 0 {
			unix.Close(r.efd)
		}
		if r.wakeMem != nil {
			unix.Munmap(r.wakeMem)
		}
		ready <- setup
		return
	}
	ready <- setup
	if r.loop() {
		r.serveFailed()
	}
	r.teardown()
}

func (r *ring) setup() ringSetup {
	var rs ringSetup
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		rs.err = os.NewSyscallError("eventfd", err)
		return rs
	}
	r.efd = efd
	r.wakeMem, err = unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		rs.err = os.NewSyscallError("mmap", err)
		return rs
	}
	r.wakeMem[0] = 1
	sq := r.t.cfg.Entries * 2
	raw, err := newRawRing(sq, sq*2, r.flags, uint32(r.t.cfg.SQPollIdle.Milliseconds()))
	if err != nil {
		rs.err = fmt.Errorf("uring: ring %d: %w", r.id, err)
		return rs
	}
	r.raw = raw
	if r.t.fixedBufs.Load() {
		reg := rsrcRegister{nr: uint32(r.t.cfg.MaxFixedBuffers), flags: rsrcRegisterSparse}
		rs.bufErr = sysRegister(raw.fd, regBuffers2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
		rs.fixedBufs = rs.bufErr == nil
	}
	if r.t.fixedFiles.Load() {
		reg := rsrcRegister{nr: uint32(r.t.cfg.MaxFixedFiles), flags: rsrcRegisterSparse}
		rs.fileErr = sysRegister(raw.fd, regFiles2, unsafe.Pointer(&reg), uint32(unsafe.Sizeof(reg)))
		rs.fixedFiles = rs.fileErr == nil
	}
	return rs
}

func (r *ring) teardown() {
	if err := r.raw.close(); err != nil { // closed already if the ring failed
		r.closeErr = err
	}
	r.mu.Lock()
	cmds := r.cmds
	r.cmds = nil
	r.mu.Unlock()
	for _, c := range cmds {
		if c.reply != nil {
			c.reply <- xfer.ErrClosed
		}
	}
}

// wakeLocked, with mu held, reports whether the caller must write the
// eventfd after unlocking: only when the poller sleeps and no wake-up is
// already on its way.
func (r *ring) wakeLocked() bool {
	if r.sleeping && !r.wakeSent {
		r.wakeSent = true
		return true
	}
	return false
}

func (r *ring) wake() {
	// The eventfd counter cannot overflow at one write per sleep; EAGAIN
	// would mean it is already readable, which wakes the poller anyway.
	unix.Write(r.efd, r.wakeMem[0:8])
}

// kick wakes the poller if it sleeps in the kernel (a guest's wake).
func (r *ring) kick() {
	r.mu.Lock()
	r.kicked = true
	w := r.wakeLocked()
	r.mu.Unlock()
	if w {
		r.wake()
	}
}

// do runs a registration command on the poller and waits for its result.
func (r *ring) do(c *command) error {
	c.reply = make(chan error, 1)
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return xfer.ErrClosed
	}
	r.cmds = append(r.cmds, c)
	wake := r.wakeLocked()
	r.mu.Unlock()
	if wake {
		r.wake()
	}
	return <-c.reply
}

// post queues a registration command without waiting; false if the ring is
// closing (the ring's teardown then drops the registration anyway).
func (r *ring) post(c *command) bool {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		return false
	}
	r.cmds = append(r.cmds, c)
	wake := r.wakeLocked()
	r.mu.Unlock()
	if wake {
		r.wake()
	}
	return true
}

func (r *ring) exec(c *command) error {
	var err error
	switch c.kind {
	case cmdBuffer:
		up := rsrcUpdate2{offset: c.idx, data: uint64(uintptr(unsafe.Pointer(&c.iov[0]))), nr: uint32(len(c.iov))}
		err = sysRegister(r.raw.fd, regBuffersUpdate, unsafe.Pointer(&up), uint32(unsafe.Sizeof(up)))
		runtime.KeepAlive(c.iov)
	case cmdFile:
		fds := [1]int32{c.fd}
		up := rsrcUpdate2{offset: c.idx, data: uint64(uintptr(unsafe.Pointer(&fds[0]))), nr: 1}
		err = sysRegister(r.raw.fd, regFilesUpdate2, unsafe.Pointer(&up), uint32(unsafe.Sizeof(up)))
		runtime.KeepAlive(&fds)
	}
	if c.reply != nil {
		c.reply <- err
	}
	if c.after != nil {
		c.after()
	}
	return err
}

var errClosedInFlight = fmt.Errorf("uring: transport closed with the request in flight: %w", xfer.ErrClosed)

// loop is the poller's work until Close, or until the ring fails: then
// it reports true.
func (r *ring) loop() (failed bool) {
	var (
		draining  bool
		cancelAll bool
		deadline  time.Time
		ts        unix.Timespec
	)
	start := time.Now()
	yields := NewYields(start, runtime.Gosched)
	busyAt := start // the last pass that was not a sliced sleep's timeout
	for {
		// Pass through the Go scheduler every pollerYield: a locked
		// goroutine that only makes system calls never does, and the
		// runtime's monitor reads that as one running for 10 ms, takes
		// its processor away during its next call, and then polls every
		// 20 µs for a millisecond or more, each 10 ms: in a profile of
		// the daemon at QD32, a seventh of its CPU. A yield of a locked
		// goroutine is itself costly (its thread hands the processor to
		// another and takes it back: two futex wake-ups), so it comes
		// only as often as the monitor's 10 ms require.
		now := time.Now()
		yields.At(now, false)
		if r.host != nil && !draining {
			// The guest's pass comes first: what it submits to this
			// ring is in pending below, and reaches the kernel in this
			// same pass.
			r.host.Serve()
		}
		r.mu.Lock()
		r.work = append(r.work[:0], r.pending...)
		r.pending = r.pending[:0]
		r.cwork = append(r.cwork[:0], r.cancels...)
		r.cancels = r.cancels[:0]
		cmds, closing, guest := r.takeControlLocked()
		r.mu.Unlock()
		// A guest new this pass is served at the next one, before the
		// poller may sleep.
		fresh := false
		if !draining && !closing && guest != r.host {
			r.host, fresh = guest, true
		}

		for _, c := range cmds {
			r.exec(c)
		}
		if closing && !draining {
			r.stopHost()
			draining = true
			deadline = time.Now().Add(r.t.cfg.DrainTimeout)
			// Queued remainders never reach the kernel again.
			for _, idx := range r.resub {
				s := &r.slots[idx]
				r.finish(idx, s.done, errClosedInFlight)
			}
			r.resub = r.resub[:0]
		}
		for _, idx := range r.work {
			r.inflight++
			switch {
			case draining:
				r.finish(idx, 0, xfer.ErrClosed)
			case r.slots[idx].canceled.Load():
				r.finish(idx, 0, xfer.ErrCanceled)
			default:
				r.resub = append(r.resub, idx)
			}
		}
		if draining {
			if !cancelAll && r.inKernel > 0 && (r.t.cfg.hooks == nil || !r.t.cfg.hooks.noDrainCancel) {
				if e := r.raw.getSQE(); e != nil {
					e.opcode = opAsyncCancel
					e.fd = -1
					e.opFlags = asyncCancelAll | asyncCancelAny
					e.userData = udCancel
					cancelAll = true
				}
			}
		} else {
			for i, ref := range r.cwork {
				idx, gen := refSlot(ref)
				// A slot that moved on to another task since: its
				// canceled task ended, and the cancel with it.
				if s := &r.slots[idx]; !s.inKernel || !s.current(gen) {
					continue
				}
				e := r.cancelSQE()
				if e == nil {
					// No SQE free (a guest's waits, enters that
					// failed): the rest go to the next pass, which
					// comes without a sleep, after this one's enter.
					r.mu.Lock()
					r.cancels = append(r.cancels, r.cwork[i:]...)
					r.mu.Unlock()
					break
				}
				e.opcode = opAsyncCancel
				e.fd = -1
				e.addr = r.slots[idx].ud
				e.userData = udCancel
			}
		}
		// At most Config.Batch requests go to the kernel per enter: the
		// rest wait in resub for the next pass, which enters without
		// sleeping (see Config.Batch).
		k := 0
		for _, idx := range r.resub {
			if k == r.t.cfg.Batch || !r.prepIO(idx) {
				break
			}
			k++
		}
		r.resub = r.resub[:copy(r.resub, r.resub[k:])]
		if !r.wakeArmed && !draining {
			if e := r.raw.getSQE(); e != nil {
				e.opcode = opRead
				e.fd = int32(r.efd)
				e.addr = uint64(uintptr(unsafe.Pointer(&r.wakeMem[8])))
				e.len = 8
				e.userData = udWake
				r.wakeArmed = true
			}
		}
		r.flushFinished()

		if draining {
			if r.inflight == 0 {
				return false
			}
			if !time.Now().Before(deadline) {
				r.abandon(errClosedInFlight)
				return false
			}
		}
		// Completions still in the CQ are reaped before the poller
		// sleeps; a pass with nothing to submit and completions to reap
		// does not enter at all.
		ready := r.raw.cqReady() > 0
		wait := len(r.resub) == 0 && !ready && !fresh
		// The guest's sleep is prepared before the ring's own check
		// below: it arms its futex waits (SQEs flushed with the rest)
		// and re-checks its own work after announcing that it sleeps.
		guestSleeps := false
		r.pollSleep, r.polled = false, false
		if wait && r.host != nil {
			guestSleeps = r.host.Sleep(r)
			wait = guestSleeps
		}
		toSubmit := r.raw.flush()
		if wait {
			r.mu.Lock()
			if len(r.pending) > 0 || len(r.cmds) > 0 || len(r.cancels) > 0 || r.closing != draining || r.kicked {
				wait = false
			} else {
				r.sleeping = true
			}
			r.mu.Unlock()
		}
		var tsp *unix.Timespec
		sliced := false
		switch {
		case draining && wait:
			ts = unix.NsecToTimespec(int64(time.Until(deadline)))
			tsp = &ts
		case wait && r.pollSleep:
			ts = unix.NsecToTimespec(int64(guestPoll))
			tsp = &ts
		case wait && r.inflight == 0 && now.Sub(busyAt) < BusyWindow:
			// Nothing of the ring's own in the kernel: the sleep lasts
			// until a client's doorbell, however long. With I/O in
			// flight its completion ends the sleep soon, and no timer
			// is armed for it.
			ts = unix.NsecToTimespec(int64(BusySleep))
			tsp, sliced = &ts, true
			yields.At(now, true)
		}
		if h := r.t.cfg.hooks; h != nil && h.sleep != nil && wait {
			bound := time.Duration(-1)
			if tsp != nil {
				bound = time.Duration(tsp.Nano())
			}
			h.sleep(bound)
		}
		var errno unix.Errno
		tried := false // io_uring_enter was made (or failed by the hook)
		if h := r.t.cfg.hooks; h != nil && h.enter != nil {
			errno = h.enter()
			tried = errno != 0
		}
		// A guest that polls (Poll) with nothing of the ring's in flight
		// passes again at once: an enter with nothing to submit would
		// only cost a system call per look.
		if errno == 0 && (toSubmit > 0 || (!ready && !r.polled)) {
			r.nEnters.Add(1)
			_, errno = r.raw.enter(toSubmit, wait, tsp)
			tried = true
		}
		if wait {
			r.mu.Lock()
			r.sleeping = false
			r.mu.Unlock()
		}
		if !sliced || errno != unix.ETIME {
			busyAt = now
		}
		if guestSleeps {
			r.host.Awake()
			// A wait that could not be armed is over with this sleep:
			// the guest must ask again next time, or it would count on
			// a wake-up that nothing in the kernel waits for.
			for _, tk := range r.unarmed {
				r.host.Fired(tk, 0)
			}
		}
		r.unarmed = r.unarmed[:0]
		var backoff time.Duration
		short := false // EAGAIN, EBUSY: the kernel is short of room
		switch errno {
		case 0, unix.EINTR, unix.ETIME:
			if tried {
				r.enterFails = 0
			}
		case unix.EAGAIN, unix.EBUSY:
			// Reap first: completions taken give the kernel room. An
			// enter that finds none to take fails as below: going round
			// at once would keep a core busy for as long as the kernel
			// stays short.
			short = true
		default:
			// Anything else is retried after a back-off, and fails the
			// ring when it persists: going round at once would keep a
			// core busy for nothing, and hold the ring's tasks until
			// Close.
			if backoff = r.enterFailed(errno); backoff < 0 {
				return true
			}
		}
		// A bounded reap: what the Done callbacks submit, and what Submit
		// queued meanwhile, reaches the kernel before the next Batch
		// completions are looked at.
		n := r.raw.Reap(r.cqes)
		for i := 0; i < n; i++ {
			r.complete(&r.cqes[i], draining)
		}
		r.flushFinished()
		switch {
		case !short:
		case n > 0:
			r.enterFails = 0
		default:
			if backoff = r.enterFailed(errno); backoff < 0 {
				return true
			}
		}
		if backoff > 0 {
			r.backoff(backoff)
		}
	}
}

// cancelSQE is an SQE for a cancel of a request, or nil when the SQ has
// none free.
func (r *ring) cancelSQE() *sqe {
	if h := r.t.cfg.hooks; h != nil && h.noCancelSQE != nil && h.noCancelSQE() {
		return nil
	}
	return r.raw.getSQE()
}

// enterFailed counts a failed io_uring_enter: it returns the back-off to
// wait before the next, or -1 when the failure is the enterFailLimit-th in
// a row and has failed the ring.
func (r *ring) enterFailed(errno unix.Errno) time.Duration {
	r.nEnterErrors.Add(1)
	r.enterFails++
	if !r.warnedErr {
		r.warnedErr = true
		r.t.log.Error("uring: io_uring_enter failed; retrying with back-off (logged once per ring)",
			"ring", r.id, "err", os.NewSyscallError("io_uring_enter", errno), "errno", unix.ErrnoName(errno))
	}
	if r.enterFails >= enterFailLimit {
		r.fail(errno)
		return -1
	}
	return min(enterBackoffMin<<(r.enterFails-1), enterBackoffMax)
}

// A ring whose io_uring_enter fails (with anything but EINTR and ETIME;
// EAGAIN and EBUSY count only when no completion was there to reap) waits before it tries again: enterBackoffMin after
// the first failure, twice as long after each next one in a row, at most
// enterBackoffMax. The enterFailLimit-th failure in a row fails the ring
// (fail): about a second of trying, counted in tries rather than time so
// that a slow pass or a late timer changes nothing about when. A failure
// that goes away costs its tasks that wait only.
const (
	enterBackoffMin = time.Millisecond
	enterBackoffMax = 100 * time.Millisecond
	enterFailLimit  = 16
)

// backoff waits d after a failed io_uring_enter, or until Close (which
// closes stop; a draining ring thus does not wait, and its failures
// soon fail it). Submit's tasks and a guest's work wait meanwhile.
func (r *ring) backoff(d time.Duration) {
	if h := r.t.cfg.hooks; h != nil && h.backoff != nil {
		h.backoff(d)
		return
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-r.stop:
	}
	t.Stop()
}

// ringError is the error of a ring declared failed: ErrRingFailed, with
// the ring and the errno its io_uring_enter kept failing with. It matches
// the errno with errors.Is, so that callers can tell EBADF from ENOMEM,
// but not that errno's category: a ring that failed with EPERM is not a
// client's permission problem, and its tasks are UNAVAILABLE.
type ringError struct {
	ring  int
	errno unix.Errno
}

func (e *ringError) Error() string {
	return fmt.Sprintf("%v: ring %d: io_uring_enter: %s (%v)", ErrRingFailed, e.ring, unix.ErrnoName(e.errno), e.errno)
}

func (e *ringError) Unwrap() error { return ErrRingFailed }

func (e *ringError) Is(target error) bool {
	errno, ok := target.(unix.Errno)
	return ok && errno == e.errno
}

// fail declares the ring failed after its io_uring_enter failed with
// errno enterFailLimit times in a row. From here Submit refuses new tasks
// for it with the ring's error, and every task it holds ends once: those
// whose completion is in the CQ with their own result, the others (queued,
// or handed to a kernel that may never take or answer them now) with the
// ring's error, as the drain's deadline ends them (abandon). The ring is
// then unmapped and closed, which makes the kernel cancel what it still
// runs; the pages of a request in flight stay pinned until it has.
// The poller goes on without it (serveFailed) until Close.
func (r *ring) fail(errno unix.Errno) {
	err := &ringError{ring: r.id, errno: errno}
	r.mu.Lock()
	r.failure.Store(err)
	r.work = append(r.work[:0], r.pending...)
	r.pending = r.pending[:0]
	r.cancels = r.cancels[:0]
	r.mu.Unlock()
	r.t.log.Error("uring: ring failed: io_uring_enter keeps failing; the tasks it held end with this error, it takes no new ones, and the transport reports itself unhealthy",
		"ring", r.id, "err", err, "errno", unix.ErrnoName(errno), "tries", r.enterFails)
	for {
		n := r.raw.Reap(r.cqes)
		if n == 0 {
			break
		}
		for i := 0; i < n; i++ {
			r.complete(&r.cqes[i], false)
		}
	}
	for _, idx := range r.resub {
		r.finish(idx, r.slots[idx].done, err)
	}
	r.resub = r.resub[:0]
	for _, idx := range r.work {
		r.inflight++
		r.finish(idx, 0, err)
	}
	r.abandon(err)
	r.closeErr = r.raw.close()
	r.waits, r.wakeArmed = 0, false
	// A read of the eventfd the closed ring armed may still be ending
	// in the kernel: serveFailed's own reads must never block on it.
	unix.SetNonblock(r.efd, true)
}

// takeControlLocked takes what a pass of the poller owes the ring's
// callers besides their I/O: the commands queued, whether Close began (the
// guest is then let go), and the guest to serve; it clears the kick. r.mu
// is held.
func (r *ring) takeControlLocked() (cmds []*command, closing bool, guest Guest) {
	if len(r.cmds) > 0 {
		cmds = r.cmds
		r.cmds = nil
	}
	closing, guest = r.closing, r.guest
	r.kicked = false
	if closing {
		r.guest = nil
	}
	return cmds, closing, guest
}

// stopHost stops the guest served, if any, for good.
func (r *ring) stopHost() {
	if g := r.host; g != nil {
		r.host = nil
		g.Stop()
	}
}

// serveFailed is the poller of a failed ring until Close. It keeps serving
// the ring's guest, a reactor whose other queues need no ring (their
// requests to this one are refused at once), and sleeps on the eventfd
// alone: at most guestPoll while it has a guest, whose waits nothing can
// arm now (failedWaits). Registrations are answered at once: a ring that
// never issues again needs no table.
func (r *ring) serveFailed() {
	var ws failedWaits
	for {
		if r.host != nil {
			r.host.Serve()
		}
		r.mu.Lock()
		cmds, closing, guest := r.takeControlLocked()
		r.mu.Unlock()
		for _, c := range cmds {
			if c.reply != nil {
				c.reply <- nil
			}
			if c.after != nil {
				c.after()
			}
		}
		if closing {
			r.stopHost()
			return
		}
		if guest != r.host {
			r.host = guest // served before the poller may sleep
			continue
		}
		timeout := -1
		if r.host != nil {
			ws.tokens = ws.tokens[:0]
			if !r.host.Sleep(&ws) {
				continue
			}
			timeout = int(guestPoll / time.Millisecond)
		}
		r.sleepFailed(timeout)
		if r.host != nil {
			r.host.Awake()
			for _, tk := range ws.tokens {
				r.host.Fired(tk, 0)
			}
		}
	}
}

// sleepFailed is a failed ring's sleep: on its eventfd, which Submit's,
// Host's, kick's and Close's wake-ups write, for at most timeout ms (-1:
// until one comes).
func (r *ring) sleepFailed(timeout int) {
	r.mu.Lock()
	if len(r.cmds) > 0 || r.closing || r.kicked || r.guest != r.host {
		r.mu.Unlock()
		return
	}
	r.sleeping = true
	r.mu.Unlock()
	fds := [1]unix.PollFd{{Fd: int32(r.efd), Events: unix.POLLIN}}
	unix.Poll(fds[:], timeout)
	r.mu.Lock()
	r.sleeping, r.wakeSent = false, false
	r.mu.Unlock()
	// Non-blocking (fail): takes the count if a wake-up left one.
	unix.Read(r.efd, r.wakeMem[8:16])
}

// failedWaits are the Waits of a failed ring's guest: nothing can be
// armed, so each wait is reported fired when the sleep ends, which
// serveFailed bounds.
type failedWaits struct{ tokens []uint32 }

func (w *failedWaits) FutexWait(_ *atomic.Uint32, _ uint32, token uint32) {
	w.tokens = append(w.tokens, token)
}
func (w *failedWaits) FDWait(_ int, token uint32)   { w.tokens = append(w.tokens, token) }
func (w *failedWaits) PollWait(_ int, token uint32) { w.tokens = append(w.tokens, token) }
func (w *failedWaits) CancelWait(uint32) bool       { return true }
func (w *failedWaits) Soon()                        {}
func (w *failedWaits) Poll() bool                   { return true }

// abandon ends every task still in the kernel with err: ErrClosed after
// the drain deadline, the ring's error when it failed. The kernel keeps
// the pages pinned until it is done.
func (r *ring) abandon(err error) {
	for i := range r.slots {
		s := &r.slots[i]
		if s.inKernel {
			s.inKernel = false
			r.inKernel--
			r.finish(int32(i), s.done, err)
		}
	}
	r.flushFinished()
}

// guestPoll bounds a sleep whose guest could not arm a futex wait (a
// kernel without IORING_OP_FUTEX_WAIT, or a full SQ): the poller then looks
// at its guest's work at least this often.
const guestPoll = time.Millisecond

// FutexWait implements Waits for the ring's guest (poller only): an
// IORING_OP_FUTEX_WAIT SQE on the shared (not private) word w, whose CQE
// carries token. Without the opcode, or with the SQ full, nothing is
// armed and the poller's sleep is bounded by guestPoll instead: the guest
// still sleeps, and a doorbell then waits for that bound at most.
func (r *ring) FutexWait(w *atomic.Uint32, v uint32, token uint32) {
	if !r.t.futexWait {
		r.unarm(token)
		return
	}
	e := r.waitSQE(token)
	if e == nil {
		return
	}
	e.opcode = opFutexWait
	e.fd = futex2SizeU32 // shared: the word lives in a mapping of another process too
	e.addr = uint64(uintptr(unsafe.Pointer(w)))
	e.off = uint64(v)             // addr2: the value the word must hold
	e.addr3 = futexBitsetMatchAny // the mask a plain FUTEX_WAKE wakes
}

// waitSQE is the SQE of one of the guest's waits, its CQE carrying token,
// counted among the guest's; nil (token unarmed) when the SQ is full or
// the guest's share of the CQ is taken (guestRoom).
func (r *ring) waitSQE(token uint32) *sqe {
	var e *sqe
	if r.guestRoom() {
		e = r.raw.getSQE()
	}
	if e == nil {
		r.unarm(token)
		return nil
	}
	e.userData = udFutex | uint64(token)
	r.waits++
	return e
}

// guestRoom reports whether the guest may put one more SQE in the ring.
// Its waits stay in the kernel until a doorbell rings, as many as it has
// queues, and each owes a CQE: they may owe only what the CQ holds beyond
// the most the ring's own requests can owe (ownCQEs), so that neither a
// wait's completion nor a request's ever finds the CQ full (see
// rawRing.owed), and a request always finds room for its own.
func (r *ring) guestRoom() bool { return r.waits < len(r.raw.cqes)-r.ownCQEs() }

// ownCQEs is the most completions the ring's own requests owe at once: a
// slot's request and a cancel of it, for every slot, the wake-up read and
// the drain's cancel.
func (r *ring) ownCQEs() int { return 2*len(r.slots) + 2 }

// unarm records that token's wait could not be put on the ring: the ring
// then sleeps briefly, and reports the wait fired when the sleep ends.
func (r *ring) unarm(token uint32) {
	r.unarmed = append(r.unarmed, token)
	r.pollSleep = true
}

// FDWait implements Waits for the ring's guest (poller only): an
// IORING_OP_READ of the eventfd fd, whose CQE carries token as a futex
// wait's does. Every such read lands in the same 8 bytes of the ring's
// own page: their values are never looked at.
func (r *ring) FDWait(fd int, token uint32) {
	e := r.waitSQE(token)
	if e == nil {
		return
	}
	e.opcode = opRead
	e.fd = int32(fd)
	e.addr = uint64(uintptr(unsafe.Pointer(&r.wakeMem[16])))
	e.len = 8
}

// PollWait implements Waits for the ring's guest (poller only): a one-shot
// IORING_OP_POLL_ADD of fd for POLLIN, whose CQE carries token as a futex
// wait's does (its result is the revents, or a negative errno).
func (r *ring) PollWait(fd int, token uint32) {
	e := r.waitSQE(token)
	if e == nil {
		return
	}
	e.opcode = opPollAdd
	e.fd = int32(fd)
	e.opFlags = unix.POLLIN // poll32_events
}

// CancelWait implements Waits (poller only): an IORING_OP_ASYNC_CANCEL of
// the wait armed with token.
func (r *ring) CancelWait(token uint32) bool {
	if !r.guestRoom() {
		return false
	}
	e := r.raw.getSQE()
	if e == nil {
		return false
	}
	e.opcode = opAsyncCancel
	e.fd = -1
	e.addr = udFutex | uint64(token)
	e.userData = udWaitCancel
	r.waits++
	return true
}

// Soon implements Waits: the poller's sleep is bounded by guestPoll.
func (r *ring) Soon() { r.pollSleep = true }

// Poll implements Waits (poller only): true when nothing of the ring's is
// in the kernel or waiting for it. Only requests count: the guest's armed
// waits stay in the kernel while it polls, and what ends one while it
// polls (a doorbell) the guest's own pass sees.
func (r *ring) Poll() bool {
	if r.inKernel > 0 || len(r.resub) > 0 || r.raw.cqReady() > 0 {
		return false
	}
	r.polled = true
	return true
}
