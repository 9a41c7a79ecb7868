package store

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// tier2 is the L2 tier: the file, its transport, the space allocator and
// the table of I/O tasks. Every L2 operation is one ioTask from the table
// (no goroutine, no allocation per operation), moving through stages as its
// completions arrive.
type tier2 struct {
	s        *Store
	tr       xfer.Transport
	file     xfer.Segment
	stage    *shm.Pool // private staging memory: one sector per task, one zero sector
	stageMem []byte
	zeroOff  uint64
	g        l2geom
	verify   bool
	cfg      L2
	owned    interface{ Close() error } // the file, when Open opened it

	seq       atomic.Uint64 // last block sequence number handed out
	fileNonce uint64

	// mu guards the space allocator: regions, classes, freeRegions and the
	// byte counts.
	mu          sync.Mutex
	regions     []region
	classes     []l2class
	freeRegions []int32
	used        uint64 // slot bytes in use
	capacity    uint64 // slot bytes in all regions
	evicting    uint64 // slot bytes being invalidated by eviction
	quarantined uint64 // slots kept out of use
	// ghosts: per key, the quarantined slots whose block header may still
	// be valid though the key no longer uses them (a zeroing that failed
	// after the key had gone anyway). Recovery would bring such a block
	// back once no newer header of its key is on the device, so every
	// invalidation of the key zeroes them first (reqInval), and the
	// maintenance loop's sweep zeroes them meanwhile (sweep.go).
	ghosts  map[string][]uint32
	nghosts atomic.Int32 // slots in ghosts; read without mu on the invalidation path
	// tainted: the quarantined slots a quarantined task (violation) may
	// still write. A ghost among them is zeroed like any other, but the
	// slot stays out of use for good (unquarantine): the stale write may
	// land on whatever block is written there later.
	tainted map[uint32]struct{}
	// older: per key, the zeroings in flight of its older headers that may
	// still fail and leave a ghost (the invalidations of its superseded
	// entries, supersede, and the sweep's zeroings of its ghosts), and the
	// key's other invalidations parked until none is left (reqInval).
	older  map[string]*olderZeroings
	nolder atomic.Int32 // keys in older; read without mu on the invalidation path
	// The ghost sweep (sweep.go), also guarded by mu: sweepOn while the
	// maintenance loop runs; a pass due at sweepAt (Store.now) when
	// sweepArmed, sweepTimer kicking the loop then; sweepDelay, the
	// back-off; the current pass's zeroings in flight, those that
	// succeeded, and those that failed (the last with sweepErr).
	sweepOn, sweepArmed  bool
	sweepAt              int64
	sweepTimer           Timer
	sweepDelay           time.Duration
	sweepRunning         int
	sweepOK, sweepFailed int
	sweepErr             error

	tasks []ioTask
	// ioMu guards freeTasks and the keys waiting for a task (wait.go):
	// waitq from whead on.
	ioMu      sync.Mutex
	freeTasks []int32
	waitq     []waitKey
	whead     int
	nwaiting  atomic.Int32 // len(waitq) - whead; written under ioMu, read by freeTask without it
	inflight  atomic.Int32 // tasks taken and not yet free (quarantined ones excluded)
	draining  atomic.Bool
	drained   chan struct{}
	drainOnce sync.Once

	// ready is the first task (linked through nextWait) whose block header
	// write waits to be submitted off the completion path; guarded by mu.
	ready int32

	wbInflight atomic.Int32
	l2Short    atomic.Bool // a writeback found no slot: pause until room is made
	violLogged atomic.Bool

	syncWG sync.WaitGroup // recovery's synchronous batches
}

// olderZeroings is an entry of tier2.older.
type olderZeroings struct {
	n      int       // zeroings of older headers of the key that have not ended
	parked []*ioTask // invalidations of the key's newer entry waiting for them
}

// Task kinds.
const (
	kSync    uint8 = iota + 1 // recovery and format: a plain read or write
	kPut                      // a durable put: value, then header
	kWB                       // a writeback: value, then header
	kPromote                  // an L2 → L1 read
	kInval                    // overwrite a block header with zeros
	kOpen                     // write a region header
	kSweep                    // zero a ghost for the maintenance loop (sweep.go)
)

// Stages of kPut and kWB.
const (
	stgValue  uint8 = iota // the value is being written
	stgHeader              // the block header is being written (or waits for its region)
	stgUndo                // the header write failed: the slot's header is being zeroed
	stgOpen                // its region's header is being written, by this task (no other was free)
)

// Task states (ioTask.state).
const (
	tsFree uint32 = iota
	tsIdle
	tsDispatching // inside Transport.Submit
	tsPending     // dispatched
	tsParked      // its Done came during Submit; the submitter handles it
	tsQuarantined // the transport broke its contract on it: never reused
)

// waitRec is one caller waiting for a promotion: a Get (pin for ss) or a
// Read (copy into the call's destination).
type waitRec struct {
	cl  *call
	pos int32
	ss  *Session
	get bool
	// over: a Get that found the key at MaxPins when the promotion
	// ended (endPromote); it is answered ErrOverflow, unpinned.
	over bool
}

type ioTask struct {
	xt        xfer.Task
	t         *tier2
	idx       int32
	sectorOff uint64 // its staging sector

	// state is the task's stage in the table; who owns it once
	// dispatched (the transport or this tier) is xt's dispatch ledger
	// (xfer.Dispatch).
	state  atomic.Uint32
	parkN  uint64 // result of a Done during Submit
	parkE  error
	kind   uint8
	stage  uint8
	commit bool // kPut from Commit (the reservation stays on failure)
	drop   bool // kInval of a corrupt block: the entry goes even if the write fails
	// ghost: the quarantined slot of an older block of the key whose
	// header a kInval zeroes before its own slot's (reqInval), or noSlot;
	// for a kSweep, the ghost it zeroes, of key.
	ghost uint32
	key   string
	ss    *Session
	// rp and copies: a durable put's copies on other hosts (rp nil:
	// none), made before its result is given.
	rp     Replicator
	copies int
	r      ref
	l1     uint64
	size   uint32
	crc    uint32
	slot   uint32
	region int32
	err    error // the first failure of a staged task
	cl     *call
	pos    int32
	off    uint64 // file offset of the slot (or region) it works on

	// waiters are the callers a promotion answers: in wbuf, or grown
	// past it when more readers of one key come at once (each in a call
	// in flight, which bounds them).
	waiters  []waitRec
	wbuf     [4]waitRec
	nextWait int32 // next task waiting for the same region header

	one  [1]*ioTask
	onex [1]*xfer.Task
	// sync results (kSync)
	syncErr error
}

var _ xfer.Completer = (*ioTask)(nil)

// registrar is implemented by transports that take fixed buffers.
type registrar interface {
	RegisterBuffers(segs ...xfer.MemSegment) error
	UnregisterBuffers(ids ...xfer.SegmentID) error
}

func newTier2(s *Store, l2 *L2) (*tier2, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: L2: "+format, append([]any{ErrConfig}, args...)...)
	}
	switch {
	case l2.Transport == nil || l2.File == nil:
		return nil, bad("a transport and a file are required")
	case l2.File.Kind() != xfer.KindFile:
		return nil, bad("segment %d is a %s segment, not a file", l2.File.ID(), l2.File.Kind())
	case l2.StagingID == 0 || l2.StagingID == s.pool.ID() || l2.StagingID == l2.File.ID():
		return nil, bad("StagingID %d (want a segment id of its own)", l2.StagingID)
	case l2.HighWatermark != 0 && (l2.HighWatermark <= 0 || l2.HighWatermark > 1),
		l2.LowWatermark != 0 && (l2.LowWatermark <= 0 || l2.LowWatermark >= 1):
		return nil, bad("watermarks low=%v high=%v", l2.LowWatermark, l2.HighWatermark)
	}
	cfg := *l2
	if cfg.HighWatermark == 0 {
		cfg.HighWatermark = 0.95
	}
	if cfg.LowWatermark == 0 {
		cfg.LowWatermark = 0.85
	}
	if cfg.LowWatermark >= cfg.HighWatermark {
		return nil, bad("watermarks low=%v high=%v (want low < high)", cfg.LowWatermark, cfg.HighWatermark)
	}
	align := uint64(cfg.Align)
	var offA, memA uint32 = 1, 1
	if a, ok := cfg.File.(aligner); ok {
		offA, memA = a.Alignment()
	}
	if align == 0 {
		align = max(4096, uint64(offA), uint64(memA))
	}
	switch {
	case align < 512 || align > 64<<10 || align&(align-1) != 0:
		return nil, bad("Align=%d (want a power of two, 512..65536)", align)
	case align%uint64(offA) != 0 || align%uint64(memA) != 0:
		return nil, bad("Align=%d is not a multiple of the file's O_DIRECT alignment (offset %d, memory %d)", align, offA, memA)
	case s.minBlock%uint64(memA) != 0:
		return nil, bad("the pool's smallest block %d is not a multiple of the file's memory alignment %d", s.minBlock, memA)
	}
	if !cfg.File.Acquire() {
		return nil, fmt.Errorf("store: L2 file: %w", ErrClosed)
	}
	n := s.cfg.IODepth
	t := &tier2{
		s: s, tr: cfg.Transport, file: cfg.File, verify: !cfg.NoVerifyReads, cfg: cfg,
		tasks: make([]ioTask, n), freeTasks: make([]int32, 0, n), drained: make(chan struct{}), ready: -1,
		sweepDelay: ghostSweepFirst,
	}
	t.g.align = align
	stage, err := shm.NewPool(shm.PoolConfig{ID: cfg.StagingID, Size: uint64(n+1) * align, Hugepages: shm.HugepagesOff,
		MinBlock: 1 << 20, MaxBlock: 1 << 20}, s.log.With("part", "staging"))
	if err != nil {
		cfg.File.Release()
		return nil, fmt.Errorf("store: L2 staging memory: %w", err)
	}
	t.stage, t.stageMem = stage, stage.Bytes()
	t.zeroOff = uint64(n) * align
	if r, ok := t.tr.(registrar); ok {
		if err := r.RegisterBuffers(stage); err != nil {
			s.log.Info("store: staging memory not registered as fixed buffers", "err", err)
		}
	}
	for i := n - 1; i >= 0; i-- {
		it := &t.tasks[i]
		it.t, it.idx, it.sectorOff = t, int32(i), uint64(i)*align
		it.waiters = it.wbuf[:0]
		it.xt.SetCompleter(it)
		it.one[0] = it
		t.freeTasks = append(t.freeTasks, int32(i))
	}
	return t, nil
}

// closeNow releases what the tier holds. Nothing is in flight (or what is
// was given up by drain).
func (t *tier2) closeNow() error {
	var errs []error
	if r, ok := t.tr.(registrar); ok {
		if err := r.UnregisterBuffers(t.stage.ID()); err != nil && !errors.Is(err, xfer.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if err := t.stage.Close(); err != nil {
		errs = append(errs, err)
	}
	t.file.Release()
	if t.owned != nil {
		if err := t.owned.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// drain waits until no task is in flight, at most timeout. The
// maintenance loop has stopped, so header writes handed to it are submitted
// from here.
func (t *tier2) drain(timeout time.Duration) error {
	t.draining.Store(true)
	var x []*xfer.Task
	var batch []*ioTask
	flushed := func() bool {
		t.flushReady(&batch, &x)
		return t.inflight.Load() == 0
	}
	if t.s.ev.waitUntil(flushed, timeout) {
		return nil
	}
	n := t.inflight.Load()
	t.s.log.Error("store: L2 operations still in flight at close; their memory stays allocated",
		"in_flight", n, "timeout", timeout)
	return fmt.Errorf("store: %d L2 operations still in flight after %v", n, timeout)
}

// flushReady submits the block header writes handed off by openDone.
func (t *tier2) flushReady(batch *[]*ioTask, xts *[]*xfer.Task) {
	t.mu.Lock()
	head := t.ready
	t.ready = -1
	t.mu.Unlock()
	b := (*batch)[:0]
	for w := head; w != -1; {
		wt := &t.tasks[w]
		w, wt.nextWait = wt.nextWait, -1
		wt.stage = stgHeader
		t.reqSector(wt, xfer.OpWrite, wt.off, false)
		b = append(b, wt)
	}
	*batch = b
	t.submit(b, xts) // a violation has failed the tasks already
	clear(b)
}

// getTask takes a free task, or nil. Background work (writeback, eviction)
// leaves a quarter of the table to foreground calls; while keys wait for a
// task (wait.go) nobody else gets one, so that they are served first and in
// order: a foreground caller that gets nil makes its key wait (enqueue).
func (t *tier2) getTask(background bool) *ioTask { return t.pop(true, background) }

// takeAny takes a free task even while keys wait: for the second task of
// an operation already under way (a region header write), which must not
// queue behind others. Nil when none is free.
func (t *tier2) takeAny() *ioTask { return t.pop(false, false) }

// pop takes a free task, or nil: with fair, none while keys wait; with
// background, none of the last quarter.
func (t *tier2) pop(fair, background bool) *ioTask {
	t.ioMu.Lock()
	n := len(t.freeTasks)
	if n == 0 || fair && t.nwaiting.Load() > 0 || background && n <= len(t.tasks)/4 {
		t.ioMu.Unlock()
		return nil
	}
	i := t.freeTasks[n-1]
	t.freeTasks = t.freeTasks[:n-1]
	t.ioMu.Unlock()
	return t.taken(i)
}

// taken marks task i, just taken off the free list, in flight.
func (t *tier2) taken(i int32) *ioTask {
	t.inflight.Add(1)
	it := &t.tasks[i]
	it.state.Store(tsIdle)
	return it
}

func (t *tier2) freeTask(it *ioTask) {
	it.kind, it.stage, it.commit, it.drop, it.ghost, it.key = 0, 0, false, false, noSlot, ""
	it.ss, it.cl, it.err, it.parkE, it.syncErr = nil, nil, nil, nil, nil
	it.rp, it.copies = nil, 0
	it.xt.Req = xfer.Request{}
	it.xt.Local, it.xt.Target = nil, nil
	clear(it.waiters)
	it.waiters = it.waiters[:0]
	it.nextWait, it.region = -1, noRegion
	if it.state.Load() == tsQuarantined {
		// Never reused: the transport may still call Done on it. violation
		// has already taken it out of the in-flight count.
		t.s.ev.fire()
		return
	}
	it.state.Store(tsFree)
	t.ioMu.Lock()
	t.freeTasks = append(t.freeTasks, it.idx)
	t.ioMu.Unlock()
	if t.nwaiting.Load() > 0 {
		// Keys wait for a task: the maintenance loop hands it on (wait.go).
		t.s.kick()
	}
	if t.inflight.Add(-1) == 0 && t.draining.Load() {
		t.drainOnce.Do(func() { close(t.drained) })
	}
	t.s.ev.fire()
}

// sector is the task's staging sector.
func (t *tier2) sector(it *ioTask) []byte {
	return t.stageMem[it.sectorOff : it.sectorOff+t.g.align]
}

// Request builders.

func (t *tier2) reqValue(it *ioTask, op xfer.Op, fileOff uint64) {
	a := t.g.align
	it.xt.Req = xfer.Request{Op: op, Local: t.s.pool.ID(), LocalOffset: it.l1, Target: t.file.ID(),
		TargetOffset: fileOff, Length: (uint64(it.size) + a - 1) &^ (a - 1)}
	it.xt.Local, it.xt.Target = t.s.pool, t.file
}

// reqSector writes (or reads) one staging sector at fileOff; zero selects
// the shared zero sector.
func (t *tier2) reqSector(it *ioTask, op xfer.Op, fileOff uint64, zero bool) {
	off := it.sectorOff
	if zero {
		off = t.zeroOff
	}
	it.xt.Req = xfer.Request{Op: op, Local: t.stage.ID(), LocalOffset: off, Target: t.file.ID(),
		TargetOffset: fileOff, Length: t.g.align}
	it.xt.Local, it.xt.Target = t.stage, t.file
}

// submit hands tasks (their requests filled) to the transport through
// xfer.Dispatch and settles what the dispatched count says: the tail it
// did not take is rolled back at once by this goroutine, the head by
// completions (a completion that came during Submit is parked and handled
// here). A transport that breaks the contract fails every task of the
// submit, and what it may still touch is quarantined.
func (t *tier2) submit(its []*ioTask, xts *[]*xfer.Task) error {
	if len(its) == 0 {
		return nil
	}
	x := (*xts)[:0]
	for _, it := range its {
		it.state.Store(tsDispatching)
		x = append(x, &it.xt)
	}
	*xts = x
	d := xfer.Dispatch(t.tr, x)
	clear(x)
	if !d.Kept() {
		t.violation(its, fmt.Sprintf("%v (Submit returned %d of %d)", d.Broke, d.N, len(its)))
		return ErrTransport
	}
	for _, it := range its[d.K:] {
		it.state.Store(tsIdle)
		t.done(it, d.Err)
	}
	for _, it := range its[:d.K] {
		if it.state.CompareAndSwap(tsDispatching, tsPending) {
			continue
		}
		t.done(it, it.parkE)
	}
	return nil
}

// submitOne dispatches one task, with its own scratch.
func (t *tier2) submitOne(it *ioTask) {
	x := it.onex[:0]
	t.submit(it.one[:], &x) // a violation has failed the task already
}

// TaskDone is the completion of a dispatched task.
func (it *ioTask) TaskDone(_ *xfer.Task, n uint64, err error) {
	t := it.t
	if c := it.xt.ClaimDone(); c != xfer.DoneOwed {
		// A second Done, or one for a task the transport did not take or
		// that was quarantined: nothing of ours is touched. One during its
		// Submit fails the whole submit, which reports it.
		t.s.c.violations.Add(1)
		if c == xfer.DoneLate {
			t.logViolation("Done for a task the transport does not own")
		}
		return
	}
	it.parkN, it.parkE = n, err
	if it.state.CompareAndSwap(tsDispatching, tsParked) {
		return
	}
	t.done(it, err)
}

func (t *tier2) logViolation(what string) {
	if t.violLogged.CompareAndSwap(false, true) {
		t.s.log.Error("store: L2 transport broke the xfer.Transport contract; affected blocks and slots are quarantined",
			"transport", t.tr.Name(), "what", what)
	}
}

// violation fails every task of a submit whose dispatch count was a lie.
// None of them is reused: the transport may still call Done on them or
// touch their memory, so the tasks, the L2 slots they wrote and the pool
// blocks they read into are kept out of use for good.
func (t *tier2) violation(its []*ioTask, what string) {
	t.s.c.violations.Add(1)
	t.logViolation(what)
	for _, it := range its {
		if !it.xt.Reclaim() {
			// Its Done claimed it and is parking it: wait the few
			// instructions until it has.
			for it.state.Load() == tsDispatching {
				runtime.Gosched()
			}
		}
		it.state.Store(tsQuarantined)
		t.s.c.quarantinedTasks.Add(1)
		t.inflight.Add(-1)
		if t.draining.Load() && t.inflight.Load() == 0 {
			t.drainOnce.Do(func() { close(t.drained) })
		}
		t.fail(it, ErrTransport)
	}
}

// done advances a task whose current I/O ended with err.
func (t *tier2) done(it *ioTask, err error) {
	switch it.kind {
	case kPut, kWB:
		t.writeDone(it, err)
	case kPromote:
		t.promoteDone(it, err)
	case kInval:
		t.invalDone(it, err)
	case kSweep:
		t.sweepDone(it, err)
	case kOpen:
		t.openDone(it, err)
	case kSync:
		it.syncErr = err
		t.syncWG.Done()
	}
}

// fail ends a quarantined task: its key gets err, nothing it touched is
// reused.
func (t *tier2) fail(it *ioTask, err error) {
	s := t.s
	switch it.kind {
	case kPut, kWB:
		if it.stage == stgOpen {
			// Its region's header is in doubt: the region is broken, and
			// the writes waiting for it fail.
			t.failOpenWaiters(t.regionOpened(it.region, err, false), err)
		}
		t.mu.Lock()
		t.quarantine(it.slot)
		t.mu.Unlock()
		it.err = err
		t.endWrite(it, false)
	case kPromote:
		s.c.quarantinedBlocks.Add(1)
		t.endPromote(it, err, false, false)
	case kInval:
		if it.ghost != noSlot {
			// The older block's header is in doubt, its own slot's
			// untouched: the key stays, the older block a ghost still.
			key := t.keyOf(it.r)
			t.mu.Lock()
			t.taint(it.ghost)
			t.addGhost(key, it.ghost)
			t.mu.Unlock()
			it.ghost = noSlot
			t.endInval(it, err, true)
			return
		}
		key := t.keyOf(it.r)
		t.mu.Lock()
		t.quarantine(it.slot)
		t.taint(it.slot)
		t.addGhost(key, it.slot)
		t.mu.Unlock()
		t.endInval(it, err, false)
	case kSweep:
		// The ghost's header is in doubt as after a failed zeroing: a
		// ghost of its key still, and its slot never reused.
		t.mu.Lock()
		t.taint(it.ghost)
		t.mu.Unlock()
		t.sweepDone(it, err)
	case kOpen:
		t.openDone(it, err)
	case kSync:
		it.syncErr = err
		t.syncWG.Done()
	}
}
