package store

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	crc "github.com/tensorcast/tensorcast/internal/crc32c"
	"github.com/tensorcast/tensorcast/shm"
)

// Location is where a value lies in the pool: a client that mapped the pool
// reads or writes Length bytes at Offset in place.
type Location struct {
	Offset uint64
	Length uint64
}

// Completion receives the end of an asynchronous call: a call that returned
// pending=true calls StoreDone exactly once, with the tag it was given, once
// every code (and location, length, error) of the call is final. StoreDone
// runs on a transport's completion goroutine, on the calling goroutine
// (possibly before the call has returned), on the maintenance loop (a key
// that waited for an L2 task: wait.go) or in Close; it must not block and
// must not call into the store.
type Completion interface {
	StoreDone(tag uint64)
}

// Store is the tiered KV block store: an index of keys to values held in
// pool blocks (L1) and, with an L2, in slots of a file on NVMe. Its methods
// are safe for concurrent use.
//
// Lock order: Session.mu, then a shard's mu, then (leaves) tier2.mu,
// tier2.ioMu, Store.leaseMu, Store.retryMu and the pool's own locks. No
// lock is held while calling the transport or a Completion.
//
// Goroutines: the store owns one, the maintenance loop (writeback,
// eviction, retries), started by New. Close stops it: refuse new calls and
// wait for those running, close stop and wait for the loop to exit, then
// wait (bounded by CloseTimeout) for L2 operations in flight.
type Store struct {
	cfg   Config
	log   *slog.Logger
	clock Clock
	base  time.Time // the clock reading that lease times count from

	pool     *shm.Pool
	poolMem  []byte
	minBlock uint64
	maxBlock uint64

	seed   maphash.Seed
	shards []shard
	shift  uint // a hash's shard is hash >> shift

	l2 *tier2     // nil without a second tier
	jr *l1Journal // nil without Config.L1Journal

	// gate counts calls in progress, plus gateClosing once Close began.
	gate      atomic.Uint64
	gateIdle  chan struct{}
	idleOnce  sync.Once
	closeOnce sync.Once
	closeErr  error

	sessions atomic.Uint32

	l1Bytes atomic.Uint64 // pool bytes (at block size) the store holds

	// leaseMu guards the lease heap and its timer.
	leaseMu    sync.Mutex
	leases     leaseHeap
	leaseTimer Timer
	leaseAt    int64 // when leaseTimer fires; 0 when unarmed

	// retryMu guards retries: failed writebacks waiting for their delay.
	retryMu    sync.Mutex
	retries    []retryRec
	retryTimer Timer
	retryAt    int64

	calls callPool
	ev    events

	// remote is the store across hosts (remote.go), nil for the host's
	// store alone.
	remote remoteState

	wake chan struct{} // kicks the maintenance loop; capacity 1
	stop chan struct{}
	done chan struct{}
	// evictFrom rotates the first shard eviction looks at.
	evictFrom atomic.Uint32

	c counters
}

const gateClosing = uint64(1) << 63

// New builds a store over pool, with l2 as its second tier (nil for none).
// With an L2 it recovers the index from the L2 file first (formatting an
// empty file), which reads every block header; New returns when that is
// done. The store allocates its L1 blocks from pool and never closes it.
func New(cfg Config, pool *shm.Pool, l2 *L2) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrConfig)
	}
	ps := pool.Stats()
	if len(ps.Classes) == 0 {
		return nil, fmt.Errorf("%w: pool has no block classes", ErrConfig)
	}
	minBlock, maxBlock := ps.Classes[0].BlockSize, ps.Classes[len(ps.Classes)-1].BlockSize
	cfg.setDefaults(ps.Size, maxBlock)
	if err := cfg.validate(maxBlock); err != nil {
		return nil, err
	}
	if !pool.Acquire() {
		return nil, fmt.Errorf("store: pool: %w", ErrClosed)
	}
	s := &Store{
		cfg: cfg, log: cfg.Log, clock: cfg.Clock,
		pool: pool, poolMem: pool.Bytes(), minBlock: minBlock, maxBlock: maxBlock,
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, cfg.Shards),
		shift:    uint(64 - bits.TrailingZeros(uint(cfg.Shards))),
		gateIdle: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	s.base = s.clock.Now()
	for i := range s.shards {
		s.shards[i].init(cfg.InitialKeys / cfg.Shards)
	}
	if l2 != nil {
		t, err := newTier2(s, l2)
		if err != nil {
			pool.Release()
			return nil, err
		}
		s.l2 = t
	}
	// The L1 journal's blocks are claimed before the L2 recovery allocates
	// any; its keys are indexed after, beside L2's.
	var kept []l1Rec
	if cfg.L1Journal != nil {
		var err error
		if kept, err = s.openJournal(); err != nil {
			if s.l2 != nil {
				s.l2.closeNow()
			}
			pool.Release()
			return nil, err
		}
	}
	if s.l2 != nil {
		if err := s.l2.recover(); err != nil {
			s.l2.closeNow()
			if s.jr != nil {
				s.jr.keep.Store(true) // the journal stays as it was, for another try
			}
			s.freeL1()
			pool.Release()
			return nil, err
		}
	}
	if s.jr != nil {
		s.adoptL1(kept)
	}
	if s.l2 != nil {
		s.l2.startSweep()
	}
	go s.maintain()
	st := s.Stats()
	s.log.Info("store ready", "keys", st.Keys, "l1_capacity", cfg.L1Capacity, "l2", s.l2 != nil,
		"l2_capacity", st.L2Capacity, "recovered", st.Recovered, "torn_dropped", st.TornDropped,
		"corrupt_dropped", st.CorruptDropped, "shards", cfg.Shards, "crc32c", crc.Impl())
	return s, nil
}

// enter admits a call; false once Close began.
func (s *Store) enter() bool {
	for {
		v := s.gate.Load()
		if v&gateClosing != 0 {
			return false
		}
		if s.gate.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

func (s *Store) exit() {
	if s.gate.Add(^uint64(0)) == gateClosing {
		s.idleOnce.Do(func() { close(s.gateIdle) })
	}
}

// Close stops the store: new calls fail with ErrClosed, calls in progress
// finish, the maintenance loop stops (writebacks not yet dispatched stay
// undone), keys still waiting for an L2 task end with ErrClosed (as if
// their I/O had failed), L2 operations in flight complete (bounded by CloseTimeout), and
// the store's pool blocks are freed. Sessions need not be closed first.
// The transport, the L2 file and the pool stay open. It is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.gate.Or(gateClosing) == 0 {
			s.idleOnce.Do(func() { close(s.gateIdle) })
		}
		<-s.gateIdle
		close(s.stop)
		<-s.done
		if s.l2 != nil {
			s.l2.stopSweep()
			// Keys still waiting for an L2 task end now, before the pool
			// blocks they hold are freed.
			s.l2.failWaiting(ErrClosed)
		}
		s.leaseMu.Lock()
		if s.leaseTimer != nil {
			s.leaseTimer.Stop()
		}
		s.leaseMu.Unlock()
		s.retryMu.Lock()
		if s.retryTimer != nil {
			s.retryTimer.Stop()
		}
		s.retryMu.Unlock()
		var errs []error
		drained := true
		if s.l2 != nil {
			if err := s.l2.drain(s.cfg.CloseTimeout); err != nil {
				errs = append(errs, err)
				drained = false
			}
		}
		if s.jr != nil {
			// The values in L1 stay recorded: a daemon that adopts the
			// pool after this one finds them again.
			s.jr.keep.Store(true)
		}
		if err := s.freeL1(); err != nil {
			errs = append(errs, err)
		}
		// After a drain that timed out the device may still write into the
		// staging memory and the pool: both stay mapped (and the file
		// open) for good rather than be reused under it.
		if drained {
			if s.l2 != nil {
				if err := s.l2.closeNow(); err != nil {
					errs = append(errs, err)
				}
			}
			s.pool.Release()
		}
		s.closeErr = errors.Join(errs...)
		st := s.Stats()
		s.log.Info("store closed", "keys", st.Keys, "tombstones", st.Tombstones,
			"transport_violations", st.TransportViolations, "err", s.closeErr)
	})
	return s.closeErr
}

// freeL1 returns every pool block the store holds that no I/O may still
// touch. It runs when nothing else does (New's failure path, Close).
func (s *Store) freeL1() error {
	var errs []error
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for idx := uint32(0); idx < sh.nents; idx++ {
			e := sh.ent(idx)
			if e.state == stFree || e.io != 0 {
				continue
			}
			if e.flags&fL1 != 0 || e.state == stReserved {
				if err := s.freeBlock(e.l1, e.size); err != nil {
					errs = append(errs, err)
				}
				e.flags &^= fL1
				if e.state == stReserved {
					e.state = stDropping // never visible again
				}
			}
		}
		sh.mu.Unlock()
	}
	return errors.Join(errs...)
}

// hash returns key's hash and shard.
func (s *Store) hash(key []byte) (uint64, *shard, uint32) {
	h := maphash.Bytes(s.seed, key)
	i := uint32(h >> s.shift)
	if s.shift == 64 {
		i = 0
	}
	return h, &s.shards[i], i
}

func (s *Store) validKey(k []byte) bool { return len(k) > 0 && len(k) <= s.cfg.MaxKeyLen }

// allocSize is how many bytes of pool a value of size bytes takes: with an
// L2, a whole number of sectors, so that it can be read and written in
// place with O_DIRECT.
func (s *Store) allocSize(size uint64) uint64 {
	if s.l2 != nil {
		a := s.l2.g.align
		return (size + a - 1) &^ (a - 1)
	}
	return size
}

// blockBytes is the class size of the pool block a value of size takes.
func (s *Store) blockBytes(size uint64) uint64 {
	n := max(s.allocSize(size), s.minBlock)
	return uint64(1) << bits.Len64(n-1)
}

// allocBlock takes a pool block for a value of size bytes, evicting
// unpinned clean blocks when the store is at its capacity or the pool is
// exhausted. No shard lock may be held.
func (s *Store) allocBlock(size uint64) (uint64, error) {
	bs := s.blockBytes(size)
	for try := 0; ; try++ {
		exhausted := false
		if s.l1Bytes.Load()+bs <= s.cfg.L1Capacity {
			off, err := s.pool.Alloc(s.allocSize(size))
			if err == nil {
				if v := s.l1Bytes.Add(bs); float64(v) > s.cfg.HighWatermark*float64(s.cfg.L1Capacity) {
					s.kick()
				}
				return off, nil
			}
			if !errors.Is(err, shm.ErrPoolExhausted) {
				return 0, err
			}
			exhausted = true
		}
		// At its capacity the store makes room for the block; under it,
		// with the pool exhausted, the pool's slabs are held by other
		// block sizes: evict up to a few slabs' worth (cold first), so
		// that a slab comes free for this size.
		if try == 1 && !exhausted || try == 3 {
			s.kick()
			s.c.l1Full.Add(1)
			return 0, ErrL1Full
		}
		need, scan := 2*bs, 64
		if exhausted {
			need, scan = max(need, s.maxBlock<<try), 64<<try
		}
		s.evict(need, scan)
	}
}

// freeBlock returns a pool block the store held for a value of size bytes.
func (s *Store) freeBlock(off uint64, size uint32) error {
	if s.jr != nil {
		s.jr.drop(off) // the record goes first: then the block may be reused
	}
	if err := s.pool.Free(off); err != nil {
		s.c.freeErrors.Add(1)
		return fmt.Errorf("store: free pool block at %d: %w", off, err)
	}
	s.l1Bytes.Add(^(s.blockBytes(uint64(size)) - 1))
	return nil
}

// rare counts an event that deserves the operator's attention and logs it
// the first 8 times and then at every power of two, with the count so far,
// so a failing device cannot flood the log.
func (s *Store) rare(c *atomic.Uint64, msg string, args ...any) {
	n := c.Add(1)
	if n <= 8 || n&(n-1) == 0 {
		s.log.Warn(msg, append(args, "count", n)...)
	}
}

// kick wakes the maintenance loop.
func (s *Store) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// now is the clock in nanoseconds since New.
func (s *Store) now() int64 { return int64(s.clock.Now().Sub(s.base)) }

// NewSession opens a session: the owner of pins and reservations, one per
// client connection. Close it when the client goes; that releases what it
// holds.
func (s *Store) NewSession() *Session {
	return &Session{s: s, id: s.sessions.Add(1), holds: make(map[ref]hold), resv: make(map[ref]uint64)}
}

// counters are the store's event counts.
type counters struct {
	evictL1, evictL2, droppedUnwritten                  atomic.Uint64
	writebacks, wbRetries, tombstones                   atomic.Uint64
	promotions, promoteFail, corruptReads               atomic.Uint64
	durable, durableFail                                atomic.Uint64
	replicaFail                                         atomic.Uint64 // durable puts whose copies elsewhere failed
	recovered, torn, corrupt, dups, foreign             atomic.Uint64
	unreadable                                          atomic.Uint64 // L2 sectors recovery could not read (headers count in torn too)
	violations, quarantinedBlocks, freeErrors, l1Full   atomic.Uint64
	leasesExpired, removeFail, prefixCut, pinLimit      atomic.Uint64
	keys, l1Keys, l2Keys, pins, reserved, l2InvalFailed atomic.Uint64
	dirtyOwed                                           atomic.Uint64 // values in L1 only still owed a writeback
	quarantinedTasks                                    atomic.Uint64
	ghostsZeroed, ghostZeroFail                         atomic.Uint64 // the ghost sweep's zeroings (sweep.go)
	aborted                                             atomic.Uint64 // reservations given back by Session.Abort
	ioWaits                                             atomic.Uint64 // callers' keys that waited for an L2 task
	l1Recovered, l1Dropped, l1Torn, l1JournalFull       atomic.Uint64 // the L1 journal's (l1journal.go)
	hidden                                              atomic.Uint64 // gauge: stHidden entries (hide.go)
	unseen, confirmed                                   atomic.Uint64 // fetched copies stored unseen, and seen since (unseen.go)
	// Reads of values (Get, Read) by what they found, per key: the value
	// in L1, only on L2 (a promotion), or no key.
	hitsL1, hitsL2, misses atomic.Uint64
}

// Stats are the store's figures, for the daemon to report.
type Stats struct {
	Keys     uint64 // keys stored: visible ones, and fetched copies unseen yet (unseen.go)
	L1Keys   uint64 // keys with their value in the pool
	L2Keys   uint64 // keys with their value on L2
	Reserved uint64 // reservations and puts in flight
	Aborted  uint64 // reservations given back by Session.Abort (not those of closed sessions)

	// Keys read (Get, Read) found in L1, found only on L2 (promoted), or
	// not stored. Exists and LookupPrefix are probes and count in none.
	HitsL1, HitsL2, Misses uint64

	L1Bytes, L1Capacity uint64 // pool bytes held (at block size), and the limit
	L2Bytes, L2Capacity uint64 // L2 slot bytes in use, and the total

	Pins uint64 // pins and active leases, over all sessions
	// Hidden: values removed from another host while pinned here, found
	// by no reader since, their blocks kept until their last pin goes.
	Hidden uint64
	Dirty  uint64 // values in L1 only, still owed a writeback
	// Unseen: copies fetched from other hosts stored unseen by readers
	// here until their home took them (unseen.go); Confirmed: those seen
	// since. The rest were dropped or evicted first.
	Unseen, Confirmed uint64

	EvictionsL1      uint64 // values dropped from L1 (still on L2, or gone with no L2)
	EvictionsL2      uint64 // keys evicted from L2
	DroppedUnwritten uint64 // dirty values evicted whose writeback had become a tombstone
	L1Full           uint64 // allocations refused with ErrL1Full

	Writebacks       uint64 // L1→L2 writebacks done
	WritebackRetries uint64 // writebacks retried after a failure
	Tombstones       uint64 // writebacks that exhausted their retry budget

	DurablePuts        uint64 // durable puts acknowledged
	DurableFailures    uint64 // durable puts failed (and rolled back)
	Promotions         uint64 // L2→L1 reads done
	PromotionFailures  uint64 // L2→L1 reads failed
	CorruptReads       uint64 // values read back whose checksum did not match (dropped)
	RemoveFailures     uint64 // removals whose L2 invalidation failed (the key stays)
	LeasesExpired      uint64 // timed pins ended by their TTL
	PrefixCut          uint64 // LookupPrefix pins stopped early by a pin limit (MaxPins, MaxSessionPinned)
	PinLimit           uint64 // pins refused: the session's values pinned were at MaxSessionPinned (ErrPinLimit)
	InvalidateFailures uint64 // L2 slots whose invalidation failed (kept out of use)
	// GhostsZeroed: slots kept out of use whose header the maintenance
	// loop's sweep zeroed, in use again since (but for those a transport
	// that broke its contract may still write); GhostZeroFailures: its
	// zeroings that failed (each retried later).
	GhostsZeroed, GhostZeroFailures uint64

	Recovered   uint64 // blocks indexed from L2 at open
	TornDropped uint64 // damaged headers found at open (torn or corrupt writes)
	// CorruptDropped: blocks whose value did not match at open (VerifyOnOpen).
	CorruptDropped    uint64
	DuplicatesDropped uint64 // older copies of a key found at open (invalidated)

	// L1Recovered: values found again in the pool at start (the L1
	// journal). L1Dropped: records whose value failed its checksum, or
	// lost to a newer record or to L2's copy. L1Torn: records half written.
	// L1JournalFull: values not recorded because the journal was full.
	L1Recovered, L1Dropped, L1Torn, L1JournalFull uint64

	TransportViolations uint64 // broken xfer.Transport contracts seen
	QuarantinedBlocks   uint64 // pool blocks kept out of use after one
	QuarantinedSlots    uint64 // L2 slots kept out of use
	QuarantinedTasks    uint64 // I/O tasks kept out of use (IODepth is that much smaller)
	FreeErrors          uint64 // pool frees that failed (a bug; logged)

	IOInFlight int // L2 operations in flight
	// IOWaiting: callers' keys waiting now for a free L2 task (wait.go);
	// IOWaits: how many have waited, in all.
	IOWaiting int
	IOWaits   uint64
}

// Stats returns the store's figures. It takes no shard lock.
func (s *Store) Stats() Stats {
	c := &s.c
	st := Stats{
		HitsL1: c.hitsL1.Load(), HitsL2: c.hitsL2.Load(), Misses: c.misses.Load(),
		Keys: c.keys.Load(), L1Keys: c.l1Keys.Load(), L2Keys: c.l2Keys.Load(), Reserved: c.reserved.Load(),
		L1Bytes: s.l1Bytes.Load(), L1Capacity: s.cfg.L1Capacity, Pins: c.pins.Load(), Dirty: c.dirtyOwed.Load(),
		Hidden: c.hidden.Load(), Unseen: c.unseen.Load(), Confirmed: c.confirmed.Load(),
		EvictionsL1: c.evictL1.Load(), EvictionsL2: c.evictL2.Load(), DroppedUnwritten: c.droppedUnwritten.Load(),
		L1Full: c.l1Full.Load(), Writebacks: c.writebacks.Load(), WritebackRetries: c.wbRetries.Load(),
		Tombstones: c.tombstones.Load(), DurablePuts: c.durable.Load(), DurableFailures: c.durableFail.Load(),
		Promotions: c.promotions.Load(), PromotionFailures: c.promoteFail.Load(), CorruptReads: c.corruptReads.Load(),
		RemoveFailures: c.removeFail.Load(), LeasesExpired: c.leasesExpired.Load(), PrefixCut: c.prefixCut.Load(),
		PinLimit: c.pinLimit.Load(), InvalidateFailures: c.l2InvalFailed.Load(),
		Recovered: c.recovered.Load(), TornDropped: c.torn.Load(), CorruptDropped: c.corrupt.Load(),
		DuplicatesDropped: c.dups.Load(), TransportViolations: c.violations.Load(),
		QuarantinedBlocks: c.quarantinedBlocks.Load(), FreeErrors: c.freeErrors.Load(),
		QuarantinedTasks: c.quarantinedTasks.Load(), Aborted: c.aborted.Load(),
		L1Recovered: c.l1Recovered.Load(), L1Dropped: c.l1Dropped.Load(), L1Torn: c.l1Torn.Load(),
		L1JournalFull: c.l1JournalFull.Load(), IOWaits: c.ioWaits.Load(),
		GhostsZeroed: c.ghostsZeroed.Load(), GhostZeroFailures: c.ghostZeroFail.Load(),
	}
	if t := s.l2; t != nil {
		t.mu.Lock()
		st.L2Bytes, st.L2Capacity, st.QuarantinedSlots = t.used, t.capacity, t.quarantined
		t.mu.Unlock()
		st.IOInFlight = int(t.inflight.Load())
		st.IOWaiting = int(t.nwaiting.Load())
	}
	return st
}
