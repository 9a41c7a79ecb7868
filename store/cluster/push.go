package cluster

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pushed answers. A home remembers, for each of its shards, the readers
// that asked it about a key of the shard within the last pushInterest
// (readers only: lookups and claims), at most pushReaders per shard. When
// a key of such a shard changes in its index (a holder added or gone, the
// key removed), the home owes each of those readers its answer for the
// key, and the pusher sends what is owed every pushEvery: one message per
// reader, the key's holders now, or none (the reader then forgets the key:
// misses are never cached). A reader takes a pushed answer as its home's
// answer of that moment, for its staleness budget, when the pusher is the
// home of the key's shard at the generation the push names in its own
// view (else it drops it), as of pushSendWait before it arrived (the
// home gives up on a push after that; a reader stalled meanwhile, by
// SIGSTOP say, may take a push older than that, which is why what a
// cached answer says is always checked at the holder). A pushed answer is advice as any cached one: a
// holder that no longer has the value says so and the reader asks the
// home; the bytes are checked against the answer's crc32c.
//
// What it buys: a reader that asked about a shard finds the shard's keys
// that changed since (a hot key's copies coming and going, a key put)
// already answered when it reads them, within the budget, without a home
// round trip. What it costs: one message per interested reader per
// pushEvery while the shard changes, never one per key.

const (
	// pushReaders bounds the readers a home pushes one shard's changes to,
	// and pushOwed the keys it owes one reader (more are dropped, and
	// counted: the reader asks the home as without pushes).
	pushReaders = 64
	pushOwed    = 4096
	// pushSendWait bounds one push message.
	pushSendWait = 500 * time.Millisecond
)

// pushes is a home's record of the readers interested in its shards and
// the answers it owes them.
type pushes struct {
	interest time.Duration // how long an ask keeps a reader interested
	// mu guards the maps.
	mu      sync.Mutex
	readers map[int]map[string]interestMark // shard → reader → mark
	owed    map[string]*owing               // reader → keys owed
	dropped atomic.Uint64                   // keys not owed: a bound was reached
	sent    atomic.Uint64                   // push messages sent
	keys    atomic.Uint64                   // keys pushed
	taken   atomic.Uint64                   // pushed keys a reader took into its cache
	refused atomic.Uint64                   // pushed keys a reader refused (not from the home it knows)
}

type interestMark struct {
	epoch uint64
	until time.Time
}

type owing struct {
	epoch uint64
	keys  map[string]struct{}
}

func newPushes(interest time.Duration) *pushes {
	return &pushes{interest: interest, readers: map[int]map[string]interestMark{}, owed: map[string]*owing{}}
}

// asked records that reader from (at epoch) asked about keys of shards.
func (p *pushes) asked(from string, epoch uint64, shards []int, now time.Time) {
	if p == nil {
		return
	}
	until := now.Add(p.interest)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range shards {
		m := p.readers[s]
		if m == nil {
			m = map[string]interestMark{}
			p.readers[s] = m
		}
		if _, ok := m[from]; !ok && len(m) >= pushReaders {
			// Room for a newcomer once an interest ends.
			for r, mk := range m {
				if now.After(mk.until) {
					delete(m, r)
				}
			}
			if len(m) >= pushReaders {
				p.dropped.Add(1)
				continue
			}
		}
		m[from] = interestMark{epoch: epoch, until: until}
	}
}

// changed records that key of shard s changed in the index (by holder
// by, "" for a removal): every reader interested in s but by is owed it.
func (p *pushes) changed(s int, key []byte, by string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.readers[s]
	if len(m) == 0 {
		return
	}
	now := time.Now()
	for r, mk := range m {
		if now.After(mk.until) {
			delete(m, r)
			continue
		}
		if r == by {
			continue
		}
		o := p.owed[r]
		if o == nil || o.epoch != mk.epoch {
			o = &owing{epoch: mk.epoch, keys: map[string]struct{}{}}
			p.owed[r] = o
		}
		if len(o.keys) >= pushOwed {
			p.dropped.Add(1)
			continue
		}
		o.keys[string(key)] = struct{}{}
	}
	if len(m) == 0 {
		delete(p.readers, s)
	}
}

// take returns what is owed, and owes nothing more.
func (p *pushes) take() map[string]*owing {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.owed) == 0 {
		return nil
	}
	o := p.owed
	p.owed = map[string]*owing{}
	return o
}

// pusher is the Cluster's goroutine that sends the pushes owed, every
// pushEvery (Config.Staleness / 4). Close stops it (pushStop), and waits
// for it (pushDone).
func (c *Cluster) pusher(every time.Duration) {
	defer close(c.pushDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.pushStop:
			return
		case <-t.C:
		}
		for r, o := range c.push.take() {
			c.pushTo(r, o)
		}
	}
}

// pushTo sends reader r what is owed to it: for each key, the generation
// this daemon holds its shard at and its holders but r (none: forget it),
// in messages of at most maxMsgKeys keys.
func (c *Cluster) pushTo(r string, o *owing) {
	var items []pushEntry
	for k := range o.keys {
		key := []byte(k)
		s := c.shardOf(key)
		gen := c.heldGen(s)
		if gen == 0 || c.homeFor(c.view.Load(), s) != c.self {
			continue // no longer its home: the reader's view moves too
		}
		hs := c.idx.get(s, key, nil)
		out := hs[:0]
		for _, h := range hs {
			if h.ID != r {
				out = append(out, h)
			}
		}
		items = append(items, pushEntry{key, gen, out})
	}
	for len(items) > 0 {
		msg, n := encodePush(items)
		items = items[n:]
		if _, err := c.peers.ExchangeAt(r, o.epoch, kindPush, msg, pushSendWait); err != nil {
			c.log.Debug("a push of home answers failed (the reader asks the home instead)", "reader", r, "err", err)
			return
		}
		c.push.sent.Add(1)
		c.push.keys.Add(uint64(n))
	}
}

// encodePush encodes the first n of es that fit one message (at least
// one, at most maxMsgKeys).
func encodePush(es []pushEntry) (msg []byte, n int) {
	e := newEnc()
	at := len(e.b)
	e.u32(0)
	for n < len(es) && n < maxMsgKeys {
		pe := es[n]
		need := keyBytes(pe.key) + 8 + 1
		for _, h := range pe.holders {
			need += holderBytes(h)
		}
		if n > 0 && !e.room(need) {
			break
		}
		e.key(pe.key)
		e.u64(pe.gen)
		e.u8(uint8(len(pe.holders)))
		for _, h := range pe.holders {
			e.holder(h)
		}
		n++
	}
	e.patch32(at, uint32(n))
	return e.bytes(), n
}

// pushEntry is one key of a push message.
type pushEntry struct {
	key     []byte
	gen     uint64
	holders []Holder
}

func decodePush(b []byte) ([]pushEntry, error) {
	d := newDec(b)
	n := d.count(maxMsgKeys)
	es := make([]pushEntry, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		pe := pushEntry{key: d.key(), gen: d.u64()}
		m := int(d.u8())
		if d.err == nil && m > maxHoldersCap {
			d.fail("%d holders", m)
		}
		for j := 0; j < m && d.err == nil; j++ {
			pe.holders = append(pe.holders, d.holder())
		}
		es = append(es, pe)
	}
	return es, d.end()
}

// onPush takes a home's pushed answers into the cache of home answers:
// each one whose key's shard has from as its home at the generation
// named, in this daemon's view; the others are dropped.
func (c *Cluster) onPush(from string, _ uint64, req []byte) ([]byte, error) {
	es, err := decodePush(req)
	if err != nil {
		return nil, err
	}
	v := c.view.Load()
	// The home sent these at most pushSendWait ago, unless this daemon
	// stalled while they waited to be read: they count as of then.
	asOf := time.Now().Add(-pushSendWait)
	for _, pe := range es {
		s := c.shardOf(pe.key)
		if from == c.self || c.homeFor(v, s) != from || pe.gen == 0 || c.genFor(s, from) != pe.gen {
			c.push.refused.Add(1)
			continue
		}
		if len(pe.holders) == 0 {
			c.answers.drop([][]byte{pe.key})
		} else {
			c.answers.put(pe.key, pe.holders, asOf)
		}
		c.push.taken.Add(1)
	}
	return []byte{msgVersion}, nil
}

// kindPush carries a home's answers to a reader (push.go): u32 n, n ×
// (key, u64 generation, u8 m, m × holder); answer empty.
const kindPush = "tc.store.push"

// pushEvery is how often the pusher sends what is owed, given the
// readers' staleness budget.
func pushEvery(staleness time.Duration) time.Duration {
	return max(staleness/4, 10*time.Millisecond)
}

// startPush sets the pushes up (none when readers keep no answers):
// the index tells of its changes, the reader's handler takes pushes, and
// the pusher runs.
func (c *Cluster) startPush() error {
	c.pushStop, c.pushDone = make(chan struct{}), make(chan struct{})
	if c.cfg.Staleness <= 0 || !c.cfg.Push {
		close(c.pushDone)
		return nil
	}
	c.push = newPushes(pushInterest * c.cfg.Staleness)
	c.idx.changed = c.push.changed
	if err := c.peers.Handle(kindPush, c.onPush); err != nil {
		close(c.pushDone)
		return err
	}
	go c.pusher(pushEvery(c.cfg.Staleness))
	return nil
}

// stopPush removes the handler and stops the pusher.
func (c *Cluster) stopPush() {
	if c.push != nil {
		_ = c.peers.Handle(kindPush, nil)
	}
	close(c.pushStop)
	<-c.pushDone
}

// pushInterest is how long, in staleness budgets, a reader's ask keeps it
// interested in a shard.
const pushInterest = 8

// asked records, at a home, that reader from (at epoch) asked about keys.
func (c *Cluster) asked(from string, epoch uint64, keys [][]byte) {
	if c.push == nil || from == c.self {
		return
	}
	shards := make([]int, 0, len(keys))
	for _, k := range keys {
		shards = append(shards, c.shardOf(k))
	}
	c.push.asked(from, epoch, shards, time.Now())
}
