package main

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// The xstore kind runs on daemons c and d, whose stores are one store
// across hosts (no [[tenants]], each the other's peer). A client puts keys
// of its own through its daemon, and gets through the same daemon keys
// that the other daemon's xstore clients put: each of those gets is a
// remote get (home lookup, claim, read over tcp into its daemon's pool,
// crc32c), made while the soak stops, kills and cuts off d.
//
// A value is a function of its key alone (xvalue), so any bytes a get
// answers can be checked exactly without knowing who put them or when: a
// get ends with the key's exact bytes, NOT_FOUND (removed, evicted, or its
// holder unreachable) or another code, each counted; wrong bytes count as
// CORRUPT, which fails the soak, and a call that overruns its deadline is
// a hang unless its own daemon was stopped meanwhile (one that waited for
// the other daemon is never excused).
//
// What the other side has put is learnt from a file per writer in the
// shared directory (dir): "<daemon>-<id>" holds the writer's last round,
// and the newest round whose every key a remove took at least
// xstoreGoneAfter before, with when that remove was acknowledged. A writer keeps its last xstoreLive rounds' keys and
// removes older ones, so a reader asks for rounds within that window, and
// sometimes for the ones just removed.
//
// One get in xstoreGoneEvery asks, at least xstoreGoneAfter after it was
// acknowledged, for that removed round. A removal takes every
// copy its home knows of before it is acknowledged, so such a get must
// not find the key; one that does is reported (servedOp) for the soak to
// judge: it is excused only near a fault that parted c from d, since a
// copy made while they were apart stays until the daemons meet again and
// it is re-announced.
const (
	xstoreKeys      = 8
	xstoreVLen      = 16 << 10
	xstoreLive      = 32
	xstoreAhead     = 40 // a reader picks a round up to this far back
	xstoreGoneEvery = 4
	xstoreGoneAfter = time.Second
)

// servedOp is an xstore get that found a key removed before the get began.
type servedOp struct {
	Key       string `json:"key"`
	RemovedAt int64  `json:"removed_ms"` // the remove acknowledged
	Start     int64  `json:"start_ms"`   // the get sent
	End       int64  `json:"end_ms"`     // the get answered
}

// xkey is key i of round r of writer w ("<daemon>-<id>").
func xkey(dst []byte, w string, r, i int) []byte {
	return fmt.Appendf(dst[:0], "x/%s/%d/%d", w, r, i)
}

// xvalue fills v with key's value: a 64-bit linear congruential sequence
// seeded by the key's FNV-1a hash, so two keys' values differ from the
// first word on.
func xvalue(v, key []byte) {
	h := fnv.New64a()
	h.Write(key)
	x := h.Sum64()
	for k := 0; k+8 <= len(v); k += 8 {
		binary.LittleEndian.PutUint64(v[k:], x)
		x = x*6364136223846793005 + 1442695040888963407
	}
}

// xstoreSession runs the xstore kind on one connection until an error
// ends it. buf holds the values put (first xstoreKeys slots), the gets'
// destinations (next xstoreKeys) and one expected value (the last slot).
func (w *worker) xstoreSession(c *client.Client, buf *client.Buffer, stop <-chan struct{}) error {
	self := w.selfName()
	me := fmt.Sprintf("%s-%d", self, w.id)
	keys := make([][]byte, xstoreKeys)
	vals := make([]client.Extent, xstoreKeys)
	dests := make([]client.Extent, xstoreKeys)
	lengths := make([]uint64, xstoreKeys)
	res := make([]error, xstoreKeys)
	for i := range xstoreKeys {
		vals[i] = client.Extent{Segment: buf.ID, Offset: uint64(i) * xstoreVLen, Length: xstoreVLen}
		dests[i] = client.Extent{Segment: buf.ID, Offset: uint64(xstoreKeys+i) * xstoreVLen, Length: xstoreVLen}
	}
	want := buf.Mem[2*xstoreKeys*xstoreVLen : (2*xstoreKeys+1)*xstoreVLen]
	for {
		// Put this round's keys.
		round, err := w.nextRound(stop)
		if err != nil {
			return err
		}
		for i := range keys {
			keys[i] = xkey(keys[i], me, round, i)
			xvalue(buf.Mem[i*xstoreVLen:(i+1)*xstoreVLen], keys[i])
		}
		if err := w.timed("xstore put", func() error { return c.StorePut(keys, vals, false, res) }); err != nil {
			return err
		}
		w.counted("put", res)
		if err := w.writeRound(me, round); err != nil {
			return err
		}

		// Get what a writer on the other daemon put.
		if wr, ok := w.pickWriter(); ok {
			r := max(0, wr.last-w.rng.IntN(xstoreAhead))
			gone := wr.removed >= 0 && time.Since(wr.removedAt) >= xstoreGoneAfter && w.rng.IntN(xstoreGoneEvery) == 0
			if gone {
				r = wr.removed
			}
			for i := range keys {
				keys[i] = xkey(keys[i], wr.name, r, i)
			}
			clear(buf.Mem[xstoreKeys*xstoreVLen : 2*xstoreKeys*xstoreVLen])
			start := time.Now()
			if err := w.timed("xstore get across hosts", func() error { return c.StoreRead(keys, dests, lengths, res) }); err != nil {
				return err
			}
			end := time.Now()
			if gone {
				w.counted("get-removed", res)
			} else {
				w.counted("get", res)
			}
			for i, e := range res {
				if e != nil {
					continue
				}
				xvalue(want, keys[i])
				w.verify(true, buf.Mem[(xstoreKeys+i)*xstoreVLen:(xstoreKeys+i+1)*xstoreVLen], want)
				if lengths[i] != xstoreVLen {
					w.count("CORRUPT", 1)
				}
				if gone {
					w.mu.Lock()
					w.rep.Served = append(w.rep.Served, servedOp{Key: string(keys[i]), RemovedAt: wr.removedAt.UnixMilli(),
						Start: start.UnixMilli(), End: end.UnixMilli()})
					w.mu.Unlock()
				}
			}
		}

		// Remove the round that leaves the window (every copy, on both
		// daemons).
		if old := round - xstoreLive; old >= 0 {
			for i := range keys {
				keys[i] = xkey(keys[i], me, old, i)
			}
			if err := w.timed("xstore remove", func() error { return c.StoreRemove(keys, res) }); err != nil {
				return err
			}
			w.counted("remove", res)
			if !slices.ContainsFunc(res, func(e error) bool { return e != nil }) {
				w.removals.add(old, time.Now())
			}
		}
	}
}

// counted counts a store call's per-key results under the call's name
// ("get-OK", "get-NOT_FOUND", ...).
func (w *worker) counted(call string, res []error) {
	for _, e := range res {
		w.count(call+"-"+codeOf(e), 1)
	}
}

// selfName is the name of the worker's own daemon: the other one of the
// pair its peer names.
func (w *worker) selfName() string {
	switch w.peer {
	case "d":
		return "c"
	case "c":
		return "d"
	}
	return "?"
}

// writer is what a reader knows of a writer of the other daemon.
type writer struct {
	name      string    // "<daemon>-<id>"
	last      int       // its last round put
	removed   int       // its last round removed whole; -1 none
	removedAt time.Time // when that remove was acknowledged
}

// pickWriter picks a writer of the other daemon at random; false when none
// has written yet.
func (w *worker) pickWriter() (writer, bool) {
	ms, _ := filepath.Glob(filepath.Join(w.dir, w.peer+"-*"))
	var names []string
	for _, m := range ms {
		if !strings.HasSuffix(m, ".tmp") {
			names = append(names, m)
		}
	}
	if len(names) == 0 {
		return writer{}, false
	}
	m := names[w.rng.IntN(len(names))]
	b, err := os.ReadFile(m)
	if err != nil {
		return writer{}, false
	}
	var wr writer
	var at int64
	if _, err := fmt.Sscan(string(b), &wr.last, &wr.removed, &at); err != nil {
		return writer{}, false
	}
	wr.name, wr.removedAt = filepath.Base(m), time.UnixMilli(at)
	return wr, true
}

// writeRound records that writer me has put round r, and its newest
// removal a reader may ask for (a rename, so a reader sees the old record
// or the new one).
func (w *worker) writeRound(me string, r int) error {
	tmp := filepath.Join(w.dir, me+".tmp")
	gone, at := w.removals.settled(time.Now())
	rec := fmt.Sprintf("%d %d %d\n", r, gone, at.UnixMilli())
	if err := os.WriteFile(tmp, []byte(rec), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(w.dir, me))
}

// removals are a writer's acknowledged removals of whole rounds, oldest
// first. Its record names the newest one at least xstoreGoneAfter old, not
// the newest: a writer removes a round every round, so its newest removal
// is always younger than that, and a reader would never ask for one (only
// the record of a writer a kill ended would age).
type removals struct{ q []removal }

type removal struct {
	round int
	at    time.Time // the remove acknowledged
}

// maxRemovals bounds the removals a writer keeps while none is old enough:
// more rounds than a writer removes in xstoreGoneAfter.
const maxRemovals = 1 << 14

// add records that round was removed whole at at (after every earlier one).
func (r *removals) add(round int, at time.Time) {
	if len(r.q) == maxRemovals {
		r.q = append(r.q[:0], r.q[1:]...)
	}
	r.q = append(r.q, removal{round, at})
}

// settled returns the newest removal at least xstoreGoneAfter before now
// (-1 and the zero time: none yet) and forgets the older ones.
func (r *removals) settled(now time.Time) (int, time.Time) {
	k := -1
	for i, e := range r.q {
		if now.Sub(e.at) < xstoreGoneAfter {
			break
		}
		k = i
	}
	if k < 0 {
		return -1, time.Time{}
	}
	r.q = append(r.q[:0], r.q[k:]...)
	return r.q[0].round, r.q[0].at
}
