package client

import (
	"errors"
	"fmt"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// The store's hot calls on a Queue (the encoding is package queue's,
// "Store calls"): the keys go into the queue's shared data area, the
// per-key results come back in a Results region of a buffer this client
// registered. Each call stages one entry and submits it; it reports false
// when the queue has no room for it now (reap, then call again). Its one
// Completion comes with the userData given; Results.Check then says
// whether the answer is whole, and each key's result is read from the
// Results. In the steady state nothing here allocates.

// Results is where the per-key results of one store call on a Queue land:
// 16 bytes per key in a buffer this client registered. The caller owns it:
// from the call that stages into it until its completion is reaped and
// checked, it must not be reused.
type Results struct {
	c   *Client
	seg xfer.SegmentID
	off uint64
	mem []byte // the region as mapped here
	n   int    // keys of the call staged into it last
	op  uint8
}

// NewResults makes a Results region for calls of up to maxKeys keys, in a
// buffer of its own (registered now, released with the client).
func (c *Client) NewResults(maxKeys int) (*Results, error) {
	if maxKeys <= 0 || maxKeys > 1<<16-1 {
		return nil, fmt.Errorf("%w: results for %d keys (want 1..65535)", ErrInvalidArgument, maxKeys)
	}
	b, err := c.RegisterBuffer(uint64(maxKeys) * queue.StoreResultSize)
	if err != nil {
		return nil, err
	}
	return c.ResultsIn(b, 0, maxKeys)
}

// ResultsIn makes a Results region for up to maxKeys keys at off (a
// multiple of 8) in b, a buffer this client registered.
func (c *Client) ResultsIn(b *Buffer, off uint64, maxKeys int) (*Results, error) {
	size := uint64(maxKeys) * queue.StoreResultSize
	if b == nil || maxKeys <= 0 || maxKeys > 1<<16-1 || off%8 != 0 || off > uint64(len(b.Mem)) || size > uint64(len(b.Mem))-off {
		return nil, fmt.Errorf("%w: results for %d keys at %d", ErrInvalidArgument, maxKeys, off)
	}
	return &Results{c: c, seg: b.ID, off: off, mem: b.Mem[off : off+size : off+size]}, nil
}

// Cap is how many keys a call may have with this region.
func (r *Results) Cap() int { return len(r.mem) / queue.StoreResultSize }

// Len is the number of keys of the call staged into it last.
func (r *Results) Len() int { return r.n }

// Code is key i's code (after Check).
func (r *Results) Code(i int) wire.Code { return wire.Code(r.mem[i*queue.StoreResultSize]) }

// Err is key i's result (after Check): nil for OK, else the sentinel of
// its code (ErrNotFound, ErrBusy, ...). It allocates nothing.
func (r *Results) Err(i int) error {
	if c := r.Code(i); c != tcproto.CodeOK {
		return codeErr(c)
	}
	return nil
}

// Location is where key i's value lies in the pool after a Get (its
// length) or a Reserve (the size reserved): offset and length; zero when
// its code is not OK.
func (r *Results) Location(i int) (offset, length uint64) {
	_, l, off, _ := queue.StoreResult(r.mem[i*queue.StoreResultSize:])
	return off, uint64(l)
}

// Value is key i's value in the pool as mapped here, after a Get (to read
// in place) or a Reserve (to write in place); nil when its code is not OK
// or the pool is not mapped.
func (r *Results) Value(i int) []byte {
	off, l := r.Location(i)
	if r.Code(i) != tcproto.CodeOK || r.c.poolMem == nil {
		return nil
	}
	return r.c.poolMem[off : off+l : off+l]
}

// Check says whether the completion c of the call staged into r last is a
// whole answer, and returns the call's own error: nil when it ran (each
// key's result is then Code, Err, Location); the sentinel of its code when
// it failed as a whole (an UNPIN refused all or nothing answers
// ErrFailedPrecondition, and its keys' codes say why). A record the daemon
// did not write, a code that is none, a count of OK keys other than the
// completion's or a location outside the pool is ErrProtocol: the whole
// call failed.
func (r *Results) Check(c Completion) error {
	switch c.Code {
	case tcproto.CodeOK, tcproto.CodeFAILED_PRECONDITION:
	default:
		return codeErr(c.Code)
	}
	loc := r.op == queue.OpStoreGet || r.op == queue.OpStoreReserve
	pool := uint64(len(r.c.poolMem))
	ok := 0
	for i := 0; i < r.n; i++ {
		code, l, off, zero := queue.StoreResult(r.mem[i*queue.StoreResultSize:])
		switch {
		case !zero || code > uint8(tcproto.CodeINTERNAL):
			return fmt.Errorf("%w: key %d of %d has no result (code %d)", ErrProtocol, i, r.n, code)
		case code == uint8(tcproto.CodeOK):
			ok++
			if loc && pool > 0 && (off >= pool || uint64(l) > pool-off) {
				return fmt.Errorf("%w: key %d at %d+%d, outside the pool", ErrProtocol, i, off, l)
			}
		}
	}
	if uint64(ok) != c.N {
		return fmt.Errorf("%w: %d keys OK, the completion says %d", ErrProtocol, ok, c.N)
	}
	if c.Code != tcproto.CodeOK {
		return codeErr(c.Code)
	}
	return nil
}

// Get pins each key for this connection and writes where its value lies
// into res (read it in place with Value, then Unpin it). A value only on
// L2 is read into the pool first; the completion comes once it is there.
func (q *Queue) Get(keys [][]byte, res *Results, userData uint64) (bool, error) {
	return q.storeCall(queue.OpStoreGet, 0, keys, 0, res, userData)
}

// Reserve reserves a pool block of size bytes for each key (write it in
// place with res.Value, then Commit).
func (q *Queue) Reserve(keys [][]byte, size uint64, res *Results, userData uint64) (bool, error) {
	if size == 0 {
		return false, fmt.Errorf("%w: reserve of 0 bytes", ErrInvalidArgument)
	}
	return q.storeCall(queue.OpStoreReserve, 0, keys, size, res, userData)
}

// Commit makes reserved keys visible; with durable the completion comes
// once each value is on L2.
func (q *Queue) Commit(keys [][]byte, durable bool, res *Results, userData uint64) (bool, error) {
	var f uint8
	if durable {
		f = queue.SQEFlagDurable
	}
	return q.storeCall(queue.OpStoreCommit, f, keys, 0, res, userData)
}

// Exists says of each key whether it is stored (OK) or not (ErrNotFound).
// It renews nothing.
func (q *Queue) Exists(keys [][]byte, res *Results, userData uint64) (bool, error) {
	return q.storeCall(queue.OpStoreExists, 0, keys, 0, res, userData)
}

// Unpin drops one pin of this connection from every key, or from none:
// the release of a Get or of a pinned LookupPrefix.
func (q *Queue) Unpin(keys [][]byte, res *Results, userData uint64) (bool, error) {
	return q.storeCall(queue.OpStoreUnpin, 0, keys, 0, res, userData)
}

// LookupPrefix counts how many leading keys are stored: the completion's N.
// With pin it also pins them for this connection in the same call, so the
// Get that follows cannot miss (Unpin them after).
func (q *Queue) LookupPrefix(keys [][]byte, pin bool, userData uint64) (bool, error) {
	var f uint8
	if pin {
		f = queue.SQEFlagPin
	}
	return q.storeCall(queue.OpStoreLookupPrefix, f, keys, 0, nil, userData)
}

// storeCall stages one store entry with its key list written straight
// into the data area and submits it.
func (q *Queue) storeCall(op, flags uint8, keys [][]byte, length uint64, res *Results, userData uint64) (bool, error) {
	n := len(keys)
	if n == 0 || n > 1<<16-1 {
		return false, fmt.Errorf("%w: %d keys (want 1..65535)", ErrInvalidArgument, n)
	}
	size := wire.KeysLen(keys)
	if size < 0 || size > int(q.ring.Geometry().DataSize) {
		return false, fmt.Errorf("%w: a key list of %d bytes for a %d-byte data area (or a key over %d bytes)",
			ErrInvalidArgument, size, q.ring.Geometry().DataSize, wire.MaxPackedKey)
	}
	if res != nil && (res.c != q.c || n > res.Cap()) {
		return false, fmt.Errorf("%w: results for %d keys of another client or too small (%d)", ErrInvalidArgument, n, res.Cap())
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	q.sqe = queue.SQE{Op: op, Flags: flags, Count: uint16(n), UserData: userData, Length: length}
	if res != nil {
		q.sqe.Local, q.sqe.LocalOff = uint64(res.seg), res.off
	}
	if q.closed {
		return false, fmt.Errorf("%w: queue %d closed", ErrClosed, q.id)
	}
	if err := q.ringErr(); err != nil {
		return false, err
	}
	if res != nil {
		// Every record starts unwritten: one the daemon leaves so is a
		// short answer (Check).
		for i := 0; i < n; i++ {
			res.mem[i*queue.StoreResultSize] = queue.StoreUnwritten
		}
		res.n, res.op = n, op
	}
	data, ok, err := q.ring.StageData(&q.sqe, size)
	if errors.Is(err, queue.ErrDataFull) {
		return false, nil // the data area frees as the daemon takes what is staged
	}
	if err != nil || !ok {
		return false, err
	}
	wire.PutKeys(data, keys)
	q.ring.Submit()
	return true, nil
}
