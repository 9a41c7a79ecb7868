package client

import (
	"fmt"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
)

// The KV block store's calls on the socket. Every batch call has
// positional results: results[i] is nil when keys[i] succeeded, else a
// *StatusError that matches the sentinel of its code (ErrNotFound,
// ErrAlreadyExists, ErrBusy, ErrResourceExhausted, ...); results must have
// len(keys) elements. An answer with another number of results fails the
// whole call with ErrProtocol. A returned error is about the call as a
// whole. The hot calls (Get, Reserve, Commit, Exists, LookupPrefix, Unpin)
// also travel on a Queue (store_queue.go).

// MaxKey is the longest key the store accepts; a longer one gets
// ErrInvalidArgument as its result.
const MaxKey = wire.MaxStoreKey

// Extent names client memory for a copying store call: Length bytes at
// Offset in Segment, a buffer this client registered or pool blocks it
// allocated.
type Extent = wire.Extent

// KeyInfo describes a stored key: its value's size, the tiers it is on,
// its pins over all clients, whether it is still owed a writeback to L2
// (Dirty) or its writeback gave up (Tombstone).
type KeyInfo struct {
	Key              []byte
	Size             uint64
	InL1, InL2       bool
	Pins             uint32
	Dirty, Tombstone bool
}

// checkKeys refuses what the key list cannot carry.
func checkKeys(keys [][]byte, results int) error {
	if results != len(keys) {
		return fmt.Errorf("%w: %d results for %d keys", ErrInvalidArgument, results, len(keys))
	}
	if wire.KeysLen(keys) < 0 {
		return fmt.Errorf("%w: a key longer than %d bytes", ErrInvalidArgument, wire.MaxPackedKey)
	}
	return nil
}

// StorePut stores keys[i] with a copy of the bytes values[i] names; with
// durable each result comes only once its value is on L2.
func (c *Client) StorePut(keys [][]byte, values []Extent, durable bool, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	if len(values) != len(keys) {
		return fmt.Errorf("%w: %d values for %d keys", ErrInvalidArgument, len(values), len(keys))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StorePutRequest](c.start(opts)) = wire.StorePutRequest{Keys: keys, Values: values, Durable: durable}
	r, err := call[wire.StorePutResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StoreRead copies the value of keys[i] into dests[i]; lengths[i] is the
// value's length (also when dests[i] is too short: ErrInvalidArgument).
func (c *Client) StoreRead(keys [][]byte, dests []Extent, lengths []uint64, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	if len(dests) != len(keys) || len(lengths) != len(keys) {
		return fmt.Errorf("%w: %d destinations and %d lengths for %d keys", ErrInvalidArgument, len(dests), len(lengths), len(keys))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StoreReadRequest](c.start(opts)) = wire.StoreReadRequest{Keys: keys, Dests: dests}
	r, err := call[wire.StoreReadResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	if err := c.positional(len(r.Lengths), len(keys)); err != nil {
		return err
	}
	copy(lengths, r.Lengths)
	return c.itemResults(r.Codes, results)
}

// StoreRemove removes keys; an absent key is a success, one a client of
// this daemon pins ErrFailedPrecondition (another host's read in flight is
// no such pin: the key goes, and that read keeps its bytes), one another
// caller is reading or removing at that moment ErrBusy (asked again, it
// goes). With the store across hosts every other copy goes too; a key
// whose other copies may remain (its home did not answer, or a holder did
// not drop its copy in time) gets ErrUnavailable, ErrDeadlineExceeded or
// ErrBusy (its home busy), never nil, and the same remove sent again
// answers nil once they are gone.
func (c *Client) StoreRemove(keys [][]byte, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StoreRemoveRequest](c.start(opts)).Keys = keys
	r, err := call[wire.StoreRemoveResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StorePin pins every key for this connection, or none: when any key
// cannot be pinned, every result is non-nil (the keys that refused say
// why, the others ErrFailedPrecondition) and nothing changed. With ttl > 0
// each pin is a lease that ends by itself (at most 49 days; the daemon
// bounds it further). Pins go with the connection.
func (c *Client) StorePin(keys [][]byte, ttl time.Duration, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	if ttl < 0 || ttl/time.Millisecond > 1<<32-1 {
		return fmt.Errorf("%w: ttl %v", ErrInvalidArgument, ttl)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StorePinRequest](c.start(opts)) = wire.StorePinRequest{Keys: keys, TTLMS: millis(ttl)}
	r, err := call[wire.StorePinResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StoreUnpin drops one pin of this connection from every key, or from none
// (as StorePin): unpinning a key this connection holds no pin on is an
// error (ErrFailedPrecondition), never a wrap-around.
func (c *Client) StoreUnpin(keys [][]byte, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StoreUnpinRequest](c.start(opts)).Keys = keys
	r, err := call[wire.StoreUnpinResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StoreReserve reserves a pool block of sizes[i] bytes for keys[i]:
// offsets[i] is where it lies in the pool (PoolBytes), to be written in
// place and then committed (StoreCommit, Queue.Commit) or given back
// (StoreAbort). A reservation goes with the connection unless committed.
func (c *Client) StoreReserve(keys [][]byte, sizes []uint64, offsets []uint64, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	if len(sizes) != len(keys) || len(offsets) != len(keys) {
		return fmt.Errorf("%w: %d sizes and %d offsets for %d keys", ErrInvalidArgument, len(sizes), len(offsets), len(keys))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StoreReserveRequest](c.start(opts)) = wire.StoreReserveRequest{Keys: keys, Sizes: sizes}
	r, err := call[wire.StoreReserveResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	if err := c.positional(len(r.Offsets), len(keys)); err != nil {
		return err
	}
	for i, off := range r.Offsets {
		if r.Codes[i] == tcproto.CodeOK && c.poolMem != nil && (off >= uint64(len(c.poolMem)) || sizes[i] > uint64(len(c.poolMem))-off) {
			return c.fail(fmt.Errorf("%w: reservation %d+%d outside the pool", ErrProtocol, off, sizes[i]))
		}
	}
	copy(offsets, r.Offsets)
	return c.itemResults(r.Codes, results)
}

// StoreCommit makes reserved keys visible; with durable each result comes
// only once its value is on L2 (on failure the reservation stays as it
// was, to be committed again).
func (c *Client) StoreCommit(keys [][]byte, durable bool, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StoreCommitRequest](c.start(opts)) = wire.StoreCommitRequest{Keys: keys, Durable: durable}
	r, err := call[wire.StoreCommitResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StoreAbort gives back reservations of this connection without
// committing them (a write that failed, a request cancelled): each key's
// pool block is freed at once and its result is nil. A key this
// connection has not reserved (never, or committed or aborted already, or
// reserved by another connection, which this call never touches) gets
// ErrFailedPrecondition, one whose durable commit is in flight ErrBusy;
// keys are independent. Reservations left unaborted go when the
// connection closes.
func (c *Client) StoreAbort(keys [][]byte, results []error, opts ...CallOption) error {
	if err := checkKeys(keys, len(results)); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StoreAbortRequest](c.start(opts)).Keys = keys
	r, err := call[wire.StoreAbortResponse](c, noFD, nil)
	if err != nil {
		return err
	}
	return c.itemResults(r.Codes, results)
}

// StoreStat describes key (ErrNotFound when it is not stored). It changes
// nothing, like Exists.
func (c *Client) StoreStat(key []byte, opts ...CallOption) (KeyInfo, error) {
	if len(key) > wire.MaxPackedKey {
		return KeyInfo{}, fmt.Errorf("%w: a %d-byte key", ErrInvalidArgument, len(key))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StoreStatRequest](c.start(opts)).Key = key
	r, err := call[wire.StoreStatResponse](c, noFD, nil)
	if err != nil {
		return KeyInfo{}, err
	}
	i := r.Info
	return KeyInfo{Key: append([]byte(nil), key...), Size: i.Size, InL1: i.InL1, InL2: i.InL2, Pins: i.Pins, Dirty: i.Dirty,
		Tombstone: i.Tombstone}, nil
}

// StoreList returns up to max stored keys (0: as many as one answer
// holds) that start with prefix and sort after after, in order, and
// whether the listing goes on (ask again with after set to the last key).
func (c *Client) StoreList(prefix, after []byte, max int, opts ...CallOption) ([]KeyInfo, bool, error) {
	if max < 0 || max > 1<<31 || len(prefix) > wire.MaxPackedKey || len(after) > wire.MaxPackedKey {
		return nil, false, fmt.Errorf("%w: list of %d keys", ErrInvalidArgument, max)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	*wire.SetRequest[wire.StoreListRequest](c.start(opts)) = wire.StoreListRequest{Prefix: prefix, After: after, Max: uint32(max)}
	r, err := call[wire.StoreListResponse](c, noFD, nil)
	if err != nil {
		return nil, false, err
	}
	if max > 0 && len(r.Keys) > max {
		return nil, false, c.fail(fmt.Errorf("%w: %d keys listed, %d asked", ErrProtocol, len(r.Keys), max))
	}
	out := make([]KeyInfo, len(r.Keys))
	for i, k := range r.Keys {
		out[i] = KeyInfo{Key: append([]byte(nil), k.Key...), Size: k.Size, InL1: k.InL1, InL2: k.InL2, Pins: k.Pins,
			Dirty: k.Dirty, Tombstone: k.Tombstone}
	}
	return out, r.More, nil
}

// StoreFlush waits, at most timeout (0: the daemon's default), until no
// value is owed a writeback to L2 (ErrDeadlineExceeded when some still
// are).
func (c *Client) StoreFlush(timeout time.Duration, opts ...CallOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wire.SetRequest[wire.StoreFlushRequest](c.start(opts)).TimeoutMS = millis(timeout)
	c.holdFor(timeout)
	_, err := call[wire.StoreFlushResponse](c, noFD, nil)
	return err
}

// Convenience: one key at a time, through a staging buffer the client
// registers on first use (and grows). For the hot path use Reserve and Get
// in place, on a Queue.

// staging is the buffer PutBytes and GetBytes copy through.
type staging struct {
	mu  sync.Mutex // serializes the calls that use buf
	buf *Buffer
}

// stage returns the staging buffer, at least n bytes; stg.mu is held.
func (c *Client) stage(n uint64) (*Buffer, error) {
	if b := c.stg.buf; b != nil && uint64(len(b.Mem)) >= n {
		return b, nil
	}
	size := uint64(64 << 10)
	for size < n {
		size *= 2
	}
	b, err := c.RegisterBuffer(size)
	if err != nil {
		return nil, err
	}
	if old := c.stg.buf; old != nil {
		c.UnregisterBuffer(old.ID) //nolint:errcheck // the connection releases it at close either way
	}
	c.stg.buf = b
	return b, nil
}

// PutBytes stores key with a copy of value (durable: on L2 before it
// returns). Its error is the key's result.
func (c *Client) PutBytes(key, value []byte, durable bool, opts ...CallOption) error {
	c.stg.mu.Lock()
	defer c.stg.mu.Unlock()
	b, err := c.stage(uint64(len(value)))
	if err != nil {
		return err
	}
	copy(b.Mem, value)
	res := []error{nil}
	if err := c.StorePut([][]byte{key}, []Extent{{Segment: b.ID, Length: uint64(len(value))}}, durable, res, opts...); err != nil {
		return err
	}
	return res[0]
}

// GetBytes returns a copy of key's value.
func (c *Client) GetBytes(key []byte, opts ...CallOption) ([]byte, error) {
	c.stg.mu.Lock()
	defer c.stg.mu.Unlock()
	info, err := c.StoreStat(key, opts...)
	if err != nil {
		return nil, err
	}
	res, lens := []error{nil}, []uint64{0}
	for try := 0; ; try++ {
		b, err := c.stage(max(info.Size, 1))
		if err != nil {
			return nil, err
		}
		if err := c.StoreRead([][]byte{key}, []Extent{{Segment: b.ID, Length: uint64(len(b.Mem))}}, lens, res, opts...); err != nil {
			return nil, err
		}
		if res[0] == nil {
			if lens[0] > uint64(len(b.Mem)) {
				return nil, c.fail(fmt.Errorf("%w: a %d-byte value read into %d bytes", ErrProtocol, lens[0], len(b.Mem)))
			}
			return append([]byte(nil), b.Mem[:lens[0]]...), nil
		}
		if try > 0 || lens[0] <= uint64(len(b.Mem)) {
			return nil, res[0]
		}
		info.Size = lens[0] // the key was put again, larger, in between
	}
}
