package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tensorcast/tensorcast/store/cluster/grant"
)

// Claims (seed 003's replica counters, kept in the home's memory). A
// reader that misses a key asks its home with a claim lookup: the home
// answers the key's holders with a claim on one of them (the least loaded
// with room, ties broken by rendezvous over the key; grant.Claims), put
// first, so that a hot key's readers spread over its replicas and no
// holder is sent more concurrent readers of a key (Config.ClaimsPerKey)
// or in all (Config.ClaimsPerHolder) than it admits. A key every replica
// of which is at its limit is answered busy: the reader asks again, with
// a growing pause, until its read's deadline. The reader releases its
// claim (unclaim, batched per home) once the read at the claimed holder
// has ended, whatever its result; a claim it never releases ends at the
// read's deadline, so a reader that dies holds nothing for long. A claim
// is the reader's: the home takes the release only from the daemon and
// run that the claim was handed to, and refuses a release naming any
// other's claim whole (grant.ErrNotClaimHolder), releasing nothing.
//
// A read whose holders came from the reader's cache of home answers asks
// no home (it saves the round trip), nor does a read that moves on to the
// next replica after the claimed one failed. Those readers are bounded at
// the source instead (seed 003 allows either: the source daemon's own
// short-lived ticket): a holder's hold admits at most Config.ClaimsPerKey
// readers of a key at once, whoever sent them, and answers the rest Busy
// (holder.go); such a reader tries the next replica, then asks the home
// for a claim after a pause. So no holder has more readers of a key than
// it admits, whether the home or a cache sent them; the holder's other
// bounds (Config.MaxHolds, the mode's serve budget) hold too.

// codeBusy, in a claim answer: every holder of the key is at its reader
// limit (the holders follow, for information only).
const codeBusy = 2

// claimAnswerBytes is the most one key's claim answer takes.
const claimAnswerBytes = 1 + 8 + 1 + maxHoldersCap*(1+maxIDLen+21)

// claimHere answers a claim lookup of reader from (in its run epoch) for
// keys from this daemon's index, each claim ending by deadline.
func (c *Cluster) claimHere(from string, epoch uint64, keys [][]byte, deadline time.Time) []lookupAnswer {
	v := c.view.Load()
	as := make([]lookupAnswer, len(keys))
	var ids []string
	// Every key's holders go in one block (grown as a slice is), each
	// key's part of it capped at its length.
	block := make([]Holder, 0, len(keys))
	for i, k := range keys {
		s := c.shardOf(k)
		if c.homeFor(v, s) != c.self {
			as[i].code = codeNotHome
			c.route.notHome.Add(1)
			continue
		}
		at := len(block)
		block = c.idx.get(s, k, block)
		hs := slices.DeleteFunc(block[at:], func(h Holder) bool { return h.ID == from })
		block = block[:at+len(hs)]
		hs = hs[:len(hs):len(hs)]
		as[i].holders = hs
		if len(hs) == 0 {
			continue
		}
		ids = ids[:0]
		for _, h := range hs {
			ids = append(ids, h.ID)
		}
		cl, err := c.claims.Acquire(grant.Reader{ID: from, Epoch: epoch}, k, ids, deadline)
		switch {
		case errors.Is(err, grant.ErrBusy):
			as[i].code = codeBusy
			continue
		case err != nil:
			// Closing, or a deadline out of the claims' range: the
			// holders without a claim (their own bounds still hold).
			c.log.Debug("no claim for a read", "key", string(k), "err", err)
			continue
		}
		j := slices.IndexFunc(hs, func(h Holder) bool { return h.ID == cl.Holder })
		hs[0], hs[j] = hs[j], hs[0]
		as[i].claim = cl.ID
	}
	c.c.lookupsLocal.Add(uint64(len(keys)))
	return as
}

func (c *Cluster) onClaim(from string, epoch uint64, req []byte) ([]byte, error) {
	ttlMS, keys, err := decodeHold(req)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(ttlMS) * time.Millisecond
	if ttl <= 0 || ttl > maxHoldTTL || len(keys) == 0 {
		return nil, fmt.Errorf("%w: claim of %d keys for %v (ttl 1ms..%v)", ErrMessage, len(keys), ttl, maxHoldTTL)
	}
	c.asked(from, epoch, keys)
	return encodeClaimAnswer(c.claimHere(from, epoch, keys, time.Now().Add(ttl))), nil
}

// releaseClaims gives back the claims of ws (their read at the claimed
// holder is over), one message per home, in the background.
func (c *Cluster) releaseClaims(ws []*want) {
	var by map[string][]uint64
	for _, w := range ws {
		if w.claim == 0 {
			continue
		}
		if by == nil {
			by = map[string][]uint64{}
		}
		by[w.home] = append(by[w.home], w.claim)
		w.claim = 0
	}
	for home, ids := range by {
		if home == c.self {
			if err := c.claims.Release(c.reader(), ids...); err != nil && !errors.Is(err, grant.ErrClaimNotFound) {
				c.log.Warn("releasing this daemon's own claims failed", "err", err)
			} // not found: expired meanwhile
			continue
		}
		if !c.track() {
			continue // the claims end at their deadline
		}
		go func() {
			defer c.fetchWG.Done()
			for len(ids) > 0 {
				n := min(len(ids), maxMsgKeys)
				if _, err := c.exchange(home, c.epochOf(home), kindUnclaim, encodeClaims(ids[:n])); err != nil {
					c.log.Debug("releasing claims at a home failed (they end at their deadline)", "home", home, "err", err)
				}
				ids = ids[n:]
			}
		}()
	}
}

func (c *Cluster) onUnclaim(from string, epoch uint64, req []byte) ([]byte, error) {
	ids, err := decodeClaims(req)
	if err != nil {
		return nil, err
	}
	switch err := c.claims.Release(grant.Reader{ID: from, Epoch: epoch}, ids...); {
	case errors.Is(err, grant.ErrNotClaimHolder):
		c.log.Warn("a daemon released claims it does not hold: refused, none released", "from", from, "epoch", epoch,
			"claims", len(ids), "err", err)
		return nil, err
	case err != nil && !errors.Is(err, grant.ErrClaimNotFound):
		return nil, err
	}
	// Not found: expired meanwhile.
	return []byte{msgVersion}, nil
}

// reader is this daemon as the reader of its claims.
func (c *Cluster) reader() grant.Reader { return grant.Reader{ID: c.self, Epoch: c.peers.Epoch()} }

// ReadClaims are the read claims this daemon, as a home, handed now (tcctl cluster, metrics).
func (c *Cluster) ReadClaims() grant.ClaimStats { return c.claims.Stats() }

// Readers is how many readers of key this daemon, as its home, has sent
// to holder now.
func (c *Cluster) Readers(holder string, key []byte) int { return c.claims.Readers(holder, key) }

// encodeClaimAnswer encodes a claim lookup's answers: u32 n, n × (u8
// code, u64 claim, u8 m, m × holder).
func encodeClaimAnswer(as []lookupAnswer) []byte { return encodeAnswers(as, true) }

func decodeClaimAnswer(b []byte, want int) ([]lookupAnswer, error) {
	return decodeAnswers(b, want, true)
}

// encodeClaims encodes claim ids (unclaim): u32 n, n × u64.
func encodeClaims(ids []uint64) []byte {
	e := newEnc()
	e.u32(uint32(len(ids)))
	for _, id := range ids {
		e.u64(id)
	}
	return e.bytes()
}

func decodeClaims(b []byte) ([]uint64, error) {
	d := newDec(b)
	n := d.count(maxMsgKeys)
	ids := make([]uint64, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.u64())
	}
	return ids, d.end()
}
