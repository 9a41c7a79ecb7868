package grant

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Leases are placement leases (seed 003): a lease pins a set of keys where
// they are for a TTL. It is created with an operation id as its join key,
// so that a create retried after an unknown outcome (at-least-once
// delivery, a client that reconnects) joins the first lease instead of
// pinning twice; the same id with another key set is refused. Expiry and
// release give the pins back. A lease that ended is remembered until the
// time it was due to end, so that a late retry of its create is refused
// rather than pinning again.
type Leases struct {
	cfg LeasesConfig

	// mu guards the fields below. Pins are taken and given back outside
	// it.
	mu      sync.Mutex
	closed  bool
	next    uint64
	byOp    map[string]*lease
	byID    map[uint64]*lease
	keys    int // keys held by the live leases
	ended   int // leases remembered after their end
	sched   sched
	scratch []deadline
	stats   LeaseStats
}

// LeasesConfig configures Leases.
type LeasesConfig struct {
	// Pinner takes a lease's pins (required).
	Pinner Pinner
	// MaxLeases bounds the leases live and remembered (default 4096);
	// MaxKeys the keys of one lease (default 1024); MaxTTL a lease's time
	// to live (default 1 h); MaxOpIDLen an operation id (default 128
	// bytes).
	MaxLeases  int
	MaxKeys    int
	MaxTTL     time.Duration
	MaxOpIDLen int
	// Clock is the time source (default the wall clock); Log where
	// creates, joins, releases and expiries are logged.
	Clock Clock
	Log   *slog.Logger
}

// Lease is a placement lease as its creator sees it.
type Lease struct {
	OpID   string
	Keys   int
	Expiry time.Time
	// Joined: the create joined a lease an earlier create with the same
	// operation id made (nothing was pinned again).
	Joined bool
}

// LeaseStats are the table's counters.
type LeaseStats struct {
	Live     uint64 // leases live now
	Keys     uint64 // keys they hold
	Created  uint64
	Joined   uint64 // creates that joined a live lease
	Refused  uint64 // creates refused for their operation id
	Released uint64
	Expired  uint64
}

type lease struct {
	op     string
	id     uint64
	digest [digestLen]byte
	nkeys  int
	expiry time.Time
	hold   Hold // nil while its pins are being taken, and once it ended
	ended  bool
}

// NewLeases makes an empty lease table.
func NewLeases(cfg LeasesConfig) (*Leases, error) {
	if cfg.Pinner == nil {
		return nil, fmt.Errorf("%w: no Pinner", ErrInvalid)
	}
	if cfg.MaxLeases <= 0 {
		cfg.MaxLeases = 4096
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = 1024
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.MaxOpIDLen <= 0 {
		cfg.MaxOpIDLen = 128
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	l := &Leases{cfg: cfg, byOp: map[string]*lease{}, byID: map[uint64]*lease{}}
	l.sched = sched{clock: cfg.Clock, fire: l.expire}
	return l, nil
}

// Create pins keys for ttl under operation id op, or joins the lease op
// already names when it is for the same keys (in the same order): then
// nothing is pinned again and the lease keeps its expiry. op naming a
// lease of other keys is ErrLeaseConflict; one that ended lately,
// ErrLeaseEnded; one whose first create is still pinning, ErrBusy (the
// retry pins nothing, and tries again for the first's outcome).
func (l *Leases) Create(op string, keys [][]byte, ttl time.Duration) (Lease, error) {
	if op == "" || len(op) > l.cfg.MaxOpIDLen {
		return Lease{}, fmt.Errorf("%w: operation id of %d bytes (1..%d)", ErrInvalid, len(op), l.cfg.MaxOpIDLen)
	}
	if err := checkKeys(keys, l.cfg.MaxKeys); err != nil {
		return Lease{}, err
	}
	if ttl <= 0 || ttl > l.cfg.MaxTTL {
		return Lease{}, fmt.Errorf("%w: ttl %v (want (0, %v])", ErrInvalid, ttl, l.cfg.MaxTTL)
	}
	digest := KeysDigest(keys)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Lease{}, ErrClosed
	}
	if ls, ok := l.byOp[op]; ok {
		defer l.mu.Unlock()
		switch {
		case ls.digest != digest:
			l.stats.Refused++
			return Lease{}, fmt.Errorf("%w: %q names a lease of %d keys", ErrLeaseConflict, op, ls.nkeys)
		case ls.ended:
			l.stats.Refused++
			return Lease{}, fmt.Errorf("%w: %q", ErrLeaseEnded, op)
		case ls.hold == nil:
			// The first create is pinning now: this retry must not
			// pin too, and cannot know the outcome yet.
			return Lease{}, fmt.Errorf("%w: %q is being created", ErrBusy, op)
		}
		l.stats.Joined++
		l.cfg.Log.Debug("placement lease joined", "op", op, "keys", ls.nkeys)
		return Lease{OpID: op, Keys: ls.nkeys, Expiry: ls.expiry, Joined: true}, nil
	}
	if len(l.byOp) >= l.cfg.MaxLeases && !l.dropEnded() {
		l.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %d leases", ErrLeaseLimit, len(l.byOp))
	}
	l.next++
	ls := &lease{op: op, id: l.next, digest: digest, nkeys: len(keys)}
	l.byOp[op], l.byID[ls.id] = ls, ls // reserved: the op id is taken while we pin

	// The expiry counts from before the pins are taken, so that the lease
	// never says it is live over pins whose TTL has run out.
	start := l.cfg.Clock.Now()
	hold, err := pinUnlocked(&l.mu, &l.closed, l.cfg.Pinner, keys, ttl)
	if err != nil {
		l.remove(ls)
		l.mu.Unlock()
		return Lease{}, err
	}
	defer l.mu.Unlock()
	ls.hold = hold
	ls.expiry = start.Add(ttl)
	l.keys += len(keys)
	l.stats.Created++
	l.sched.add(ls.expiry, ls.id, 0)
	l.cfg.Log.Debug("placement lease created", "op", op, "keys", len(keys), "expiry", ls.expiry)
	return Lease{OpID: op, Keys: ls.nkeys, Expiry: ls.expiry}, nil
}

// Release gives back the pins of the lease op names and says what it was
// (its keys and expiry, for the caller's audit). A lease that ended
// already is released (idempotent); an unknown op is ErrLeaseNotFound.
func (l *Leases) Release(op string) (Lease, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Lease{}, ErrClosed
	}
	ls, ok := l.byOp[op]
	switch {
	case !ok:
		l.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %q", ErrLeaseNotFound, op)
	case ls.hold == nil && !ls.ended:
		l.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %q is being created", ErrBusy, op)
	}
	was := Lease{OpID: op, Keys: ls.nkeys, Expiry: ls.expiry}
	if ls.ended {
		l.mu.Unlock()
		return was, nil
	}
	hold := l.end(ls)
	l.stats.Released++
	l.mu.Unlock()
	hold.Release()
	l.cfg.Log.Debug("placement lease released", "op", op, "keys", ls.nkeys)
	return was, nil
}

// end marks a live lease ended, remembered until its expiry, and returns
// its hold for the caller to release after unlocking. l.mu is held.
func (l *Leases) end(ls *lease) Hold {
	h := ls.hold
	ls.hold, ls.ended = nil, true
	l.keys -= ls.nkeys
	l.ended++
	return h
}

// remove forgets a lease. l.mu is held.
func (l *Leases) remove(ls *lease) {
	delete(l.byOp, ls.op)
	delete(l.byID, ls.id)
	if ls.ended {
		l.ended--
	}
}

// dropEnded forgets the remembered lease that would be forgotten first,
// making room for a new one; false when none is remembered. l.mu is held.
// Its deadline stays behind in the schedule, which is tidied here: a
// table at its limit drops one per create, and the records of a loop of
// creates and releases must not pile up until their TTLs end.
func (l *Leases) dropEnded() bool {
	if l.ended == 0 {
		return false
	}
	var first *lease
	for _, ls := range l.byID {
		if ls.ended && (first == nil || ls.expiry.Before(first.expiry)) {
			first = ls
		}
	}
	l.remove(first)
	l.sched.tidy(len(l.byID), l.current)
	return true
}

// current reports whether d is the deadline of a lease the table has (live
// or remembered). l.mu is held.
func (l *Leases) current(d deadline) bool {
	_, ok := l.byID[d.id]
	return ok
}

// expire ends the leases whose time has come and forgets the ended ones
// whose time has come (the timer calls it).
func (l *Leases) expire() {
	var holds []Hold
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.sched.fired()
	l.scratch = l.sched.due(l.cfg.Clock.Now(), l.scratch[:0])
	for _, d := range l.scratch {
		ls, ok := l.byID[d.id]
		if !ok {
			continue
		}
		if !ls.ended {
			holds = append(holds, l.end(ls))
			l.stats.Expired++
			l.cfg.Log.Debug("placement lease expired", "op", ls.op, "keys", ls.nkeys)
		}
		l.remove(ls)
	}
	l.sched.arm()
	l.mu.Unlock()
	releaseAll(holds)
}

// Stats reports the counters.
func (l *Leases) Stats() LeaseStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.Live, s.Keys = uint64(len(l.byOp)-l.ended), uint64(l.keys)
	return s
}

// Close releases every lease's pins and refuses new calls. The daemon
// closes it before the store.
func (l *Leases) Close() {
	var holds []Hold
	l.mu.Lock()
	l.closed = true
	l.sched.stop()
	for _, ls := range l.byID {
		if ls.hold != nil {
			holds = append(holds, l.end(ls))
		}
	}
	l.mu.Unlock()
	releaseAll(holds)
}
