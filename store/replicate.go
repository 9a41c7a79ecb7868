package store

import (
	"bytes"
	"fmt"
)

// Replicas: copies of a value on other hosts, made by the store across
// hosts when its Remote is also a Replicator. A session puts with the
// Remote's number of copies unless it says otherwise (SetReplicas, a
// per-call override for the session's calls from then on).
//
// A put or commit without durable is visible here when it returns; its
// copies elsewhere follow in the background (a failure is the Remote's to
// count and log). A durable put or commit answers only once its value is
// on this host's L2 and every copy is on its holder's L2: its code is OK
// then, or the error that names the copy that failed. The value stays here
// (it is on L2) when a copy fails: the error says the put is not
// replicated, not that it is absent.

// MaxReplicas bounds the copies of a value (this host's included).
const MaxReplicas = 8

// Replicator is a Remote that keeps copies of values on other hosts.
type Replicator interface {
	// Replicas is how many copies of each value the store across hosts
	// keeps by default, this host's included (1: none elsewhere).
	Replicas() int
	// Replicate has copies of keys (copies the callee owns from then on),
	// stored here, made on other hosts until each has copies copies, this
	// host's included; with durable each copy is on its holder's L2 when
	// done(i, nil) is called. done is called exactly once per key, on any
	// goroutine (possibly before Replicate returns); it must not block.
	// Replicate must not block nor call into the store with a lock held.
	Replicate(keys [][]byte, copies int, durable bool, done func(i int, err error))
}

// SetReplicas sets how many copies (this host's included) the session's
// later puts and commits make: 0 is the store across hosts' default, 1 is
// this host's copy only.
func (ss *Session) SetReplicas(n int) error {
	if n < 0 || n > MaxReplicas {
		return fmt.Errorf("%w: %d replicas (want 0..%d)", ErrBadCall, n, MaxReplicas)
	}
	ss.replicas.Store(int32(n))
	return nil
}

// copies is how many copies a put of the session makes now (n, when not
// 0, is the call's own number), and the Replicator that makes them (nil:
// none, copies 1).
func (ss *Session) copies(n int) (Replicator, int) {
	rp, ok := ss.s.rem().(Replicator)
	if !ok {
		return nil, 1
	}
	if n == 0 {
		n = int(ss.replicas.Load())
	}
	if n == 0 {
		n = rp.Replicas()
	}
	if n <= 1 {
		return nil, 1
	}
	return rp, min(n, MaxReplicas)
}

// replicateLater has copies of keys made in the background (a put or
// commit without durable); pos are the positions of keys published.
func (ss *Session) replicateLater(rp Replicator, copies int, keys [][]byte, pos []int) {
	if rp == nil || len(pos) == 0 {
		return
	}
	own := make([][]byte, len(pos))
	for j, i := range pos {
		own[j] = bytes.Clone(keys[i])
	}
	rp.Replicate(own, copies, false, func(int, error) {})
}

// replicateDurable ends key pos of a durable put once its copies are on
// their holders' L2: the call's result waits for them.
func (s *Store) replicateDurable(rp Replicator, copies int, key []byte, cl *call, pos int32) {
	rp.Replicate([][]byte{key}, copies, true, func(_ int, err error) {
		if err != nil {
			s.rare(&s.c.replicaFail, "store: a durable put is on this host's L2 but not on every replica", "err", err)
		}
		cl.result(pos, err)
		cl.finish1(&s.calls)
	})
}

// Copyable is the size and crc32c of key's value stored here (not asked of
// other hosts), for the store across hosts to have it copied: ErrNotFound
// when it is not stored here.
func (s *Store) Copyable(key []byte) (size uint64, crc uint32, err error) {
	size, crc, _, err = s.CopyHere(key)
	return size, crc, err
}

// CopyHere is Copyable with whether the value is on L2 too, read in one
// look at the record: the store across hosts checks with it that a copy
// it was asked to make, and found already here, is the value asked for,
// and on L2 when the copy must be.
func (s *Store) CopyHere(key []byte) (size uint64, crc uint32, onL2 bool, err error) {
	if !s.validKey(key) {
		return 0, 0, false, ErrBadKey
	}
	if !s.enter() {
		return 0, 0, false, ErrClosed
	}
	defer s.exit()
	h, sh, _ := s.hash(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	idx, ok := sh.find(h, key)
	if !ok || sh.ent(idx).state != stReady {
		return 0, 0, false, ErrNotFound
	}
	e := sh.ent(idx)
	return uint64(e.size), s.knownCRC(e), e.flags&fL2 != 0, nil
}
