package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/internal/keyblock"
	"github.com/tensorcast/tensorcast/internal/ratelog"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/xfer"
)

// Peers is the peer channel the cluster speaks on (*tcp.Node).
type Peers interface {
	// ID and Epoch are this daemon's id and run.
	ID() string
	Epoch() uint64
	// Handle registers the handler of one kind of exchange.
	Handle(kind string, h func(from string, epoch uint64, req []byte) ([]byte, error)) error
	// HandleNested registers the handler of a kind that makes exchanges
	// of its own and waits on them (a removal, waiting on its drops):
	// such handlers run under a bound apart from the others', so the
	// handlers they wait on, here or at a peer, always have room
	// (tcp.Node.HandleNested). Their exchanges must be of kinds Handle
	// registered.
	HandleNested(kind string, h func(from string, epoch uint64, req []byte) ([]byte, error)) error
	// ExchangeAt sends req to peer's handler of kind, addressed to its
	// run epoch (0: any), and returns the answer.
	ExchangeAt(peer string, epoch uint64, kind string, req []byte, timeout time.Duration) ([]byte, error)
	// EpochOf is the run of peer as this daemon knows it (0: not known
	// yet).
	EpochOf(peer string) uint64
	// Unreachable reports whether err, from an exchange, says the peer
	// cannot be reached (no session, connection lost, no answer in time,
	// another run), rather than that its handler failed.
	Unreachable(err error) bool
	// Busy reports whether err, from an exchange, says the peer refused
	// it before running it because its handlers were all taken: the peer
	// is there and did nothing of it, so it may be sent again.
	Busy(err error) bool
}

// nestedKinds are the kinds whose handlers make exchanges of their own
// and wait on them (Peers.HandleNested): a removal at its home sends
// drops to the holders (and tombstones to their keepers), a replica's
// holder reads the value from its sender and announces it to its home.
// Every other handler answers from this daemon alone, and starts in the
// background whatever else it asks of others; and the kinds these send
// (drop, keep, hold, announce) are of those.
var nestedKinds = map[string]bool{kindRemove: true, kindReplicate: true}

// StallDropper is what a Peers may also do: close the connections
// carrying this daemon's requests to peer whose bytes the network stalled
// (unacknowledged, retransmitted on a backed-off timer), so that the next
// request dials afresh (tcp.Node.DropStalled). The cluster does it when a
// member it had taken for down is heard from again: a network cut leaves
// those connections open, and after it heals their bytes wait seconds for
// TCP's next retransmission, while a new connection goes at once.
type StallDropper interface {
	DropStalled(peer, reason string) int
}

// Span is one value's move from a holder's pool into this daemon's.
type Span struct {
	Local, Remote, Length uint64
	// Sum is the crc32c of the bytes that landed, when the Mover's
	// transport took it as they landed (Sum.Taken). Otherwise the reader
	// takes it from the pool.
	Sum xfer.Sum
}

// Mover moves bytes of a holder's pool (which it exports to its peers for
// reading) into this daemon's pool, over the peer link (rdma where the
// link to the holder is up, else tcp).
type Mover interface {
	// Read moves spans by deadline: nil when every one is in place, a
	// span's Sum set when its transport took the checksum as the bytes
	// landed. After
	// an error a transfer that outlived its deadline may still write into
	// a span's bytes here: settled, when not nil, closes once none can
	// any more, and until then the blocks the spans name must not be
	// given back to the pool.
	Read(holder string, epoch uint64, spans []Span, deadline time.Time) (settled <-chan struct{}, err error)
}

// Config configures a Cluster.
type Config struct {
	// Shards is how many shards the key space is split into (default
	// 1024); every daemon of a cluster must use the same.
	Shards int
	// Members are the daemon ids of the cluster, this daemon's included
	// or not (it is added).
	Members []string
	// Directory, when set (directory = etcd), lists the daemons the
	// directory knows (from its cache: no request to etcd); the prober
	// adds the new ones to the members and takes those gone out.
	Directory func() []string
	// Fence, with directory = etcd, is the shard claims: homes are those
	// holding them, with their generations (fence.go). Without it the
	// homes are rendezvous's over the members, at their epochs.
	Fence Fence
	// MaxKeys bounds the keys this daemon's location index holds as a
	// home (default 1<<20); MaxHolders the holders per key (default 4, at
	// most 4).
	MaxKeys, MaxHolders int
	// Timeout bounds every remote step of a call: a fetch, a lookup, a
	// removal (default 2 s).
	Timeout time.Duration
	// MaxFetches bounds the fetches in flight (default 64) and MaxHolds
	// the claims this daemon hands readers at once (default 1024); past
	// either a key gets ErrBusy.
	MaxFetches, MaxHolds int
	// MaxPending bounds announcements waiting to be sent (default 1<<16);
	// past it they are dropped and counted (the keys are then found only
	// here until re-announced).
	MaxPending int
	// ProbeEvery is how often each member is asked whether it is there
	// (default 1 s); ReannounceRate bounds the keys re-announced to new
	// homes a second (default 50000).
	ProbeEvery     time.Duration
	ReannounceRate int
	// MaxTombstones bounds the removed copies a home remembers for
	// holders it could not reach (default 1<<16), for at most
	// TombstoneTTL each (default 10 min) (tomb.go), the copies of other
	// homes' tombstones kept here, the removed keys kept here until the
	// I/O in flight on them ends (dropLater), and the puts whose time is
	// noted while members are away, for TombstoneTTL after the last came
	// back (apart.go).
	MaxTombstones int
	TombstoneTTL  time.Duration
	// Staleness is how long a reader keeps a home's answer (default 2 s;
	// negative: none), for at most MaxCached keys (default 1<<16).
	Staleness time.Duration
	MaxCached int
	// Push turns on the homes' pushes of fresh answers to the readers
	// interested in a shard (push.go). Off by default: in the 100-daemon
	// simulation it sent 23 pushes per home round trip it saved.
	Push bool
	// Pool is this daemon's pool memory (the store's values), where
	// fetched values land and are checked.
	Pool []byte
	Log  *slog.Logger
	// manualClaims (tests only) starts no claimer: the test runs each
	// claim round itself, in an order it chooses.
	manualClaims bool

	// Replicas is how many copies of each value put here the cluster
	// keeps, this daemon's included (default 1: none elsewhere; at most
	// store.MaxReplicas); a session may ask for others
	// (store.Session.SetReplicas).
	Replicas int
	// ClaimsPerKey bounds the readers a home sends to one holder of one
	// key at once, and the readers of one key a holder admits at once
	// from anywhere (default 8); ClaimsPerHolder those a home sends to one
	// holder over all keys (default MaxHolds).
	ClaimsPerKey, ClaimsPerHolder int
	// Admission, when set, is the mode's budget for remote work: each
	// remote get of a key is admitted by it, and each read this daemon
	// serves another takes its bytes from it.
	Admission *grant.Admission
}

func (c *Config) setDefaults() error {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = 1 << 20
	}
	if c.MaxHolders == 0 {
		c.MaxHolders = maxHoldersCap
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.MaxFetches == 0 {
		c.MaxFetches = 64
	}
	if c.MaxHolds == 0 {
		c.MaxHolds = 1024
	}
	if c.MaxPending == 0 {
		c.MaxPending = 1 << 16
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = time.Second
	}
	if c.ReannounceRate == 0 {
		c.ReannounceRate = 50000
	}
	if c.Staleness == 0 {
		c.Staleness = 2 * time.Second
	}
	if c.MaxCached == 0 {
		c.MaxCached = 1 << 16
	}
	if c.MaxTombstones == 0 {
		c.MaxTombstones = 1 << 16
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.ClaimsPerKey == 0 {
		c.ClaimsPerKey = 8
	}
	if c.ClaimsPerHolder == 0 {
		c.ClaimsPerHolder = c.MaxHolds
	}
	switch {
	case c.Shards < 1 || c.Shards > maxShards:
		return fmt.Errorf("%w: %d shards (want 1..%d)", xfer.ErrInvalid, c.Shards, maxShards)
	case c.MaxHolders < 1 || c.MaxHolders > maxHoldersCap:
		return fmt.Errorf("%w: %d holders per key (want 1..%d)", xfer.ErrInvalid, c.MaxHolders, maxHoldersCap)
	case c.Replicas < 1 || c.Replicas > store.MaxReplicas:
		return fmt.Errorf("%w: %d replicas (want 1..%d)", xfer.ErrInvalid, c.Replicas, store.MaxReplicas)
	case c.ClaimsPerKey < 1, c.ClaimsPerHolder < 1:
		return fmt.Errorf("%w: claims per key and per holder must be positive", xfer.ErrInvalid)
	case c.MaxKeys < 1, c.MaxFetches < 1, c.MaxHolds < 1, c.MaxPending < 1, c.Timeout < 0, c.ProbeEvery < 0, c.ReannounceRate < 1, c.MaxCached < 1,
		c.MaxTombstones < 1, c.TombstoneTTL < 0:
		return fmt.Errorf("%w: limits must be positive", xfer.ErrInvalid)
	}
	for _, m := range c.Members {
		if m == "" || len(m) > maxIDLen {
			return fmt.Errorf("%w: member id %q (1..%d bytes)", xfer.ErrInvalid, m, maxIDLen)
		}
	}
	return nil
}

// Cluster is one daemon's part of the store across hosts: home of some
// shards, holder of its store's values, reader of the others'. It
// implements store.Remote.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	peers Peers
	st    *store.Store
	mover Mover
	self  string
	view  atomic.Pointer[view]
	idx   *index
	tombs *tombs
	// apart notes the puts made here while members are away (apart.go).
	apart *putsApart
	// gainedAt is, per shard, when this daemon last became its home
	// (UnixNano); walks what it knows of the members' re-announcements
	// since, which rebuild its index of the shard (walk.go).
	gainedAt []atomic.Int64
	walks    *walks
	// homeMoves counts, per shard, the changes of its home in this
	// daemon's view, each counted before the change is seen: a walk that
	// finds a shard's count changed since it began does not report it
	// (its keys may have gone to another home meanwhile, and back).
	homeMoves []atomic.Uint64
	// answers caches the homes' answers this daemon got as a reader.
	answers *answers
	// claims are the claims this daemon, as a home, handed readers.
	claims *grant.Claims
	// route counts how the homes of looked-up keys were found (stats.go).
	route routeCounters
	// push is what this daemon, as a home, owes the readers interested in
	// its shards; pushStop stops the pusher, pushDone is closed when it
	// exits (push.go).
	push               *pushes
	pushStop, pushDone chan struct{}

	// mu guards pending, keys, sending and closed.
	mu      sync.Mutex
	pending []entry
	// keys holds the pending entries' keys, copied in blocks (one
	// allocation per a few hundred keys, not one per put).
	keys keyblock.Arena
	// sending is set while the announcer sends a batch it took from
	// pending (idle: pending empty and sending false).
	sending bool
	closed  bool
	kick    chan struct{} // wakes the announcer; capacity 1
	stop    chan struct{}
	life    context.Context // ends when Close starts: what waits on etcd stops
	endLife context.CancelFunc
	done    chan struct{} // closed when the announcer exits
	// greeted is closed once the start-up greeting (greet) has ended:
	// every member reached has had its hello.
	greeted chan struct{}
	// reqs are the re-announcements asked for (mu guards them); rekick
	// wakes the reannouncer, redone is closed when it exits.
	reqs []func(shard int, home string) bool
	// reqsAll: reqs is one re-announcement of every key (maxReannounceReqs).
	reqsAll bool
	rekick  chan struct{}
	redone  chan struct{}
	// repQ are the copies asked of Replicate, waiting for the replicator
	// (mu guards it); repKick wakes it, repDone is closed when it exits.
	repQ    []repJob
	repKick chan struct{}
	repDone chan struct{}

	// mmu guards members: the other members, by id.
	mmu     sync.Mutex
	members map[string]*member
	// vmu serializes view changes (recompute).
	vmu sync.Mutex

	fetchSem chan struct{}
	fetchWG  sync.WaitGroup
	// flyMu guards flying: the keys being fetched, with the answers owed
	// to the fetches that joined.
	flyMu  sync.Mutex
	flying map[string][]func(error)

	// dropRounds runs one retryDrops round per holder at a time, handing
	// one handTombs hand-off per home.
	dropRounds, handing rounds

	// holdMu guards holds, holdsTaking, holdKeys, gone, dropping and
	// nextClaim.
	holdMu sync.Mutex
	holds  map[uint64]*hold
	// holdsTaking counts the holds being taken (onHold, past its check of
	// Config.MaxHolds and not yet in holds): they count against the bound.
	holdsTaking int
	holdKeys    map[string]int // readers holding each key here (ClaimsPerKey at most)
	// gone are the records of keys removed while a caller's I/O was in
	// flight on them here: dropped once it ends (dropLater).
	gone     map[string]store.RecordID
	dropping bool // the dropper runs
	// goneN is len(gone), stored with it under holdMu and read without:
	// a put looks at gone only when it is not empty.
	goneN     atomic.Int32
	nextClaim uint64

	// takenMu guards takenBy: for each shard another member claimed from
	// this daemon, that claim (fence.go: not taken back while the
	// directory lists its holder).
	takenMu sync.Mutex
	takenBy map[int]ShardClaim

	// claims are the shard claims as the Fence says (nil without one);
	// ckick wakes the claimer, cdone is closed when it exits.
	shardClaims []atomic.Pointer[ShardClaim]
	ckick       chan struct{}
	cdone       chan struct{}

	c      counters
	byPeer peerCounts
	// served counts the messages this daemon served, by kind (made in
	// New, read-only after).
	served map[string]*atomic.Uint64
	// kinds are the exchange kinds this Cluster handles, in the order it
	// registered them (Close removes them in reverse).
	kinds []string
	// lastFailLog is when logFailed last logged (unix ns); lastRepLog when
	// logReplica did.
	lastFailLog, lastRepLog atomic.Int64
	// leftTaken is how many shards the last claim round left with the
	// members that took them from here (fence.go), for its log.
	leftTaken atomic.Int64
	// awayRemovals and noKeepers log the removals made while members are
	// away, and their tombstones no member keeps a copy of, a line an
	// interval: a client removing while a member is away makes them at
	// its own rate (a line per remove, 27 a second in a soak).
	awayRemovals, noKeepers *ratelog.Log
}

var (
	_ store.Remote     = (*Cluster)(nil)
	_ store.Replicator = (*Cluster)(nil)
)

// hold is a claim a reader holds here: its keys pinned in a store
// session of their own until released or expired.
type hold struct {
	ss    *store.Session
	timer *time.Timer
	from  string // the reader and its run: only they release it
	epoch uint64
	keys  []string // the keys it counts as a reader of (holdKeys)
}

// counters are the cluster's figures (Stats).
type counters struct {
	announced, announceSent, announceDropped, announceFailed atomic.Uint64
	lookups, lookupsLocal, lookupFailed                      atomic.Uint64
	lookupsOwn                                               atomic.Uint64 // keys a reader here looked up in its own index (home of their shard)
	remoteHits, remoteMisses, remoteFailed, remoteBytes      atomic.Uint64
	crcMismatch, crcLanded, holds, holdsRefused, removes     atomic.Uint64
	reannounced, viewChanges, cacheHits                      atomic.Uint64
	staleRefused, staleAnswers, claimsWon, tombDrops         atomic.Uint64
	tombRetried, tombsHanded, tombsTaken                     atomic.Uint64
	dropRetryRounds, handStopped                             atomic.Uint64 // drops asked again of a member after a round failed; hand-offs stopped at a message refused
	dropsSoon, removesKept                                   atomic.Uint64 // copies dropped when asked again within a removal's time; keys whose removal a member's copy outlasted
	putsKept                                                 atomic.Uint64 // values put after their removal, kept against its late drop
	lateLosses                                               atomic.Uint64 // failed exchanges sent before the member answered again: not taken for down
	busyRetries, busyHellos                                  atomic.Uint64 // exchanges sent again after the peer answered busy; hellos it answered busy
	olderKinds                                               atomic.Uint64 // messages sent as the kind an older release knows (members.go, older)
	walksTaken, removeAsksUnnamed                            atomic.Uint64 // members' walks of this daemon's shards reported; drops a removal asked of members the index does not name (walk.go)
	tombsKept, keepFailed, keepNone                          atomic.Uint64 // tombstone copies given to keepers, and not; tombstones made with no member to keep a copy
	goneOver                                                 atomic.Uint64 // removed keys with I/O in flight here past the bound
	overBudget, readersRefused                               atomic.Uint64
	replicasMade, replicaFailed, replicasShort               atomic.Uint64
	quickReads, quickFallbacks, quickServed                  atomic.Uint64 // one-round-trip reads (quick.go)
	// unsettled counts failed reads whose blocks wait for their late
	// transfers (closeWhenSettled).
	unsettled atomic.Int64
}

// New makes the cluster of st, speaking on peers and moving bytes with
// mover, registers its exchange handlers and starts its announcer. The
// caller makes it st's Remote (store.SetRemote) and closes it before st.
func New(cfg Config, st *store.Store, peers Peers, mover Mover) (*Cluster, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if st == nil || peers == nil || mover == nil || cfg.Pool == nil {
		return nil, fmt.Errorf("%w: cluster needs a store, peers, a mover and the pool", xfer.ErrInvalid)
	}
	c := &Cluster{
		cfg: cfg, log: cfg.Log, peers: peers, st: st, mover: mover, self: peers.ID(),
		idx:      newIndex(cfg.Shards, cfg.MaxKeys, cfg.MaxHolders),
		answers:  newAnswers(cfg.Staleness, cfg.MaxCached),
		tombs:    newTombs(cfg.MaxTombstones, cfg.TombstoneTTL, 2*cfg.Timeout),
		apart:    newPutsApart(cfg.MaxTombstones, cfg.TombstoneTTL),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		fetchSem: make(chan struct{}, cfg.MaxFetches),
		holds:    map[uint64]*hold{},
		holdKeys: map[string]int{},
		gone:     map[string]store.RecordID{},
		takenBy:  map[int]ShardClaim{},
		flying:   map[string][]func(error){},
		greeted:  make(chan struct{}),
		rekick:   make(chan struct{}, 1),
		redone:   make(chan struct{}),
		members:  map[string]*member{},
		ckick:    make(chan struct{}, 1),
		cdone:    make(chan struct{}),
		repKick:  make(chan struct{}, 1),
		repDone:  make(chan struct{}),
		claims: grant.NewClaims(grant.ClaimsConfig{MaxPerKey: cfg.ClaimsPerKey, MaxPerHolder: cfg.ClaimsPerHolder,
			MaxOutstanding: cfg.MaxKeys, MaxTTL: maxHoldTTL}),
	}
	c.awayRemovals = ratelog.New(c.log, slog.LevelInfo, "keys removed while members are away: their copies there are dropped when they are back", 0)
	c.noKeepers = ratelog.New(c.log, slog.LevelWarn, "no member to keep tombstones: the removal of copies on holders away holds only while this home lives", 0)
	c.life, c.endLife = context.WithCancel(context.Background())
	// Whatever shard this daemon is home of at first, its index of it is
	// empty until the members' re-announcements come.
	c.gainedAt = make([]atomic.Int64, cfg.Shards)
	c.homeMoves = make([]atomic.Uint64, cfg.Shards)
	c.walks = newWalks(cfg.Shards)
	c.gain(func(int) bool { return true })
	c.served = map[string]*atomic.Uint64{kindRead: new(atomic.Uint64)}
	if cfg.Fence != nil {
		c.shardClaims = make([]atomic.Pointer[ShardClaim], cfg.Shards)
	}
	ids := cfg.Members
	if cfg.Directory != nil {
		ids = append(slices.Clone(ids), cfg.Directory()...)
	}
	for _, m := range ids {
		if m != c.self && m != "" && len(m) <= maxIDLen {
			c.members[m] = &member{up: true}
		}
	}
	c.view.Store(newView(c.live(), cfg.Shards))
	if err := c.startPush(); err != nil {
		return nil, err
	}
	handlers := map[string]func(string, uint64, []byte) ([]byte, error){
		kindAnnounce: c.onFenced(c.onAnnounce), kindLookup: c.onFenced(c.onLookup), kindRemove: c.onFenced(c.onRemove),
		kindDrop: c.onDrop, kindHold: c.onHold, kindRelease: c.onRelease, kindReannounce: c.onReannounce, kindHello: c.onHello,
		kindClaim: c.onFenced(c.onClaim), kindUnclaim: c.onUnclaim, kindReplicate: c.onReplicate, kindTombs: c.onTombs,
		kindKeep: c.onKeep, kindAnnounceAges: c.onFenced(c.onAnnounceAges), kindDropAges: c.onDropAges,
		kindPull: c.onPull, kindWalked: c.onWalked,
	}
	// The kinds an older release lacks first (and, in Close, last): a
	// member that serves an older kind but not these runs an older
	// release (members.go, older; walk.go, pull), not this one starting
	// or stopping.
	order := []string{kindAnnounceAges, kindDropAges, kindPull, kindWalked}
	for _, k := range slices.Sorted(maps.Keys(handlers)) {
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	c.kinds = order
	for _, kind := range order {
		h := handlers[kind]
		n := new(atomic.Uint64)
		c.served[kind] = n
		handle := peers.Handle
		if nestedKinds[kind] {
			handle = peers.HandleNested
		}
		err := handle(kind, func(from string, epoch uint64, req []byte) ([]byte, error) {
			n.Add(1)
			if kind != kindHello { // a hello says whether it counts
				c.seen(from, epoch)
			}
			return h(from, epoch, req)
		})
		if err != nil {
			return nil, err
		}
	}
	if qp, ok := peers.(QuickPeers); ok {
		if err := qp.HandleInline(kindRead, c.onRead); err != nil {
			return nil, err
		}
	}
	go c.announcer()
	go c.reannouncer()
	go c.replicator()
	if cfg.Fence != nil {
		cfg.Fence.Watch(c.onShardClaims)
	}
	if cfg.Fence != nil && !cfg.manualClaims {
		go c.claimer()
	} else {
		close(c.cdone)
	}
	// What the store recovered from L2 goes to its homes.
	c.reannounce(func(int, string) bool { return true })
	v := c.view.Load()
	c.log.Info("store across hosts up", "daemon_id", c.self, "members", v.members, "shards", cfg.Shards,
		"home_of", c.homeOf(v))
	return c, nil
}

// Served is how many messages of each kind ("tc.store.hold", …) this
// daemon has served.
func (c *Cluster) Served() map[string]uint64 {
	m := make(map[string]uint64, len(c.served))
	for k, n := range c.served {
		m[k] = n.Load()
	}
	return m
}

// homeOf counts the shards this daemon is home of under v.
func (c *Cluster) homeOf(v *view) int {
	n := 0
	for s := range v.homes {
		if c.homeFor(v, s) == c.self {
			n++
		}
	}
	return n
}

// Close stops the announcer, waits for the fetches in flight (each ends by
// its deadline) and releases every claim readers hold here. Handlers are
// removed first, so no new work comes in.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	c.endLife()
	c.stopPush()
	for _, k := range slices.Backward(c.kinds) { // the kinds with ages last
		_ = c.peers.Handle(k, nil)
	}
	if qp, ok := c.peers.(QuickPeers); ok {
		_ = qp.HandleInline(kindRead, nil)
	}
	if c.cfg.Fence != nil {
		c.cfg.Fence.Watch(nil)
	}
	close(c.stop)
	<-c.done
	<-c.redone
	<-c.cdone
	<-c.repDone
	c.fetchWG.Wait()
	c.claims.Close()
	c.holdMu.Lock()
	hs := c.holds
	c.holds = map[uint64]*hold{}
	clear(c.holdKeys)
	c.holdMu.Unlock()
	for _, h := range hs {
		h.timer.Stop()
		_ = h.ss.Close()
	}
	c.awayRemovals.Stop()
	c.noKeepers.Stop()
}

// shardOf is key's shard.
func (c *Cluster) shardOf(key []byte) int { return ShardOf(key, c.cfg.Shards) }

// Home is the daemon id of key's home (tcctl cluster locate).
func (c *Cluster) Home(key []byte) string { return c.homeFor(c.view.Load(), c.shardOf(key)) }

// Locate is key's home and the holders it knows (asking it when it is
// another daemon). Its answer is not kept in the cache of home answers: a
// later read here still asks the home, and takes a claim.
func (c *Cluster) Locate(key []byte) (home string, holders []Holder, err error) {
	home = c.Home(key)
	as, errs, _, _ := c.lookupAll([][]byte{key}, nil, time.Now().Add(c.cfg.Timeout), cacheNone, false)
	if errs[0] != nil {
		return home, nil, errs[0]
	}
	return home, as[0].holders, nil
}

// Where is a key's place in the store across hosts, as this daemon knows
// it (tcctl cluster locate).
type Where struct {
	Shard      int
	Home       string
	Generation uint64 // the home's claim (etcd), or its run epoch
	// Rendezvous is the member rendezvous hashing makes home of the shard
	// (with etcd, the one to claim it: Home until it has).
	Rendezvous string
	Holders    []Holder
}

// Where asks key's home about it (the home this daemon knows, not a
// cached answer) and says where it is.
func (c *Cluster) Where(key []byte) (Where, error) {
	w := c.Placement(key)
	_, hs, err := c.Locate(key)
	w.Holders = hs
	return w, err
}

// Placement is key's shard, home, generation and rendezvous home as this
// daemon knows them (no holders: nothing is asked).
func (c *Cluster) Placement(key []byte) Where {
	s := c.shardOf(key)
	home := c.Home(key)
	w := Where{Shard: s, Home: home, Generation: c.genFor(s, home), Rendezvous: c.view.Load().home(s)}
	if home == c.self {
		w.Generation = c.heldGen(s)
	}
	return w
}

// epochOf is the run a message to id is addressed to.
func (c *Cluster) epochOf(id string) uint64 {
	if id == c.self {
		return c.peers.Epoch()
	}
	c.mmu.Lock()
	m, ok := c.members[id]
	e := uint64(0)
	if ok {
		e = m.epoch
	}
	c.mmu.Unlock()
	if e != 0 {
		return e // the run it last spoke from
	}
	return c.peers.EpochOf(id)
}

// exchange sends a message to id within the cluster's timeout; a member
// that cannot be reached goes down.
func (c *Cluster) exchange(id string, epoch uint64, kind string, req []byte) ([]byte, error) {
	return c.exchangeBy(id, epoch, kind, req, time.Now().Add(c.cfg.Timeout))
}

// exchangeBy is exchange ending by deadline. A peer that answers busy
// (every exchange handler of its taken, as on a daemon back from a
// restart that all its members tell at once) ran nothing of it: it is
// asked again after a short back-off, doubling, at most busyTries times in
// all and while the deadline leaves time, and its last busy answer is the
// error. A burst passes so; a peer busy for longer fails the exchange
// soon, as any failure does (a removal's drop then leaves a tombstone),
// so that the caller (often a handler itself) does not hold on.
func (c *Cluster) exchangeBy(id string, epoch uint64, kind string, req []byte, deadline time.Time) ([]byte, error) {
	for try, wait := 1, busyBackoff; ; try, wait = try+1, 2*wait {
		left := time.Until(deadline)
		if left < time.Millisecond {
			return nil, fmt.Errorf("%w: no time left to ask %s", xfer.ErrTimeout, id)
		}
		sent := time.Now()
		resp, err := c.peers.ExchangeAt(id, epoch, kind, req, left)
		switch {
		case err == nil:
			c.reachedAt(id, sent)
		case c.peers.Busy(err):
			c.reachedAt(id, sent) // it answered
			jittered := wait/2 + rand.N(wait/2+1)
			if try >= busyTries || time.Until(deadline) <= jittered+busyBackoff {
				return nil, err
			}
			c.c.busyRetries.Add(1)
			select {
			case <-time.After(jittered):
				continue
			case <-c.stop:
				return nil, err
			}
		case left >= c.cfg.Timeout/2 || !errors.Is(err, xfer.ErrTimeout):
			// Unreachable, or silent for a good part of the timeout: not
			// merely a call that had little time left.
			c.lost(id, err, sent)
		}
		return resp, err
	}
}

// busyBackoff is the first wait before an exchange a peer answered busy
// is sent again (doubling after each), and busyTries how many times in all
// it is sent: the waits come to at most about 60 ms.
const (
	busyBackoff = 2 * time.Millisecond
	busyTries   = 5
)

// chunks splits positions into messages of at most maxMsgKeys keys and
// maxMsgBytes bytes (each key costs at most per+its length).
func chunks(keys [][]byte, pos []int, per int) [][]int {
	var out [][]int
	const head = 16 + fenceBytes
	start, bytes := 0, head
	for i, p := range pos {
		n := per + len(keys[p])
		if i > start && (i-start == maxMsgKeys || bytes+n > maxMsgBytes) {
			out = append(out, pos[start:i])
			start, bytes = i, head
		}
		bytes += n
	}
	if start < len(pos) {
		out = append(out, pos[start:])
	}
	return out
}
