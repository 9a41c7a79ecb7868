package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestStress runs every call at once from several goroutines over a small
// key space, with L2 completions arriving on another goroutine, some of
// them failing, and eviction racing everything; then the bookkeeping must
// check out and every value read must have been the one put.
func TestStress(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(64<<20), withCfg(func(c *Config) {
		c.L1Capacity = 4 << 20
		c.WritebackRetries = 1
		c.IODepth = 32
		c.WritebackDepth = 4
		c.MaxSessionPinned = 128 << 10 // a bound the sessions' pins and leases reach
	}))
	var failOn atomic.Bool
	var rnd sync.Mutex
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	kick := make(chan struct{}, 1)
	e.tr.Update(func(c *xfertest.Config) {
		c.Inline = false
		c.AfterSubmit = func() {
			select {
			case kick <- struct{}{}:
			default:
			}
		}
		c.Err = func(*xfer.Task) error {
			rnd.Lock()
			defer rnd.Unlock()
			if failOn.Load() && r.IntN(20) == 0 {
				return errInjected
			}
			return nil
		}
	})
	stopRel := make(chan struct{})
	relDone := make(chan struct{})
	go func() { // the transport's completion goroutine
		defer close(relDone)
		for {
			select {
			case <-kick:
				e.tr.release()
			case <-stopRel:
				e.tr.release()
				return
			}
		}
	}()
	failOn.Store(true)

	keys := keysN("st", 48)
	size := func(k []byte) int { return 500 + int(k[len(k)-1])*300 }
	var wg sync.WaitGroup
	var badBytes atomic.Int32
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss := e.s.NewSession()
			defer ss.Close()
			rr := rand.New(rand.NewPCG(seed+uint64(g), 9))
			pick := func(n int) [][]byte {
				out := make([][]byte, n)
				for i := range out {
					out[i] = keys[rr.IntN(len(keys))]
				}
				return out
			}
			for range 600 {
				ks := pick(1 + rr.IntN(6))
				n := len(ks)
				codes, errs := make([]Code, n), make([]error, n)
				switch op := rr.IntN(10); op {
				case 0, 1:
					vals := make([][]byte, n)
					for i, k := range ks {
						vals[i] = valueFor(k, size(k))
					}
					ss.Put(ks, vals, op == 1, codes, errs, nil, 0)
				case 2:
					sizes := make([]uint64, n)
					for i, k := range ks {
						sizes[i] = uint64(size(k))
					}
					locs := make([]Location, n)
					if err := ss.Reserve(ks, sizes, locs, codes, errs); err != nil {
						t.Error(err)
					}
					for i, l := range locs {
						if codes[i] == OK {
							copy(e.pool.Bytes()[l.Offset:], valueFor(ks[i], size(ks[i])))
						}
					}
					ss.Commit(ks, rr.IntN(2) == 0, codes, errs, nil, 0)
				case 3, 4:
					locs := make([]Location, n)
					ss.Get(ks, locs, codes, errs, nil, 0)
					for i, l := range locs {
						if codes[i] == OK && !bytes.Equal(e.pool.Bytes()[l.Offset:l.Offset+l.Length], valueFor(ks[i], size(ks[i]))) {
							badBytes.Add(1)
						}
					}
					var pinned [][]byte
					for i := range ks {
						if codes[i] == OK {
							pinned = append(pinned, ks[i])
						}
					}
					if len(pinned) > 0 {
						if err := ss.Unpin(pinned, make([]Code, len(pinned))); err != nil {
							t.Errorf("unpin after get: %v", err)
						}
					}
				case 5:
					dsts := make([][]byte, n)
					for i := range dsts {
						dsts[i] = make([]byte, 64<<10)
					}
					lens := make([]uint64, n)
					e.s.Read(ks, dsts, lens, codes, errs, nil, 0)
					for i := range ks {
						if codes[i] == OK && !bytes.Equal(dsts[i][:lens[i]], valueFor(ks[i], size(ks[i]))) {
							badBytes.Add(1)
						}
					}
				case 6:
					e.s.Remove(ks, codes, errs, nil, 0)
				case 7:
					if m, _ := ss.LookupPrefix(ks, true); m > 0 {
						if err := ss.Unpin(ks[:m], codes[:m]); err != nil {
							t.Errorf("unpin after lookup: %v", err)
						}
					}
				case 8:
					if ss.Pin(ks, time.Duration(1+rr.IntN(3))*time.Second, codes) == nil && rr.IntN(2) == 0 {
						e.clk.Advance(time.Second)
					}
				case 9:
					e.s.evict(uint64(rr.IntN(1<<20)), 64)
					e.s.Exists(ks, codes)
				}
				for i, c := range codes {
					if c == Internal && !isInjected(errs[i]) {
						t.Errorf("unexpected INTERNAL: %v", errs[i])
					}
				}
			}
			if _, err := ss.pinned(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	failOn.Store(false)
	// A write that failed by injection schedules its retry on the fake
	// clock when it ends: wait until every I/O has ended, or a retry
	// scheduled after the advance below would wait for a clock no one
	// moves again, and Flush with it.
	e.waitFor("the I/O under injected failures to end", func() bool { return e.s.Stats().IOInFlight == 0 })
	e.clk.Advance(time.Hour) // expire every lease, run every retry
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	e.waitFor("nothing in flight", func() bool { return e.s.Stats().IOInFlight == 0 })
	close(stopRel)
	<-relDone
	if n := badBytes.Load(); n != 0 {
		t.Fatalf("%d reads returned bytes that were not the value put", n)
	}
	e.s.check(t)
	st := e.s.Stats()
	if st.Pins != 0 || st.TransportViolations != 0 || st.FreeErrors != 0 {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("stats: %+v", st)
	e.tr.Update(func(c *xfertest.Config) { c.Inline, c.AfterSubmit, c.Err = true, nil, nil })
	e.reopen()
	e.s.check(t)
	// What is on L2 reads back intact after the restart.
	dsts := [][]byte{make([]byte, 64<<10)}
	lens := []uint64{0}
	codes := []Code{OK}
	for _, k := range keys {
		if _, err := e.s.Read([][]byte{k}, dsts, lens, codes, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
		if codes[0] == OK && !bytes.Equal(dsts[0][:lens[0]], valueFor(k, size(k))) {
			t.Fatalf("%s: wrong bytes after restart", k)
		}
	}
	e.s.check(t)
}

func isInjected(err error) bool {
	return err != nil && (fmt.Sprint(err) == errInjected.Error() || containsErr(err, errInjected))
}

func containsErr(err, target error) bool {
	for err != nil {
		if err == target {
			return true
		}
		switch x := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if containsErr(e, target) {
					return true
				}
			}
			return false
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		default:
			return false
		}
	}
	return false
}
