package control

import (
	"fmt"
	"sync"
	"time"
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
}

func newSharedIdem(limit int, ttl time.Duration, now func() time.Time) *sharedIdem {
	if now == nil {
		now = time.Now
	}
	return &sharedIdem{limit: limit, ttl: ttl, now: now, m: make(map[string]*idemRecord)}
}

// check says what a call with key, lane and argument hash on connection
// conn does; with idemReplay it returns the recorded frame (shared: the
// caller copies it before changing it).
func (t *sharedIdem) check(key, lane []byte, hash, conn uint64) (idemVerdict, []byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.m[string(key)]
	if r == nil {
		return idemRun, nil, nil
	}
	if t.now().Sub(r.at) >= t.ttl {
		delete(t.m, string(key))
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

// record stores the first answer to key (or the answer of a rerun after
// its owner closed), evicting the oldest records past the limit.
func (t *sharedIdem) record(key, lane []byte, hash, conn uint64, frame []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := string(key)
	r := &idemRecord{lane: string(lane), hash: hash, conn: conn, frame: frame, at: t.now()}
	if old, ok := t.m[k]; ok {
		r.seq = old.seq // keeps its place: the key's age is its first use
	} else {
		t.seq++
		r.seq = t.seq
		t.order = append(t.order, idemSlot{key: k, seq: r.seq})
	}
	t.m[k] = r
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

// closed records that connection conn closed: its keys may run afresh on
// another connection (still bound to their lane and arguments).
func (t *sharedIdem) closed(conn uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.m {
		if r.conn == conn {
			r.connGone = true
		}
	}
}

// len is the number of keys remembered.
func (t *sharedIdem) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
