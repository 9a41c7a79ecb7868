package uring

import (
	"fmt"
	"syscall"
	"time"
)

// Toggle is a tri-state switch for kernel features: Auto uses the feature
// when the kernel has it.
type Toggle int8

const (
	// Auto: use the feature when the kernel offers it.
	Auto Toggle = iota
	// On: require the feature; New fails if the kernel lacks it.
	On
	// Off: never use the feature.
	Off
)

func (t Toggle) String() string {
	switch t {
	case Auto:
		return "auto"
	case On:
		return "on"
	case Off:
		return "off"
	}
	return "invalid"
}

// Config configures a Transport. The zero value plus AllowedDirs is a
// working configuration; see the field comments for defaults.
type Config struct {
	// Rings is the number of rings (one poller each). Default 1; the
	// daemon makes one per reactor worker, each hosting one (Host).
	Rings int
	// Entries is the SQ size of each ring and the number of tasks each ring
	// keeps in flight at most. Rounded up to a power of two. Default 256.
	Entries uint32
	// Batch bounds each step of a ring's poller: it reaps at most Batch
	// completions before it submits again, and hands the kernel at most
	// Batch requests per io_uring_enter. Small steps keep the device fed
	// evenly: requests that completed together are not resubmitted
	// together, behind each other's completion work, in one burst the
	// device then also completes together. Larger steps take fewer
	// system calls per request. Default 4; at most Entries.
	Batch int
	// SQPoll makes the kernel poll the SQ from its own thread. It costs a
	// whole core; default off.
	SQPoll bool
	// SQPollIdle is how long the SQPOLL thread spins before sleeping.
	// Default 50 ms.
	SQPollIdle time.Duration
	// SingleIssuer, DeferTaskrun and CoopTaskrun pick the setup flags
	// (IORING_SETUP_SINGLE_ISSUER, _DEFER_TASKRUN, _COOP_TASKRUN). Auto
	// uses SINGLE_ISSUER|DEFER_TASKRUN when the kernel has them, else
	// COOP_TASKRUN. DeferTaskrun needs SingleIssuer.
	SingleIssuer, DeferTaskrun, CoopTaskrun Toggle
	// AllowedDirs are the directories under which OpenFile accepts regular
	// files (after resolving symlinks and ".."). Empty refuses all files.
	AllowedDirs []string
	// AllowedDevices are block device paths OpenFile accepts.
	AllowedDevices []string
	// DrainTimeout bounds how long Close waits for in-flight I/O after
	// canceling it. Default 5 s.
	DrainTimeout time.Duration
	// SubmitWait bounds how long Submit waits for a free slot when a ring
	// is full before returning ErrQueueFull. Default 10 s.
	SubmitWait time.Duration
	// MaxFixedBuffers is the size of each ring's registered-buffer table.
	// Default 64; segments over 1 GiB take one entry per GiB.
	MaxFixedBuffers int
	// MaxFixedFiles is the size of each ring's registered-file table.
	// Default 256.
	MaxFixedFiles int
	// NoFixedBuffers / NoFixedFiles turn registration off (plain READ and
	// WRITE with the file's own descriptor).
	NoFixedBuffers, NoFixedFiles bool
	// TraceEvery picks about one data SQE in TraceEvery, at random gaps
	// (so that no periodic pattern of requests is always or never picked),
	// to carry TracedUserData for the kernel-side latency view. 1 picks
	// every SQE; 0, the default, none.
	TraceEvery int

	// hooks are test-only fault injection points; nil in production.
	hooks *testHooks
}

// testHooks let tests bend completions: result sees each I/O completion's
// result (bytes or -errno) and returns the one to act on.
type testHooks struct {
	result        func(op uint8, res int32) int32
	enter         func() syscall.Errno  // non-zero: io_uring_enter is not made and fails so
	backoff       func(d time.Duration) // called instead of the wait of d after a failed enter: the test's clock
	failRegister  bool
	noDrainCancel bool                      // Close does not cancel in-flight requests
	noFutexWait   bool                      // the kernel is taken to lack IORING_OP_FUTEX_WAIT
	noCancelSQE   func() bool               // true: a cancel finds no SQE free
	sleep         func(bound time.Duration) // before each sleep of the poller: its bound (negative: none)
}

func (c *Config) setDefaults() {
	if c.Rings == 0 {
		c.Rings = 1
	}
	if c.Entries == 0 {
		c.Entries = 256
	}
	if c.Batch == 0 {
		c.Batch = 4
	}
	if c.SQPollIdle == 0 {
		c.SQPollIdle = 50 * time.Millisecond
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5 * time.Second
	}
	if c.SubmitWait == 0 {
		c.SubmitWait = 10 * time.Second
	}
	if c.MaxFixedBuffers == 0 {
		c.MaxFixedBuffers = 64
	}
	if c.MaxFixedFiles == 0 {
		c.MaxFixedFiles = 256
	}
}

// validate checks a defaulted config.
func (c *Config) validate() error {
	switch {
	case c.Rings < 1 || c.Rings > 64:
		return fmt.Errorf("%w: Rings=%d (want 1..64)", ErrConfig, c.Rings)
	case c.Entries < 2 || c.Entries > 32768:
		return fmt.Errorf("%w: Entries=%d (want 2..32768)", ErrConfig, c.Entries)
	case c.Batch < 1 || c.Batch > 32768:
		return fmt.Errorf("%w: Batch=%d (want 1..32768)", ErrConfig, c.Batch)
	case c.DrainTimeout < 0:
		return fmt.Errorf("%w: DrainTimeout=%v", ErrConfig, c.DrainTimeout)
	case c.SubmitWait < 0:
		return fmt.Errorf("%w: SubmitWait=%v", ErrConfig, c.SubmitWait)
	case c.MaxFixedBuffers < 0 || c.MaxFixedBuffers > 16384:
		return fmt.Errorf("%w: MaxFixedBuffers=%d (want 0..16384)", ErrConfig, c.MaxFixedBuffers)
	case c.TraceEvery < 0 || c.TraceEvery > 1<<16:
		return fmt.Errorf("%w: TraceEvery=%d (want 0..65536)", ErrConfig, c.TraceEvery)
	case c.MaxFixedFiles < 0 || c.MaxFixedFiles > 65536:
		return fmt.Errorf("%w: MaxFixedFiles=%d (want 0..65536)", ErrConfig, c.MaxFixedFiles)
	case c.DeferTaskrun == On && c.SingleIssuer == Off:
		return fmt.Errorf("%w: DeferTaskrun=on needs SingleIssuer", ErrConfig)
	}
	for _, t := range []Toggle{c.SingleIssuer, c.DeferTaskrun, c.CoopTaskrun} {
		if t < Auto || t > Off {
			return fmt.Errorf("%w: toggle value %d", ErrConfig, t)
		}
	}
	return nil
}

// FileOptions says how OpenFile opens a file segment.
type FileOptions struct {
	// Direct opens with O_DIRECT; requests must then be aligned to the
	// device's logical block size (offset, length and memory address).
	Direct bool
	// Size is the segment's size. Zero means the file's current size; a
	// regular file smaller than Size is extended (sparse) to it.
	Size uint64
	// Create creates the file (mode 0600) if it does not exist.
	Create bool
	// ReadOnly opens the file read-only; writes to it then fail.
	ReadOnly bool
	// Within, when set, narrows Config.AllowedDirs and AllowedDevices for
	// this open: the resolved path must also lie strictly inside one of
	// these directories or be one of these files. A daemon confines a
	// tenant to its own files with it.
	Within []string
	// Refuse are files that may not be opened whatever path names them (a
	// symlink, a hard link, /proc/self/fd/N): the daemon's own, such as a
	// store's L2 file. They are compared by device and inode.
	Refuse []string
}

// Features says what the kernel offers and what a Transport uses.
type Features struct {
	// Kernel feature mask (IORING_FEAT_*) and supported opcode count.
	Mask    uint32
	Opcodes int
	// Setup flags in use on the rings.
	SingleIssuer, DeferTaskrun, CoopTaskrun, SQPoll bool
	// FixedBuffers/FixedFiles: registration in use (false after a
	// registration failure made the transport fall back).
	FixedBuffers, FixedFiles bool
	// ExtArg: waits with a timeout are supported.
	ExtArg bool
}

// RingStats is one ring's counters (monotonic unless said otherwise).
type RingStats struct {
	Entries   uint32 // slots (tasks in flight at most)
	InFlight  int    // tasks holding a slot now
	Submitted uint64 // SQEs handed to the kernel
	Completed uint64 // tasks ended with success
	Failed    uint64 // tasks ended with an error
	Resubmits uint64 // short transfers and EAGAIN/EINTR/ECANCELED retries
	// KernelCancels counts requests the kernel answered -ECANCELED
	// though nobody canceled them (resent, within Resubmits).
	KernelCancels uint64
	Enters        uint64 // io_uring_enter calls
	Wakeups       uint64 // eventfd wake-ups of a sleeping poller
	Fixed         uint64 // SQEs that used a registered buffer
	Traced        uint64 // SQEs that carried TracedUserData (Config.TraceEvery)
	// EnterErrors counts io_uring_enter calls that failed with an errno
	// other than EINTR and ETIME, EAGAIN and EBUSY included when no
	// completion was there to reap (each is retried after a back-off).
	EnterErrors uint64
	// Down: the ring failed (its io_uring_enter kept failing; see
	// ErrRingFailed and Transport.Health), and stays so until Close.
	Down bool
}

// BusySleep bounds the sleep of a poller (and of a reactor's worker on
// its own thread, package reactor) that had work within the last
// BusyWindow. The Go runtime's monitor takes the processor of a thread
// that stays 10 ms in one system call; with every processor idle it then
// sleeps, and the next wake-up sets it polling every 20 µs for a
// millisecond or more. A poller woken every 20 ms by one request paid that
// each time: 1.5 ms of the daemon's CPU per request, 60 % of it the
// monitor's (BENCHMARKS.md). A sleep of 8 ms (under 10, with room for a
// late wake-up) is never taken, and the monitor backs off to a poll every
// 10 ms (a poller also passes through the scheduler before each slice
// that would otherwise end 10 ms after its last pass there, which the
// monitor reads the same way: YieldDue); one idle for BusyWindow sleeps
// unbounded, so an idle daemon costs nothing. A poller bounds only a sleep
// with none of its ring's own I/O in flight: one with I/O ends at its
// completion, and a timer armed for each would cost the busy ring.
const (
	BusySleep  = 8 * time.Millisecond
	BusyWindow = time.Second
)

// pollerYield is how often a poller passes through the Go scheduler
// (see loop): well under the runtime's 10 ms.
const pollerYield = 5 * time.Millisecond

// yieldBeforeSlice is how long after its last yield a poller about to
// sleep a slice (BusySleep) yields first (see YieldDue).
const yieldBeforeSlice = time.Millisecond

// YieldDue tells whether a locked goroutine that serves I/O on its own
// thread (a ring's poller, a reactor's own-thread worker) passes through
// the Go scheduler now, since its last yield: at the top of a pass every
// pollerYield, and before a sleep of a slice (BusySleep) once
// yieldBeforeSlice has passed, so that no slice ends more than BusySleep
// plus that after a yield. A thread that only makes system calls never
// passes there, and the runtime's monitor reads 10 ms without one as a
// goroutine running too long: it takes the processor of the thread in its
// sleep, and then polls every 20 µs for a millisecond or more. Without the
// yield before a slice, a pass that did not yield (a request's, under
// pollerYield after the last) followed by a whole slice left a poller up
// to 13 ms without a yield: at one request every 20 ms, 470 of the
// monitor's wake-ups a second instead of 100, and 600 µs of the daemon's
// CPU per request instead of 500 (BENCHMARKS.md).
func YieldDue(since time.Duration, slice bool) bool {
	if slice {
		return since > yieldBeforeSlice
	}
	return since >= pollerYield
}

// Yields is a locked goroutine's passes through the Go scheduler, by
// YieldDue's rule: one value per goroutine, used by it alone.
type Yields struct {
	last    time.Time
	gosched func()
}

// NewYields starts the record at now, yielding with gosched
// (runtime.Gosched, or a test's).
func NewYields(now time.Time, gosched func()) Yields {
	return Yields{last: now, gosched: gosched}
}

// At yields at now when YieldDue says so: at the top of a pass (slice
// false), or before a sleep of a slice (BusySleep).
func (y *Yields) At(now time.Time, slice bool) {
	if YieldDue(now.Sub(y.last), slice) {
		y.last = now
		y.gosched()
	}
}
