package store

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// recorder is a Completion that counts StoreDone per tag.
type recorder struct {
	mu   sync.Mutex
	n    map[uint64]int
	done chan uint64
}

func newRecorder() *recorder { return &recorder{n: map[uint64]int{}, done: make(chan uint64, 64)} }

func (r *recorder) StoreDone(tag uint64) {
	r.mu.Lock()
	r.n[tag]++
	r.mu.Unlock()
	r.done <- tag
}

func (r *recorder) count(tag uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[tag]
}

// snapshot is what a failed durable put must leave exactly as it was.
type snapshot struct {
	lru    []string
	keys   uint64
	blocks uint64
	l1     uint64
	l2     uint64
}

func (e *testEnv) snap() snapshot {
	st := e.s.Stats()
	return snapshot{lru: e.s.lruOrder(), keys: st.Keys, blocks: e.pool.Stats().Blocks, l1: st.L1Bytes, l2: st.L2Bytes}
}

func (e *testEnv) mustSame(what string, a snapshot) {
	e.t.Helper()
	b := e.snap()
	if !slices.Equal(a.lru, b.lru) {
		e.t.Fatalf("%s: LRU order changed:\n was %v\n now %v", what, a.lru, b.lru)
	}
	if a.keys != b.keys || a.blocks != b.blocks || a.l1 != b.l1 || a.l2 != b.l2 {
		e.t.Fatalf("%s: keys %d→%d, pool blocks %d→%d, L1 bytes %d→%d, L2 bytes %d→%d", what,
			a.keys, b.keys, a.blocks, b.blocks, a.l1, b.l1, a.l2, b.l2)
	}
}

// TestDurableFailureLeavesL1 is seed 000's put_durable rollback: a durable
// put whose L2 write fails (at the value, at the header, or at a new
// region's header) leaves L1, its LRU order, the pool and L2 exactly as they
// were, without any snapshot of the order being taken; a durable commit's
// reservation survives for a retry.
func TestDurableFailureLeavesL1(t *testing.T) {
	stages := map[string]func(t *xfer.Task) bool{
		"value":  isValueWrite,
		"header": func(t *xfer.Task) bool { return isHeaderWrite(t) && t.Req.TargetOffset%(1<<20) != 4096 },
		"region": func(t *xfer.Task) bool { return isHeaderWrite(t) && (t.Req.TargetOffset-4096)%(1<<20) == 0 },
	}
	for name, match := range stages {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20), withCfg(oneShard))
			ss := e.s.NewSession()
			defer ss.Close()
			keys := keysN("a", 8)
			mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 5000), false), OK)
			if err := e.s.Flush(flushWait); err != nil {
				t.Fatal(err)
			}
			e.get(ss, [][]byte{keys[3], keys[0]}) // reorder: 0 and 3 pinned, then released
			if err := ss.Unpin([][]byte{keys[3], keys[0]}, make([]Code, 2)); err != nil {
				t.Fatal(err)
			}
			before := e.snap()
			// 100 KiB values take a new slot size: a region is opened too.
			size := 5000
			if name == "region" {
				size = 100 << 10
			}
			e.tr.Update(func(c *xfertest.Config) {
				c.Err = func(t *xfer.Task) error {
					if match(t) {
						return errInjected
					}
					return nil
				}
			})
			nk := keysN("n", 3)
			codes := make([]Code, 3)
			errs := make([]error, 3)
			if _, err := ss.Put(nk, valuesFor(nk, size), true, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "failed durable put", codes, Internal)
			for _, err := range errs {
				if !errors.Is(err, errInjected) {
					t.Fatalf("error %v does not carry the cause", err)
				}
			}
			e.mustSame("after a failed durable put", before)
			mustCodes(t, "absent", e.exists(nk), NotFound)

			// A durable commit: the reservation is exactly as before it.
			locs := make([]Location, 3)
			if err := ss.Reserve(nk, []uint64{uint64(size), uint64(size), uint64(size)}, locs, codes, nil); err != nil {
				t.Fatal(err)
			}
			vals := valuesFor(nk, size)
			for i, l := range locs {
				copy(e.pool.Bytes()[l.Offset:], vals[i][:l.Length])
				vals[i] = vals[i][:l.Length]
			}
			resv := e.snap()
			if _, err := ss.Commit(nk, true, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "failed durable commit", codes, Internal)
			e.mustSame("after a failed durable commit", resv)
			e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			if _, err := ss.Commit(nk, true, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "commit retried", codes, OK)
			if st := e.s.Stats(); st.DurableFailures != 6 || st.DurablePuts != 3 || st.QuarantinedSlots != 0 {
				t.Fatalf("stats %+v", st)
			}
			e.checkValues(nk, vals)
			e.reopen()
			e.checkValues(nk, vals)
		})
	}
}

// TestRollbackAtEverySplitPoint is seed 004: a durable batch put takes
// refs and in-flight marks for every key before dispatch; when dispatch
// stops after k of its tasks (the transport closing) while the store is
// being closed concurrently, the undispatched tail is rolled back at once
// by the caller and the dispatched head by its completions. Nothing leaks,
// nothing is released twice, and the keys can be put again at once.
func TestRollbackAtEverySplitPoint(t *testing.T) {
	const n = 6
	for _, withClose := range []bool{false, true} {
		for k := 0; k <= n+1; k++ { // n+1 tasks: the region header and n values
			t.Run(fmt.Sprintf("close=%v/k=%d", withClose, k), func(t *testing.T) {
				e := newEnv(t, 16<<20, withL2(32<<20))
				ss := e.s.NewSession()
				keys := keysN("s", n)
				vals := valuesFor(keys, 3000)
				var closed chan error
				e.tr.Update(func(c *xfertest.Config) {
					c.Inline = false
					c.Limit = k
					if k == 0 {
						c.Lie = func(int, error) (int, error) { return 0, xfer.ErrClosed }
					}
					if withClose {
						c.AfterSubmit = func() {
							if closed == nil {
								closed = make(chan error, 1)
								go func() { closed <- e.s.Close() }()
							}
						}
					}
				})
				rec := newRecorder()
				codes := make([]Code, n)
				errs := make([]error, n)
				pending, err := ss.Put(keys, vals, true, codes, errs, rec, 7)
				if err != nil {
					t.Fatal(err)
				}
				// The tail was rolled back before Put returned: the region
				// header went first, so values k-1.. were never dispatched.
				for i := max(k-1, 0); i < n; i++ {
					if codes[i] != Unavailable || !errors.Is(errs[i], xfer.ErrClosed) {
						t.Fatalf("undispatched key %d: %v %v", i, codes[i], errs[i])
					}
				}
				if pending != (k > 1) {
					t.Fatalf("pending %v with %d dispatched", pending, k)
				}
				e.tr.Update(func(c *xfertest.Config) { c.Limit, c.Lie, c.AfterSubmit = 0, nil, nil })
				e.tr.release()
				e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
				if pending {
					if tag := <-rec.done; tag != 7 {
						t.Fatalf("tag %d", tag)
					}
				}
				for i := 0; i < k-1 && i < n; i++ {
					if codes[i] != OK {
						t.Fatalf("dispatched key %d: %v %v", i, codes[i], errs[i])
					}
				}
				if pending && rec.count(7) != 1 {
					t.Fatalf("StoreDone called %d times", rec.count(7))
				}
				if withClose {
					if err := <-closed; err != nil {
						t.Fatalf("Close: %v", err)
					}
					if b := e.pool.Stats().Blocks; b != 0 {
						t.Fatalf("%d pool blocks leaked", b)
					}
					if st := e.s.Stats(); st.FreeErrors != 0 || st.IOInFlight != 0 {
						t.Fatalf("stats %+v", st)
					}
					e.s = nil
					ss.Close()
					e.open()
					ss = e.s.NewSession()
				}
				// The same keys can be put again right away: the ones that
				// were stored exist, the others are free.
				again := e.put(ss, keys, vals, true)
				for i := range n {
					want := OK
					if i < k-1 {
						want = AlreadyExists
					}
					if again[i] != want {
						t.Fatalf("put again key %d: %v, want %v", i, again[i], want)
					}
				}
				e.checkValues(keys, vals)
				if st := e.s.Stats(); st.FreeErrors != 0 || st.Reserved != 0 {
					t.Fatalf("stats %+v", st)
				}
				ss.Close()
			})
		}
	}
}

// TestTransportContractViolations: a transport whose answer is short, long,
// negative, or that calls Done twice, fails the whole call: nothing of its
// answer counts as a success, what it may still touch is quarantined, and
// the keys can be put again through a transport that behaves.
func TestTransportContractViolations(t *testing.T) {
	lies := map[string]func(n int, err error) (int, error){
		"short without error": func(n int, err error) (int, error) { return n - 1, nil },
		"long":                func(n int, err error) (int, error) { return n + 1, nil },
		"negative":            func(n int, err error) (int, error) { return -1, xfer.ErrClosed },
		"full with error":     func(n int, err error) (int, error) { return n, errInjected },
	}
	run := func(t *testing.T, setup func(c *xfertest.Config)) {
		e := newEnv(t, 16<<20, withL2(32<<20))
		ss := e.s.NewSession()
		defer ss.Close()
		keys := keysN("v", 4)
		vals := valuesFor(keys, 3000)
		e.tr.Update(setup)
		codes := make([]Code, 4)
		errs := make([]error, 4)
		_, err := ss.Put(keys, vals, true, codes, errs, nil, 0)
		if !errors.Is(err, ErrTransport) {
			t.Fatalf("Put: %v, want ErrTransport", err)
		}
		for i := range keys {
			if codes[i] == OK {
				t.Fatalf("key %d reported OK through a broken transport", i)
			}
		}
		st := e.s.Stats()
		if st.TransportViolations == 0 || st.Keys != 0 || st.DurablePuts != 0 || st.IOInFlight != 0 ||
			st.QuarantinedTasks == 0 || st.Reserved != 0 {
			t.Fatalf("stats %+v", st)
		}
		mustCodes(t, "absent", e.exists(keys), NotFound)
		e.tr.Update(func(c *xfertest.Config) { c.Lie, c.Err, c.Inline = nil, nil, true })
		mustCodes(t, "put again", e.put(ss, keys, vals, true), OK)
		e.checkValues(keys, vals)
		if st := e.s.Stats(); st.QuarantinedSlots == 0 {
			t.Fatal("nothing quarantined")
		}
	}
	for name, lie := range lies {
		t.Run(name, func(t *testing.T) { run(t, func(c *xfertest.Config) { c.Lie = lie }) })
	}
	t.Run("second Done", func(t *testing.T) {
		run(t, func(c *xfertest.Config) {
			c.Err = func(t *xfer.Task) error {
				t.Done(t.Req.Length, nil) // the fake then calls Done again
				return nil
			}
		})
	})
}

// TestConcurrentPutsOneKey: many puts of one key race; exactly one stores
// it, the others get ALREADY_EXISTS, or BUSY while the winner is in
// flight; the stored bytes are the winner's.
func TestConcurrentPutsOneKey(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			key := [][]byte{[]byte("contended")}
			const g = 16
			var wg sync.WaitGroup
			var ok, exists, busy atomic.Int32
			winner := make(chan int, g)
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ss := e.s.NewSession()
					defer ss.Close()
					c := e.put(ss, key, [][]byte{valueFor([]byte(fmt.Sprint(i)), 4000)}, durable)
					switch c[0] {
					case OK:
						ok.Add(1)
						winner <- i
					case AlreadyExists:
						exists.Add(1)
					case Busy:
						busy.Add(1)
					default:
						t.Errorf("put %d: %v", i, c[0])
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 1 || ok.Load()+exists.Load()+busy.Load() != g {
				t.Fatalf("ok %d, exists %d, busy %d", ok.Load(), exists.Load(), busy.Load())
			}
			w := <-winner
			e.checkValues(key, [][]byte{valueFor([]byte(fmt.Sprint(w)), 4000)})
		})
	}
	// BUSY while in flight, deterministically: the first durable put is held
	// in the transport.
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	key := [][]byte{[]byte("k")}
	rec := newRecorder()
	codes := make([]Code, 1)
	if p, err := ss.Put(key, [][]byte{{1, 2, 3}}, true, codes, nil, rec, 1); !p || err != nil {
		t.Fatalf("first put: pending %v, %v", p, err)
	}
	mustCodes(t, "second while in flight", e.putAsync(ss, key), Busy)
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	<-rec.done
	mustCodes(t, "first", codes, OK)
	mustCodes(t, "third", e.put(ss, key, [][]byte{{4}}, false), AlreadyExists)
}

func (e *testEnv) putAsync(ss *Session, keys [][]byte) []Code {
	codes := make([]Code, len(keys))
	rec := newRecorder()
	if p, err := ss.Put(keys, valuesFor(keys, 10), true, codes, nil, rec, 0); p || err != nil {
		e.t.Fatalf("put: pending %v, %v", p, err)
	}
	return codes
}

// TestCloseBounded: Close returns after CloseTimeout even when the device
// never answers, says so, and keeps the memory the device may still write
// (the pool reference, the staging memory, the blocks in flight) rather
// than release it under the I/O.
func TestCloseBounded(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20), withCfg(func(c *Config) { c.CloseTimeout = 50 * time.Millisecond }))
	ss := e.s.NewSession()
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	rec := newRecorder()
	codes := make([]Code, 2)
	keys := keysN("c", 2)
	if p, err := ss.Put(keys, valuesFor(keys, 100), true, codes, nil, rec, 0); !p || err != nil {
		t.Fatalf("put: %v %v", p, err)
	}
	start := time.Now()
	err := e.s.Close()
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Close with I/O stuck: %v after %v", err, time.Since(start))
	}
	if b := e.pool.Stats().Blocks; b != 2 {
		t.Fatalf("%d pool blocks, want the 2 still in flight kept", b)
	}
	// The device answers at last: the puts end, StoreDone is called once.
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	<-rec.done
	if rec.count(0) != 1 {
		t.Fatal("StoreDone not called once")
	}
	// What Close kept, this test gives back (the process would keep it).
	s := e.s
	e.s = nil
	if err := s.l2.closeNow(); err != nil {
		t.Fatal(err)
	}
	s.pool.Release()
	for _, c := range codes {
		if c != OK {
			t.Logf("a put that completed after Close: %v", c)
		}
	}
	ss.Close()
}
