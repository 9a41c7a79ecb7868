//go:build linux

package uring

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

const (
	// maxIO is the most one SQE moves; longer requests continue through
	// the remainder path. A multiple of every block size.
	maxIO = 1 << 30
	// bufChunk is the largest registered buffer the kernel accepts.
	bufChunk = 1 << 30
	// maxRetries bounds EAGAIN/EINTR resubmissions of one task.
	maxRetries = 16

	udWake   = 1 << 62
	udCancel = 1 << 61
)

// Transport is the io_uring xfer.Transport. Create it with New; it is safe
// for concurrent use.
type Transport struct {
	cfg   Config
	log   *slog.Logger
	rings []*ring
	feat  Features

	allowedDirs []string
	allowedDevs []string

	rr     atomic.Uint32
	closed atomic.Bool

	closeOnce sync.Once
	closeErr  error

	fixedBufs  atomic.Bool
	fixedFiles atomic.Bool
	// bufTab maps a registered memory segment to its fixed-buffer indices.
	// Copy-on-write: the poller reads it without locks.
	bufTab atomic.Pointer[bufTable]

	// regMu guards bufFree and warnedBufs and serializes buffer
	// registration; it is held while waiting for pollers, so a poller
	// never takes it.
	regMu      sync.Mutex
	bufFree    []uint16
	warnedBufs bool

	// fileMu guards the fields below; it is never held while waiting for
	// a poller (pollers take it when a file's last reference goes).
	fileMu      sync.Mutex
	fileFree    []int32
	files       map[*File]struct{}
	warnedFiles bool
}

type bufEntry struct {
	base uintptr
	size uint64
	idx  []uint16 // one registered buffer per GiB of the segment
}

type bufTable struct {
	m map[xfer.SegmentID]bufEntry
}

var _ xfer.Transport = (*Transport)(nil)

// New probes io_uring (once per process), creates cfg.Rings rings and starts
// one poller per ring. log receives lifecycle messages only.
func New(cfg Config, log *slog.Logger) (*Transport, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Entries = roundPow2(cfg.Entries)
	cfg.Batch = min(cfg.Batch, int(cfg.Entries))
	p := probe()
	if p.err != nil {
		return nil, fmt.Errorf("%w: io_uring_setup: %w", ErrNotSupported, p.err)
	}
	for _, op := range []int{opRead, opWrite, opAsyncCancel} {
		if !p.ops[op] {
			return nil, fmt.Errorf("%w: io_uring opcode %d missing", ErrNotSupported, op)
		}
	}
	t := &Transport{cfg: cfg, log: log, files: make(map[*File]struct{})}
	if err := t.resolveAllowlist(); err != nil {
		return nil, err
	}
	flags, err := t.chooseFlags(p)
	if err != nil {
		return nil, err
	}
	t.feat = Features{
		Mask: p.features, Opcodes: p.opCount(),
		SingleIssuer: flags&setupSingleIssuer != 0, DeferTaskrun: flags&setupDeferTaskrun != 0,
		CoopTaskrun: flags&setupCoopTaskrun != 0, SQPoll: flags&setupSQPoll != 0,
		ExtArg: p.features&featExtArg != 0,
	}
	t.fixedBufs.Store(!cfg.NoFixedBuffers && cfg.MaxFixedBuffers > 0 && p.ops[opReadFixed] && p.ops[opWriteFixed])
	t.fixedFiles.Store(!cfg.NoFixedFiles && cfg.MaxFixedFiles > 0)
	for i := cfg.MaxFixedBuffers - 1; i >= 0; i-- {
		t.bufFree = append(t.bufFree, uint16(i))
	}
	for i := cfg.MaxFixedFiles - 1; i >= 0; i-- {
		t.fileFree = append(t.fileFree, int32(i))
	}
	t.bufTab.Store(&bufTable{m: map[xfer.SegmentID]bufEntry{}})

	for i := 0; i < cfg.Rings; i++ {
		r := newRing(t, i, flags)
		ready := make(chan ringSetup, 1)
		go r.run(ready)
		rs := <-ready
		if rs.err != nil {
			t.Close()
			return nil, rs.err
		}
		if !rs.fixedBufs && t.fixedBufs.Load() {
			t.fixedBufs.Store(false)
			log.Warn("uring: registered buffers unavailable, using plain READ/WRITE", "err", rs.bufErr)
		}
		if !rs.fixedFiles && t.fixedFiles.Load() {
			t.fixedFiles.Store(false)
			log.Warn("uring: registered files unavailable, using plain descriptors", "err", rs.fileErr)
		}
		t.rings = append(t.rings, r)
	}
	t.feat.FixedBuffers = t.fixedBufs.Load()
	t.feat.FixedFiles = t.fixedFiles.Load()
	probeLog.Do(func() {
		log.Info("uring: kernel io_uring probe",
			"features", fmt.Sprintf("%#x", p.features), "opcodes", p.opCount(), "last_opcode", p.lastOp,
			"single_issuer", p.singleIssuer, "defer_taskrun", p.deferTaskrun, "coop_taskrun", p.coopTaskrun,
			"ext_arg", p.features&featExtArg != 0, "read_fixed", p.ops[opReadFixed], "async_cancel", p.ops[opAsyncCancel])
	})
	log.Info("uring: transport ready",
		"rings", cfg.Rings, "entries", cfg.Entries,
		"single_issuer", t.feat.SingleIssuer, "defer_taskrun", t.feat.DeferTaskrun,
		"coop_taskrun", t.feat.CoopTaskrun, "sqpoll", t.feat.SQPoll,
		"fixed_buffers", t.feat.FixedBuffers, "fixed_files", t.feat.FixedFiles)
	return t, nil
}

func roundPow2(v uint32) uint32 {
	n := uint32(1)
	for n < v {
		n <<= 1
	}
	return n
}

func (t *Transport) chooseFlags(p *probeResult) (uint32, error) {
	c := &t.cfg
	var flags uint32
	if c.SQPoll {
		flags |= setupSQPoll
		if c.DeferTaskrun == On {
			return 0, fmt.Errorf("%w: DeferTaskrun cannot be combined with SQPoll", ErrConfig)
		}
	}
	si := c.SingleIssuer != Off && p.singleIssuer
	if c.SingleIssuer == On && !p.singleIssuer {
		return 0, fmt.Errorf("%w: IORING_SETUP_SINGLE_ISSUER", ErrNotSupported)
	}
	dt := si && !c.SQPoll && c.DeferTaskrun != Off && p.deferTaskrun
	if c.DeferTaskrun == On && !dt {
		return 0, fmt.Errorf("%w: IORING_SETUP_DEFER_TASKRUN", ErrNotSupported)
	}
	// The task-run flags concern interrupting the issuer; with SQPOLL the
	// kernel thread issues, and the kernel refuses them.
	coop := false
	switch c.CoopTaskrun {
	case On:
		if c.SQPoll {
			return 0, fmt.Errorf("%w: CoopTaskrun cannot be combined with SQPoll", ErrConfig)
		}
		if !p.coopTaskrun {
			return 0, fmt.Errorf("%w: IORING_SETUP_COOP_TASKRUN", ErrNotSupported)
		}
		coop = !dt
	case Auto:
		coop = !dt && !c.SQPoll && p.coopTaskrun
	}
	if si {
		flags |= setupSingleIssuer
	}
	if dt {
		flags |= setupDeferTaskrun
	}
	if coop {
		flags |= setupCoopTaskrun | setupTaskrunFlag
	}
	return flags, nil
}

func (t *Transport) resolveAllowlist() error {
	for _, d := range t.cfg.AllowedDirs {
		r, err := resolvePath(d)
		if err != nil {
			return fmt.Errorf("%w: AllowedDirs %q: %w", ErrConfig, d, err)
		}
		t.allowedDirs = append(t.allowedDirs, r)
	}
	for _, d := range t.cfg.AllowedDevices {
		r, err := resolvePath(d)
		if err != nil {
			return fmt.Errorf("%w: AllowedDevices %q: %w", ErrConfig, d, err)
		}
		t.allowedDevs = append(t.allowedDevs, r)
	}
	return nil
}

func resolvePath(p string) (string, error) {
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(a)
}

// Name is "uring".
func (t *Transport) Name() string { return "uring" }

// Features reports what the kernel offers and what the rings use.
func (t *Transport) Features() Features {
	f := t.feat
	f.FixedBuffers = t.fixedBufs.Load()
	f.FixedFiles = t.fixedFiles.Load()
	return f
}

// Stats returns one RingStats per ring.
func (t *Transport) Stats() []RingStats {
	out := make([]RingStats, len(t.rings))
	for i, r := range t.rings {
		r.mu.Lock()
		inflight := len(r.slots) - len(r.free)
		r.mu.Unlock()
		out[i] = RingStats{
			Entries: uint32(len(r.slots)), InFlight: inflight,
			Submitted: r.nSubmitted.Load(), Completed: r.nCompleted.Load(), Failed: r.nFailed.Load(),
			Resubmits: r.nResubmits.Load(), Enters: r.nEnters.Load(), Wakeups: r.nWakeups.Load(),
			Fixed: r.nFixed.Load(),
		}
	}
	return out
}

// Submit dispatches tasks in order (see xfer.Transport). Invalid tasks are
// dispatched and end at once with an error matching xfer.ErrInvalid (or
// xfer.ErrPermission); a task carrying a notification ends with
// xfer.ErrNoNotify (xfer.ErrNotSupported). A full ring makes Submit wait up to
// Config.SubmitWait for room, then return ErrQueueFull for the rest. Submit
// may be called from Task.Done callbacks, but then must not submit more
// tasks than it was handed back, or it waits for room only its own
// goroutine could make and returns ErrQueueFull after SubmitWait.
func (t *Transport) Submit(tasks []*xfer.Task) (int, error) {
	if t.closed.Load() {
		return 0, xfer.ErrClosed
	}
	if len(tasks) == 0 {
		return 0, nil
	}
	r := t.rings[0]
	if len(t.rings) > 1 {
		r = t.rings[int(t.rr.Add(1)-1)%len(t.rings)]
	}
	return r.submit(tasks)
}

// Cancel asks the kernel to end the task early (IORING_OP_ASYNC_CANCEL). A
// task that already completed, or that is not this transport's, is left
// alone. A canceled task ends with an error matching xfer.ErrCanceled, or
// with its real result if the device finished first.
func (t *Transport) Cancel(task *xfer.Task) {
	if task == nil {
		return
	}
	ri, si := int(task.Tag>>32), task.Tag&0xffffffff
	if ri >= len(t.rings) {
		return
	}
	r := t.rings[ri]
	if si >= uint64(len(r.slots)) {
		return
	}
	r.mu.Lock()
	s := &r.slots[si]
	wake := false
	if s.task == task && !s.cancelQueued {
		s.cancelQueued = true
		s.canceled.Store(true)
		r.cancels = append(r.cancels, int32(si))
		wake = r.wakeLocked()
	}
	r.mu.Unlock()
	if wake {
		r.wake()
	}
}

// Close stops dispatch, cancels and drains in-flight I/O (bounded by
// Config.DrainTimeout), ends every task exactly once, tears the rings down
// and closes the files opened through the transport. Safe to call more
// than once and concurrently, but not from Task.Done (it waits for the
// poller that runs the callback).
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		for _, r := range t.rings {
			r.mu.Lock()
			r.closing = true
			wake := r.wakeLocked()
			r.mu.Unlock()
			close(r.stop)
			if wake {
				r.wake()
			}
		}
		var errs []error
		for _, r := range t.rings {
			<-r.exited
			if r.closeErr != nil {
				errs = append(errs, r.closeErr)
			}
			if err := unix.Close(r.efd); err != nil {
				errs = append(errs, os.NewSyscallError("close eventfd", err))
			}
			unix.Munmap(r.wakeMem)
		}
		t.fileMu.Lock()
		files := make([]*File, 0, len(t.files))
		for f := range t.files {
			files = append(files, f)
		}
		t.fileMu.Unlock()
		for _, f := range files {
			f.Close()
		}
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// RegisterBuffers registers memory segments as fixed buffers on every ring
// so requests on them use READ_FIXED/WRITE_FIXED. A segment over 1 GiB
// takes one table entry per GiB. When the kernel refuses (RLIMIT_MEMLOCK,
// table full) the segment stays usable through plain READ/WRITE; that is
// logged once and is not an error. It must not be called from Task.Done.
func (t *Transport) RegisterBuffers(segs ...xfer.MemSegment) error {
	if t.closed.Load() {
		return xfer.ErrClosed
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	for _, seg := range segs {
		if seg == nil {
			return fmt.Errorf("%w: nil segment", ErrBadRequest)
		}
		mem := seg.Bytes()
		if len(mem) == 0 {
			return fmt.Errorf("%w: segment %d has no memory", ErrBadRequest, seg.ID())
		}
		if !t.fixedBufs.Load() {
			continue
		}
		if _, ok := t.bufTab.Load().m[seg.ID()]; ok {
			continue
		}
		chunks := (len(mem) + bufChunk - 1) / bufChunk
		if chunks > len(t.bufFree) {
			t.warnBufs(fmt.Errorf("fixed-buffer table full (%d entries)", t.cfg.MaxFixedBuffers))
			continue
		}
		e := bufEntry{base: uintptr(unsafe.Pointer(&mem[0])), size: uint64(len(mem))}
		e.idx = append([]uint16(nil), t.bufFree[len(t.bufFree)-chunks:]...)
		iov := make([]unix.Iovec, chunks)
		for i := range iov {
			lo := i * bufChunk
			hi := min(lo+bufChunk, len(mem))
			iov[i].Base = &mem[lo]
			iov[i].SetLen(hi - lo)
		}
		if err := t.updateBuffers(e.idx, iov); err != nil {
			t.warnBufs(err)
			clear := make([]unix.Iovec, chunks)
			t.updateBuffers(e.idx, clear)
			continue
		}
		t.bufFree = t.bufFree[:len(t.bufFree)-chunks]
		old := t.bufTab.Load().m
		m := make(map[xfer.SegmentID]bufEntry, len(old)+1)
		for k, v := range old {
			m[k] = v
		}
		m[seg.ID()] = e
		t.bufTab.Store(&bufTable{m: m})
		runtime.KeepAlive(mem)
	}
	return nil
}

// UnregisterBuffers drops segments' fixed-buffer registrations (unknown ids
// are ignored). Requests already in the kernel keep their pages pinned
// until they complete. It must not be called from Task.Done.
func (t *Transport) UnregisterBuffers(ids ...xfer.SegmentID) error {
	if t.closed.Load() {
		return xfer.ErrClosed
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	old := t.bufTab.Load().m
	m := make(map[xfer.SegmentID]bufEntry, len(old))
	for k, v := range old {
		m[k] = v
	}
	var drop []bufEntry
	for _, id := range ids {
		if e, ok := m[id]; ok {
			drop = append(drop, e)
			delete(m, id)
		}
	}
	t.bufTab.Store(&bufTable{m: m})
	var first error
	for _, e := range drop {
		if err := t.updateBuffers(e.idx, make([]unix.Iovec, len(e.idx))); err != nil && first == nil {
			first = err
		}
		t.bufFree = append(t.bufFree, e.idx...)
	}
	return first
}

func (t *Transport) warnBufs(err error) {
	if !t.warnedBufs {
		t.warnedBufs = true
		t.log.Warn("uring: buffer registration failed, segment uses plain READ/WRITE", "err", err)
	}
}

// updateBuffers sets registered-buffer entries idx[i] to iov[i] on every
// ring (a zero iovec clears an entry).
func (t *Transport) updateBuffers(idx []uint16, iov []unix.Iovec) error {
	if t.cfg.hooks != nil && t.cfg.hooks.failRegister && iov[0].Base != nil {
		return os.NewSyscallError("io_uring_register", unix.ENOMEM)
	}
	for _, r := range t.rings {
		for i := range idx {
			if err := r.do(&command{kind: cmdBuffer, idx: uint32(idx[i]), iov: iov[i : i+1]}); err != nil {
				return err
			}
		}
	}
	return nil
}

// --- rings ---

// slot is one task in flight on a ring. Submit fills a free slot under
// ring.mu and queues it; from then on only the poller touches the fields
// above task, until the slot is freed again under ring.mu.
type slot struct {
	addr      uintptr // memory address of the request's first byte
	localBase uintptr // base of the local segment's mapping
	localID   xfer.SegmentID
	off       uint64 // file offset of the request's first byte
	total     uint64
	done      uint64
	fd        int32 // file descriptor, or fixed-file index when fixedFile
	fixedFile bool
	op        uint8
	retries   uint8
	inKernel  bool // an SQE for it is in the kernel

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

	efd     int    // eventfd that wakes a sleeping poller
	wakeMem []byte // one page: [0:8] the eventfd write value, [8:16] the read buffer

	stop   chan struct{} // closed by Close: wakes Submit waiting for room
	room   chan struct{} // the poller signals freed slots to a waiting Submit
	exited chan struct{} // closed by the poller when the ring is torn down

	slots []slot

	// mu guards the fields below, and slot.task/cancelQueued.
	mu       sync.Mutex
	free     []int32 // free slot indices (stack)
	pending  []int32 // slots queued by Submit for the poller
	cancels  []int32 // slots Cancel asked about
	cmds     []*command
	sleeping bool // the poller is (about to be) waiting in the kernel
	wakeSent bool // an eventfd wake-up is outstanding
	closing  bool
	waiters  int // Submit calls waiting for room

	// poller-only:
	raw       *rawRing
	work      []int32
	cwork     []int32
	resub     []int32
	cqes      []CQE
	fin       []finished
	inflight  int // slots taken from pending and not yet finished
	inKernel  int
	wakeArmed bool
	closeErr  error
	warnedErr bool

	nSubmitted, nCompleted, nFailed, nResubmits, nEnters, nWakeups, nFixed atomic.Uint64
}

func newRing(t *Transport, id int, flags uint32) *ring {
	n := int(t.cfg.Entries)
	r := &ring{
		t: t, id: id, flags: flags, efd: -1,
		stop: make(chan struct{}), room: make(chan struct{}, 1), exited: make(chan struct{}),
		slots: make([]slot, n),
		free:  make([]int32, 0, n), pending: make([]int32, 0, n), cancels: make([]int32, 0, n),
		work: make([]int32, 0, n), cwork: make([]int32, 0, n), resub: make([]int32, 0, n),
		cqes: make([]CQE, t.cfg.Batch), fin: make([]finished, 0, n),
	}
	for i := n - 1; i >= 0; i-- {
		r.free = append(r.free, int32(i))
	}
	return r
}

// run is the poller. It locks itself to its OS thread for its whole life:
// that thread creates the ring and is its single issuer.
func (r *ring) run(ready chan<- ringSetup) {
	runtime.LockOSThread()
	// The thread is never unlocked: it exits with the goroutine, taking
	// its io_uring task context with it after the ring is gone.
	defer close(r.exited)
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
	r.loop()
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
	r.closeErr = r.raw.close()
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

// prepared is a validated task, ready to fill a slot.
type prepared struct {
	addr, base uintptr
	localID    xfer.SegmentID
	off, total uint64
	fd         int32
	fixedFile  bool
	op         uint8
}

// resolve validates a task and works out its SQE parameters.
func (t *Transport) resolve(task *xfer.Task, p *prepared) error {
	req := &task.Req
	if task.Notify != nil {
		// A file has nobody to deliver a notification to.
		return xfer.ErrNoNotify
	}
	switch req.Op {
	case xfer.OpRead:
		p.op = opRead
	case xfer.OpWrite:
		p.op = opWrite
	default:
		return fmt.Errorf("%w: op %d", ErrBadRequest, req.Op)
	}
	if req.Length == 0 {
		return fmt.Errorf("%w: zero length", ErrBadRequest)
	}
	local, ok := task.Local.(xfer.MemSegment)
	if !ok || local == nil {
		return fmt.Errorf("%w: local side must be a memory segment", ErrBadRequest)
	}
	f, ok := task.Target.(*File)
	if !ok || f == nil || f.t != t {
		return fmt.Errorf("%w: target must be a file opened by this transport", ErrBadRequest)
	}
	mem := local.Bytes()
	if req.LocalOffset > uint64(len(mem)) || req.Length > uint64(len(mem))-req.LocalOffset {
		return fmt.Errorf("%w: local range %d+%d beyond segment size %d", ErrBadRequest, req.LocalOffset, req.Length, len(mem))
	}
	if req.TargetOffset > f.size || req.Length > f.size-req.TargetOffset {
		return fmt.Errorf("%w: file range %d+%d beyond size %d", ErrBadRequest, req.TargetOffset, req.Length, f.size)
	}
	if p.op == opWrite && f.readOnly {
		return fmt.Errorf("%w: file %s is read-only", xfer.ErrPermission, f.path)
	}
	p.base = uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	p.addr = p.base + uintptr(req.LocalOffset)
	if f.direct {
		oa, ma := uint64(f.offAlign), uint64(f.memAlign)
		switch {
		case req.TargetOffset%oa != 0:
			return fmt.Errorf("%w: file offset %d is not a multiple of %d", ErrMisaligned, req.TargetOffset, oa)
		case req.Length%oa != 0:
			return fmt.Errorf("%w: length %d is not a multiple of %d", ErrMisaligned, req.Length, oa)
		case uint64(p.addr)%ma != 0:
			return fmt.Errorf("%w: memory address %#x is not a multiple of %d", ErrMisaligned, p.addr, ma)
		}
	}
	p.localID = local.ID()
	p.off = req.TargetOffset
	p.total = req.Length
	if f.fixed >= 0 {
		p.fd, p.fixedFile = f.fixed, true
	} else {
		p.fd, p.fixedFile = int32(f.fd), false
	}
	return nil
}

func (r *ring) submit(tasks []*xfer.Task) (int, error) {
	n := 0
	locked := false
	unlock := func() {
		wake := r.wakeLocked()
		r.mu.Unlock()
		if wake {
			r.wake()
		}
	}
	for n < len(tasks) {
		task := tasks[n]
		if task == nil {
			if locked {
				unlock()
			}
			return n, fmt.Errorf("%w: nil task at %d", ErrBadRequest, n)
		}
		var p prepared
		if err := r.t.resolve(task, &p); err != nil {
			if locked {
				unlock()
				locked = false
			}
			r.nFailed.Add(1)
			task.Done(0, err)
			n++
			continue
		}
		if !locked {
			r.mu.Lock()
			locked = true
		}
		if r.closing {
			r.mu.Unlock()
			return n, xfer.ErrClosed
		}
		if len(r.free) == 0 {
			// Backpressure: let the poller see what is queued, then wait.
			wake := r.wakeLocked()
			if wake {
				r.mu.Unlock()
				r.wake()
				r.mu.Lock()
			}
			if err := r.waitRoom(); err != nil {
				r.mu.Unlock()
				return n, err
			}
			continue
		}
		idx := r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
		s := &r.slots[idx]
		s.addr, s.localBase, s.localID = p.addr, p.base, p.localID
		s.off, s.total, s.done = p.off, p.total, 0
		s.fd, s.fixedFile, s.op = p.fd, p.fixedFile, p.op
		s.retries, s.inKernel = 0, false
		s.task = task
		task.Tag = uint64(r.id)<<32 | uint64(idx)
		r.pending = append(r.pending, idx)
		n++
		if len(r.free) > 0 && r.waiters > 0 && n == len(tasks) {
			select {
			case r.room <- struct{}{}:
			default:
			}
		}
	}
	if locked {
		unlock()
	}
	return n, nil
}

// waitRoom waits, bounded by Config.SubmitWait, for the poller to free a
// slot. Called and returns with mu held.
func (r *ring) waitRoom() error {
	if len(r.free) > 0 {
		return nil // freed while mu was dropped to wake the poller
	}
	r.waiters++
	r.mu.Unlock()
	timer := time.NewTimer(r.t.cfg.SubmitWait)
	var err error
	select {
	case <-r.room:
	case <-r.stop:
		err = xfer.ErrClosed
	case <-timer.C:
		err = ErrQueueFull
	}
	timer.Stop()
	r.mu.Lock()
	r.waiters--
	if err == nil && r.closing {
		err = xfer.ErrClosed
	}
	return err
}

// finish records a task's end; flushFinished frees the slots and calls
// Task.Done outside the lock.
func (r *ring) finish(idx int32, n uint64, err error) {
	s := &r.slots[idx]
	r.fin = append(r.fin, finished{idx: idx, task: s.task, n: n, err: err})
	r.inflight--
	if err == nil {
		r.nCompleted.Add(1)
	} else {
		r.nFailed.Add(1)
	}
}

func (r *ring) flushFinished() {
	if len(r.fin) == 0 {
		return
	}
	r.mu.Lock()
	for i := range r.fin {
		idx := r.fin[i].idx
		s := &r.slots[idx]
		if invariants && (s.task == nil || s.inKernel || len(r.free) >= len(r.slots)) {
			panic(fmt.Sprintf("uring invariant: freeing slot %d twice or while in the kernel", idx))
		}
		s.task = nil
		s.cancelQueued = false
		s.canceled.Store(false)
		r.free = append(r.free, idx)
	}
	if r.waiters > 0 {
		select {
		case r.room <- struct{}{}:
		default:
		}
	}
	r.mu.Unlock()
	for i := range r.fin {
		f := &r.fin[i]
		f.task.Done(f.n, f.err)
		*f = finished{}
	}
	r.fin = r.fin[:0]
}

var errClosedInFlight = fmt.Errorf("uring: transport closed with the request in flight: %w", xfer.ErrClosed)

func (r *ring) loop() {
	var (
		draining  bool
		cancelAll bool
		deadline  time.Time
		ts        unix.Timespec
	)
	for {
		r.mu.Lock()
		r.work = append(r.work[:0], r.pending...)
		r.pending = r.pending[:0]
		r.cwork = append(r.cwork[:0], r.cancels...)
		r.cancels = r.cancels[:0]
		var cmds []*command
		if len(r.cmds) > 0 {
			cmds = r.cmds
			r.cmds = nil
		}
		closing := r.closing
		r.mu.Unlock()

		for _, c := range cmds {
			r.exec(c)
		}
		if closing && !draining {
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
			for _, idx := range r.cwork {
				if !r.slots[idx].inKernel {
					continue
				}
				e := r.raw.getSQE()
				if e == nil {
					break
				}
				e.opcode = opAsyncCancel
				e.fd = -1
				e.addr = uint64(idx)
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
				return
			}
			if !time.Now().Before(deadline) {
				r.abandon()
				return
			}
		}
		toSubmit := r.raw.flush()
		// Completions still in the CQ are reaped before the poller
		// sleeps; a pass with nothing to submit and completions to reap
		// does not enter at all.
		ready := r.raw.cqReady() > 0
		wait := len(r.resub) == 0 && !ready
		if wait {
			r.mu.Lock()
			if len(r.pending) > 0 || len(r.cmds) > 0 || len(r.cancels) > 0 || r.closing != draining {
				wait = false
			} else {
				r.sleeping = true
			}
			r.mu.Unlock()
		}
		var tsp *unix.Timespec
		if draining && wait {
			ts = unix.NsecToTimespec(int64(time.Until(deadline)))
			tsp = &ts
		}
		var errno unix.Errno
		if toSubmit > 0 || !ready {
			r.nEnters.Add(1)
			_, errno = r.raw.enter(toSubmit, wait, tsp)
		}
		if wait {
			r.mu.Lock()
			r.sleeping = false
			r.mu.Unlock()
		}
		switch errno {
		case 0, unix.EINTR, unix.ETIME:
		case unix.EAGAIN, unix.EBUSY:
			// The kernel is short of room for completions: reap first.
		default:
			if !r.warnedErr {
				r.warnedErr = true
				r.t.log.Error("uring: io_uring_enter failed", "ring", r.id, "err", os.NewSyscallError("io_uring_enter", errno))
			}
			runtime.Gosched()
		}
		// A bounded reap: what the Done callbacks submit, and what Submit
		// queued meanwhile, reaches the kernel before the next Batch
		// completions are looked at.
		n := r.raw.Reap(r.cqes)
		for i := 0; i < n; i++ {
			r.complete(&r.cqes[i], draining)
		}
		r.flushFinished()
	}
}

// abandon ends every task still in the kernel with ErrClosed after the
// drain deadline. The kernel keeps the pages pinned until it is done.
func (r *ring) abandon() {
	for i := range r.slots {
		s := &r.slots[i]
		if s.inKernel {
			s.inKernel = false
			r.inKernel--
			r.finish(int32(i), s.done, errClosedInFlight)
		}
	}
	r.flushFinished()
}

func (r *ring) prepIO(idx int32) bool {
	e := r.raw.getSQE()
	if e == nil {
		return false
	}
	s := &r.slots[idx]
	n := s.total - s.done
	if n > maxIO {
		n = maxIO
	}
	addr := s.addr + uintptr(s.done)
	e.opcode = s.op
	e.fd = s.fd
	if s.fixedFile {
		e.flags = sqeFixedFile
	}
	e.off = s.off + s.done
	e.addr = uint64(addr)
	if tab := r.t.bufTab.Load(); len(tab.m) > 0 {
		if be, ok := tab.m[s.localID]; ok && be.base == s.localBase {
			rel := uint64(addr - be.base)
			chunk := rel / bufChunk
			if end := (chunk + 1) * bufChunk; rel+n > end {
				n = end - rel
			}
			if s.op == opRead {
				e.opcode = opReadFixed
			} else {
				e.opcode = opWriteFixed
			}
			e.bufIndex = be.idx[chunk]
			r.nFixed.Add(1)
		}
	}
	e.len = uint32(n)
	e.userData = uint64(idx)
	s.inKernel = true
	r.inKernel++
	r.nSubmitted.Add(1)
	return true
}

func (r *ring) complete(c *CQE, draining bool) {
	switch {
	case c.UserData == udWake:
		r.wakeArmed = false
		r.nWakeups.Add(1)
		r.mu.Lock()
		r.wakeSent = false
		r.mu.Unlock()
		return
	case c.UserData == udCancel:
		return
	case c.UserData >= uint64(len(r.slots)):
		return
	}
	idx := int32(c.UserData)
	s := &r.slots[idx]
	if !s.inKernel {
		if invariants {
			panic(fmt.Sprintf("uring invariant: completion for slot %d that is not in the kernel", idx))
		}
		return
	}
	s.inKernel = false
	r.inKernel--
	res := c.Res
	if h := r.t.cfg.hooks; h != nil && h.result != nil {
		res = h.result(s.op, res)
	}
	if res < 0 {
		errno := unix.Errno(-res)
		switch {
		case (errno == unix.EAGAIN || errno == unix.EINTR) && !draining && s.retries < maxRetries:
			s.retries++
			r.nResubmits.Add(1)
			r.resub = append(r.resub, idx)
		case errno == unix.ECANCELED && draining:
			r.finish(idx, s.done, errClosedInFlight)
		case errno == unix.ECANCELED:
			r.finish(idx, s.done, xfer.ErrCanceled)
		default:
			r.finish(idx, s.done, r.ioError(s, errno))
		}
		return
	}
	if res == 0 {
		r.finish(idx, s.done, fmt.Errorf("%w: %s of %d bytes at file offset %d returned 0", ErrShortIO, opName(s.op), s.total-s.done, s.off+s.done))
		return
	}
	s.done += uint64(res)
	switch {
	case s.done >= s.total:
		r.finish(idx, s.total, nil)
	case draining:
		r.finish(idx, s.done, errClosedInFlight)
	case s.canceled.Load():
		r.finish(idx, s.done, xfer.ErrCanceled)
	default:
		r.nResubmits.Add(1)
		r.resub = append(r.resub, idx)
	}
}

func opName(op uint8) string {
	if op == opWrite {
		return "write"
	}
	return "read"
}

func (r *ring) ioError(s *slot, errno unix.Errno) error {
	return fmt.Errorf("uring: %s at file offset %d: %w", opName(s.op), s.off+s.done,
		os.NewSyscallError("io_uring "+opName(s.op), errno))
}
