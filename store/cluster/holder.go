package cluster

import (
	"fmt"
	"strings"
	"time"

	"github.com/tensorcast/tensorcast/internal/keyblock"
	"github.com/tensorcast/tensorcast/store"
)

// The holder's side of a remote read: a claim (hold) pins the keys a
// reader reads in a store session of their own, until the reader releases
// it or its deadline passes.
//
// The hold is also the holder's own claim ticket (seed 003: the source
// daemon issues a short-TTL ticket): a holder admits at most
// Config.ClaimsPerKey readers of one key at once, whoever sent them. The
// home's claims spread readers it answers over the replicas; a reader
// whose holders came from its cache of home answers (or that moved on to
// the next replica) asked no home, and this bound is what keeps it from
// piling onto a holder. A key past the bound is answered Busy in the
// hold (not pinned for that reader); the reader tries the next replica,
// then asks the home again after a pause, as for a busy home answer.

// maxHoldTTL bounds how long a reader may ask a claim to last.
const maxHoldTTL = time.Minute

func (c *Cluster) onHold(from string, epoch uint64, req []byte) ([]byte, error) {
	ttlMS, keys, err := decodeHold(req)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(ttlMS) * time.Millisecond
	if ttl <= 0 || ttl > maxHoldTTL || len(keys) == 0 {
		return nil, fmt.Errorf("%w: hold of %d keys for %v (ttl 1ms..%v)", ErrMessage, len(keys), ttl, maxHoldTTL)
	}
	// The hold's place under the bound is taken now, not only looked at:
	// holds handled at once do not all find room for one.
	c.holdMu.Lock()
	full := len(c.holds)+c.holdsTaking >= c.cfg.MaxHolds
	if !full {
		c.holdsTaking++
	}
	c.holdMu.Unlock()
	if full {
		c.c.holdsRefused.Add(1)
		return nil, ErrBusy
	}
	inserted := false
	defer func() {
		if !inserted {
			c.holdMu.Lock()
			c.holdsTaking--
			c.holdMu.Unlock()
		}
	}()
	// Its pins are other hosts' reads: a Remove here of a key only such
	// sessions pin hides the key instead of refusing.
	ss := c.st.NewSessionForOthers()
	locs := make([]store.Location, len(keys))
	codes := make([]store.Code, len(keys))
	if err := c.inCalls(len(keys), func(lo, hi int) error {
		return ss.GetHere(keys[lo:hi], locs[lo:hi], codes[lo:hi], nil)
	}); err != nil {
		_ = ss.Close()
		return nil, err
	}
	hs := make([]held, len(keys))
	names := keyblock.Strings(keys)
	var counted []string // the keys this hold counts as a reader of (of names: the hold's life bounds theirs)
	var busy [][]byte    // pinned by GetHere, answered Busy or NotFound: unpinned at once
	var bytes uint64
	c.holdMu.Lock()
	for i, code := range codes {
		switch {
		case code != store.OK:
		case c.isGoneLocked(names[i]):
			code = store.NotFound // removed, here until its I/O ends
			busy = append(busy, keys[i])
		case c.holdKeys[names[i]] >= c.cfg.ClaimsPerKey:
			code = store.Busy // at its reader limit
			busy = append(busy, keys[i])
			c.c.readersRefused.Add(1)
		}
		hs[i] = held{code: uint8(code), offset: locs[i].Offset, size: locs[i].Length}
		if code == store.OK {
			c.countLocked(names[i])
			counted = append(counted, names[i])
			bytes += locs[i].Length
		}
	}
	c.holdMu.Unlock()
	if len(busy) > 0 {
		if err := c.inCalls(len(busy), func(lo, hi int) error {
			return ss.Unpin(busy[lo:hi], make([]store.Code, hi-lo))
		}); err != nil {
			c.log.Warn("unpinning keys a hold refused failed: they stay pinned until the hold ends", "keys", len(busy), "err", err)
		}
	}
	if len(counted) == 0 {
		_ = ss.Close()
		return encodeHeld(0, hs), nil
	}
	if a := c.cfg.Admission; a != nil {
		// The mode's budget for serving other hosts' reads: past it the
		// reader is refused (and tries another replica).
		if err := a.Serve(bytes); err != nil {
			c.uncount(counted)
			_ = ss.Close()
			c.c.overBudget.Add(1)
			return nil, err
		}
	}
	c.holdMu.Lock()
	if c.closedLocked() {
		c.uncountLocked(counted)
		c.holdMu.Unlock()
		_ = ss.Close()
		return nil, ErrClosed
	}
	c.nextClaim++
	id := c.nextClaim
	h := &hold{ss: ss, from: from, epoch: epoch, keys: counted}
	c.holds[id] = h
	c.holdsTaking--
	inserted = true
	h.timer = time.AfterFunc(ttl, func() { c.endHold(id, from, epoch, true) })
	c.holdMu.Unlock()
	c.c.holds.Add(1)
	return encodeHeld(id, hs), nil
}

// closedLocked reports whether Close has taken the holds (holdMu held).
func (c *Cluster) closedLocked() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// endHold releases claim id when it is still held and was taken by from
// in its run epoch: a release from any other daemon or run is ignored.
func (c *Cluster) endHold(id uint64, from string, epoch uint64, expired bool) bool {
	c.holdMu.Lock()
	h, ok := c.holds[id]
	mine := ok && h.from == from && h.epoch == epoch
	if mine {
		delete(c.holds, id)
		c.uncountLocked(h.keys)
	}
	c.holdMu.Unlock()
	if !mine {
		if ok {
			c.log.Warn("a daemon released a read hold it does not hold: ignored", "from", from, "epoch", epoch, "hold", id)
		}
		return false
	}
	h.timer.Stop()
	if expired {
		c.log.Info("a reader's claim expired before it was released", "reader", from, "claim", id)
	}
	_ = h.ss.Close()
	return true
}

func (c *Cluster) onRelease(from string, epoch uint64, req []byte) ([]byte, error) {
	id, err := decodeClaim(req)
	if err != nil {
		return nil, err
	}
	c.endHold(id, from, epoch, false)
	return []byte{msgVersion}, nil
}

// uncount takes keys' readers off the holder's per-key counts.
func (c *Cluster) uncount(keys []string) {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	c.uncountLocked(keys)
}

// countLocked adds a reader to key's count (holdMu held). A key counted
// first is named by a copy of its own, not by k, which may share its
// memory with other keys (keyblock.Strings) and would keep them all while this
// key has readers.
func (c *Cluster) countLocked(k string) {
	if n, ok := c.holdKeys[k]; ok {
		c.holdKeys[k] = n + 1
		return
	}
	c.holdKeys[strings.Clone(k)] = 1
}

// uncountLocked is uncount with holdMu held.
func (c *Cluster) uncountLocked(keys []string) {
	for _, k := range keys {
		if c.holdKeys[k]--; c.holdKeys[k] <= 0 {
			delete(c.holdKeys, k)
		}
	}
}

// HoldReaders is how many readers of key hold it here now.
func (c *Cluster) HoldReaders(key []byte) int {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	return c.holdKeys[string(key)]
}

// Holds is how many claims readers hold here.
func (c *Cluster) Holds() int {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	return len(c.holds)
}
