package control

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/tensorcast/tensorcast/wire"
)

// The daemon-wide idempotency record. A connection's idemTable replays a
// retried call's first answer within that connection; this table is what
// makes a key mean one thing across connections: a key is bound, daemon
// wide, to the lane and arguments of its first use, and a call that
// presents it with another lane (or other arguments) is refused whichever
// connection it comes on. Answers name the connection's own resources
// (block offsets, batch and segment ids), so one is replayed only to the
// connection that got it; another connection presenting the same key, lane
// and arguments is refused while the first connection lives (two live
// owners would duplicate the effect) and runs afresh once it has closed
// (its effects were released with it). The exception is a call whose
// effect is the tenant's (tenantWide: a retention handle or placement
// lease, which outlives its connection): its answer is replayed to any
// connection of the tenant, whether the first lives or has closed, since
// running it again would issue a second handle while the first, whose
// token the client never read, stays pinned until its TTL.
//
// Keys are per tenant: the table's key is the tenant's name, a NUL (which
// no tenant's name has: validTenantName) and the client's key, so that a
// client of one tenant can neither probe another tenant's keys nor block
// them by using them first. Connections without a tenant (root, the
// daemon's uid) share a space of their own.
//
// Bounded so that no client's keys can push out another's: the records of
// an open connection are its own, at most Limits.MaxIdempotencyKeys (as
// many as its own table holds; past that its oldest goes first), and
// nothing else evicts them, so a retry on another connection is refused
// while the first lives whatever other clients send. When a connection
// closes its records become its key space's (its tenant's) bindings, with
// a bound per key space (the oldest binding goes first), so one tenant's
// closed connections forget only that tenant's keys. And expiring: a key
// is forgotten ttl after its last recorded answer.

// idemVerdict is what a keyed call does.
type idemVerdict uint8

const (
	// idemRun: the key is new (or forgotten, or its owner closed): run the
	// call and record its answer.
	idemRun idemVerdict = iota
	// idemReplay: answer with the recorded frame.
	idemReplay
	// idemRefuse: refuse with the error returned.
	idemRefuse
)

// idemRecord is the first answer to a key.
type idemRecord struct {
	lane     string
	hash     uint64 // argsHash: kind, lane and arguments
	conn     uint64 // the connection that got the answer
	connGone bool   // that connection has closed
	shared   bool   // the answer is the tenant's (tenantWide): replayed to any connection, kept after close
	frame    []byte
	at       time.Time
	q        *idemQueue // the queue it is in: its connection's, or its key space's once that closed
	seq      uint64     // its slot in q
}

// idemSlot is one place in an eviction order; a slot whose seq is not its
// key's record's is stale (the record expired, moved to another queue or
// was evicted).
type idemSlot struct {
	key string
	seq uint64
}

// idemQueue is the eviction order of one owner's records: an open
// connection's, or a key space's records of closed connections.
type idemQueue struct {
	space string     // the tenant's name ("" for none)
	slots []idemSlot // oldest first
	n     int        // the records in the queue: its slots that are not stale
	limit int        // n at most; past it the oldest goes
}

// sharedIdem is the daemon-wide table.
type sharedIdem struct {
	connLimit  int // records of one open connection
	spaceLimit int // records of one key space's closed connections
	ttl        time.Duration
	now        func() time.Time

	// mu guards the fields below.
	mu  sync.Mutex
	m   map[string]*idemRecord
	seq uint64
	// conns are the open connections' queues, by connection; spaces are
	// the key spaces' queues of records of closed connections, by tenant
	// (at most one per configured tenant, and one for none).
	conns  map[uint64]*idemQueue
	spaces map[string]*idemQueue
}

// sharedIdemTTL is how long the daemon-wide table remembers a key after
// its last recorded answer.
const sharedIdemTTL = 10 * time.Minute

// sharedIdemLimits are the bounds of the daemon-wide table with spaces key
// spaces (the tenants, and connections without one when there are such):
// a connection keeps as many records as its own table
// (Limits.MaxIdempotencyKeys), and each key space an equal share of
// MaxConns×MaxIdempotencyKeys records of closed connections (at most 2^20
// in all, at least MaxIdempotencyKeys each).
func sharedIdemLimits(cfg *Config, spaces int) (conn, space int) {
	conn = cfg.Limits.MaxIdempotencyKeys
	return conn, max(conn, min(cfg.MaxConns*conn, 1<<20)/spaces)
}

func newSharedIdem(connLimit, spaceLimit int, ttl time.Duration, now func() time.Time) *sharedIdem {
	if now == nil {
		now = time.Now
	}
	return &sharedIdem{connLimit: connLimit, spaceLimit: spaceLimit, ttl: ttl, now: now,
		m: make(map[string]*idemRecord), conns: make(map[uint64]*idemQueue), spaces: make(map[string]*idemQueue)}
}

// scoped is key in tenant's space of the table.
func scoped(tenant string, key []byte) string { return tenant + "\x00" + string(key) }

// check says what a call of tenant with key, lane and argument hash on
// connection conn does; with idemReplay it returns the recorded frame
// (shared: the caller copies it before changing it).
func (t *sharedIdem) check(tenant string, key, lane []byte, hash, conn uint64) (idemVerdict, []byte, error) {
	k := scoped(tenant, key)
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.m[k]
	if r == nil {
		return idemRun, nil, nil
	}
	if t.now().Sub(r.at) >= t.ttl {
		delete(t.m, k)
		r.q.n--
		return idemRun, nil, nil
	}
	switch {
	case r.lane != string(lane):
		return idemRefuse, nil, fmt.Errorf("%w: key %q is bound to lane %q by its first use; a call in lane %q needs a new key",
			ErrIdempotencyConflict, key, r.lane, lane)
	case r.hash != hash:
		return idemRefuse, nil, fmt.Errorf("%w: key %q was first used with other arguments", ErrIdempotencyConflict, key)
	case r.conn == conn || r.shared:
		return idemReplay, r.frame, nil
	case !r.connGone:
		return idemRefuse, nil, fmt.Errorf("%w: key %q is in use by connection %d, which is open; its answer names that connection's resources",
			ErrIdempotencyConflict, key, r.conn)
	}
	return idemRun, nil, nil
}

// record stores the first answer to tenant's key (or the answer of a rerun
// after its owner closed) as one of connection conn's records, evicting
// that connection's oldest past its limit. shared: the answer is the
// tenant's (tenantWide), replayed to any of its connections.
func (t *sharedIdem) record(tenant string, key, lane []byte, hash, conn uint64, frame []byte, shared bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := scoped(tenant, key)
	if old, ok := t.m[k]; ok {
		old.q.n-- // its slot goes stale: the record moves to conn's queue
	}
	q := t.conns[conn]
	if q == nil {
		q = &idemQueue{space: tenant, limit: t.connLimit}
		t.conns[conn] = q
	}
	r := &idemRecord{lane: string(lane), hash: hash, conn: conn, shared: shared, frame: frame, at: t.now()}
	t.m[k] = r
	t.push(q, k, r)
}

// push appends k's record r to q and evicts q's oldest records past its
// limit. With t.mu held.
func (t *sharedIdem) push(q *idemQueue, k string, r *idemRecord) {
	t.seq++
	r.q, r.seq = q, t.seq
	q.slots = append(q.slots, idemSlot{key: k, seq: r.seq})
	q.n++
	for q.n > q.limit {
		s := q.slots[0]
		q.slots = q.slots[1:]
		if t.live(s) {
			delete(t.m, s.key)
			q.n--
		}
	}
	// Records that expired or moved leave stale slots; drop them when they
	// outnumber the live ones.
	if len(q.slots) > 2*q.n+16 {
		live := q.slots[:0]
		for _, s := range q.slots {
			if t.live(s) {
				live = append(live, s)
			}
		}
		clear(q.slots[len(live):])
		q.slots = live
	}
}

// live reports whether slot s is its key's record's. With t.mu held.
func (t *sharedIdem) live(s idemSlot) bool {
	r, ok := t.m[s.key]
	return ok && r.seq == s.seq
}

// closed records that connection conn closed: its keys may run afresh on
// another connection (still bound to their lane and arguments, as records
// of its key space), and their answers, which name its released
// resources, are dropped; a shared answer, the tenant's, is kept.
func (t *sharedIdem) closed(conn uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.conns[conn]
	if q == nil {
		return
	}
	delete(t.conns, conn)
	sq := t.spaces[q.space]
	if sq == nil {
		sq = &idemQueue{space: q.space, limit: t.spaceLimit}
		t.spaces[q.space] = sq
	}
	for _, s := range q.slots {
		if !t.live(s) {
			continue
		}
		r := t.m[s.key]
		r.connGone = true
		if !r.shared {
			r.frame = nil
		}
		t.push(sq, s.key, r)
	}
}

// len is the number of keys remembered.
func (t *sharedIdem) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// idemLookup says what a keyed call does before it runs: replay the
// answer it got on this connection, or a tenant-wide one (frame), be
// refused (err: the key is bound to another lane or other arguments, on
// this connection or any other, or in use by another open connection), or
// run (neither).
func (c *conn) idemLookup(m *wire.Request, hash uint64) (frame []byte, err error) {
	key := m.Ctx.IdempotencyKey
	if e, ok := c.idem.get(key); ok {
		if e.hash != hash {
			return nil, fmt.Errorf("%w: key %q was first used on this connection with another lane or other arguments",
				ErrIdempotencyConflict, key)
		}
		return e.frame, nil
	}
	switch v, frame, err := c.s.idem.check(c.tenantName(), key, m.Ctx.Lane, hash, c.id); v {
	case idemRefuse:
		// Rate-limited: a client can present a key another connection
		// holds on every call, data-path ones included, which log
		// nothing per request; the audit record has each refusal.
		c.s.logs.idemRefused.Event(append(c.who(), slog.String("kind", m.Kind().String()),
			slog.Uint64("request_id", m.Ctx.RequestID), slog.String("lane", string(m.Ctx.Lane)), slog.String("err", err.Error()))...)
		return nil, err
	case idemReplay:
		// A tenant-wide answer (tenantWide: a handle's or lease's),
		// recorded on another connection of the tenant.
		return frame, nil
	}
	return nil, nil
}

// idemRecord remembers the answer out to a keyed call, in this
// connection's table and the daemon's (one copy, shared: neither changes
// it). A key the connection's tables forget to make room (its oldest) is
// counted and warned of: a retry of it runs again.
func (c *conn) idemRecord(m *wire.Request, hash uint64, out []byte) {
	f := slices.Clone(out)
	limit := c.s.cfg.Limits.MaxIdempotencyKeys
	if n := c.idem.put(m.Ctx.IdempotencyKey, idemEntry{hash: hash, frame: f}, limit); n > 0 {
		c.idemForgotten += uint64(n)
		c.s.logs.idemForgotten.Event(append(c.who(), slog.Int("max_idempotency_keys", limit),
			slog.Uint64("forgotten", c.idemForgotten))...)
	}
	c.s.idem.record(c.tenantName(), m.Ctx.IdempotencyKey, m.Ctx.Lane, hash, c.id, f, tenantWide(m.Kind()))
}

// tenantName is the connection's tenant's name, "" for none.
func (c *conn) tenantName() string {
	if c.tenant == nil {
		return ""
	}
	return c.tenant.Name
}

// idemReplay is a recorded answer to the request being served: a copy
// with its request id. An answer recorded for request id 0 has no id field
// to set in place; it is decoded and encoded again under this id.
func (c *conn) idemReplay(frame []byte) []byte {
	out := slices.Clone(frame)
	if setRequestID(out, c.req.Ctx.RequestID) {
		return out
	}
	var r wire.Response
	if err := wire.DecodeResponse(out[wire.FrameHeader:], c.s.dlim, &r); err != nil {
		// The daemon encoded it: it cannot be malformed.
		c.log.Error("a recorded answer does not decode", "request_id", c.req.Ctx.RequestID, "err", err)
		return c.errorFrame(errPanic)
	}
	r.RequestID = c.req.Ctx.RequestID
	return wire.EncodeResponse(c.b, &r)
}

// idemEntry is the first answer to a mutating call with an idempotency key.
type idemEntry struct {
	hash  uint64
	frame []byte
}

// idemTable remembers answers by idempotency key, evicting the oldest.
type idemTable struct {
	m     map[string]idemEntry
	order []string
}

func (t *idemTable) get(key []byte) (idemEntry, bool) {
	e, ok := t.m[string(key)]
	return e, ok
}

// put remembers e under key and returns how many of the oldest keys it
// forgot to stay within limit.
func (t *idemTable) put(key []byte, e idemEntry, limit int) (forgot int) {
	if t.m == nil {
		t.m = make(map[string]idemEntry)
	}
	k := string(key)
	if _, ok := t.m[k]; !ok {
		t.order = append(t.order, k)
	}
	t.m[k] = e
	for len(t.order) > limit {
		delete(t.m, t.order[0])
		t.order = t.order[1:]
		forgot++
	}
	return forgot
}

// argsHash hashes what makes a mutating call: its kind, lane and
// arguments (the body's bytes as wire encodes them, equal for equal
// arguments). It builds in b.
func argsHash(b *flatbuffers.Builder, m *wire.Request) uint64 {
	h := fnv.New64a()
	h.Write(binary.LittleEndian.AppendUint64([]byte{byte(m.Kind())}, uint64(len(m.Ctx.Lane))))
	h.Write(m.Ctx.Lane)
	h.Write(wire.EncodeBody(b, m))
	return h.Sum64()
}
