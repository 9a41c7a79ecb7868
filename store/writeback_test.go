package store

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// waitFor waits for cond, re-checked whenever the store's background work
// moves (no polling, no sleeps).
func (e *testEnv) waitFor(what string, cond func() bool) {
	e.t.Helper()
	if !e.s.ev.waitUntil(cond, 10*time.Second) {
		e.t.Fatalf("timed out waiting for %s; stats %+v", what, e.s.Stats())
	}
}

// waitHeld waits until the transport holds n tasks, re-checked after each
// Submit that held some: holding a task fires none of the store's events,
// so waitFor would see it only at its timeout.
func (e *testEnv) waitHeld(what string, n int) {
	e.t.Helper()
	for e.tr.Held() != n {
		select {
		case <-e.tr.Holding():
		case <-time.After(10 * time.Second):
			e.t.Fatalf("timed out waiting for %s: %d tasks held, want %d", what, e.tr.Held(), n)
		}
	}
}

// holdingWritebacks is a store over an L2 whose value writes are held
// until endWritebacks, and a session on it.
func holdingWritebacks(t *testing.T) (*testEnv, *Session) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	e.tr.Update(func(c *xfertest.Config) { c.Hold = isValueWrite })
	ss := e.s.NewSession()
	t.Cleanup(func() { ss.Close() })
	return e, ss
}

// endWritebacks lets the writebacks held (Hold = isValueWrite) go on,
// their value writes failing when fail is set (until Err is reset).
func (e *testEnv) endWritebacks(fail bool) {
	e.tr.Update(func(c *xfertest.Config) {
		c.Hold = nil
		if fail {
			c.Err = func(t *xfer.Task) error {
				if isValueWrite(t) {
					return errInjected
				}
				return nil
			}
		}
	})
	e.tr.release()
}

// TestWritebackTombstone is seed 000's endless retry: a writeback target
// that always fails. Each action is retried WritebackRetries times, on the
// store's clock, then becomes a tombstone (counted, shown in Stats, never
// retried again); the store keeps serving and the values stay readable
// from L1.
func TestWritebackTombstone(t *testing.T) {
	const retries = 2
	e := newEnv(t, 16<<20, withL2(32<<20), withCfg(func(c *Config) {
		c.WritebackRetries, c.WritebackBackoff = retries, time.Second
	}))
	var mu sync.Mutex
	attempts := map[uint64]int{} // value writes per pool block
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(t *xfer.Task) error {
			if isValueWrite(t) {
				mu.Lock()
				attempts[t.Req.LocalOffset]++
				mu.Unlock()
				return errInjected
			}
			return nil
		}
	})
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("b", 3)
	vals := valuesFor(keys, 2000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	for try := 1; try <= retries; try++ {
		e.waitFor(fmt.Sprintf("retry %d scheduled", try), func() bool {
			return e.s.Stats().WritebackRetries == uint64(3*try)
		})
		e.clk.Advance(time.Second)
	}
	e.waitFor("tombstones", func() bool { return e.s.Stats().Tombstones == 3 })
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatalf("flush with only tombstones left: %v", err)
	}
	// Flush waits until no value is owed a writeback; the last failed
	// write's I/O task may still be on its way back to the free list.
	e.waitFor("the failed writes' I/O tasks back", func() bool { return e.s.Stats().IOInFlight == 0 })
	st := e.s.Stats()
	if st.Writebacks != 0 || st.Dirty != 0 || st.WritebackRetries != 3*retries || st.IOInFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
	writes := e.tr.writes.Load()
	done := int64(e.tr.Ended())
	e.clk.Advance(time.Hour)
	e.s.kick()
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	if int64(e.tr.Ended()) != done || e.tr.writes.Load() != writes {
		t.Fatal("a tombstone was retried")
	}
	mu.Lock()
	if len(attempts) != 3 {
		t.Fatalf("%d blocks written, want 3", len(attempts))
	}
	for off, n := range attempts {
		if n != retries+1 {
			t.Fatalf("block at %d written %d times, want %d", off, n, retries+1)
		}
	}
	mu.Unlock()
	// Healthy: the values read back from L1, new puts work (the failure
	// was on value writes only, durable ones fail with a code).
	e.checkValues(keys, vals)
	more := keysN("c", 2)
	mustCodes(t, "new put", e.put(ss, more, valuesFor(more, 10), false), OK)
	mustCodes(t, "durable put to the failing target", e.put(ss, keysN("d", 1), valuesFor(keysN("d", 1), 10), true), Internal)
	mustCodes(t, "exists", e.exists(append(keys, more...)), OK)
	// A tombstoned value is evictable: it leaves the store, counted.
	e.s.evict(1<<62, 1<<20)
	if st := e.s.Stats(); st.DroppedUnwritten != 3 {
		t.Fatalf("dropped unwritten %d", st.DroppedUnwritten)
	}
}

// failZeroWrites makes every write that zeroes a block header fail
// (errInjected), so removals and L2 evictions cannot complete.
func (e *testEnv) failZeroWrites() {
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(t *xfer.Task) error {
			if isZeroWrite(t) {
				return errInjected
			}
			return nil
		}
	})
}

// TestRemoveFailureReported is seed 002's batch_remove: a removal that
// fails is reported per key (with its cause), never only logged; the key
// stays, and removing it again once the device is back works.
func TestRemoveFailureReported(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("x", 3)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 100), true), OK)
	ss.Close()
	e.failZeroWrites()
	codes := make([]Code, 4)
	errs := make([]error, 4)
	rm := append(keys[:2:2], []byte("absent"), keys[2])
	if _, err := e.s.Remove(rm[:3], codes[:3], errs[:3], nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", codes[:3], Internal, Internal, OK)
	if !errors.Is(errs[0], errInjected) || errs[2] != nil {
		t.Fatalf("errs %v", errs)
	}
	mustCodes(t, "still there", e.exists(keys), OK)
	if st := e.s.Stats(); st.RemoveFailures != 2 || st.Keys != 3 {
		t.Fatalf("stats %+v", st)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	if _, err := e.s.Remove(rm, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove again", codes, OK)
	e.reopen()
	mustCodes(t, "after restart", e.exists(keys), NotFound)
}

// TestPromotionRollback: a Get of L2-only keys whose reads are dispatched
// only in part (the transport closing) gives the undispatched keys
// UNAVAILABLE at once, frees their pool blocks, keeps the keys on L2, and
// the next Get promotes them.
func TestPromotionRollback(t *testing.T) {
	for k := 0; k <= 4; k++ {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			defer ss.Close()
			keys := keysN("g", 4)
			vals := valuesFor(keys, 3000)
			mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
			e.dropL1()
			blocks := e.pool.Stats().Blocks
			e.tr.Update(func(c *xfertest.Config) {
				c.Limit = k
				if k == 0 {
					c.Lie = func(int, error) (int, error) { return 0, xfer.ErrClosed }
				}
			})
			_, codes, _ := e.get(ss, keys)
			for i := range keys {
				want := OK
				if i >= k {
					want = Unavailable
				}
				if codes[i] != want {
					t.Fatalf("key %d: %v, want %v", i, codes[i], want)
				}
			}
			if got := e.pool.Stats().Blocks; got != blocks+uint64(k) {
				t.Fatalf("pool blocks %d, want %d (one per promoted key)", got, blocks+uint64(k))
			}
			e.tr.Update(func(c *xfertest.Config) { c.Limit, c.Lie = 0, nil })
			_, codes, _ = e.get(ss, keys)
			mustCodes(t, "get again", codes, OK)
			if err := ss.Unpin(keys, codes); err != nil {
				t.Fatal(err)
			}
			if err := ss.Unpin(keys[:k], codes[:k]); err != nil {
				t.Fatal(err)
			}
			if st := e.s.Stats(); st.Pins != 0 || st.PromotionFailures != uint64(4-k) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestReadErrors: the copying Get reports a destination that is too small
// with the value's length, and copies nothing.
func TestReadErrors(t *testing.T) {
	e := newEnv(t, 8<<20)
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("q", 1)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 500), false), OK)
	dst := [][]byte{make([]byte, 100)}
	lens := []uint64{0}
	codes := []Code{OK}
	errs := []error{nil}
	if _, err := e.s.Read(keys, dst, lens, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	if codes[0] != InvalidArgument || lens[0] != 500 || !errors.Is(errs[0], ErrShortBuffer) {
		t.Fatalf("short dst: %v %d %v", codes[0], lens[0], errs[0])
	}
}

// TestRemoveDuringWriteback: the store's own writeback of a key is no
// caller's business. While it is in flight the key reads and exists as any
// stored key; a Remove of it is never BUSY: the key is gone at once, the
// Remove ends with the writeback (the header it wrote zeroed again, or
// nothing written), and the key does not come back after a restart.
func TestRemoveDuringWriteback(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("writeback fails %v", fail), func(t *testing.T) {
			e, ss := holdingWritebacks(t)
			keys := keysN("wb", 8)
			vals := valuesFor(keys, 3000)
			mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
			e.waitHeld("every writeback in flight", len(keys))
			mustCodes(t, "exists under writeback", e.exists(keys), OK)
			e.checkValues(keys, vals)

			codes := make([]Code, len(keys))
			errs := make([]error, len(keys))
			rec := newRecorder()
			pending, err := e.s.Remove(keys[:4], codes[:4], errs[:4], rec, 1)
			if err != nil || !pending {
				t.Fatalf("remove under writeback: pending %v, %v, codes %v", pending, err, codes[:4])
			}
			mustCodes(t, "exists once removed", e.exists(keys), NotFound, NotFound, NotFound, NotFound, OK, OK, OK, OK)
			e.endWritebacks(fail)
			<-rec.done
			mustCodes(t, "remove", codes[:4], OK, OK, OK, OK)
			// A blocking Remove of the rest once their writeback is done (or
			// being retried) is as before.
			if _, err := e.s.Remove(keys[4:], codes[4:], errs[4:], nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "remove after writeback", codes[4:], OK, OK, OK, OK)
			e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			if err := e.s.Flush(flushWait); err != nil {
				t.Fatal(err)
			}
			if st := e.s.Stats(); st.Keys != 0 || st.L2Bytes != 0 || st.Dirty != 0 || st.IOInFlight != 0 {
				t.Fatalf("stats after removing every key: %+v", st)
			}
			e.reopen()
			mustCodes(t, "after restart", e.exists(keys), NotFound, NotFound, NotFound, NotFound, NotFound, NotFound, NotFound, NotFound)
		})
	}
}

// TestPutRemoveLoopNeverBusy: a single writer that puts keys and removes
// them at once, while the store writes back what it put (each writeback
// held until another goroutine carries it out), never sees BUSY; after a
// restart on the same L2 none of the removed keys is there.
func TestPutRemoveLoopNeverBusy(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	e.tr.Update(func(c *xfertest.Config) { c.Hold = isValueWrite })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-e.tr.Holding():
				e.tr.release()
			case <-stop:
				return
			}
		}
	}()
	ss := e.s.NewSession()
	const rounds, batch = 400, 4
	var removed [][]byte
	codes := make([]Code, batch)
	errs := make([]error, batch)
	for r := range rounds {
		keys := keysN(fmt.Sprintf("loop%d-", r), batch)
		mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 5000), false), OK, OK, OK, OK)
		if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
			t.Fatal(err)
		}
		for i, c := range codes {
			if c != OK {
				t.Fatalf("round %d: remove of %s: %v (%v)", r, keys[i], c, errs[i])
			}
		}
		removed = append(removed, keys...)
	}
	ss.Close()
	close(stop)
	wg.Wait()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v", e.s.Stats())
	e.reopen()
	for i, c := range e.existsAll(removed) {
		if c != NotFound {
			t.Fatalf("%s is back after a restart: %v", removed[i], c)
		}
	}
}

// existsAll is exists over any number of keys, a call per MaxKeysPerCall.
func (e *testEnv) existsAll(keys [][]byte) []Code {
	var codes []Code
	for i := 0; i < len(keys); i += e.s.cfg.MaxKeysPerCall {
		codes = append(codes, e.exists(keys[i:min(i+e.s.cfg.MaxKeysPerCall, len(keys))])...)
	}
	return codes
}

// evictingL2 drops L1 and starts the eviction from L2 of the n values
// stored, held by the transport at the write that zeroes each header.
func (e *testEnv) evictingL2(t *testing.T, n int) {
	t.Helper()
	e.dropL1()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = isZeroWrite })
	batch := e.s.evictL2LRU(1<<40, nil)
	if len(batch) != n {
		t.Fatalf("%d evictions started, want %d", len(batch), n)
	}
	var xts []*xfer.Task
	e.s.l2.startInvals(batch, &xts)
	e.waitHeld("every eviction in flight", n)
}

// TestRemoveDuringL2Eviction: the store's own eviction of a key from L2 is
// no caller's business either: a Remove of a key whose eviction is in
// flight is not BUSY; it ends with the eviction, and the key does not come
// back after a restart.
func TestRemoveDuringL2Eviction(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("ev", 4)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK, OK, OK, OK)
	ss.Close()
	e.evictingL2(t, len(keys))

	codes := make([]Code, 2)
	rec := newRecorder()
	pending, err := e.s.Remove(keys[:2], codes, nil, rec, 1)
	if err != nil || !pending {
		t.Fatalf("remove under eviction: pending %v, %v, codes %v", pending, err, codes)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	<-rec.done
	mustCodes(t, "remove", codes, OK, OK)
	if st := e.s.Stats(); st.Keys != 0 || st.EvictionsL2 != uint64(len(keys)) || st.IOInFlight != 0 {
		t.Fatalf("stats after the evictions: %+v", st)
	}
	e.reopen()
	mustCodes(t, "after restart", e.exists(keys), NotFound, NotFound, NotFound, NotFound)
}

// TestPutDuringL2Eviction: a key the store is evicting from L2 is absent
// to every reader at once, and a client that misses it puts it again. The
// eviction is the store's own work, so that put is not BUSY: it stores the
// new value (copying, durable, or reserved and committed) while the old
// block's header is still being zeroed. Once the evictions end, the new
// values are what is read, and what a restart finds.
func TestPutDuringL2Eviction(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("ev", 4)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK, OK, OK, OK)
	e.evictingL2(t, len(keys))
	mustCodes(t, "exists under eviction", e.exists(keys), NotFound, NotFound, NotFound, NotFound)

	vals := valuesFor(keys, 5000)
	mustCodes(t, "put under eviction", e.put(ss, keys[:1], vals[:1], false), OK)
	mustCodes(t, "durable put under eviction", e.put(ss, keys[1:2], vals[1:2], true), OK)
	locs := make([]Location, 1)
	codes := make([]Code, 1)
	errs := make([]error, 1)
	if err := ss.Reserve(keys[2:3], []uint64{uint64(len(vals[2]))}, locs, codes, errs); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "reserve under eviction", codes, OK)
	copy(e.s.poolMem[locs[0].Offset:], vals[2])
	if _, err := ss.Commit(keys[2:3], false, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "commit under eviction", codes, OK)

	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	e.waitFor("every eviction ended", func() bool { return e.s.Stats().EvictionsL2 == uint64(len(keys)) })
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	e.checkValues(keys[:3], vals[:3])
	mustCodes(t, "evicted and not put again", e.exists(keys[3:]), NotFound)
	if st := e.s.Stats(); st.Keys != 3 || st.L2Keys != 3 || st.IOInFlight != 0 {
		t.Fatalf("stats after the evictions: %+v", st)
	}
	ss.Close()
	e.reopen()
	e.checkValues(keys[:3], vals[:3])
	mustCodes(t, "after restart", e.exists(keys[3:]), NotFound)
}

// TestFailingL2EvictionIsNotRetriedAtOnce: when every write to L2 fails,
// an eviction that fails does not start the next one: the maintenance
// loop used to kick itself after each failed invalidation, and wrote to a
// failing device as fast as it answered (hundreds of thousands of writes a
// second) with no caller asking for anything. Eviction goes on at the next
// event, once the device writes again.
func TestFailingL2EvictionIsNotRetriedAtOnce(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(4096+4*(1<<20)))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("f", 500) // 500 of the 508 slots: over the high watermark
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
	var zeros atomic.Int64
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(task *xfer.Task) error {
			if task.Req.Op != xfer.OpWrite {
				return nil
			}
			if isZeroWrite(task) {
				zeros.Add(1)
			}
			return fmt.Errorf("fake write: %w", syscall.EIO)
		}
	})
	e.dropL1() // L2-only now: evictable
	e.s.kick()
	e.waitFor("an eviction failed", func() bool { return zeros.Load() > 0 })
	// A round of evictions takes at most the tasks the store's own work
	// may have, and a kick left from the puts may run one more: a store
	// that kicks itself after each failure never stops.
	bound := int64(2 * e.s.cfg.IODepth)
	if e.s.ev.waitUntil(func() bool { return zeros.Load() > bound }, 200*time.Millisecond) {
		t.Fatalf("the store kept evicting on its own from a device that fails every write: %d writes", zeros.Load())
	}
	e.waitFor("the evictions ended", func() bool { return e.s.Stats().IOInFlight == 0 })
	if st := e.s.Stats(); st.InvalidateFailures != uint64(zeros.Load()) || st.Keys != 500 {
		t.Fatalf("stats after the failed evictions: %+v", st)
	}
	// The device writes again: the next event evicts down to the low
	// watermark.
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	e.s.kick()
	e.waitFor("eviction under the low watermark", func() bool {
		st := e.s.Stats()
		return st.IOInFlight == 0 && float64(st.L2Bytes) <= 0.85*float64(st.L2Capacity)
	})
}
