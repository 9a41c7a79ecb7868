package store

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// fakeRemote is the other hosts as a store sees them: values they hold
// (others), what this store announced and removed. Fetch stores a value
// here as the store across hosts does, through a session of its own, on a
// goroutine of its own.
type fakeRemote struct {
	s      *Store
	others map[string][]byte
	// mu guards the fields below.
	mu       sync.Mutex
	stored   map[string]uint32 // key → crc announced
	removed  []string
	evicted  []string
	fetching sync.WaitGroup
	// landed, when set, runs after a fetched value is stored here and
	// before its fetch is answered.
	landed func(key []byte)
	// unseen are the fetched copies announced unseen (key → record); with
	// keepUnseen they stay so, else each is confirmed at once, as a home
	// that took its announcement would have it.
	unseen     map[string]RecordID
	keepUnseen bool
	// removeErr: what Removed answers for a key whose other copies may
	// remain.
	removeErr map[string]error
}

func (r *fakeRemote) Stored(key []byte, size uint64, crc uint32, _ bool, unseen RecordID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stored[string(key)] = crc
	if unseen != 0 {
		if r.unseen == nil {
			r.unseen = map[string]RecordID{}
		}
		r.unseen[string(key)] = unseen
	}
}

func (r *fakeRemote) Evicted(key []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evicted = append(r.evicted, string(key))
}

func (r *fakeRemote) Removed(keys [][]byte, errs []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range keys {
		r.removed = append(r.removed, string(k))
		if err := r.removeErr[string(k)]; err != nil {
			errs[i] = err
		}
	}
}

func (r *fakeRemote) Fetch(keys [][]byte, done func(int, error)) {
	r.fetching.Add(1)
	go func() {
		defer r.fetching.Done()
		ss := r.s.NewSession()
		defer ss.Close()
		for i, k := range keys {
			v, ok := r.others[string(k)]
			if !ok {
				done(i, fmt.Errorf("%w: nobody holds it", ErrNotFound))
				continue
			}
			locs, codes := make([]Location, 1), make([]Code, 1)
			if err := ss.Reserve([][]byte{k}, []uint64{uint64(len(v))}, locs, codes, nil); err != nil || codes[0] != OK {
				done(i, fmt.Errorf("reserve: %v %v", err, codes[0]))
				continue
			}
			copy(r.s.poolMem[locs[0].Offset:], v)
			if err := ss.CommitFetched([][]byte{k}, []uint32{CRC(v)}, codes, nil); err != nil || codes[0] != OK {
				done(i, fmt.Errorf("commit: %v %v", err, codes[0]))
				continue
			}
			r.mu.Lock()
			id, keep := r.unseen[string(k)], r.keepUnseen
			r.mu.Unlock()
			if !keep {
				r.s.Confirm([][]byte{k}, []RecordID{id})
			}
			if r.landed != nil {
				r.landed(k)
			}
			done(i, nil)
		}
	}()
}

func (r *fakeRemote) Present(keys [][]byte, found []bool) {
	for i, k := range keys {
		if _, ok := r.others[string(k)]; ok && !found[i] {
			found[i] = true
		}
	}
}

func (r *fakeRemote) SizeOf(key []byte) (uint64, bool) {
	v, ok := r.others[string(key)]
	return uint64(len(v)), ok
}

// TestRemote: with a Remote, the store announces what becomes visible
// (with its crc32c), answers a local miss with the value the Remote
// fetched (pinned in place for Get, copied for Read), counts other hosts'
// keys in Exists, LookupPrefix and Stat, and has a Remove remove the other
// copies; GetHere and RemoveHere stay on this host. Without one, nothing
// of this happens.
func TestRemote(t *testing.T) {
	e := newEnv(t, 8<<20)
	s := e.s
	r := &fakeRemote{s: s, stored: map[string]uint32{}, others: map[string][]byte{
		"far/1": bytes.Repeat([]byte{1}, 5000), "far/2": bytes.Repeat([]byte{2}, 70000), "far/3": {3},
	}}
	ss := s.NewSession()
	defer ss.Close()
	codes := make([]Code, 3)
	if _, err := ss.Put([][]byte{[]byte("near")}, [][]byte{[]byte("value")}, false, codes[:1], nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("put without a remote: %v %v", err, codes[0])
	}
	if len(r.stored) != 0 {
		t.Fatal("announced with no Remote set")
	}
	locs := make([]Location, 1)
	if _, err := ss.Get([][]byte{[]byte("far/1")}, locs, codes[:1], nil, nil, 0); err != nil || codes[0] != NotFound {
		t.Fatalf("get of another host's key with no Remote: %v %v", err, codes[0])
	}

	s.SetRemote(r)
	if _, err := ss.Put([][]byte{[]byte("near/2")}, [][]byte{[]byte("value 2")}, false, codes[:1], nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("put: %v %v", err, codes[0])
	}
	if crc, ok := r.stored["near/2"]; !ok || crc != CRC([]byte("value 2")) {
		t.Fatalf("announced %v: crc %#x, want %#x", ok, crc, CRC([]byte("value 2")))
	}

	// Exists, LookupPrefix (the run goes on past the keys here) and Stat.
	keys := [][]byte{[]byte("near"), []byte("far/2"), []byte("absent")}
	if err := s.Exists(keys, codes); err != nil || codes[0] != OK || codes[1] != OK || codes[2] != NotFound {
		t.Fatalf("exists: %v %v", err, codes)
	}
	if n, err := ss.LookupPrefix(keys, false); err != nil || n != 2 {
		t.Fatalf("lookup_prefix: %d %v, want 2", n, err)
	}
	if k, err := s.Stat([]byte("far/2")); err != nil || k.Size != 70000 || k.InL1 || k.InL2 {
		t.Fatalf("stat of another host's key: %+v %v", k, err)
	}
	if s.Stats().Keys != 2 {
		t.Fatalf("%d keys here: Exists, LookupPrefix or Stat fetched something", s.Stats().Keys)
	}

	// Get: fetched, then pinned in place like a local hit; a miss is a miss.
	gk := [][]byte{[]byte("far/1"), []byte("near"), []byte("absent")}
	glocs := make([]Location, 3)
	if _, err := ss.Get(gk, glocs, codes, nil, nil, 0); err != nil || codes[0] != OK || codes[1] != OK || codes[2] != NotFound {
		t.Fatalf("get: %v %v", err, codes)
	}
	if got := s.poolMem[glocs[0].Offset : glocs[0].Offset+glocs[0].Length]; !bytes.Equal(got, r.others["far/1"]) {
		t.Fatalf("far/1 in place: %d bytes, not the value", len(got))
	}
	if st := s.Stats(); st.Pins != 2 || st.Keys != 3 {
		t.Fatalf("after the get: %d pins, %d keys", st.Pins, st.Keys)
	}
	// Read copies.
	dst := make([]byte, 70000)
	lens := make([]uint64, 1)
	if _, err := s.Read([][]byte{[]byte("far/2")}, [][]byte{dst}, lens, codes[:1], nil, nil, 0); err != nil || codes[0] != OK ||
		lens[0] != 70000 || !bytes.Equal(dst, r.others["far/2"]) {
		t.Fatalf("read: %v %v %d", err, codes[0], lens[0])
	}
	// LookupPrefix with pin fetches the run and pins it here.
	if n, err := ss.LookupPrefix([][]byte{[]byte("far/3"), []byte("absent")}, true); err != nil || n != 1 {
		t.Fatalf("lookup_prefix with pin: %d %v", n, err)
	}
	if st := s.Stats(); st.Pins != 3 {
		t.Fatalf("%d pins after lookup_prefix with pin, want 3", st.Pins)
	}
	// GetHere does not fetch.
	delete(r.others, "far/9")
	r.others["far/9"] = []byte("x")
	if err := ss.GetHere([][]byte{[]byte("far/9")}, locs, codes[:1], nil); err != nil || codes[0] != NotFound {
		t.Fatalf("GetHere of another host's key: %v %v", err, codes[0])
	}
	// Remove removes the other copies too; RemoveHere does not ask.
	if _, err := s.Remove([][]byte{[]byte("near/2"), []byte("absent")}, codes[:2], nil, nil, 0); err != nil || codes[0] != OK || codes[1] != OK {
		t.Fatalf("remove: %v %v", err, codes[:2])
	}
	// A removal from elsewhere of a key pinned here hides it (hide.go).
	if err := s.RemoveHere([][]byte{[]byte("near")}, codes[:1], nil); err != nil || codes[0] != OK {
		t.Fatalf("RemoveHere of a pinned key: %v %v", err, codes[0])
	}
	if err := s.Exists([][]byte{[]byte("near")}, codes[:1]); err != nil || codes[0] != NotFound {
		t.Fatalf("exists of a pinned key removed from elsewhere: %v %v", err, codes[0])
	}
	r.fetching.Wait()
	if fmt.Sprint(r.removed) != "[near/2 absent]" {
		t.Fatalf("removed elsewhere %v, want [near/2 absent]", r.removed)
	}
	// Each record removed here, by either call, is news to its home like
	// an eviction (the absent key had none).
	r.mu.Lock()
	if fmt.Sprint(r.evicted) != "[near/2 near]" {
		t.Fatalf("told gone after the removals: %v, want [near/2 near]", r.evicted)
	}
	r.evicted = nil
	r.mu.Unlock()
	// Evicted values (here with no L2: gone) are told too; "near", hidden,
	// went with the session's pins, never evicted.
	if err := ss.Close(); err != nil {
		t.Fatal(err)
	}
	s.evict(1<<30, 1<<20)
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := s.Stats(); st.Keys != 0 || st.Hidden != 0 || len(r.evicted) != 3 {
		t.Fatalf("evicted %v, %d keys left, %d hidden", r.evicted, st.Keys, st.Hidden)
	}
}

// TestFetchedThenEvicted: a value fetched from another host that the store
// evicts to L2 before the fetch is answered is promoted for the caller, as
// any key on L2 is: a Get pins it and a Read copies it, never BUSY (the
// eviction is the store's own doing).
func TestFetchedThenEvicted(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	s := e.s
	vals := map[string][]byte{"far/a": bytes.Repeat([]byte{0xa}, 5000), "far/b": bytes.Repeat([]byte{0xb}, 70000)}
	r := &fakeRemote{s: s, stored: map[string]uint32{}, others: vals}
	r.landed = func([]byte) {
		if err := s.Flush(flushWait); err != nil {
			t.Errorf("flush: %v", err)
		}
		s.evict(1<<62, 1<<20)
	}
	s.SetRemote(r)
	defer r.fetching.Wait()
	ss := s.NewSession()
	defer ss.Close()

	keys := [][]byte{[]byte("far/a")}
	locs, codes, errs := e.get(ss, keys)
	if codes[0] != OK || errs[0] != nil {
		t.Fatalf("get of a fetched value evicted before the answer: %v %v", codes[0], errs[0])
	}
	if got := e.pool.Bytes()[locs[0].Offset : locs[0].Offset+locs[0].Length]; !bytes.Equal(got, vals["far/a"]) {
		t.Fatalf("get: %d bytes, not the value", len(got))
	}
	if st := s.Stats(); st.Pins != 1 || st.Promotions < 1 {
		t.Fatalf("after the get: %+v", st)
	}

	dst := make([]byte, 70000)
	lens, rcodes, rerrs := make([]uint64, 1), make([]Code, 1), make([]error, 1)
	if _, err := s.Read([][]byte{[]byte("far/b")}, [][]byte{dst}, lens, rcodes, rerrs, nil, 0); err != nil {
		t.Fatal(err)
	}
	if rcodes[0] != OK || rerrs[0] != nil || lens[0] != 70000 || !bytes.Equal(dst, vals["far/b"]) {
		t.Fatalf("read of a fetched value evicted before the answer: %v %v len %d", rcodes[0], rerrs[0], lens[0])
	}
}

// TestRecheckQueuesWhatChanged: of values a re-announcement walk read
// (Holdings), Recheck tells the Remote again only those whose record
// changed since: gone (Evicted) for one removed, the record stored now
// (Stored, its crc) for one put again; one unchanged is not told again.
func TestRecheckQueuesWhatChanged(t *testing.T) {
	e := newEnv(t, 8<<20)
	s := e.s
	r := &fakeRemote{s: s, stored: map[string]uint32{}, others: map[string][]byte{}}
	s.SetRemote(r)
	ss := s.NewSession()
	defer ss.Close()
	put := func(k, v string) {
		t.Helper()
		codes := make([]Code, 1)
		if _, err := ss.Put([][]byte{[]byte(k)}, [][]byte{[]byte(v)}, false, codes, nil, nil, 0); err != nil || codes[0] != OK {
			t.Fatalf("put %s: %v %v", k, err, codes[0])
		}
	}
	for _, k := range []string{"same", "removed", "again"} {
		put(k, k+" 1")
	}
	var held []Held
	for i := range s.IndexShards() {
		held = s.Holdings(i, func([]byte) bool { return true }, held)
	}
	if len(held) != 3 {
		t.Fatalf("holdings: %d values, want 3", len(held))
	}
	codes := make([]Code, 1)
	for _, k := range []string{"removed", "again"} {
		if _, err := s.Remove([][]byte{[]byte(k)}, codes, nil, nil, 0); err != nil || codes[0] != OK {
			t.Fatalf("remove %s: %v %v", k, err, codes[0])
		}
	}
	put("again", "again 2")
	for k, want := range map[string]bool{"same": true, "removed": false, "again": true, "never": false} {
		if got := s.HeldHere([]byte(k)); got != want {
			t.Errorf("HeldHere(%s) = %v, want %v", k, got, want)
		}
	}
	r.mu.Lock()
	r.evicted, r.stored = nil, map[string]uint32{}
	r.mu.Unlock()
	s.Recheck(held)
	r.mu.Lock()
	defer r.mu.Unlock()
	if fmt.Sprint(r.evicted) != "[removed]" {
		t.Errorf("told gone: %v, want [removed]", r.evicted)
	}
	if len(r.stored) != 1 || r.stored["again"] != CRC([]byte("again 2")) {
		t.Errorf("told stored: %v, want again with the crc of its new value %#x", r.stored, CRC([]byte("again 2")))
	}
}

// TestRemoveElsewhereErrorOutlastsL2: a key removed here whose other
// copies may remain (the Remote says so) is not OK, also when its removal
// here waited for L2 (its header overwritten) and ended OK after the other
// hosts answered; blocking and with a Completion.
func TestRemoveElsewhereErrorOutlastsL2(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	errKept := xfer.Categorized(xfer.ErrUnavailable, "test: a copy elsewhere kept")
	r := &fakeRemote{s: e.s, stored: map[string]uint32{}, others: map[string][]byte{}, removeErr: map[string]error{}}
	e.s.SetRemote(r)
	ss := e.s.NewSession()
	keys := keysN("kept", 4)
	mustCodes(t, "durable put", e.put(ss, keys, valuesFor(keys, 100), true), OK, OK, OK, OK)
	ss.Close()
	r.mu.Lock()
	r.removeErr[string(keys[1])], r.removeErr[string(keys[3])] = errKept, errKept
	r.mu.Unlock()

	codes, errs := make([]Code, 2), make([]error, 2)
	if pending, err := e.s.Remove(keys[:2], codes, errs, nil, 0); pending || err != nil {
		t.Fatalf("remove: pending %v, %v", pending, err)
	}
	mustCodes(t, "blocking remove, the second key's copies elsewhere kept", codes, OK, Unavailable)
	if !errors.Is(errs[1], errKept) {
		t.Fatalf("the kept key's error: %v", errs[1])
	}

	// The invalidations held, so that the call is pending and ends on
	// the transport's completion.
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	rec := newRecorder()
	if pending, err := e.s.Remove(keys[2:], codes, errs, rec, 7); !pending || err != nil {
		t.Fatalf("remove with its invalidations held: pending %v, %v", pending, err)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	if tag := <-rec.done; tag != 7 || rec.count(7) != 1 {
		t.Fatalf("StoreDone(%d), %d times", tag, rec.count(7))
	}
	mustCodes(t, "remove with a Completion, the second key's copies elsewhere kept", codes, OK, Unavailable)
	if !errors.Is(errs[1], errKept) {
		t.Fatalf("the kept key's error: %v", errs[1])
	}
	mustCodes(t, "gone here all the same", e.exists(keys), NotFound, NotFound, NotFound, NotFound)
}

// TestLookupPrefixAsync: the run stored here is answered at once, with no
// completion; a run that goes on past it is answered through the
// completion, once, with other hosts' keys counted and, with pin, fetched
// here and pinned; with no Remote nothing goes pending.
func TestLookupPrefixAsync(t *testing.T) {
	e := newEnv(t, 8<<20)
	s := e.s
	ss := s.NewSession()
	defer ss.Close()
	codes := make([]Code, 1)
	if _, err := ss.Put([][]byte{[]byte("near")}, [][]byte{[]byte("value")}, false, codes, nil, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("put: %v %v", err, codes[0])
	}
	rec := newRecorder()
	var res PrefixResult
	chain := [][]byte{[]byte("near"), []byte("far/1"), []byte("absent")}
	if n, pending, err := ss.LookupPrefixAsync(chain, false, &res, rec, 1); err != nil || pending || n != 1 {
		t.Fatalf("with no Remote: %d pending %v %v, want 1 answered at once", n, pending, err)
	}
	r := &fakeRemote{s: s, stored: map[string]uint32{}, others: map[string][]byte{"far/1": bytes.Repeat([]byte{1}, 5000)}}
	s.SetRemote(r)
	if n, pending, err := ss.LookupPrefixAsync(chain[:1], true, &res, rec, 2); err != nil || pending || n != 1 {
		t.Fatalf("a run all here: %d pending %v %v, want 1 answered at once", n, pending, err)
	}
	for i, pin := range []bool{false, true} {
		tag := uint64(3 + i)
		n, pending, err := ss.LookupPrefixAsync(chain, pin, &res, rec, tag)
		if err != nil || !pending || n != 1 {
			t.Fatalf("pin %v: %d pending %v %v, want the run here (1) and pending", pin, n, pending, err)
		}
		select {
		case got := <-rec.done:
			if got != tag {
				t.Fatalf("pin %v: completion of %d, want %d", pin, got, tag)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("pin %v: no completion within 10s", pin)
		}
		if res.N != 2 || res.Err != nil || rec.count(tag) != 1 {
			t.Fatalf("pin %v: %+v, %d completions, want a run of 2 once", pin, res, rec.count(tag))
		}
	}
	r.fetching.Wait()
	// near pinned twice (the run here of the two lookups with pin), far/1
	// fetched and pinned once.
	if st := s.Stats(); st.Pins != 3 || st.Keys != 2 {
		t.Fatalf("after the lookups with pin: %d pins, %d keys, want 3 and 2", st.Pins, st.Keys)
	}
}

// TestHoldingsOnL2: a re-announcement walk reads a durable value as on
// L2 while it is still in L1 too, as its commit announced it (a durable
// copy re-announced as memory-only would lower its home's record). (A
// value put without durable may reach L2 by writeback at any time, so
// its tier is not asserted.)
func TestHoldingsOnL2(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	s := e.s
	ss := s.NewSession()
	defer ss.Close()
	codes := make([]Code, 1)
	for k, durable := range map[string]bool{"durable": true, "memory": false} {
		if _, err := ss.Put([][]byte{[]byte(k)}, [][]byte{[]byte(k + " value")}, durable, codes, nil, nil, 0); err != nil || codes[0] != OK {
			t.Fatalf("put %s: %v %v", k, err, codes[0])
		}
	}
	got := map[string]bool{}
	var held []Held
	for i := range s.IndexShards() {
		held = s.Holdings(i, func([]byte) bool { return true }, held[:0])
		for _, h := range held {
			got[string(h.Key)] = h.OnL2
		}
	}
	if len(got) != 2 || !got["durable"] {
		t.Fatalf("holdings on L2: %v, want both, durable on L2", got)
	}
	if ki, err := s.Stat([]byte("durable")); err != nil || !ki.InL1 || !ki.InL2 {
		t.Fatalf("the durable value: %+v %v, want in L1 and on L2 (else the case reads nothing)", ki, err)
	}
}
