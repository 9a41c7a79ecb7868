package cluster

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/store"
)

// Replicas. A value put here is copied to Config.Replicas-1 other daemons
// (or as many as the putting session asked, store.Session.SetReplicas),
// picked by rendezvous over the key among the members up, so that every
// daemon agrees where a key's copies go and a change of members moves
// only the copies it must. The holder does not send the bytes: it asks
// each target (replicate, batched per target) to read them, as a reader
// does, from its pool (a hold, then rdma or tcp into the target's pool,
// the crc32c checked), and to commit them as a value of its own (to L2
// first when the put is durable). The target announces its copy to the
// key's home before it answers, so once a durable put is acknowledged its
// home knows the copies elsewhere (the putter's own copy is announced in
// the background, as any put's), and a get may read any of them: a reader
// whose read at one holder fails tries the next.
//
// A durable put answers once every copy is on its holder's L2 (or with
// the error that names the copy that failed, or too few daemons up to
// hold the copies asked); a put without durable answers at once and its
// copies follow (failures counted and logged). The replicator is the
// Cluster's goroutine: it takes what Replicate queued, one batch at a
// time, and ends each job by Config.Timeout.

// repJob is one key's copies to make.
type repJob struct {
	key     []byte
	copies  int
	durable bool
	done    func(error)
}

// Replicas is how many copies of each value the cluster keeps by default,
// this daemon's included (store.Replicator).
func (c *Cluster) Replicas() int { return c.cfg.Replicas }

// Replicate queues copies of keys for the replicator (store.Replicator).
func (c *Cluster) Replicate(keys [][]byte, copies int, durable bool, done func(int, error)) {
	c.mu.Lock()
	if c.closed || len(c.repQ)+len(keys) > c.cfg.MaxPending {
		err := error(ErrClosed)
		if !c.closed {
			err = fmt.Errorf("%w: %d copies waiting to be made", ErrBusy, len(c.repQ))
		}
		c.mu.Unlock()
		for i := range keys {
			c.c.replicaFailed.Add(1)
			done(i, err)
		}
		return
	}
	for i, k := range keys {
		c.repQ = append(c.repQ, repJob{key: k, copies: copies, durable: durable, done: func(err error) { done(i, err) }})
	}
	c.mu.Unlock()
	select {
	case c.repKick <- struct{}{}:
	default:
	}
}

// replicator makes the copies Replicate queued, a batch at a time; at
// Close it ends what is still queued with ErrClosed.
func (c *Cluster) replicator() {
	defer close(c.repDone)
	for {
		select {
		case <-c.stop:
			c.mu.Lock()
			q := c.repQ
			c.repQ = nil
			c.mu.Unlock()
			for _, j := range q {
				j.done(ErrClosed)
			}
			return
		case <-c.repKick:
		}
		c.mu.Lock()
		batch := c.repQ
		c.repQ = nil
		c.mu.Unlock()
		if len(batch) > 0 {
			c.replicate(batch)
		}
	}
}

// replicaTargets are the n daemons of v other than this one that key's
// copies go to: the highest rendezvous scores over the key.
func (c *Cluster) replicaTargets(v *view, key []byte, n int) []string {
	kh := fnv1a(fnvOffset, key)
	return v.top(n, func(id string) uint64 { return mix(kh ^ mix(fnv1a(fnvOffset, []byte(id)))) }, c.self)
}

// replicate makes the copies of batch: one replicate exchange per target
// (per maxMsgKeys keys), the targets in parallel; each job's done is
// called once every target it went to answered.
func (c *Cluster) replicate(batch []repJob) {
	v := c.view.Load()
	type part struct {
		jobs    []int
		durable bool
	}
	byTarget := map[string]*[2]part{} // [0]: without durable, [1]: durable
	errs := make([]error, len(batch))
	for i, j := range batch {
		ts := c.replicaTargets(v, j.key, j.copies-1)
		if len(ts) < j.copies-1 {
			c.c.replicasShort.Add(1)
			err := fmt.Errorf("%w: %d copies of %q asked, %d daemons up to hold them besides this one", ErrReplicas, j.copies, j.key, len(ts))
			if j.durable {
				errs[i] = err
			} else {
				c.logReplica(err)
			}
		}
		d := 0
		if j.durable {
			d = 1
		}
		for _, t := range ts {
			p := byTarget[t]
			if p == nil {
				p = &[2]part{}
				byTarget[t] = p
			}
			p[d].jobs = append(p[d].jobs, i)
			p[d].durable = j.durable
		}
	}
	var mu sync.Mutex // guards errs while the targets answer
	var wg sync.WaitGroup
	for t, ps := range byTarget {
		for _, p := range ps {
			if len(p.jobs) == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.replicateTo(t, batch, p.jobs, p.durable, func(i int, err error) {
					mu.Lock()
					if errs[i] == nil {
						errs[i] = err
					}
					mu.Unlock()
				})
			}()
		}
	}
	wg.Wait()
	for i, j := range batch {
		if errs[i] != nil {
			c.c.replicaFailed.Add(1)
			c.logReplica(errs[i])
		}
		j.done(errs[i])
	}
}

// replicateTo asks target for copies of the jobs at pos; fail(i, err)
// says job i's copy there failed.
func (c *Cluster) replicateTo(target string, batch []repJob, pos []int, durable bool, fail func(int, error)) {
	for len(pos) > 0 {
		n, size := 0, 16
		var es []entry
		for n < len(pos) && n < maxMsgKeys {
			j := batch[pos[n]]
			vsize, crc, err := c.st.Copyable(j.key)
			if err != nil {
				fail(pos[n], fmt.Errorf("cluster: the value to copy is no longer here: %w", err))
				pos = slices.Delete(pos, n, n+1)
				continue
			}
			e := entry{key: j.key, size: vsize, crc: crc}
			if size+entryBytes(e) > maxMsgBytes {
				break
			}
			size += entryBytes(e)
			es = append(es, e)
			n++
		}
		if n == 0 {
			return
		}
		part := pos[:n]
		pos = pos[n:]
		resp, err := c.exchange(target, c.epochOf(target), kindReplicate, encodeReplicate(durable, es))
		var codes []uint8
		if err == nil {
			codes, err = decodeReplicated(resp, len(es))
		}
		if err != nil {
			for _, i := range part {
				fail(i, fmt.Errorf("%w: copy on %s: %w", ErrReplicaFailed, target, err))
			}
			continue
		}
		for k, i := range part {
			if store.Code(codes[k]) != store.OK {
				fail(i, fmt.Errorf("%w: copy of %q on %s: %v", ErrReplicaFailed, batch[i].key, target, store.Code(codes[k])))
				continue
			}
			c.c.replicasMade.Add(1)
		}
	}
}

// onReplicate copies the values from asks of (it holds them) into this
// daemon's store, as a reader would, announces them to their homes and
// answers a code per key.
func (c *Cluster) onReplicate(from string, epoch uint64, req []byte) ([]byte, error) {
	durable, es, err := decodeReplicate(req)
	if err != nil {
		return nil, err
	}
	// Answered before the sender's exchange times out.
	deadline := time.Now().Add(c.cfg.Timeout * 3 / 4)
	keys := make([][]byte, len(es))
	ws := make([]*want, len(es))
	for i, e := range es {
		keys[i] = e.key
		ws[i] = &want{i: i, cands: []Holder{{ID: from, Epoch: epoch, Tier: TierL1, Size: e.size, CRC: e.crc}}}
	}
	c.readFrom(from, epoch, keys, ws, deadline, durable, false)
	codes := make([]uint8, len(es))
	var landed []entry
	for i, w := range ws {
		codes[i] = uint8(store.OK)
		if w.last != nil {
			codes[i] = uint8(status.CodeOf(w.last))
			if codes[i] == uint8(store.OK) {
				codes[i] = uint8(store.Internal)
			}
			continue
		}
		// Committed here, or found here the same value (land): it is the
		// sender's size and crc32c, on the tier land saw it reach.
		tier := TierL1
		if w.tier == TierL2 {
			tier = TierL2
		}
		landed = append(landed, entry{key: es[i].key, tier: tier, size: es[i].size, crc: es[i].crc})
	}
	// The home learns of the copies now, not after the announcer's next
	// batch: once the sender acknowledges its put, a reader finds them.
	if failed := c.announce(landed); failed > 0 {
		c.log.Info("copies made but not announced to their home (they are re-announced when members change)",
			"from", from, "keys", failed)
	}
	e := newEnc()
	e.u32(uint32(len(codes)))
	for _, code := range codes {
		e.u8(code)
	}
	return e.bytes(), nil
}

// logReplica says (at most once a second) that a copy failed.
func (c *Cluster) logReplica(err error) {
	now := time.Now().UnixNano()
	last := c.lastRepLog.Load()
	if now-last < int64(time.Second) || !c.lastRepLog.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("a copy of a value on another daemon failed", "err", err,
		"failed_total", c.c.replicaFailed.Load(), "short_total", c.c.replicasShort.Load())
}

func encodeReplicate(durable bool, es []entry) []byte {
	e := newEnc()
	d := uint8(0)
	if durable {
		d = 1
	}
	e.u8(d)
	e.u32(uint32(len(es)))
	for _, x := range es {
		e.key(x.key)
		e.u64(x.size)
		e.u32(x.crc)
	}
	return e.bytes()
}

func decodeReplicate(b []byte) (durable bool, es []entry, err error) {
	d := newDec(b)
	f := d.u8()
	if d.err == nil && f > 1 {
		d.fail("durable flag %d", f)
	}
	n := d.count(maxMsgKeys)
	es = make([]entry, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		es = append(es, entry{key: d.key(), size: d.u64(), crc: d.u32()})
	}
	if err := d.end(); err != nil {
		return false, nil, err
	}
	if n == 0 {
		return false, nil, fmt.Errorf("%w: replicate of no keys", ErrMessage)
	}
	return f == 1, es, nil
}

func decodeReplicated(b []byte, want int) ([]uint8, error) {
	d := newDec(b)
	n := d.count(maxMsgKeys)
	if d.err == nil && n != want {
		d.fail("%d answers for %d keys", n, want)
	}
	codes := make([]uint8, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		codes = append(codes, d.u8())
	}
	return codes, d.end()
}
