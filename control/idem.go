package control

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
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
// (its effects were released with it).
//
// Keys are per tenant: the table's key is the tenant's name and the
// client's key, so that a client of one tenant can neither probe another
// tenant's keys nor block them by using them first. Connections without a
// tenant (root, the daemon's uid) share a space of their own.
//
// Bounded (the oldest key goes first past the limit) and expiring (a key
// is forgotten ttl after its last recorded answer).

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
	frame    []byte
	at       time.Time
	seq      uint64 // its slot in order
}

// idemSlot is one place in the eviction order; a slot whose seq is not
// its key's record's is stale (the key expired and came back).
type idemSlot struct {
	key string
	seq uint64
}

// sharedIdem is the daemon-wide table.
type sharedIdem struct {
	limit int
	ttl   time.Duration
	now   func() time.Time

	// mu guards the fields below.
	mu    sync.Mutex
	m     map[string]*idemRecord
	order []idemSlot // oldest first
	seq   uint64
	// byConn lists the keys each open connection recorded, so that its
	// close touches only those (slots whose record moved on are skipped,
	// and dropped when they outnumber the live ones).
	byConn map[uint64]*connKeys
}

// connKeys is the keys one connection recorded; compacted when it grows
// to next, so it holds at most about twice the live ones.
type connKeys struct {
	slots []idemSlot
	next  int
}

// sharedIdemTTL is how long the daemon-wide table remembers a key after
// its last recorded answer.
const sharedIdemTTL = 10 * time.Minute

// sharedIdemLimit is how many keys the daemon-wide table remembers: as
// many as every connection's own table together, at most 2^20.
func sharedIdemLimit(cfg *Config) int {
	return min(cfg.MaxConns*cfg.Limits.MaxIdempotencyKeys, 1<<20)
}

func newSharedIdem(limit int, ttl time.Duration, now func() time.Time) *sharedIdem {
	if now == nil {
		now = time.Now
	}
	return &sharedIdem{limit: limit, ttl: ttl, now: now, m: make(map[string]*idemRecord), byConn: make(map[uint64]*connKeys)}
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
		return idemRun, nil, nil
	}
	switch {
	case r.lane != string(lane):
		return idemRefuse, nil, fmt.Errorf("%w: key %q is bound to lane %q by its first use; a call in lane %q needs a new key",
			ErrIdempotencyConflict, key, r.lane, lane)
	case r.hash != hash:
		return idemRefuse, nil, fmt.Errorf("%w: key %q was first used with other arguments", ErrIdempotencyConflict, key)
	case r.conn == conn:
		return idemReplay, r.frame, nil
	case !r.connGone:
		return idemRefuse, nil, fmt.Errorf("%w: key %q is in use by connection %d, which is open; its answer names that connection's resources",
			ErrIdempotencyConflict, key, r.conn)
	}
	return idemRun, nil, nil
}

// record stores the first answer to tenant's key (or the answer of a rerun
// after its owner closed), evicting the oldest records past the limit.
func (t *sharedIdem) record(tenant string, key, lane []byte, hash, conn uint64, frame []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := scoped(tenant, key)
	r := &idemRecord{lane: string(lane), hash: hash, conn: conn, frame: frame, at: t.now()}
	old, ok := t.m[k]
	if ok {
		r.seq = old.seq // keeps its place: the key's age is its first use
	} else {
		t.seq++
		r.seq = t.seq
		t.order = append(t.order, idemSlot{key: k, seq: r.seq})
	}
	t.m[k] = r
	if !ok || old.conn != conn {
		t.addConnKey(conn, idemSlot{key: k, seq: r.seq})
	}
	for len(t.m) > t.limit && len(t.order) > 0 {
		s := t.order[0]
		t.order = t.order[1:]
		if cur, ok := t.m[s.key]; ok && cur.seq == s.seq {
			delete(t.m, s.key)
		}
	}
	// Keys forgotten by expiry leave stale slots; drop them when they
	// outnumber the live ones.
	if len(t.order) > 2*len(t.m)+16 {
		live := t.order[:0]
		for _, s := range t.order {
			if cur, ok := t.m[s.key]; ok && cur.seq == s.seq {
				live = append(live, s)
			}
		}
		t.order = live
	}
}

// addConnKey lists key under conn, compacting the list when most of its
// slots no longer name a record of conn. With t.mu held.
func (t *sharedIdem) addConnKey(conn uint64, s idemSlot) {
	ck := t.byConn[conn]
	if ck == nil {
		ck = &connKeys{next: 64}
		t.byConn[conn] = ck
	}
	ck.slots = append(ck.slots, s)
	if len(ck.slots) < ck.next {
		return
	}
	live := ck.slots[:0]
	for _, s := range ck.slots {
		if r, ok := t.m[s.key]; ok && r.seq == s.seq && r.conn == conn {
			live = append(live, s)
		}
	}
	clear(ck.slots[len(live):])
	ck.slots, ck.next = live, 2*len(live)+64
}

// closed records that connection conn closed: its keys may run afresh on
// another connection (still bound to their lane and arguments), and their
// answers, which name its released resources, are dropped.
func (t *sharedIdem) closed(conn uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ck := t.byConn[conn]
	if ck == nil {
		return
	}
	for _, s := range ck.slots {
		if r, ok := t.m[s.key]; ok && r.seq == s.seq && r.conn == conn {
			r.connGone, r.frame = true, nil
		}
	}
	delete(t.byConn, conn)
}

// len is the number of keys remembered.
func (t *sharedIdem) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// idemLookup says what a keyed call does before it runs: replay the
// answer it got on this connection (frame), be refused (err: the key is
// bound to another lane or other arguments, on this connection or any
// other, or in use by another open connection), or run (neither).
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
		c.log.Info("idempotency key refused", "kind", m.Kind().String(), "request_id", m.Ctx.RequestID,
			"lane", string(m.Ctx.Lane), "err", err)
		return nil, err
	case idemReplay:
		// Evicted from this connection's table, still in the daemon's.
		return frame, nil
	}
	return nil, nil
}

// idemRecord remembers the answer out to a keyed call, in this
// connection's table and the daemon's (one copy, shared: neither changes
// it).
func (c *conn) idemRecord(m *wire.Request, hash uint64, out []byte) {
	f := slices.Clone(out)
	c.idem.put(m.Ctx.IdempotencyKey, idemEntry{hash: hash, frame: f}, c.s.cfg.Limits.MaxIdempotencyKeys)
	c.s.idem.record(c.tenantName(), m.Ctx.IdempotencyKey, m.Ctx.Lane, hash, c.id, f)
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

func (t *idemTable) put(key []byte, e idemEntry, limit int) {
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
	}
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
