//go:build linux

package uring

// The Transport: New (probe, flags, allowlist, one ring per Config.Rings),
// the xfer.Transport methods Submit, Cancel and Close, and Stats.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

const (
	// maxIO is the most one SQE moves; longer requests continue through
	// the remainder path. A multiple of every block size.
	maxIO = 1 << 30
	// bufChunk is the largest registered buffer the kernel accepts.
	bufChunk = 1 << 30
	// maxRetries bounds EAGAIN/EINTR and unasked ECANCELED resubmissions
	// of one task.
	maxRetries = 16

	udWake   = 1 << 62
	udCancel = 1 << 61
	// udFutex is a guest's futex wait; its low 32 bits are the guest's
	// token (udTokenMask).
	udFutex     = 1 << 59
	udTokenMask = 1<<32 - 1
	// udWaitCancel is the cancel of a guest's wait (Waits.CancelWait),
	// told apart from a request's cancel (udCancel) because it is the
	// guest's to owe (ring.waits).
	udWaitCancel = 1 << 58
)

// TracedUserData is the bit a data SQE's user_data carries when the ring
// picked it for the kernel-side latency view (Config.TraceEvery; package
// ktrace times only the requests that carry it). The rest of user_data is
// the slot and its generation; the wake-up and cancel SQEs never carry it.
const TracedUserData = 1 << 60

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
	// futexWait: the kernel has IORING_OP_FUTEX_WAIT, so a guest's
	// doorbells end the ring's sleep (Guest, Waits).
	futexWait bool
	// regMu guards warnedBufs and serializes buffer registration; it is
	// held while waiting for pollers, so a poller never takes it.
	regMu      sync.Mutex
	warnedBufs bool
	// bufMu guards the fields below; it is never held while waiting for a
	// poller (pollers take it when a segment's teardown freed entries).
	// The poller reads a segment's registration from its slot, not here.
	bufMu   sync.Mutex
	bufFree []uint16
	bufs    map[*bufEntry]struct{} // the registrations in segments' slots

	// fileMu guards the fields below; it is never held while waiting for
	// a poller (pollers take it when a file's last reference goes).
	fileMu      sync.Mutex
	fileFree    []int32
	files       map[*File]struct{}
	warnedFiles bool
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
	t := &Transport{cfg: cfg, log: log, files: make(map[*File]struct{}), futexWait: p.ops[opFutexWait] && (cfg.hooks == nil || !cfg.hooks.noFutexWait)}
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
	t.bufs = make(map[*bufEntry]struct{})

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
			"ext_arg", p.features&featExtArg != 0, "read_fixed", p.ops[opReadFixed], "async_cancel", p.ops[opAsyncCancel],
			"futex_wait", p.ops[opFutexWait])
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
			Fixed: r.nFixed.Load(), Traced: r.nTraced.Load(), KernelCancels: r.nKernelCancels.Load(),
			EnterErrors: r.nEnterErrors.Load(), Down: r.failure.Load() != nil,
		}
	}
	return out
}

// Submit dispatches tasks in order (see xfer.Transport). Invalid tasks are
// dispatched and end at once with an error matching xfer.ErrInvalid (or
// xfer.ErrPermission); a task carrying a notification ends with
// xfer.ErrNoNotify (xfer.ErrNotSupported). A full ring makes Submit wait up to
// Config.SubmitWait for room, then return ErrQueueFull for the rest; on
// the ring's own poller (its guest, or a Task.Done callback) a full ring
// returns ErrQueueFull at once, since only that thread makes room. Tasks
// whose Home names a ring go to that ring; the others round robin, past
// rings that failed. A ring that failed refuses its tasks with its error
// (ErrRingFailed).
func (t *Transport) Submit(tasks []*xfer.Task) (int, error) {
	if t.closed.Load() {
		return 0, xfer.ErrClosed
	}
	if len(tasks) == 0 {
		return 0, nil
	}
	if h := tasks[0].Home; h != 0 && int(h) <= len(t.rings) {
		// Submitted by the thread of ring h-1 (its guest): see Task.Home.
		return t.rings[h-1].submit(tasks, true)
	}
	r := t.rings[0]
	if len(t.rings) > 1 {
		first := int(t.rr.Add(1) - 1)
		for i := range len(t.rings) {
			if r = t.rings[(first+i)%len(t.rings)]; r.failure.Load() == nil {
				break
			}
		}
	}
	return r.submit(tasks, false)
}

// Health is nil while every ring works; otherwise it is the error of each
// ring that failed (ErrRingFailed, naming its errno). Such a ring's tasks
// ended, its guest runs on without it and the other rings serve on, but
// nothing brings it back: a daemon reports itself unhealthy with it, so
// that it is restarted.
func (t *Transport) Health() error {
	var errs []error
	for _, r := range t.rings {
		if err := r.failure.Load(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Rings is how many rings the transport has: the guests it can host.
func (t *Transport) Rings() int { return len(t.rings) }

// Wakeable reports whether a hosted guest's sleep can end on its
// doorbells (the kernel has IORING_OP_FUTEX_WAIT, Linux 6.7). Without it a
// hosted guest would look at its queues only every millisecond: reactors
// then run on their own threads instead (package reactor).
func (t *Transport) Wakeable() bool { return t.futexWait }

// Host makes ring i's poller serve g beside the ring (see Guest) until
// the transport closes, and returns the function that wakes that poller
// when it sleeps; any goroutine may call it, and the guest calls it when
// work comes from outside its doorbells (a queue attached from another
// goroutine). A ring hosts one guest.
func (t *Transport) Host(i int, g Guest) (wake func(), err error) {
	if i < 0 || i >= len(t.rings) || g == nil {
		return nil, fmt.Errorf("%w: Host(%d) of %d rings", ErrConfig, i, len(t.rings))
	}
	r := t.rings[i]
	r.mu.Lock()
	switch {
	case r.closing:
		r.mu.Unlock()
		return nil, xfer.ErrClosed
	case r.guest != nil:
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: ring %d hosts a guest already", ErrConfig, i)
	}
	r.guest = g
	r.kicked = true // a poller about to sleep looks again
	w := r.wakeLocked()
	r.mu.Unlock()
	if w {
		r.wake()
	}
	return r.kick, nil
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
		r.cancels = append(r.cancels, slotRef(int32(si), s.gen.Load()))
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
		t.dropBuffers()
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
