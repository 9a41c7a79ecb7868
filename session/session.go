package session

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/reactor"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/store/cluster/grant"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Limits bound what one session may hold.
type Limits struct {
	MaxBuffers         int    // registered buffers and files (default 64)
	MaxBufferSize      uint64 // bytes of one registered buffer (default 64 GiB)
	MaxBlocks          int    // pool blocks held (default 65536)
	MaxBatches         int    // batches held (default 64)
	MaxBatchCapacity   int    // tasks per batch, and requests per Transfer (default 4096)
	MaxRequests        int    // requests per Submit (default 4096)
	MaxIdempotencyKeys int    // remembered idempotency keys, oldest evicted; only the connection's own evict them (default 1024)
	MaxExports         int    // exported segments, opened remote ones and subscriptions (default 64 each)
	MaxNotifications   int    // queued notifications; a full queue refuses more (default 1024)
	MaxQueues          int    // shared-memory queues open (default 16)
	MaxQueueEntries    int    // submission entries of one queue (default 4096; its completion ring may be up to 4x that)
	MaxQueueData       int    // bytes of one queue's data area (default 4 MiB)
}

// Host is what the sessions of one server share: the limits and waits
// they keep, what they drive, and the server's lifecycle as they see it.
// The server fills the exported fields before its first session and
// changes none after.
type Host struct {
	Limits Limits
	// MaxFrame is the largest frame body: answers are cut to fit it.
	MaxFrame int
	// DefaultWait bounds waits that name no timeout and no deadline.
	DefaultWait time.Duration
	// ReleaseWait is how long closing a session waits for its busy
	// batches and its exports' peer requests.
	ReleaseWait time.Duration

	Engine     Engine
	Registry   Registry
	MapBuffer  MapBufferFunc
	FileOpener FileOpener // nil: RegisterFile answers UNAVAILABLE
	Exports    *peer.Exports
	Peers      PeerPlane // nil: OpenRemote answers UNAVAILABLE
	// Reactors are the workers that serve the sessions' queues; nil:
	// OpenQueue answers UNAVAILABLE.
	Reactors *reactor.Pool

	// Closing is closed when the server closes: long waits give up and
	// closing sessions wait no more.
	Closing <-chan struct{}
	// Quiesced is closed when the server quiesces: waits for a client's
	// events end.
	Quiesced <-chan struct{}
	// Draining reports whether new requests are refused.
	Draining func() bool
	// Log and LogInterval are where and how often at most (ratelog.Interval
	// when 0) the warnings a client can trigger are logged (warnings.go);
	// nil Log discards them.
	Log         *slog.Logger
	LogInterval time.Duration

	warnOnce sync.Once
	warnings *warnings // made by warns

	nextQueue atomic.Uint64
	// mu guards closedQueues: the counters closed queues left behind.
	mu           sync.Mutex
	closedQueues QueueTotals
}

// closing reports whether the server is closing.
func (h *Host) closing() bool {
	select {
	case <-h.Closing:
		return true
	default:
		return false
	}
}

// Session is what one client holds: its registered buffers and files, the
// remote segments it opened, its pool blocks and the view of the pool its
// transfers resolve, its batches, its queues and their workers, its store
// session, its exports and subscriptions. It is the resolver and range
// holder the engine calls back for the client's transfers.
//
// Its methods name it c, the client. The connection's serving goroutine
// makes the calls (New, SetTenant, the handlers, Close); the engine, the
// transports and the queue workers call Resolve and the pool view from
// their own goroutines.
type Session struct {
	h   *Host
	id  uint64
	log *slog.Logger

	// tenant names the client's tenant ("" for none); pool and store are
	// its, nil without a tenant. SetTenant sets them before the first
	// handler.
	tenant string
	pool   Pool
	store  *store.Store
	// grants are the tenant's handles and leases (grant.go); nil: none.
	grants *grant.Grants
	// gone reports whether the client has hung up (SetGone); nil: never
	// known before its connection's read fails.
	gone func() bool

	// segGen changes (under mu) whenever a segment is removed from the
	// maps below, so that a queue's cache of resolved segments knows.
	segGen atomic.Uint64
	// mu guards the resources below: the engine may resolve segments from
	// its own goroutines while the serving goroutine adds or removes them.
	mu      sync.Mutex
	buffers map[xfer.SegmentID]Buffer
	files   map[xfer.SegmentID]FileSegment
	remotes map[xfer.SegmentID]remote

	// inbox is the queue of the notifications of the exports the
	// session subscribed to, which PollNotifications drains.
	inbox *peer.Inbox

	// pview is the pool as this session's requests resolve it: the pool
	// with the session's blocks as the holder of its requests' ranges.
	pview xfer.PoolView
	// st is the session's store session and scratch (store.go).
	st connStore

	// Owned by the serving goroutine.
	blocks  xfer.Blocks // the pool blocks the session allocated
	batches map[BatchID]struct{}
	// qmu guards queues against stats scrapes; the serving goroutine
	// owns the map and changes it under qmu.
	qmu     sync.Mutex
	queues  map[uint64]*cqueue
	exports []*peer.Export // what this session exported
	// lingering are unexported pool ranges a peer request still held
	// when unexport gave up waiting; their blocks are not freed while it
	// does.
	lingering []*peer.Export

	// The serving goroutine's scratch.
	errs  []error
	codes []Code
	reqs  []xfer.Request
	offs  []uint64
	sts   []tcproto.TaskState
}

// New makes the session of connection id; log is its logger.
func New(h *Host, id uint64, log *slog.Logger) *Session {
	c := &Session{
		h:       h,
		id:      id,
		log:     log,
		buffers: make(map[xfer.SegmentID]Buffer),
		files:   make(map[xfer.SegmentID]FileSegment),
		remotes: make(map[xfer.SegmentID]remote),
		batches: make(map[BatchID]struct{}),
		queues:  make(map[uint64]*cqueue),
	}
	c.inbox = peer.NewInbox(fmt.Sprintf("connection %d", id), h.Limits.MaxNotifications)
	c.pview.Blocks = &c.blocks
	return c
}

// SetTenant makes the session's tenant name, with its pool and store (nil
// pool: no tenant, no pool), and its logger log. It is called once,
// before the first handler.
func (c *Session) SetTenant(name string, pool Pool, st *store.Store, log *slog.Logger) {
	c.tenant, c.pool, c.store, c.log = name, pool, st, log
	if pool != nil {
		c.pview.MemSegment = pool
	}
}

// SetGone gives the session a way to learn, without reading from it,
// that its client has hung up: a handler that waits (Wait, Transfer,
// PollNotifications, StoreFlush) asks it once per slice of its wait and
// gives up, so
// that the connection is released at once and not when the call's
// timeout, which the client chose, ends. It is called once, before the
// first handler; f must not block.
func (c *Session) SetGone(f func() bool) { c.gone = f }

// clientGone reports whether the client has hung up, as SetGone's
// function says.
func (c *Session) clientGone() bool { return c.gone != nil && c.gone() }

// poolID is the id of the session's pool, 0 (no segment's) when it has
// none.
func (c *Session) poolID() xfer.SegmentID {
	if c.pool == nil {
		return 0
	}
	return c.pool.ID()
}

// Resolve implements xfer.Resolver scoped to this session: the pool and
// the segments this session registered.
func (c *Session) Resolve(id xfer.SegmentID) (xfer.Segment, bool) {
	if c.pool != nil && id == c.pool.ID() {
		return &c.pview, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.buffers[id]; ok {
		return b, true
	}
	if f, ok := c.files[id]; ok {
		return f, true
	}
	if r, ok := c.remotes[id]; ok {
		return r.seg, true
	}
	return nil, false
}

var _ xfer.Resolver = (*Session)(nil)

// deadline is when a call with timeoutMS (0: none) in context ctx ends.
func (c *Session) deadline(ctx *wire.Context, timeoutMS uint32) time.Time {
	switch {
	case timeoutMS > 0:
		return time.Now().Add(time.Duration(timeoutMS) * time.Millisecond)
	case ctx.DeadlineMS > 0:
		return time.Now().Add(time.Duration(ctx.DeadlineMS) * time.Millisecond)
	}
	return time.Now().Add(c.h.DefaultWait)
}

// Counters appends the session's figures for Stats to dst: what it holds
// and its queues' counters. idempotencyKeys is the connection's count of
// remembered keys, which the server keeps, listed among them.
func (c *Session) Counters(dst []wire.Counter, idempotencyKeys int) []wire.Counter {
	dst = append(dst,
		wire.Counter{Name: "segments", Value: uint64(c.segments())},
		wire.Counter{Name: "blocks", Value: uint64(c.blocks.Len())},
		wire.Counter{Name: "batches", Value: uint64(len(c.batches))},
		wire.Counter{Name: "idempotency_keys", Value: uint64(idempotencyKeys)},
		wire.Counter{Name: "exports", Value: uint64(len(c.exports))},
		wire.Counter{Name: "remotes", Value: uint64(c.remoteCount())},
		wire.Counter{Name: "notifications_queued", Value: uint64(c.inbox.Len())},
	)
	return c.queueCounters(dst)
}

// Pool is the session's pool, nil without a tenant.
func (c *Session) Pool() Pool { return c.pool }
