package store

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The store's own writeback may hold three quarters of the L2 task table;
// a caller's key that then finds no free task waits for one (wait.go)
// instead of answering BUSY.

// waitDepth is the task table of these tests: writeback takes 6 of its 8
// tasks, a caller's keys the other 2.
const waitDepth = 8

func withWaitDepth() envOpt {
	return withCfg(func(c *Config) { c.IODepth, c.WritebackDepth = waitDepth, 64 })
}

// returns runs call on another goroutine and fails the test if it does not
// return: a call with a Completion must never block, whatever the device
// does (a queue worker makes it).
func returns(t *testing.T, what string, call func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s blocked (it has a Completion)", what)
	}
}

// holdWriteback holds every value write and puts n values without
// durable, whose writebacks then hold as many tasks as background work may
// take; it returns once they do.
func (e *testEnv) holdWriteback(prefix string, n int) {
	e.t.Helper()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = isValueWrite })
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN(prefix, n)
	mustCodes(e.t, "writeback puts", e.put(ss, keys, valuesFor(keys, 5000), false), OK)
	want := waitDepth - waitDepth/4
	for e.tr.Held() < want {
		select {
		case <-e.tr.Holding(): // after a Submit that held tasks
		case <-time.After(10 * time.Second):
			e.t.Fatalf("writeback holds %d tasks, want %d", e.tr.Held(), want)
		}
	}
	if h := e.tr.Held(); h != want {
		e.t.Fatalf("writeback holds %d tasks, want %d", h, want)
	}
}

// reserveWrite reserves keys for ss and writes vals in place.
func (e *testEnv) reserveWrite(ss *Session, keys, vals [][]byte) {
	e.t.Helper()
	n := len(keys)
	sizes := make([]uint64, n)
	for i := range vals {
		sizes[i] = uint64(len(vals[i]))
	}
	locs := make([]Location, n)
	codes := make([]Code, n)
	if err := ss.Reserve(keys, sizes, locs, codes, nil); err != nil {
		e.t.Fatal(err)
	}
	mustCodes(e.t, "reserve", codes, OK)
	for i, l := range locs {
		copy(e.pool.Bytes()[l.Offset:], vals[i])
	}
}

// releaser carries out every held task as soon as it is held, until the
// returned stop is called.
func (e *testEnv) releaser() (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.tr.release()
		for {
			select {
			case <-e.tr.Holding():
				e.tr.release()
			case <-quit:
				return
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

// asyncCall is one call made with a Completion.
type asyncCall struct {
	what  string
	codes []Code
	errs  []error
	rec   *recorder
	wait  bool // pending: StoreDone is owed
}

func newAsync(what string, n int) *asyncCall {
	return &asyncCall{what: what, codes: make([]Code, n), errs: make([]error, n), rec: newRecorder()}
}

func (a *asyncCall) end(t *testing.T) {
	t.Helper()
	if a.wait {
		select {
		case <-a.rec.done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no StoreDone", a.what)
		}
	}
}

// TestDurableWaitsForTask: with writeback holding three quarters of the L2
// tasks and the device slow, durable Puts and Commits from several
// sessions (with a Completion and blocking), promotions for Get and Read,
// and Removes of keys on L2 never see BUSY: their keys wait for tasks,
// first come first served, and all end OK. The values read back
// byte-exact from L2, and the removed keys are gone after a restart.
func TestDurableWaitsForTask(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withWaitDepth())
	ss := e.s.NewSession()
	onL2 := keysN("l2-", 12) // read, got and removed while writeback holds the tasks
	mustCodes(t, "durable puts", e.put(ss, onL2, valuesFor(onL2, 7000), true), OK)
	ss.Close()
	e.dropL1()
	e.holdWriteback("wb-", 40)

	const n = 5
	var calls []*asyncCall
	var durable [][]byte // keys put or committed durably, with their values
	var vals [][]byte
	async := func(what string, call func(a *asyncCall) (bool, error)) {
		a := newAsync(what, n)
		returns(t, what, func() {
			var err error
			if a.wait, err = call(a); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
		calls = append(calls, a)
	}
	var blocking sync.WaitGroup
	var mu sync.Mutex
	var blockingCodes [][]Code
	block := func(call func(codes []Code, errs []error) error) {
		blocking.Add(1)
		go func() {
			defer blocking.Done()
			codes, errs := make([]Code, n), make([]error, n)
			if err := call(codes, errs); err != nil {
				t.Error(err)
			}
			for i, c := range codes {
				if c != OK {
					t.Errorf("blocking call: key %d: %v (%v)", i, c, errs[i])
				}
			}
			mu.Lock()
			blockingCodes = append(blockingCodes, codes)
			mu.Unlock()
		}()
	}
	for s := range 3 {
		pk := keysN(fmt.Sprintf("put%d-", s), n)
		pv := valuesFor(pk, 5000+s)
		ck := keysN(fmt.Sprintf("commit%d-", s), n)
		cv := valuesFor(ck, 6000+s)
		durable, vals = append(durable, pk...), append(vals, pv...)
		durable, vals = append(durable, ck...), append(vals, cv...)
		ss := e.s.NewSession()
		defer ss.Close()
		e.reserveWrite(ss, ck, cv)
		if s == 2 {
			block(func(codes []Code, errs []error) error {
				_, err := ss.Put(pk, pv, true, codes, errs, nil, 0)
				return err
			})
			block(func(codes []Code, errs []error) error {
				_, err := ss.Commit(ck, true, codes, errs, nil, 0)
				return err
			})
			continue
		}
		async("put", func(a *asyncCall) (bool, error) { return ss.Put(pk, pv, true, a.codes, a.errs, a.rec, 1) })
		async("commit", func(a *asyncCall) (bool, error) { return ss.Commit(ck, true, a.codes, a.errs, a.rec, 2) })
	}
	getter := e.s.NewSession()
	defer getter.Close()
	locs := make([]Location, n)
	async("get", func(a *asyncCall) (bool, error) { return getter.Get(onL2[:n], locs, a.codes, a.errs, a.rec, 3) })
	dsts := make([][]byte, n)
	for i := range dsts {
		dsts[i] = make([]byte, 8000)
	}
	lens := make([]uint64, n)
	async("read", func(a *asyncCall) (bool, error) { return e.s.Read(onL2[n:2*n], dsts, lens, a.codes, a.errs, a.rec, 4) })
	// The same keys again: served after the first read's promotions, it
	// joins one in flight or finds the value in L1.
	dsts2 := make([][]byte, n)
	for i := range dsts2 {
		dsts2[i] = make([]byte, 8000)
	}
	lens2 := make([]uint64, n)
	async("read again", func(a *asyncCall) (bool, error) {
		return e.s.Read(onL2[n:2*n], dsts2, lens2, a.codes, a.errs, a.rec, 6)
	})
	removed := onL2[2*n:]
	rm := newAsync("remove", len(removed))
	returns(t, "remove", func() {
		var err error
		if rm.wait, err = e.s.Remove(removed, rm.codes, rm.errs, rm.rec, 5); err != nil {
			t.Error(err)
		}
	})

	// Two keys got the two tasks writeback leaves; every other key waits.
	total := 6*n + 3*n + len(removed)
	answered := func() bool { // a key that did not wait: the check below says how it ended
		for _, a := range calls {
			for _, c := range a.codes {
				if c != OK {
					return true
				}
			}
		}
		return false
	}
	e.waitFor("every other key waiting for a task", func() bool { return e.s.Stats().IOWaiting == total-2 || answered() })
	for _, a := range calls {
		for i, c := range a.codes {
			if c != OK || !a.wait {
				t.Fatalf("%s: key %d: %v (%v), pending %v: a key waiting for a task is no caller's business", a.what, i, c, a.errs[i], a.wait)
			}
		}
	}

	stop := e.releaser()
	for _, a := range append(calls, rm) {
		a.end(t)
		for i, c := range a.codes {
			if c != OK {
				t.Errorf("%s: key %d: %v (%v)", a.what, i, c, a.errs[i])
			}
		}
	}
	blocking.Wait()
	if t.Failed() {
		t.FailNow()
	}
	want := valuesFor(onL2, 7000)
	for i, l := range locs {
		if got := e.pool.Bytes()[l.Offset : l.Offset+l.Length]; !bytes.Equal(got, want[i]) {
			t.Fatalf("get %s: wrong bytes", onL2[i])
		}
	}
	for i := range dsts {
		if !bytes.Equal(dsts[i][:lens[i]], want[n+i]) || !bytes.Equal(dsts2[i][:lens2[i]], want[n+i]) {
			t.Fatalf("read %s: wrong bytes", onL2[n+i])
		}
	}
	codes := make([]Code, n)
	if err := getter.Unpin(onL2[:n], codes); err != nil {
		t.Fatal(err)
	}
	st := e.s.Stats()
	if st.IOWaiting != 0 || st.IOWaits < uint64(total-2) || st.DurablePuts < uint64(len(durable)) {
		t.Fatalf("stats %+v", st)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	stop()
	e.tr.release() // what was held before Hold was cleared
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	// From L2, byte-exact, in this store and after a restart.
	e.dropL1()
	e.checkValues(durable, vals)
	e.reopen()
	e.checkValues(durable, vals)
	mustCodes(t, "removed, after a restart", e.exists(removed), NotFound)
}

// TestCloseEndsWaitingKeys: closing the store while callers' keys wait for
// an L2 task ends each of them with ErrClosed (UNAVAILABLE), as a failed
// I/O would: a commit's reservation, a put's block, a promotion's block and
// a Remove's key are as before the call, and nothing leaks (pool blocks,
// call records, tasks).
func TestCloseEndsWaitingKeys(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withWaitDepth())
	ss := e.s.NewSession()
	onL2 := keysN("l2-", 4)
	mustCodes(t, "durable puts", e.put(ss, onL2, valuesFor(onL2, 7000), true), OK)
	e.dropL1()
	e.holdWriteback("wb-", 40)

	// A durable put that takes the two tasks left, and holds them.
	first := newAsync("first", 2)
	fk := keysN("first-", 2)
	returns(t, "first put", func() {
		first.wait, _ = ss.Put(fk, valuesFor(fk, 5000), true, first.codes, first.errs, first.rec, 1)
	})
	const n = 3
	put := newAsync("put", n)
	pk := keysN("put-", n)
	returns(t, "put", func() { put.wait, _ = ss.Put(pk, valuesFor(pk, 5000), true, put.codes, put.errs, put.rec, 2) })
	committer := e.s.NewSession()
	ck := keysN("commit-", n)
	e.reserveWrite(committer, ck, valuesFor(ck, 6000))
	commit := newAsync("commit", n)
	returns(t, "commit", func() { commit.wait, _ = committer.Commit(ck, true, commit.codes, commit.errs, commit.rec, 3) })
	read := newAsync("read", 2)
	dsts := [][]byte{make([]byte, 8000), make([]byte, 8000)}
	returns(t, "read", func() {
		read.wait, _ = e.s.Read(onL2[:2], dsts, make([]uint64, 2), read.codes, read.errs, read.rec, 4)
	})
	rm := newAsync("remove", 2)
	returns(t, "remove", func() { rm.wait, _ = e.s.Remove(onL2[2:], rm.codes, rm.errs, rm.rec, 5) })
	bk := keysN("blocking-", n)
	blockCodes, blockErrs := make([]Code, n), make([]error, n)
	blocked := make(chan struct{})
	go func() {
		defer close(blocked)
		ss.Put(bk, valuesFor(bk, 5000), true, blockCodes, blockErrs, nil, 0)
	}()
	waiting := 2*n + 2 + 2 + n
	e.waitFor("the keys waiting for a task", func() bool { return e.s.Stats().IOWaiting == waiting })

	closed := make(chan error, 1)
	go func() { closed <- e.s.Close() }()
	for _, a := range []*asyncCall{put, commit, read, rm} {
		if !a.wait {
			t.Fatalf("%s: not pending: codes %v", a.what, a.codes)
		}
		a.end(t)
		for i, c := range a.codes {
			if c != Unavailable || !errors.Is(a.errs[i], ErrClosed) {
				t.Errorf("%s: key %d: %v (%v), want UNAVAILABLE (ErrClosed)", a.what, i, c, a.errs[i])
			}
		}
	}
	<-blocked
	for i, c := range blockCodes {
		if c != Unavailable || !errors.Is(blockErrs[i], ErrClosed) {
			t.Errorf("blocking put: key %d: %v (%v)", i, c, blockErrs[i])
		}
	}
	// The first put's I/O is in flight: Close waits for it.
	stop := e.releaser()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	stop()
	first.end(t)
	mustCodes(t, "the put in flight at Close", first.codes, OK, OK)
	if b := e.pool.Stats().Blocks; b != 0 {
		t.Fatalf("%d pool blocks still allocated after Close", b)
	}
	if n := e.s.calls.live.Load(); n != 0 {
		t.Fatalf("%d call records not given back", n)
	}
	if st := e.s.Stats(); st.IOWaiting != 0 || st.IOInFlight != 0 {
		t.Fatalf("stats after Close: %+v", st)
	}
	committer.Close()
	ss.Close()
	e.s = nil
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.open()
	mustCodes(t, "the put in flight at Close, after a restart", e.exists(fk), OK)
	mustCodes(t, "the keys that waited, after a restart", e.exists(append(append(pk, ck...), bk...)), NotFound)
	mustCodes(t, "the removes that waited, after a restart", e.exists(onL2), OK)
}

// isRegionHeaderWrite reports whether t writes a region header.
func isRegionHeaderWrite(t *xfer.Task) bool {
	if !isHeaderWrite(t) {
		return false
	}
	b := t.Local.(xfer.MemSegment).Bytes()[t.Req.LocalOffset:]
	return bytes.Equal(b[:8], magicRegion[:])
}

// TestRegionHeaderOwnTask: a batch of durable puts larger than the task
// table, into a slot size with no region yet, needs one task more than
// there are for the region's header; the first put writes it with its own
// task, then its value, and none of the puts answers BUSY. When that
// header write fails, the region is broken, the puts into it fail with the
// device's error (not BUSY) and leave nothing behind, and the next puts
// succeed.
func TestRegionHeaderOwnTask(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withCfg(func(c *Config) { c.IODepth = 4 }))
	ss := e.s.NewSession()
	defer ss.Close()
	var regionWrites atomic.Int64
	fail := atomic.Bool{}
	fail.Store(true)
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(t *xfer.Task) error {
			if isRegionHeaderWrite(t) {
				regionWrites.Add(1)
				if fail.Load() {
					return errInjected
				}
			}
			return nil
		}
	})
	before := e.pool.Stats().Blocks
	keys := keysN("broken", 10)
	codes := e.put(ss, keys, valuesFor(keys, 3000), true)
	for i, c := range codes {
		if c == OK || c == Busy {
			t.Fatalf("key %d: %v, want the region header write's failure", i, c)
		}
	}
	if regionWrites.Load() == 0 {
		t.Fatal("no region header was written")
	}
	if st := e.s.Stats(); st.Keys != 0 || st.Reserved != 0 || st.IOInFlight != 0 || st.IOWaiting != 0 || st.L2Bytes != 0 {
		t.Fatalf("after the failed puts: %+v", st)
	}
	if b := e.pool.Stats().Blocks; b != before {
		t.Fatalf("pool blocks %d → %d", before, b)
	}
	fail.Store(false)
	keys = keysN("ok", 12)
	vals := valuesFor(keys, 3000)
	mustCodes(t, "durable puts", e.put(ss, keys, vals, true), OK)
	e.dropL1()
	e.checkValues(keys, vals)
	e.reopen()
	e.checkValues(keys, vals)
}

// TestSessionClosedWhileGetWaits: a Get whose promotion waits for a task
// when its session closes ends with ErrClosed once served: no pin is left
// behind and the block reserved for the promotion is freed.
func TestSessionClosedWhileGetWaits(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withWaitDepth())
	ss := e.s.NewSession()
	onL2 := keysN("l2-", 2)
	mustCodes(t, "durable puts", e.put(ss, onL2, valuesFor(onL2, 7000), true), OK)
	ss.Close()
	e.dropL1()
	e.holdWriteback("wb-", 40)
	filler := e.s.NewSession()
	defer filler.Close()
	first := newAsync("first", 2)
	fk := keysN("first-", 2)
	returns(t, "first put", func() {
		first.wait, _ = filler.Put(fk, valuesFor(fk, 5000), true, first.codes, first.errs, first.rec, 1)
	})
	getter := e.s.NewSession()
	get := newAsync("get", 2)
	locs := make([]Location, 2)
	returns(t, "get", func() { get.wait, _ = getter.Get(onL2, locs, get.codes, get.errs, get.rec, 2) })
	e.waitFor("the get's keys waiting", func() bool { return e.s.Stats().IOWaiting == 2 })
	blocks := e.pool.Stats().Blocks
	if err := getter.Close(); err != nil {
		t.Fatal(err)
	}
	stop := e.releaser()
	get.end(t)
	first.end(t)
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	stop()
	e.tr.release()
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "first put", first.codes, OK, OK)
	for i, c := range get.codes {
		if c != Unavailable || !errors.Is(get.errs[i], ErrClosed) {
			t.Fatalf("get of a closed session: key %d: %v (%v)", i, c, get.errs[i])
		}
	}
	if st := e.s.Stats(); st.Pins != 0 || st.IOWaiting != 0 || st.L1Keys != 40+2 {
		t.Fatalf("stats %+v", st)
	}
	// The two blocks reserved for the promotions are back; the first put's
	// two values stay.
	if b := e.pool.Stats().Blocks; b != blocks-2 {
		t.Fatalf("pool blocks %d, want %d", b, blocks-2)
	}
}

// TestWaitingKeysFirstComeFirstServed: keys that wait for a task get the
// freed tasks in the order they came, and all of them before writeback
// starts another value write.
func TestWaitingKeysFirstComeFirstServed(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20), withWaitDepth())
	const wbPrefix, wbKeys = "wb-", 40
	e.holdWriteback(wbPrefix, wbKeys)
	ss := e.s.NewSession()
	defer ss.Close()
	first := newAsync("first", 2)
	fk := keysN("first-", 2)
	returns(t, "first put", func() {
		first.wait, _ = ss.Put(fk, valuesFor(fk, 5000), true, first.codes, first.errs, first.rec, 1)
	})
	// Who each value write is for, by the first bytes of its value: the
	// writeback's keys (holdWriteback's values), the first put's, the
	// waiting calls'.
	names := map[string]string{}
	const prefix = 16
	for _, ks := range [][][]byte{keysN(wbPrefix, wbKeys), fk} {
		for i, v := range valuesFor(ks, 5000) {
			names[string(v[:prefix])] = string(ks[i])
		}
	}
	var order []string
	var mu sync.Mutex
	e.tr.Update(func(c *xfertest.Config) {
		c.OnSubmit = func(ts []*xfer.Task) {
			mu.Lock()
			defer mu.Unlock()
			for _, tk := range ts {
				if isValueWrite(tk) {
					b := tk.Local.(xfer.MemSegment).Bytes()[tk.Req.LocalOffset:]
					order = append(order, names[string(b[:prefix])])
				}
			}
		}
	})
	var calls []*asyncCall
	var want []string
	for c := range 4 {
		keys := keysN(fmt.Sprintf("c%d", c), 3)
		vals := valuesFor(keys, 5000)
		mu.Lock()
		for i, k := range keys {
			names[string(vals[i][:prefix])] = string(k)
			want = append(want, string(k))
		}
		mu.Unlock()
		a := newAsync(fmt.Sprintf("put %d", c), len(keys))
		returns(t, a.what, func() { a.wait, _ = ss.Put(keys, vals, true, a.codes, a.errs, a.rec, uint64(c)) })
		calls = append(calls, a)
	}
	e.waitFor("the keys waiting", func() bool { return e.s.Stats().IOWaiting == len(want) })
	stop := e.releaser()
	for _, a := range append(calls, first) {
		a.end(t)
		mustCodes(t, a.what, a.codes, OK)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	stop()
	e.tr.release()
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The waiting calls' keys are written in the order they asked, and
	// before any writeback: writeback gets no task while a key waits. The
	// first put's keys asked before them; one of them may have waited too
	// (a writeback's region header can hold the task it would have had for
	// a moment), and is then written among these, first as it came first.
	var got []string
	wbBefore, firstAfter := 0, 0
	for _, k := range order {
		switch {
		case strings.HasPrefix(k, wbPrefix) && len(got) < len(want):
			wbBefore++
		case strings.HasPrefix(k, "first") && len(got) > 0:
			firstAfter++
		case strings.HasPrefix(k, "c"):
			got = append(got, k)
		}
	}
	if !slices.Equal(got, want) || wbBefore > 0 || firstAfter > 0 {
		t.Fatalf("value writes in the order %q: the waiting keys' %q (want %q), %d writebacks before the last of them, "+
			"%d of the first put's after the first of them", order, got, want, wbBefore, firstAfter)
	}
}

// TestManyReadersOfOnePromotion: more readers of one L2-only key than a
// promotion's first waiter slots, each its own call, all wait for the one
// promotion and read it byte-exact; none gets BUSY.
func TestManyReadersOfOnePromotion(t *testing.T) {
	e := newEnv(t, 32<<20, withL2(64<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	key := keysN("hot", 1)
	val := valuesFor(key, 9000)
	mustCodes(t, "durable put", e.put(ss, key, val, true), OK)
	e.dropL1()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = func(t *xfer.Task) bool { return t.Req.Op == xfer.OpRead } })
	const readers = 10
	var calls []*asyncCall
	dsts := make([][]byte, readers)
	lens := make([][]uint64, readers)
	for r := range readers {
		a := newAsync(fmt.Sprintf("read %d", r), 1)
		dsts[r], lens[r] = make([]byte, 10000), make([]uint64, 1)
		returns(t, a.what, func() {
			a.wait, _ = e.s.Read(key, dsts[r:r+1], lens[r], a.codes, a.errs, a.rec, uint64(r))
		})
		if !a.wait {
			t.Fatalf("%s: %v (%v), not pending", a.what, a.codes, a.errs)
		}
		calls = append(calls, a)
	}
	if st := e.s.Stats(); st.IOInFlight != 1 {
		t.Fatalf("%d L2 operations in flight, want the one promotion", st.IOInFlight)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	for r, a := range calls {
		a.end(t)
		mustCodes(t, a.what, a.codes, OK)
		if !bytes.Equal(dsts[r][:lens[r][0]], val[0]) {
			t.Fatalf("%s: wrong bytes", a.what)
		}
	}
	if st := e.s.Stats(); st.Promotions != 1 || st.IOInFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestReadersOfOnePromotionPastIOCount: a key's I/O count is 16 bits, and
// every Read waiting for a promotion holds one of it while its copy is
// made. More waiting readers than it counts (one call of MaxKeysPerCall
// copies of a key, and another) must not wrap it: a reader past the count
// gets BUSY, the others their bytes, and once all have ended the key
// carries no I/O (a Remove then takes it; a wrapped count left it BUSY for
// good, or let eviction free the block under the copies).
func TestReadersOfOnePromotionPastIOCount(t *testing.T) {
	const many = 1 << 16
	e := newEnv(t, 32<<20, withL2(64<<20), withCfg(func(c *Config) { c.MaxKeysPerCall = many }))
	ss := e.s.NewSession()
	key := keysN("hot", 1)
	val := valuesFor(key, 100)
	mustCodes(t, "durable put", e.put(ss, key, val, true), OK)
	ss.Close()
	e.dropL1()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = func(t *xfer.Task) bool { return t.Req.Op == xfer.OpRead } })
	var calls []*asyncCall
	var dsts [][][]byte
	var lens [][]uint64
	for r, n := range []int{many, 1} {
		a := newAsync(fmt.Sprintf("read %d", r), n)
		keys := make([][]byte, n)
		d := make([][]byte, n)
		for i := range keys {
			keys[i], d[i] = key[0], make([]byte, len(val[0]))
		}
		l := make([]uint64, n)
		returns(t, a.what, func() {
			a.wait, _ = e.s.Read(keys, d, l, a.codes, a.errs, a.rec, uint64(r))
		})
		calls, dsts, lens = append(calls, a), append(dsts, d), append(lens, l)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	ok, busy := 0, 0
	for r, a := range calls {
		a.end(t)
		for i, c := range a.codes {
			switch c {
			case OK:
				ok++
				if !bytes.Equal(dsts[r][i][:lens[r][i]], val[0]) {
					t.Fatalf("%s, key %d: wrong bytes", a.what, i)
				}
			case Busy:
				busy++
			default:
				t.Fatalf("%s, key %d: %v (%v)", a.what, i, c, a.errs[i])
			}
		}
	}
	if ok == 0 || busy == 0 {
		t.Fatalf("%d reads OK, %d BUSY: want both", ok, busy)
	}
	codes := make([]Code, 1)
	errs := make([]error, 1)
	if _, err := e.s.Remove(key, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove after every reader ended", codes, OK)
	if st := e.s.Stats(); st.Keys != 0 || st.IOInFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// getPromoted is one Get of keys, values only on L2, that goes pending
// while their promotions' reads are held, and the end of it once they are
// let go.
func (e *testEnv) getPromoted(t *testing.T, ss *Session, keys [][]byte) *asyncCall {
	t.Helper()
	e.tr.Update(func(c *xfertest.Config) { c.Hold = func(t *xfer.Task) bool { return t.Req.Op == xfer.OpRead } })
	a := newAsync("get", len(keys))
	locs := make([]Location, len(keys))
	returns(t, a.what, func() {
		a.wait, _ = ss.Get(keys, locs, a.codes, a.errs, a.rec, 0)
	})
	if !a.wait {
		t.Fatalf("get: %v (%v), not pending", a.codes, a.errs)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Hold = nil })
	e.tr.release()
	a.end(t)
	return a
}

// TestGettersOfOnePromotionPastMaxPins: Gets that wait for one promotion
// are pinned when it ends, and no more of them than MaxPins allows: the
// others get RESOURCE_EXHAUSTED, as a Get of the value in L1 would, and
// the key carries exactly the pins its OK answers hold.
func TestGettersOfOnePromotionPastMaxPins(t *testing.T) {
	const maxPins = 2
	e := newEnv(t, 32<<20, withL2(64<<20), withCfg(func(c *Config) { c.MaxPins = maxPins }))
	ss := e.s.NewSession()
	defer ss.Close()
	key := keysN("hot", 1)
	mustCodes(t, "durable put", e.put(ss, key, valuesFor(key, 9000), true), OK)
	e.dropL1()
	a := e.getPromoted(t, ss, [][]byte{key[0], key[0], key[0], key[0]})
	ok := 0
	for i, c := range a.codes {
		switch c {
		case OK:
			ok++
		case ResourceExhausted:
		default:
			t.Fatalf("get %d: %v (%v)", i, c, a.errs[i])
		}
	}
	if st := e.s.Stats(); ok != maxPins || st.Pins != maxPins {
		t.Fatalf("%d gets pinned, %d pins held: want %d of each (codes %v)", ok, st.Pins, maxPins, a.codes)
	}
}
