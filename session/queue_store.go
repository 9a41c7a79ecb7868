package session

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/faultcopy"
	"github.com/tensorcast/tensorcast/internal/testhook"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/store"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// The store's queue operations (the encoding is queue/doc.go's, "Store
// calls"). The queue's worker checks an SQE, copies its key list out of
// the shared data area into its own memory (before Publish lets the client
// reuse it, and before a byte of it is parsed), and calls the store with
// the connection's session. A call that waits for the device (a durable
// commit, a Get that promotes from L2) or for other hosts (a Get, Exists
// or LookupPrefix past the keys stored here) returns pending; the store's
// Completion then writes the results and posts the CQE, on whichever
// goroutine ended the last key, so the worker never waits for the device
// or the network, and its other queues are served meanwhile.
// Until then the call's record holds its codes, locations and a reference
// on the client buffer its results go to.

// qstore is one queue's side of the store, made at its first store op.
type qstore struct {
	q       *cqueue
	s       *store.Store
	ss      *store.Session
	maxKeys int

	// Owned by the worker: the copied key list and its keys.
	keyBuf []byte
	keys   [][]byte
	// held lists the calls of the entries being prepared: the worker
	// keeps its share of each (storeCall.left) until it has published
	// sq_head (published).
	held []*storeCall

	// calls has one slot per completion-ring entry (what is in flight is
	// bounded by the ring); a slot's record is made on first use and
	// reused. The slice never changes after newQStore; a slot is written
	// by the worker before its call starts and read by whoever ends it.
	calls []*storeCall
	// mu guards free: the slots not in use. Calls end on the store's
	// completion goroutines.
	mu   sync.Mutex
	free []uint32

	// inflight counts calls started and not yet ended; idle gets a token
	// each time it drops to zero (the queue's close waits for it before
	// unmapping the ring their CQEs go to).
	inflight atomic.Int32
	idle     chan struct{}
}

var _ store.Completion = (*qstore)(nil)

// storeCall is one store op in flight.
type storeCall struct {
	qs   *qstore
	slot uint32
	ud   uint64
	op   uint8
	n    int

	codes []store.Code
	locs  []store.Location
	sizes []uint64
	res   []byte       // the results region, in the client's buffer
	buf   xfer.Segment // that buffer, held until the results are written
	err   error        // the call's own error
	// prefix is a LookupPrefix's answer: its CQE's result and code (it
	// has no results region).
	prefix store.PrefixResult
	// left is 2 while a call has neither been published by the worker
	// (sq_head past its entry) nor completed: whichever of the two comes
	// last ends it. A call that did not go pending has completed already.
	left atomic.Int32
}

// newQStore makes q's store side, or says why there is none.
func newQStore(q *cqueue) (*qstore, Code) {
	s, ss, err := q.c.storeSession()
	if err != nil {
		return nil, status.CodeOf(err)
	}
	g := q.ring.Geometry()
	qs := &qstore{q: q, s: s, ss: ss, maxKeys: min(s.MaxKeysPerCall(), 1<<16-1),
		calls: make([]*storeCall, g.CQEntries), free: make([]uint32, g.CQEntries), idle: make(chan struct{}, 1)}
	for i := range qs.free {
		qs.free[i] = uint32(len(qs.free) - 1 - i)
	}
	// A key list longer than the data area cannot be; one longer than
	// maxKeys keys of the store's longest is refused.
	qs.keyBuf = make([]byte, min(int(g.DataSize), qs.maxKeys*(wire.KeyHeader+wire.MaxStoreKey)))
	return qs, tcproto.CodeOK
}

// storeOp runs one store SQE (e.Op >= queue.OpStoreFirst); every path
// posts exactly one CQE for it.
//
// A refused SQE is answered, as every answer of the worker's, once sq_head
// is published past its entry (q.answers): a client that reaped it first
// would find the entry's slot and key bytes still taken.
func (q *cqueue) storeOp(e *queue.SQE) {
	if q.store == nil {
		qs, code := newQStore(q)
		if code != tcproto.CodeOK {
			q.refuseLater(e.UserData, code)
			return
		}
		q.store = qs
	}
	if code := q.store.start(e); code != tcproto.CodeOK {
		q.refuseLater(e.UserData, code)
	}
}

// flagsOf is the flags each store op may carry.
func flagsOf(op uint8) uint8 {
	switch op {
	case queue.OpStoreCommit:
		return queue.SQEFlagDurable
	case queue.OpStoreLookupPrefix:
		return queue.SQEFlagPin
	}
	return 0
}

// start checks e, copies its keys and starts the call; a code other than
// OK refuses the SQE (nothing was written, the caller posts the CQE).
func (qs *qstore) start(e *queue.SQE) Code {
	op, n := e.Op, int(e.Count)
	switch {
	case op > queue.OpStoreLast, e.Flags&^flagsOf(op) != 0, n == 0, n > qs.maxKeys,
		e.Target != 0, e.TargetOff != 0, e.Length != 0 && op != queue.OpStoreReserve:
		return tcproto.CodeINVALID_ARGUMENT
	}
	var res []byte
	var buf xfer.Segment
	if op == queue.OpStoreLookupPrefix {
		if e.Local != 0 || e.LocalOff != 0 {
			return tcproto.CodeINVALID_ARGUMENT
		}
	} else {
		var code Code
		if res, buf, code = qs.q.c.resultsRegion(xfer.SegmentID(e.Local), e.LocalOff, n); code != tcproto.CodeOK {
			return code
		}
	}
	keys, ok := qs.copyKeys(e, n)
	if !ok {
		if buf != nil {
			buf.Release()
		}
		return tcproto.CodeINVALID_ARGUMENT
	}
	c := qs.get()
	if c == nil {
		// Cannot be: each call holds a completion slot and there are as
		// many records. Refused rather than trusted.
		if buf != nil {
			buf.Release()
		}
		return tcproto.CodeBUSY
	}
	c.ud, c.op, c.n, c.res, c.buf, c.err = e.UserData, op, n, res, buf, nil
	c.codes = slices.Grow(c.codes[:0], n)[:n]
	c.locs = slices.Grow(c.locs[:0], n)[:n]
	qs.inflight.Add(1)
	c.left.Store(2)
	var pending bool
	var err error
	tag := uint64(c.slot)
	switch op {
	case queue.OpStoreLookupPrefix:
		// The run stored here is answered at once; what other hosts
		// hold is asked of their homes (and with pin fetched) in the
		// background, never on the worker, which serves other queues.
		var n int
		n, pending, err = qs.ss.LookupPrefixAsync(keys, e.Flags&queue.SQEFlagPin != 0, &c.prefix, qs, tag)
		if !pending {
			c.prefix = store.PrefixResult{N: n, Err: err}
			err = nil
		}
	case queue.OpStoreGet:
		pending, err = qs.ss.Get(keys, c.locs, c.codes, nil, qs, tag)
	case queue.OpStoreReserve:
		c.sizes = slices.Grow(c.sizes[:0], n)[:n]
		for i := range c.sizes {
			c.sizes[i] = e.Length
		}
		err = qs.ss.Reserve(keys, c.sizes, c.locs, c.codes, nil)
	case queue.OpStoreCommit:
		pending, err = qs.ss.Commit(keys, e.Flags&queue.SQEFlagDurable != 0, c.codes, nil, qs, tag)
	case queue.OpStoreExists:
		// Keys other hosts hold are asked of their homes in the
		// background: the worker goes on.
		pending, err = qs.s.ExistsAsync(keys, c.codes, qs, tag)
	case queue.OpStoreUnpin:
		err = qs.ss.Unpin(keys, c.codes)
	}
	c.err = err
	if !pending {
		c.left.Add(-1) // no completion will come
	}
	// Answered no sooner than the worker publishes sq_head (published),
	// even when it has completed already.
	qs.held = append(qs.held, c)
	return tcproto.CodeOK
}

// published drops the worker's share of the calls it started, once
// sq_head is published past their entries; a call that has completed is
// answered now.
func (qs *qstore) published() {
	for i, c := range qs.held {
		qs.held[i] = nil
		if c.left.Add(-1) == 0 {
			cqe := qs.end(c)
			qs.q.ring.Post(&cqe)
			qs.answered(1)
		}
	}
	qs.held = qs.held[:0]
}

// copyKeys copies e's key list out of the data area into the worker's own
// buffer and splits it: exactly n keys, filling the range exactly.
func (qs *qstore) copyKeys(e *queue.SQE, n int) ([][]byte, bool) {
	l := e.NotifyLen
	if int(l) < n*wire.KeyHeader || int(l) > len(qs.keyBuf) || !qs.q.ring.Data(qs.keyBuf, e.NotifyOff, l) {
		return nil, false
	}
	keys, err := wire.SplitKeys(qs.keyBuf[:l], qs.keys, n)
	qs.keys = keys
	if err != nil || len(keys) != n {
		return nil, false
	}
	return keys, true
}

// resultsRegion resolves a store op's results region: n records at off in
// a client buffer of this connection, 8-aligned and inside it (the checks
// of a transfer's local side); the buffer is held until released.
func (c *Session) resultsRegion(id xfer.SegmentID, off uint64, n int) ([]byte, xfer.Segment, Code) {
	size := uint64(n) * queue.StoreResultSize
	if off%8 != 0 {
		return nil, nil, tcproto.CodeINVALID_ARGUMENT
	}
	if c.pool != nil && id == c.pool.ID() {
		return nil, nil, tcproto.CodeINVALID_ARGUMENT // results go to a client buffer, never the pool
	}
	c.mu.Lock()
	b, ok := c.buffers[id]
	_, file := c.files[id]
	_, remote := c.remotes[id]
	c.mu.Unlock()
	switch {
	case file || remote:
		return nil, nil, tcproto.CodeINVALID_ARGUMENT
	case !ok:
		return nil, nil, tcproto.CodeNOT_FOUND
	case off+size < off || off+size > b.Size():
		return nil, nil, tcproto.CodeINVALID_ARGUMENT
	case !b.Acquire():
		return nil, nil, tcproto.CodeUNAVAILABLE
	}
	return b.Bytes()[off : off+size : off+size], b, tcproto.CodeOK
}

// StoreDone implements store.Completion: the last key of a pending call
// ended.
func (qs *qstore) StoreDone(tag uint64) {
	c := qs.calls[tag]
	if c.left.Add(-1) == 0 {
		cqe := qs.end(c)
		qs.q.ring.Post(&cqe)
		qs.answered(1)
	}
	if h := testhook.StoreDone.Load(); h != nil {
		(*h)()
	}
}

// end writes a call's results into the client's buffer, frees its record
// and returns its CQE. No call is answered before the worker publishes
// sq_head past its entry: a client that reaped the answer first would find
// the entry's slot and key bytes still taken, and could wait for a
// completion with nothing in flight. Whichever of published and StoreDone
// comes last posts it.
func (qs *qstore) end(c *storeCall) queue.CQE {
	if c.op == queue.OpStoreLookupPrefix {
		code, st := status.CodeOf(c.prefix.Err), xfer.StateCompleted
		if code != tcproto.CodeOK {
			st = xfer.StateFailed
		}
		cqe := queue.CQE{UserData: c.ud, Result: uint64(c.prefix.N), Code: uint32(code), State: uint8(st)}
		c.prefix = store.PrefixResult{}
		qs.put(c)
		return cqe
	}
	code := tcproto.CodeOK
	switch {
	case c.err == nil, errors.Is(c.err, store.ErrTransport):
		// The call ran; each key's code says the rest (keys a broken
		// transport touched carry INTERNAL).
	case errors.Is(c.err, store.ErrNotApplied):
		// An all-or-nothing batch refused: nothing changed, whichever key
		// refused it (and why: its record says).
		code = tcproto.CodeFAILED_PRECONDITION
	default:
		code = status.CodeOf(c.err)
	}
	ok := 0
	for _, k := range c.codes[:c.n] {
		if k == store.OK {
			ok++
		}
	}
	if !faultcopy.Call(putResults, c) {
		// The client shrank the buffer under its own results region: the
		// store did its part (pins taken stay the session's), but the
		// client cannot learn which, so the call fails.
		code = tcproto.CodeFAILED_PRECONDITION
		qs.q.c.faultedResults(c)
	}
	c.buf.Release()
	st := xfer.StateCompleted
	if code != tcproto.CodeOK {
		st = xfer.StateFailed
	}
	ud := c.ud
	c.res, c.buf, c.err = nil, nil, nil
	qs.put(c)
	return queue.CQE{UserData: ud, Result: uint64(ok), Code: uint32(code), State: uint8(st)}
}

// putResults writes each key's record into c's results region, in the
// client's buffer: memory that may fault (see faultcopy.Call).
func putResults(c *storeCall) {
	loc := c.op == queue.OpStoreGet || c.op == queue.OpStoreReserve
	for i, k := range c.codes[:c.n] {
		var length uint32
		var off uint64
		if k == store.OK && loc {
			length, off = uint32(c.locs[i].Length), c.locs[i].Offset
		}
		queue.PutStoreResult(c.res[i*queue.StoreResultSize:], uint8(k), length, off)
	}
}

// answered counts n calls whose CQEs are posted: the queue may close once
// none is left.
func (qs *qstore) answered(n int32) {
	if qs.inflight.Add(-n) == 0 {
		select {
		case qs.idle <- struct{}{}:
		default:
		}
	}
}

// get takes a free record (one always is: each call holds a completion
// slot); nil if none.
func (qs *qstore) get() *storeCall {
	qs.mu.Lock()
	if len(qs.free) == 0 {
		qs.mu.Unlock()
		return nil
	}
	i := qs.free[len(qs.free)-1]
	qs.free = qs.free[:len(qs.free)-1]
	qs.mu.Unlock()
	c := qs.calls[i]
	if c == nil {
		c = &storeCall{qs: qs, slot: i}
		qs.calls[i] = c
	}
	return c
}

func (qs *qstore) put(c *storeCall) {
	qs.mu.Lock()
	qs.free = append(qs.free, c.slot)
	qs.mu.Unlock()
}

// wait waits until no store call of the queue is in flight (every CQE is
// posted), or closing; false when closing came first.
func (qs *qstore) wait(closing <-chan struct{}) bool {
	for qs.inflight.Load() != 0 {
		select {
		case <-qs.idle:
		case <-closing:
			return false
		}
	}
	return true
}

// storeIdle is wait for a queue that may have made no store side.
func (q *cqueue) storeIdle() bool {
	return q.store == nil || q.store.wait(q.c.h.Closing)
}
