package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

const flushWait = 10 * time.Second

func (e *testEnv) get(ss *Session, keys [][]byte) ([]Location, []Code, []error) {
	e.t.Helper()
	locs := make([]Location, len(keys))
	codes := make([]Code, len(keys))
	errs := make([]error, len(keys))
	if _, err := ss.Get(keys, locs, codes, errs, nil, 0); err != nil {
		e.t.Fatalf("Get: %v", err)
	}
	return locs, codes, errs
}

func (e *testEnv) dropL1() {
	e.t.Helper()
	e.s.evict(1<<62, 1<<20)
	if st := e.s.Stats(); st.L1Keys != 0 {
		e.t.Fatalf("%d keys still in L1 after evicting everything", st.L1Keys)
	}
}

// TestDurableRecover: durable puts are on L2 when acknowledged; a new
// store over the same file finds them all and reads back their bytes.
func TestDurableRecover(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("d", 40)
	vals := valuesFor(keys, 3000)
	vals[7] = valueFor(keys[7], 200<<10) // another slot size
	mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
	if st := e.s.Stats(); st.L2Keys != 40 || st.DurablePuts != 40 || st.Dirty != 0 {
		t.Fatalf("stats after durable put %+v", st)
	}
	ss.Close()
	e.reopen()
	st := e.s.Stats()
	if st.Recovered != 40 || st.Keys != 40 || st.L1Keys != 0 || st.TornDropped != 0 {
		t.Fatalf("stats after reopen %+v", st)
	}
	e.checkValues(keys, vals)
	if st := e.s.Stats(); st.Promotions != 40 || st.L1Keys != 40 {
		t.Fatalf("stats after read %+v", st)
	}
	// A durable put after recovery does not reuse a live slot.
	ss = e.s.NewSession()
	defer ss.Close()
	more := keysN("m", 10)
	mvals := valuesFor(more, 3000)
	mustCodes(t, "put more", e.put(ss, more, mvals, true), OK)
	e.reopen()
	e.checkValues(append(keys, more...), append(vals, mvals...))
}

// TestWritebackEvictPromote: a plain put is written back in the
// background; once on L2 it can leave L1, and a Get promotes it again
// straight into a pool block, pinned.
func TestWritebackEvictPromote(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("w", 20)
	vals := valuesFor(keys, 5000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	if st := e.s.Stats(); st.Writebacks != 20 || st.L2Keys != 20 || st.Dirty != 0 {
		t.Fatalf("after flush %+v", st)
	}
	e.dropL1()
	locs, codes, errs := e.get(ss, keys[:5])
	mustCodes(t, "get L2-only", codes, OK)
	for i, l := range locs {
		if errs[i] != nil || !bytes.Equal(e.pool.Bytes()[l.Offset:l.Offset+l.Length], vals[i]) {
			t.Fatalf("promoted %q: %v, bytes differ", keys[i], errs[i])
		}
	}
	// Pinned promoted blocks are not evicted.
	e.s.evict(1<<62, 1<<20)
	if st := e.s.Stats(); st.L1Keys != 5 || st.Pins != 5 {
		t.Fatalf("after evicting with 5 pinned: %+v", st)
	}
	e.checkValues(keys, vals) // the copying read promotes the rest
	c := make([]Code, 5)
	if err := ss.Unpin(keys[:5], c); err != nil {
		t.Fatal(err)
	}
	// The writebacks and promotions used whole sectors of the file.
	if st := e.s.Stats(); st.Promotions != 20 || st.PromotionFailures != 0 {
		t.Fatalf("final %+v", st)
	}
}

// TestRemoveL2Durable: a removed key does not come back after a restart.
func TestRemoveL2Durable(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("r", 6)
	vals := valuesFor(keys, 100)
	mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
	ss.Close()
	codes := make([]Code, 3)
	if _, err := e.s.Remove(keys[:3], codes, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", codes, OK)
	e.reopen()
	mustCodes(t, "after restart", e.exists(keys), NotFound, NotFound, NotFound, OK, OK, OK)
	// Their slots are free again: as many puts fit as before.
	if st := e.s.Stats(); st.L2Bytes != 3*2*4096 {
		t.Fatalf("L2 bytes %d, want 3 slots of 8 KiB", st.L2Bytes)
	}
}

// findHeader returns the file offset of the block header of key.
func findHeader(t *testing.T, f *fakeFile, key []byte) uint64 {
	t.Helper()
	for off := 0; off+hdrMax <= len(f.data); off += int(f.align) {
		h, err := decodeHeader(f.data[off:off+hdrMax], magicBlock)
		if err == nil && bytes.Equal(h.key, key) {
			return uint64(off)
		}
	}
	t.Fatalf("no header for %q", key)
	return 0
}

// TestRecoverTornAndCorrupt: a damaged header is dropped and counted at
// open; a damaged value is caught when read back (and, with VerifyOnOpen,
// at open), and its key dropped. Everything else survives.
func TestRecoverTornAndCorrupt(t *testing.T) {
	for _, verify := range []bool{false, true} {
		t.Run(map[bool]string{false: "lazy", true: "verify-on-open"}[verify], func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			e.l2.VerifyOnOpen = verify
			ss := e.s.NewSession()
			keys := keysN("t", 10)
			vals := valuesFor(keys, 6000)
			mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
			ss.Close()
			torn := findHeader(t, e.file, keys[2])
			e.file.data[torn+20] ^= 0xff // a torn or corrupt header write
			bad := findHeader(t, e.file, keys[5])
			e.file.data[bad+4096+100] ^= 0x01 // one bit of the value
			e.reopen()
			st := e.s.Stats()
			if st.TornDropped != 1 {
				t.Fatalf("torn dropped %d, want 1", st.TornDropped)
			}
			want := []Code{OK, OK, NotFound, OK, OK, OK, OK, OK, OK, OK}
			if verify {
				want[5] = NotFound
				if st.CorruptDropped != 1 {
					t.Fatalf("corrupt dropped %d, want 1", st.CorruptDropped)
				}
			}
			mustCodes(t, "exists", e.exists(keys), want...)
			_, codes := e.read(keys, 8000)
			want[5] = NotFound // dropped at recovery, or by this read
			mustCodes(t, "read", codes, want...)
			if !verify {
				if st := e.s.Stats(); st.CorruptReads != 1 {
					t.Fatalf("corrupt reads %d", st.CorruptReads)
				}
				mustCodes(t, "exists after the bad read", e.exists(keys[5:6]), NotFound)
			}
			// The slot of the corrupt block was zeroed: it is gone after
			// another restart too, and the rest is intact.
			e.reopen()
			keep := slicesDelete(keys, 5, 2)
			kvals := slicesDelete(vals, 5, 2)
			e.checkValues(keep, kvals)
			mustCodes(t, "gone", e.exists([][]byte{keys[2], keys[5]}), NotFound)
		})
	}
}

// slicesDelete returns s without elements i and j.
func slicesDelete[T any](s []T, i, j int) []T {
	var out []T
	for k := range s {
		if k != i && k != j {
			out = append(out, s[k])
		}
	}
	return out
}

// TestRecoverRefusesForeignFile: a file whose first sector is not a
// tensorcast superblock is not overwritten.
func TestRecoverRefusesForeignFile(t *testing.T) {
	e := newEnv(t, 8<<20)
	file := newFakeFile(8 << 20)
	copy(file.data, "not a superblock")
	_, err := New(e.cfg, e.pool, &L2{Transport: newFakeL2(), File: file, StagingID: stagingID})
	if !errors.Is(err, ErrL2Format) {
		t.Fatalf("New on a foreign file: %v", err)
	}
	if binary.LittleEndian.Uint64(file.data) == 0 || string(file.data[:16]) != "not a superblock" {
		t.Fatal("the foreign file was written")
	}
}

// TestRecoverBoundsRegions: the region size in the superblock is outside
// input. A tensorcast superblock that cuts a 1 TiB file into regions of
// three sectors (89 million of them) is refused after reading the
// superblock alone: recovery used to keep a record for every region (9
// GB) and read every region's header before its first call.
func TestRecoverBoundsRegions(t *testing.T) {
	e := newEnv(t, 8<<20, withCfg(func(c *Config) { c.MaxValueSize = 4096 }))
	const a = 4096
	file := &fakeFile{id: 900, align: a, null: true, size: 1 << 40, head: make([]byte, a)}
	encodeHeader(file.head, &header{magic: magicSuper, units: a, seq: 7, nonce: 7, offset: 3 * a})
	tr := newFakeL2()
	s, err := New(e.cfg, e.pool, &L2{Transport: tr, File: file, StagingID: stagingID})
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, ErrConfig) || tr.reads.Load() != 1 {
		t.Fatalf("New on a superblock of %d regions: %v after %d reads; want ErrConfig after the superblock's",
			(file.size-a)/(3*a), err, tr.reads.Load())
	}
	// The same file with the default region size opens.
	file.head = make([]byte, a)
	s, err = New(e.cfg, e.pool, &L2{Transport: newFakeL2(), File: file, StagingID: stagingID})
	if err != nil {
		t.Fatalf("New on an empty 1 TiB file: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverSkipsUnreadableSectors: a header the device cannot read at
// start-up (a bad sector) costs what it describes, not the whole L2. An
// unreadable block header drops its key and keeps its slot out of use; an
// unreadable region header does the same for the region's keys and the
// region. Neither is written over, so once the sectors read again, a
// restart finds every value with its bytes. Recovery used to fail, and
// the daemon with it, on the first such sector.
func TestRecoverSkipsUnreadableSectors(t *testing.T) {
	for _, verify := range []bool{false, true} {
		t.Run(map[bool]string{false: "lazy", true: "verify-on-open"}[verify], func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			e.l2.VerifyOnOpen = verify
			ss := e.s.NewSession()
			small := keysN("s", 6)
			svals := valuesFor(small, 5000)
			big := keysN("b", 2)
			bvals := valuesFor(big, 100<<10) // another slot size: another region
			mustCodes(t, "put", e.put(ss, append(small, big...), append(svals, bvals...), true), OK)
			ss.Close()
			region := func(off uint64) uint64 { return 4096 + (off-4096)/(1<<20)*(1<<20) }
			lostBlock := findHeader(t, e.file, small[2])
			lostRegion := region(findHeader(t, e.file, big[0]))
			lostValue := findHeader(t, e.file, small[4]) + 4096
			if lostRegion != region(findHeader(t, e.file, big[1])) || lostRegion == region(lostBlock) {
				t.Fatal("the test wants the big values in one region, the small ones in another")
			}
			bad := func(task *xfer.Task) error {
				if task.Req.Op == xfer.OpRead && (task.Req.TargetOffset == lostBlock || task.Req.TargetOffset == lostRegion ||
					verify && task.Req.TargetOffset == lostValue) {
					return fmt.Errorf("fake read: %w", syscall.EIO)
				}
				return nil
			}
			e.tr.Update(func(c *xfertest.Config) { c.Err = bad })
			e.reopen()
			st := e.s.Stats()
			if st.TornDropped != 2 || st.QuarantinedSlots != 1 || st.Recovered != 5 {
				t.Fatalf("stats after opening with two unreadable headers: %+v", st)
			}
			mustCodes(t, "exists", e.exists(append(small, big...)), OK, OK, NotFound, OK, OK, OK, NotFound, NotFound)
			if verify {
				// Its value could not be read at open: the key stays, and a
				// read of it answers the device's error.
				if _, codes := e.read(small[4:5], 8000); codes[0] == OK {
					t.Fatal("a value the device cannot read was read")
				}
			}
			// New values of both sizes go elsewhere: the unreadable
			// sectors are not written over.
			before := slices.Clone(e.file.data)
			ss = e.s.NewSession()
			more := keysN("m", 6)
			mvals := valuesFor(more, 5000)
			mvals[5] = valueFor(more[5], 100<<10)
			mustCodes(t, "put more", e.put(ss, more, mvals, true), OK)
			ss.Close()
			for _, off := range []uint64{lostBlock, lostRegion} {
				if !bytes.Equal(e.file.data[off:off+4096], before[off:off+4096]) {
					t.Fatalf("the unreadable sector at %d was written", off)
				}
			}
			// The device reads them again: everything is there.
			e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			e.reopen()
			e.checkValues(append(append(small, big...), more...), append(append(svals, bvals...), mvals...))

			// A read that fails in the transport, not on the device, still
			// fails the open: it says nothing about the sector.
			if err := e.s.Close(); err != nil {
				t.Fatal(err)
			}
			e.s = nil
			e.tr.Update(func(c *xfertest.Config) {
				c.Err = func(task *xfer.Task) error {
					if task.Req.Op == xfer.OpRead && task.Req.TargetOffset == lostBlock {
						return errInjected
					}
					return nil
				}
			})
			if s, err := New(e.cfg, e.pool, e.l2); !errors.Is(err, errInjected) {
				if err == nil {
					s.Close()
				}
				t.Fatalf("New with a header read failing in the transport: %v", err)
			}
		})
	}
}

// TestDurablePutThatFindsNoSlotMakesRoom: L2 is full of values that are
// only there (L1 gave them up) and past its high watermark, and a durable
// put of a slot size no region has gets ErrL2Full. That starts the
// eviction that makes room (by LRU, and by emptying a region of another
// slot size), so that the put, asked again, finds it. Only L1 pressure and
// plain puts used to start it: a client that puts durably got
// RESOURCE_EXHAUSTED for as long as it kept asking.
func TestDurablePutThatFindsNoSlotMakesRoom(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(4096+4*(1<<20)))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("f", 500) // 500 slots of 8 KiB of the 508 of four regions
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
	e.dropL1()
	big := keysN("big", 1)
	bval := valuesFor(big, 100<<10)
	e.putMakingRoom(t, ss, big, bval, "durable put %d into a full L2: %v %v", "L2 evictions",
		func(err error) bool { return errors.Is(err, ErrL2Full) })
	e.checkValues(big, bval)
	if st := e.s.Stats(); float64(st.L2Bytes) > 0.95*float64(st.L2Capacity) {
		t.Fatalf("L2 still past its high watermark: %+v", st)
	}
}

// TestRegionWithAQuarantinedSlotIsNotEmptiedForAnother: a durable put
// whose header write failed, and the zeroing after it too, leaves its slot
// quarantined for good, alone in its region. When a slot size then finds
// no region, the store empties another region, one that can empty: it
// used to pick the region with the fewest live slots, that one, evict
// nothing from it, and answer ErrL2Full to that slot size for as long as
// it ran.
func TestRegionWithAQuarantinedSlotIsNotEmptiedForAnother(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(4096+4*(1<<20)))
	ss := e.s.NewSession()
	defer ss.Close()
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(task *xfer.Task) error {
			if isZeroWrite(task) || isHeaderWrite(task) && (task.Req.TargetOffset-4096)%(1<<20) != 0 {
				return errInjected // block headers and their zeroing; region headers land
			}
			return nil
		}
	})
	x := keysN("x", 1)
	mustCodes(t, "put whose header and its zeroing fail", e.put(ss, x, valuesFor(x, 3000), true), Internal)
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	keys := keysN("f", 3*85) // the other three regions, full of 12 KiB slots
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 5000), true), OK)
	if st := e.s.Stats(); st.QuarantinedSlots != 1 || st.Keys != uint64(len(keys)) {
		t.Fatalf("stats after the failed put: %+v", st)
	}
	e.dropL1()
	big := keysN("big", 1)
	bval := valuesFor(big, 100<<10)
	e.putMakingRoom(t, ss, big, bval, "durable put %d of a slot size without a region: %v %v", "a region emptied",
		func(error) bool { return true })
	e.checkValues(big, bval)
}

// putMakingRoom puts keys durably into a full L2, asking again after each
// refusal once the L2 evictions it started are over (they may be over
// already): a refusal must be RESOURCE_EXHAUSTED with an error refused
// passes, and the put must land by the fourth try. fail formats the try,
// the code and the error; evicted names what the wait waits for.
func (e *testEnv) putMakingRoom(t *testing.T, ss *Session, keys, vals [][]byte, fail, evicted string, refused func(error) bool) {
	t.Helper()
	codes, errs := make([]Code, len(keys)), make([]error, len(keys))
	for try := 0; ; try++ {
		ev := e.s.Stats().EvictionsL2
		if _, err := ss.Put(keys, vals, true, codes, errs, nil, 0); err != nil {
			t.Fatal(err)
		}
		if codes[0] == OK {
			return
		}
		if codes[0] != ResourceExhausted || !refused(errs[0]) || try == 3 {
			t.Fatalf(fail, try, codes[0], errs[0])
		}
		e.waitFor(evicted, func() bool { st := e.s.Stats(); return st.EvictionsL2 > ev && st.IOInFlight == 0 })
	}
}

// TestPromotionShared: Gets and Reads of one L2-only key while its
// promotion is in flight wait for that one read (however many: never
// BUSY), and each gets its pin or its copy.
func TestPromotionShared(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	a, b := e.s.NewSession(), e.s.NewSession()
	defer a.Close()
	defer b.Close()
	key := keysN("cold", 1)
	val := valueFor(key[0], 7000)
	mustCodes(t, "put", e.put(a, key, [][]byte{val}, true), OK)
	e.dropL1()
	reads := e.tr.reads.Load()
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	rec := newRecorder()
	la, lb := make([]Location, 1), make([]Location, 1)
	ca, cb, cr, c5 := make([]Code, 1), make([]Code, 1), make([]Code, 1), make([]Code, 1)
	if p, err := a.Get(key, la, ca, nil, rec, 1); !p || err != nil {
		t.Fatal(p, err)
	}
	if p, err := b.Get(key, lb, cb, nil, rec, 2); !p || err != nil {
		t.Fatal(p, err)
	}
	dst := [][]byte{make([]byte, 8000)}
	lens := []uint64{0}
	if p, err := e.s.Read(key, dst, lens, cr, nil, rec, 3); !p || err != nil {
		t.Fatal(p, err)
	}
	if p, err := a.Get(key, make([]Location, 1), make([]Code, 1), nil, rec, 4); !p || err != nil {
		t.Fatal(p, err)
	}
	if p, err := b.Get(key, make([]Location, 1), c5, nil, rec, 5); !p || err != nil {
		t.Fatalf("a fifth waiter: pending %v, %v, %v", p, err, c5[0])
	}
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	for range 5 {
		<-rec.done
	}
	if got := e.tr.reads.Load() - reads; got != 1 {
		t.Fatalf("%d device reads for one key, want 1", got)
	}
	mustCodes(t, "a", ca, OK)
	mustCodes(t, "b", cb, OK)
	mustCodes(t, "read", cr, OK)
	mustCodes(t, "the fifth", c5, OK)
	if la[0] != lb[0] || !bytes.Equal(e.pool.Bytes()[la[0].Offset:la[0].Offset+la[0].Length], val) ||
		!bytes.Equal(dst[0][:lens[0]], val) {
		t.Fatal("waiters did not all get the value")
	}
	if e.s.pinsOf(string(key[0])) != 4 || e.s.Stats().Promotions != 1 {
		t.Fatalf("pins %d, promotions %d", e.s.pinsOf(string(key[0])), e.s.Stats().Promotions)
	}
}

// TestRemoveDuringAReadIsBusy: a Remove of a key another caller's read is
// bringing up from L2 is BUSY (store/doc.go: not the store's own I/O, so
// not joined); the read gets the value, and the Remove asked again goes.
func TestRemoveDuringAReadIsBusy(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	key := keysN("read-rm", 1)
	val := valueFor(key[0], 7000)
	mustCodes(t, "put", e.put(ss, key, [][]byte{val}, true), OK)
	e.dropL1()
	e.tr.Update(func(c *xfertest.Config) { c.Inline = false })
	rec := newRecorder()
	dst := [][]byte{make([]byte, 8000)}
	lens := []uint64{0}
	cr := make([]Code, 1)
	if p, err := e.s.Read(key, dst, lens, cr, nil, rec, 1); !p || err != nil {
		t.Fatal(p, err)
	}
	codes := make([]Code, 1)
	errs := make([]error, 1)
	if _, err := e.s.Remove(key, codes, errs, nil, 0); err != nil || codes[0] != Busy || !errors.Is(errs[0], ErrBusy) {
		t.Fatalf("remove during the read: %v, %v (%v); want BUSY", err, codes[0], errs[0])
	}
	e.tr.Update(func(c *xfertest.Config) { c.Inline = true })
	e.tr.release()
	<-rec.done
	mustCodes(t, "read", cr, OK)
	if !bytes.Equal(dst[0][:lens[0]], val) {
		t.Fatal("the read did not get the value")
	}
	if _, err := e.s.Remove(key, codes, errs, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("remove after the read: %v, %v (%v)", err, codes[0], errs[0])
	}
	mustCodes(t, "after", e.exists(key), NotFound)
}

// TestRegionHeaderLast: when a new region's header write completes after
// the values written into the region, their block headers wait for it
// (never a block header in a region whose header is not on the device),
// and then all go out: every put succeeds and survives a restart.
func TestRegionHeaderLast(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	e.tr.Update(func(c *xfertest.Config) { c.Inline, c.LIFO = false, true })
	keys := keysN("rh", 5)
	vals := valuesFor(keys, 3000)
	rec := newRecorder()
	codes := make([]Code, 5)
	errs := make([]error, 5)
	if p, err := ss.Put(keys, vals, true, codes, errs, rec, 9); !p || err != nil {
		t.Fatal(p, err)
	}
	var order []string
	submitted := make(chan struct{}, 64)
	e.tr.Update(func(c *xfertest.Config) {
		c.AfterSubmit = func() { submitted <- struct{}{} }
		c.Err = func(t *xfer.Task) error {
			switch {
			case isValueWrite(t):
				order = append(order, "value")
			case isHeaderWrite(t) && (t.Req.TargetOffset-4096)%(1<<20) == 0:
				order = append(order, "region")
			case isHeaderWrite(t):
				order = append(order, "block")
			}
			return nil
		}
	})
	// Release what is queued until the call ends; the maintenance loop
	// submits the waiting headers in between.
	for done := false; !done; {
		e.tr.release()
		select {
		case <-rec.done:
			done = true
		case <-submitted:
		case <-time.After(10 * time.Second):
			t.Fatalf("the put never ended; order so far %v", order)
		}
	}
	mustCodes(t, "puts", codes, OK)
	if i := slices.Index(order, "region"); i < 0 || slices.Contains(order[:i], "block") {
		t.Fatalf("a block header was written before its region's: %v", order)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Inline, c.LIFO, c.Err, c.AfterSubmit = true, false, nil, nil })
	ss.Close()
	e.reopen()
	e.checkValues(keys, vals)
}

// TestHitsAndMisses: every key a Get or Read looks for counts once, as a
// hit in L1, a hit only on L2 (promoted), or a miss; a key that is not
// valid, and the probes (Exists, LookupPrefix), count in none.
func TestHitsAndMisses(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("h", 4)
	vals := valuesFor(keys, 3000)
	mustCodes(t, "put", e.put(ss, keys, vals, false), OK)
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	e.dropL1()
	want := func(what string, l1, l2, miss uint64) {
		t.Helper()
		if st := e.s.Stats(); st.HitsL1 != l1 || st.HitsL2 != l2 || st.Misses != miss {
			t.Fatalf("after %s: hits l1 %d, l2 %d, misses %d; want %d, %d, %d", what, st.HitsL1, st.HitsL2, st.Misses, l1, l2, miss)
		}
	}
	want("puts", 0, 0, 0)
	_, codes, _ := e.get(ss, [][]byte{keys[0], keys[1], []byte("absent"), nil})
	mustCodes(t, "get", codes, OK, OK, NotFound, InvalidArgument)
	want("a get of two L2-only keys, an absent and an invalid one", 0, 2, 1)
	_, codes, _ = e.get(ss, keys[:2])
	mustCodes(t, "get again", codes, OK, OK)
	want("the same get again (now in L1)", 2, 2, 1)
	e.checkValues(keys, vals) // Read: two in L1, two promoted
	want("a read of all four", 4, 4, 1)
	mustCodes(t, "exists", e.exists([][]byte{keys[0], []byte("absent")}), OK, NotFound)
	if n, err := ss.LookupPrefix([][]byte{keys[0], []byte("absent")}, false); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	want("the probes", 4, 4, 1)
}

// TestCorruptAnywhereIsAMiss: one bit flipped anywhere in a value on L2
// (its first bytes, which the checksum's state is mixed into, the middle,
// the last 256-byte step of the fold, the short tail after it, the very
// last byte), in values the fold covers and in values too small for it:
// the Get and the Read that bring it back are misses, nothing is copied
// into the Read's buffer, the read is counted and the key dropped. A
// value's neighbours read back intact.
func TestCorruptAnywhereIsAMiss(t *testing.T) {
	for _, size := range []int{300, 700, 64 << 10, 256<<10 - 100, 256 << 10} {
		tail := size % 256
		if size < 512 {
			tail = size
		}
		at := []int{0, 3, 4, size / 2, size - 1}
		if tail > 0 && tail < size {
			at = append(at, size-tail-1, size-tail) // the fold's last byte, the tail's first
		}
		for _, a := range at {
			for _, get := range []bool{true, false} {
				name := fmt.Sprintf("%d/byte%d/read", size, a)
				if get {
					name = fmt.Sprintf("%d/byte%d/get", size, a)
				}
				t.Run(name, func(t *testing.T) { corruptOne(t, size, a, get) })
			}
		}
	}
}

func corruptOne(t *testing.T, size, at int, get bool) {
	e := newEnv(t, 8<<20, withL2(16<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("c", 3)
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		vals[i] = valueFor(k, size)
	}
	mustCodes(t, "put", e.put(ss, keys, vals, true), OK, OK, OK)
	e.dropL1()
	e.file.data[findHeader(t, e.file, keys[1])+uint64(e.file.align)+uint64(at)] ^= 0x10
	if get {
		locs, codes, errs := e.get(ss, keys)
		mustCodes(t, "get", codes, OK, NotFound, OK)
		if !errors.Is(errs[1], ErrCorrupt) {
			t.Fatalf("get of the corrupt value: %v, want ErrCorrupt", errs[1])
		}
		for _, i := range []int{0, 2} {
			l := locs[i]
			if !bytes.Equal(e.pool.Bytes()[l.Offset:l.Offset+l.Length], vals[i]) {
				t.Fatalf("neighbour %d changed", i)
			}
		}
		if err := ss.Unpin([][]byte{keys[0], keys[2]}, make([]Code, 2)); err != nil {
			t.Fatal(err)
		}
	} else {
		dsts := make([][]byte, 3)
		for i := range dsts {
			dsts[i] = bytes.Repeat([]byte{0xa5}, size)
		}
		lens := make([]uint64, 3)
		codes := make([]Code, 3)
		errs := make([]error, 3)
		if _, err := e.s.Read(keys, dsts, lens, codes, errs, nil, 0); err != nil {
			t.Fatal(err)
		}
		mustCodes(t, "read", codes, OK, NotFound, OK)
		if !errors.Is(errs[1], ErrCorrupt) {
			t.Fatalf("read of the corrupt value: %v, want ErrCorrupt", errs[1])
		}
		if lens[1] != 0 || !bytes.Equal(dsts[1], bytes.Repeat([]byte{0xa5}, size)) {
			t.Fatalf("the read of the corrupt value wrote %d bytes (len %d)", size-bytes.Count(dsts[1], []byte{0xa5}), lens[1])
		}
		for _, i := range []int{0, 2} {
			if !bytes.Equal(dsts[i][:lens[i]], vals[i]) {
				t.Fatalf("neighbour %d: %d bytes, not the %d put", i, lens[i], size)
			}
		}
	}
	if st := e.s.Stats(); st.CorruptReads != 1 {
		t.Fatalf("corrupt reads %d, want 1", st.CorruptReads)
	}
	mustCodes(t, "exists after", e.exists(keys), OK, NotFound, OK)
}

// TestCorruptInABurst: of a call's 32 reads that complete together (the
// fake device ends them all inside the submit, as a virtual disk does
// within microseconds), the corrupt values (the first ones of the burst,
// one in the middle, the last) are misses and every other value reads back
// intact.
func TestCorruptInABurst(t *testing.T) {
	for _, get := range []bool{true, false} {
		t.Run(map[bool]string{true: "get", false: "read"}[get], func(t *testing.T) {
			const n, size = 32, 64<<10 - 100
			// One Get pins every value: the session's bound lets it.
			e := newEnv(t, 8<<20, withL2(16<<20), withCfg(func(c *Config) { c.MaxSessionPinned = n * 64 << 10 }))
			ss := e.s.NewSession()
			defer ss.Close()
			keys := keysN("b", n)
			vals := make([][]byte, n)
			for i, k := range keys {
				vals[i] = valueFor(k, size)
			}
			mustCodes(t, "put", e.put(ss, keys, vals, true), OK)
			e.dropL1()
			bad := []int{0, 1, 2, 17, n - 1}
			for _, i := range bad {
				e.file.data[findHeader(t, e.file, keys[i])+uint64(e.file.align)+uint64(i*997%size)] ^= 0x04
			}
			want := make([]Code, n)
			for i := range want {
				want[i] = OK
			}
			for _, i := range bad {
				want[i] = NotFound
			}
			var codes []Code
			var errs []error
			var got [][]byte
			if get {
				var locs []Location
				locs, codes, errs = e.get(ss, keys)
				for _, l := range locs {
					got = append(got, e.pool.Bytes()[l.Offset:l.Offset+l.Length])
				}
			} else {
				got = make([][]byte, n)
				for i := range got {
					got[i] = make([]byte, size)
				}
				lens := make([]uint64, n)
				codes, errs = make([]Code, n), make([]error, n)
				if _, err := e.s.Read(keys, got, lens, codes, errs, nil, 0); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					got[i] = got[i][:lens[i]]
				}
			}
			mustCodes(t, "get", codes, want...)
			for i := range keys {
				switch {
				case want[i] == NotFound && !errors.Is(errs[i], ErrCorrupt):
					t.Fatalf("value %d: %v, want ErrCorrupt", i, errs[i])
				case want[i] == OK && !bytes.Equal(got[i], vals[i]):
					t.Fatalf("value %d: %d bytes, not the %d put", i, len(got[i]), size)
				}
			}
			if st := e.s.Stats(); st.CorruptReads != uint64(len(bad)) {
				t.Fatalf("corrupt reads %d, want %d", st.CorruptReads, len(bad))
			}
			if get {
				var pinned [][]byte
				for i, k := range keys {
					if want[i] == OK {
						pinned = append(pinned, k)
					}
				}
				if err := ss.Unpin(pinned, make([]Code, len(pinned))); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRemovedKeyStaysGoneOverAQuarantinedCopy: an eviction from L2 whose
// header zeroing fails while a put of the same key superseded it leaves
// the old block's header valid in a slot kept out of use. The new value
// is then removed, or evicted from L2: its header is zeroed, and a restart
// must not find the old block and bring the key back with its old bytes.
// The old header is zeroed first, so a crash between the two writes finds
// the new value.
func TestRemovedKeyStaysGoneOverAQuarantinedCopy(t *testing.T) {
	for _, how := range []string{"remove", "evict"} {
		t.Run(how, func(t *testing.T) { removedKeyStaysGone(t, how) })
	}
}

// putOverFailedEviction evicts keys (stored on L2 alone) from L2, puts
// them again durably with values of size bytes while the evictions are in
// flight, and then has the evictions' zeroing fail: each old block's
// header stays valid, in a quarantined slot.
func (e *testEnv) putOverFailedEviction(t *testing.T, ss *Session, keys [][]byte, size int) {
	t.Helper()
	failed := e.s.Stats().InvalidateFailures
	e.evictingL2(t, len(keys))
	mustCodes(t, "put again under eviction", e.put(ss, keys, valuesFor(keys, size), true), OK)
	e.tr.Update(func(c *xfertest.Config) {
		c.Hold = nil
		c.Err = func(task *xfer.Task) error {
			if isZeroWrite(task) {
				return errInjected
			}
			return nil
		}
	})
	e.tr.release()
	e.waitFor("the evictions failed", func() bool {
		st := e.s.Stats()
		return st.InvalidateFailures == failed+uint64(len(keys)) && st.IOInFlight == 0
	})
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	e.checkValues(keys, valuesFor(keys, size))
}

func removedKeyStaysGone(t *testing.T, how string) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	defer ss.Close()
	keys := keysN("q", 1)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
	e.putOverFailedEviction(t, ss, keys, 5000)
	// From here on, every write is logged over a copy of the file, to
	// replay a crash after each.
	e.file.mu.Lock()
	before := bytes.Clone(e.file.data)
	var log []landed // guarded by the file's mu
	e.tr.onWrite = func(off uint64, b []byte) { log = append(log, landed{off, bytes.Clone(b)}) }
	e.file.mu.Unlock()
	switch how {
	case "remove":
		codes, errs := make([]Code, 1), make([]error, 1)
		if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
			t.Fatal(err)
		}
		mustCodes(t, "remove", codes, OK)
	case "evict":
		e.dropL1()
		batch := e.s.evictL2LRU(1<<40, nil)
		if len(batch) != 1 {
			t.Fatalf("%d evictions started, want 1", len(batch))
		}
		var xts []*xfer.Task
		e.s.l2.startInvals(batch, &xts)
		e.waitFor("the eviction ended", func() bool { return e.s.Stats().EvictionsL2 == 2 && e.s.Stats().IOInFlight == 0 })
	}
	mustCodes(t, "gone", e.exists(keys), NotFound)
	if st := e.s.Stats(); st.InvalidateFailures != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	e.s = nil
	e.file.mu.Lock()
	e.tr.onWrite = nil
	e.file.mu.Unlock()
	for p := 0; p <= len(log); p++ {
		e.file.mu.Lock()
		copy(e.file.data, before)
		for _, w := range log[:p] {
			copy(e.file.data[w.off:], w.data)
		}
		e.file.mu.Unlock()
		e.open()
		vals, codes := e.read(keys, 5000)
		switch {
		case p == len(log) && codes[0] != NotFound:
			t.Fatalf("after every write, a restart finds the key: %v", codes)
		case codes[0] == OK && !bytes.Equal(vals[0], valuesFor(keys, 5000)[0]):
			t.Fatalf("crash after write %d: the key reads %d bytes, not its newest value", p, len(vals[0]))
		}
		if err := e.s.Close(); err != nil {
			t.Fatal(err)
		}
		e.s = nil
	}
	if len(log) != 2 {
		t.Fatalf("%d writes, want 2: the old header's zeroing, then the new one's", len(log))
	}
}

// TestRegionsPastAShrunkenL2StayGone: a store opened on a smaller L2 than
// it was formatted on ignores the regions past the new size, and its
// removals there write nothing. Grown again, the L2 must not bring back
// the blocks of those regions: keys removed meanwhile would be served
// again.
func TestRegionsPastAShrunkenL2StayGone(t *testing.T) {
	const full, small = 4096 + 4<<20, 4096 + 2<<20
	e := newEnv(t, 16<<20, withL2(full))
	ss := e.s.NewSession()
	var keys [][]byte
	for i, size := range []int{3000, 6000, 12000, 30000} { // a slot size each: regions 0 to 3
		k := keysN(fmt.Sprintf("r%d-", i), 1)
		mustCodes(t, "put", e.put(ss, k, valuesFor(k, size), true), OK)
		keys = append(keys, k[0])
	}
	ss.Close()
	resize := func(n int) {
		if err := e.s.Close(); err != nil {
			t.Fatal(err)
		}
		e.s = nil
		e.file.mu.Lock()
		e.file.data = e.file.data[:n] // a device or file whose bytes past n stay
		e.file.mu.Unlock()
		e.open()
	}
	resize(small)
	mustCodes(t, "shrunk", e.exists(keys), OK, OK, NotFound, NotFound)
	codes, errs := make([]Code, len(keys)), make([]error, len(keys))
	if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", codes, OK, OK, OK, OK)
	// Grown again, with the zeroing of the regions cut off failing: the
	// store does not open, and records nothing (a crash there does as
	// much); the next start zeroes them.
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	e.s = nil
	e.file.mu.Lock()
	e.file.data = e.file.data[:full]
	e.file.mu.Unlock()
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(task *xfer.Task) error {
			if isZeroWrite(task) {
				return errInjected
			}
			return nil
		}
	})
	if s, err := New(e.cfg, e.pool, e.l2); !errors.Is(err, errInjected) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("New with the zeroing failing: %v, want the injected error", err)
	}
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	e.open()
	mustCodes(t, "grown again", e.exists(keys), NotFound, NotFound, NotFound, NotFound)
	// The regions cut off are the store's again.
	ss = e.s.NewSession()
	defer ss.Close()
	more := keysN("m", 4*120)
	mustCodes(t, "put over the grown L2", e.put(ss, more, valuesFor(more, 3000), true), OK)
}

// TestRecoverRefusesHugeSequence: a block's sequence number orders the
// copies of its key, and recovery goes on from the highest one found. A
// header whose number no store writes (past 2^62: millennia of puts),
// valid but forged or corrupt, used to be taken: the next numbers wrapped
// past zero, and a key's newer copy lost to an older one at the next
// restart. Such a header is dropped as damaged.
func TestRecoverRefusesHugeSequence(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	j, x := keysN("j", 1), keysN("x", 1)
	mustCodes(t, "put", e.put(ss, j, valuesFor(j, 3000), true), OK)
	mustCodes(t, "put", e.put(ss, x, valuesFor(x, 3000), true), OK)
	ss.Close()
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	e.s = nil
	off := findHeader(t, e.file, x[0])
	sector := e.file.data[off : off+4096]
	h, err := decodeHeader(sector, magicBlock)
	if err != nil {
		t.Fatal(err)
	}
	h.seq = ^uint64(0)
	h.key = bytes.Clone(h.key)
	encodeHeader(sector, &h)
	e.open()
	torn := e.s.Stats().TornDropped
	codes, errs := make([]Code, 1), make([]error, 1)
	if _, err := e.s.Remove(x, codes, errs, nil, 0); err != nil || codes[0] != OK {
		t.Fatalf("remove: %v %v %v", codes, errs, err)
	}
	ss = e.s.NewSession()
	defer ss.Close()
	// Two valid copies of j on the device: the old one quarantined, the
	// new one with the later number.
	e.putOverFailedEviction(t, ss, j, 5000)
	e.reopen()
	vals, codes := e.read(j, 5000)
	mustCodes(t, "after a restart", codes, OK)
	if !bytes.Equal(vals[0], valuesFor(j, 5000)[0]) {
		t.Fatalf("after a restart, %s reads %d bytes: its older value", j[0], len(vals[0]))
	}
	if torn == 0 {
		t.Fatalf("the header of sequence %d was not counted as damaged", h.seq)
	}
}

// TestRemovedKeyStaysGoneOverAStaleCopyRecoveryCouldNotZero: a restart
// that finds two copies of a key keeps the newer and zeroes the older;
// when that zeroing fails, the older copy's header stays valid. A Remove
// of the key must zero it too, or the next restart brings the key back
// with its older bytes.
func TestRemovedKeyStaysGoneOverAStaleCopyRecoveryCouldNotZero(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	ss := e.s.NewSession()
	keys := keysN("s", 1)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
	e.putOverFailedEviction(t, ss, keys, 5000)
	ss.Close()
	zeroFails := func(on bool) {
		e.tr.Update(func(c *xfertest.Config) {
			c.Err = nil
			if on {
				c.Err = func(task *xfer.Task) error {
					if isZeroWrite(task) {
						return errInjected
					}
					return nil
				}
			}
		})
	}
	zeroFails(true)
	e.reopen()
	zeroFails(false)
	e.checkValues(keys, valuesFor(keys, 5000))
	codes, errs := make([]Code, 1), make([]error, 1)
	if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove", codes, OK)
	e.reopen()
	mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
}

// ghostsUnderL1 opens a session (closed at the test's end) and makes n
// keys named prefix with a ghost each under a newer value in L1 only: a
// durable put of 3000 bytes, then putL1OverFailedEviction of 5000.
func (e *testEnv) ghostsUnderL1(t *testing.T, prefix string, n int) (*Session, [][]byte) {
	t.Helper()
	ss := e.s.NewSession()
	t.Cleanup(func() { ss.Close() })
	keys := keysN(prefix, n)
	mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
	e.putL1OverFailedEviction(t, ss, keys, 5000)
	return ss, keys
}

// putL1OverFailedEviction is putOverFailedEviction with the new values put
// without durable and kept off L2: their writebacks fail and wait for a
// retry on the store's clock, which stands still until the test moves it.
// Each key's newer value is then in L1 only, and its older block's header
// stays valid in a quarantined slot (a ghost of the key).
func (e *testEnv) putL1OverFailedEviction(t *testing.T, ss *Session, keys [][]byte, size int) {
	t.Helper()
	st := e.s.Stats()
	e.evictingL2(t, len(keys))
	e.tr.Update(func(c *xfertest.Config) {
		c.Err = func(task *xfer.Task) error {
			if isValueWrite(task) {
				return errInjected
			}
			return nil
		}
	})
	mustCodes(t, "put again under eviction", e.put(ss, keys, valuesFor(keys, size), false), OK)
	e.waitFor("the writebacks failed", func() bool {
		return e.s.Stats().WritebackRetries == st.WritebackRetries+uint64(len(keys))
	})
	e.tr.Update(func(c *xfertest.Config) {
		c.Hold = nil
		c.Err = func(task *xfer.Task) error {
			if isValueWrite(task) || isZeroWrite(task) {
				return errInjected
			}
			return nil
		}
	})
	e.tr.release()
	e.waitFor("the evictions failed", func() bool {
		st2 := e.s.Stats()
		return st2.InvalidateFailures == st.InvalidateFailures+uint64(len(keys)) && st2.IOInFlight == 0
	})
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	e.checkValues(keys, valuesFor(keys, size))
	if st2 := e.s.Stats(); st2.L2Keys != 0 || st2.Dirty != uint64(len(keys)) {
		t.Fatalf("stats: %+v, want the new values in L1 only, owed their writebacks", st2)
	}
	if g := e.ghosts(keys[0]); g != 1 {
		t.Fatalf("%d ghosts of %s, want 1", g, keys[0])
	}
}

// ghosts is how many quarantined slots may still hold a valid header of
// key.
func (e *testEnv) ghosts(key []byte) int {
	t := e.s.l2
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ghosts[string(key)])
}

// removePending removes keys on a recorder, a removal that must stay
// pending (a zeroing in flight under) with the keys gone at once, and
// returns its codes and errors, which the recorder's done fills.
func (e *testEnv) removePending(t *testing.T, keys [][]byte, under string) ([]Code, []error, *recorder) {
	t.Helper()
	codes, errs := make([]Code, len(keys)), make([]error, len(keys))
	rec := newRecorder()
	pending, err := e.s.Remove(keys, codes, errs, rec, 1)
	if err != nil || !pending {
		t.Fatalf("remove under %s: pending %v, %v, codes %v", under, pending, err, codes)
	}
	mustCodes(t, "gone at once", e.exists(keys), NotFound)
	return codes, errs, rec
}

// keptOverFailedZeroing checks a Remove of keys[0] (a 5000-byte value in
// L1 over a ghost, putL1OverFailedEviction) whose zeroing of the ghost
// failed with errInjected: it answered INTERNAL naming that failure, and
// the key stays, readable, with its ghost; the device writes again after.
func (e *testEnv) keptOverFailedZeroing(t *testing.T, keys [][]byte, codes []Code, errs []error) {
	t.Helper()
	mustCodes(t, "remove", codes, Internal)
	if !errors.Is(errs[0], errInjected) {
		t.Fatalf("remove: %v, want the failed zeroing", errs[0])
	}
	e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
	e.checkValues(keys, valuesFor(keys, 5000))
	if g := e.ghosts(keys[0]); g != 1 {
		t.Fatalf("%d ghosts after the failed remove, want 1", g)
	}
}

// TestRemovedL1ValueStaysGoneOverAQuarantinedCopy: a key whose older
// block's header outlived a failed zeroing (a ghost) and whose newer
// value is in L1 only, not yet written back, is removed. The Remove has
// no header of the key's own to zero, and used to drop the value at once:
// the ghost's header stayed valid, and a restart brought the removed key
// back with its older bytes. The Remove zeroes the ghost first, whether
// the value was only in L1 or its writeback was in flight (and failed).
func TestRemovedL1ValueStaysGoneOverAQuarantinedCopy(t *testing.T) {
	for _, how := range []string{"in L1 only", "under a failing writeback"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			_, keys := e.ghostsUnderL1(t, "g", 1)
			st := e.s.Stats()
			codes, errs := make([]Code, 1), make([]error, 1)
			if how == "in L1 only" {
				if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
					t.Fatal(err)
				}
			} else {
				// The retry comes due, its value write held: the Remove
				// joins the writeback, which then fails.
				e.tr.Update(func(c *xfertest.Config) { c.Hold = isValueWrite })
				e.clk.Advance(2 * e.s.cfg.WritebackBackoff)
				for e.tr.Held() < 1 {
					select {
					case <-e.tr.Holding(): // after a Submit that held tasks
					case <-time.After(10 * time.Second):
						t.Fatal("the writeback retried is not in flight")
					}
				}
				rec := newRecorder()
				pending, err := e.s.Remove(keys, codes, errs, rec, 1)
				if err != nil || !pending {
					t.Fatalf("remove under writeback: pending %v, %v, codes %v", pending, err, codes)
				}
				e.endWritebacks(true)
				<-rec.done
				e.tr.Update(func(c *xfertest.Config) { c.Err = nil })
			}
			mustCodes(t, "remove", codes, OK)
			if errs[0] != nil {
				t.Fatal(errs[0])
			}
			mustCodes(t, "gone", e.exists(keys), NotFound)
			st2, ghosts := e.s.Stats(), e.ghosts(keys[0])
			e.reopen()
			mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
			if ghosts != 0 {
				t.Fatalf("%d ghosts left after the remove", ghosts)
			}
			if st2.Keys != 0 || st2.Dirty != 0 || st2.QuarantinedSlots != st.QuarantinedSlots-1 || st2.IOInFlight != 0 {
				t.Fatalf("stats after the remove: %+v (before: %+v)", st2, st)
			}
		})
	}
}

// TestRemoveOfAnL1ValueWhoseQuarantinedCopyCannotBeZeroed: when the
// zeroing of the ghost fails again, the Remove answers the failure (a
// restart would bring the older value back, and recovery has nothing to
// tell it was removed), and the key stays as it was: its newer value
// read from L1 and owed its writeback (made once the device writes
// again), the ghost kept out of use and still the key's, so that the next
// Remove zeroes it before the key's own header.
func TestRemoveOfAnL1ValueWhoseQuarantinedCopyCannotBeZeroed(t *testing.T) {
	e := newEnv(t, 16<<20, withL2(32<<20))
	_, keys := e.ghostsUnderL1(t, "g", 1)
	st := e.s.Stats()
	e.failZeroWrites()
	codes, errs := make([]Code, 1), make([]error, 1)
	if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	e.keptOverFailedZeroing(t, keys, codes, errs)
	if err := e.s.Flush(flushWait); err != nil {
		t.Fatal(err)
	}
	if st2 := e.s.Stats(); st2.Keys != 1 || st2.Dirty != 0 || st2.Writebacks != st.Writebacks+1 ||
		st2.RemoveFailures != st.RemoveFailures+1 || st2.QuarantinedSlots != st.QuarantinedSlots {
		t.Fatalf("stats after the failed remove and a flush: %+v (before: %+v)", st2, st)
	}
	if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
		t.Fatal(err)
	}
	mustCodes(t, "remove again", codes, OK)
	e.reopen()
	mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
}

// isBlockHeaderWrite reports whether t writes a block header (not a
// region's).
func isBlockHeaderWrite(t *xfer.Task) bool {
	if !isHeaderWrite(t) {
		return false
	}
	b := t.Local.(xfer.MemSegment).Bytes()[t.Req.LocalOffset:]
	return bytes.Equal(b[:8], magicBlock[:])
}

// TestFailedHeaderWriteThatCannotBeZeroedIsAGhost: a block header write
// that reaches the device but reports failure, and whose zeroing fails
// too, leaves a valid header of the key, with the highest sequence number
// of the key's, in a quarantined slot. It used to be quarantined only:
// nothing zeroed it before the key's later removal, and a restart
// brought the removed key back, from a writeback's value in L1 only or
// from a durable put that had answered failure. It is a ghost of the key
// now, zeroed by the Remove first.
func TestFailedHeaderWriteThatCannotBeZeroedIsAGhost(t *testing.T) {
	for _, how := range []string{"writeback", "durable put"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			defer ss.Close()
			keys := keysN("u", 1)
			st := e.s.Stats()
			e.tr.Update(func(c *xfertest.Config) {
				c.Move = func(task *xfer.Task) (uint64, error) {
					n, err := e.tr.move(task)
					if err == nil && isBlockHeaderWrite(task) {
						return 0, errInjected // written, and reported failed
					}
					return n, err
				}
				c.Err = func(task *xfer.Task) error {
					if isZeroWrite(task) {
						return errInjected
					}
					return nil
				}
			})
			if how == "writeback" {
				// The retry waits on the store's clock, which stands still.
				mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 5000), false), OK)
				e.waitFor("the writeback failed", func() bool {
					st2 := e.s.Stats()
					return st2.WritebackRetries == st.WritebackRetries+1 && st2.IOInFlight == 0
				})
			} else {
				mustCodes(t, "durable put", e.put(ss, keys, valuesFor(keys, 3000), true), Internal)
			}
			e.tr.Update(func(c *xfertest.Config) { c.Move, c.Err = e.tr.move, nil })
			if how == "durable put" {
				mustCodes(t, "durable put again", e.put(ss, keys, valuesFor(keys, 5000), true), OK)
			}
			if g := e.ghosts(keys[0]); g != 1 {
				t.Fatalf("%d ghosts of %s, want 1", g, keys[0])
			}
			e.checkValues(keys, valuesFor(keys, 5000))
			codes, errs := make([]Code, 1), make([]error, 1)
			if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			mustCodes(t, "remove", codes, OK)
			if g := e.ghosts(keys[0]); g != 0 {
				t.Fatalf("%d ghosts left after the remove", g)
			}
			e.reopen()
			mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
		})
	}
}

// TestRemoveWaitsForTheZeroingOfAnOlderCopy: a key is put again while
// the eviction of its older block from L2 is zeroing that block's header
// (or a ghost of the key the eviction had claimed), and the new value is
// removed before that zeroing ends. The Remove used to answer at once,
// having found no ghost: the zeroing then failed, the older header stayed
// valid as a ghost registered after the answer, and a restart brought the
// removed key back. So it did for a new value written back meanwhile: its
// own header zeroed, the older one left valid. The Remove now waits for
// the older invalidation and zeroes what it left; if that zeroing fails
// too, the Remove answers the failure and the key stays, as when its
// ghost cannot be zeroed.
func TestRemoveWaitsForTheZeroingOfAnOlderCopy(t *testing.T) {
	for _, c := range []struct {
		older string // what the eviction is zeroing: "its header", "a ghost"
		newer string // the new value: "in L1 only", "written back"
		fail  bool   // the Remove's zeroing of what the eviction left fails
	}{
		{"its header", "in L1 only", false},
		{"its header", "in L1 only", true},
		{"a ghost", "in L1 only", false},
		{"its header", "written back", false},
	} {
		t.Run(fmt.Sprintf("%s, %s, zeroing fails %v", c.older, c.newer, c.fail), func(t *testing.T) {
			e := newEnv(t, 16<<20, withL2(32<<20))
			ss := e.s.NewSession()
			defer ss.Close()
			keys := keysN("z", 1)
			mustCodes(t, "put", e.put(ss, keys, valuesFor(keys, 3000), true), OK)
			if c.older == "a ghost" {
				e.putOverFailedEviction(t, ss, keys, 4000)
			}
			// The eviction's first zeroing (its header, or the ghost it
			// claimed) is held.
			e.evictingL2(t, 1)
			st := e.s.Stats()
			if c.newer == "in L1 only" {
				e.tr.Update(func(c *xfertest.Config) {
					c.Err = func(task *xfer.Task) error {
						if isValueWrite(task) {
							return errInjected
						}
						return nil
					}
				})
				mustCodes(t, "put again under eviction", e.put(ss, keys, valuesFor(keys, 5000), false), OK)
				e.waitFor("the writeback failed", func() bool { return e.s.Stats().WritebackRetries == st.WritebackRetries+1 })
			} else {
				mustCodes(t, "put again under eviction", e.put(ss, keys, valuesFor(keys, 5000), false), OK)
				e.waitFor("the writeback", func() bool { return e.s.Stats().Writebacks == st.Writebacks+1 })
			}
			codes, errs, rec := e.removePending(t, keys, "the older copy's zeroing")
			e.tr.Update(func(cf *xfertest.Config) {
				cf.Hold = nil
				cf.Err = nil
				if c.fail {
					cf.Err = func(task *xfer.Task) error {
						if isValueWrite(task) || isZeroWrite(task) {
							return errInjected
						}
						return nil
					}
				}
			})
			if n := e.tr.Fail(errInjected); n != 1 {
				t.Fatalf("%d zeroings held, want 1", n)
			}
			<-rec.done
			if c.fail {
				e.keptOverFailedZeroing(t, keys, codes, errs)
				if _, err := e.s.Remove(keys, codes, errs, nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			mustCodes(t, "remove", codes, OK)
			if errs[0] != nil {
				t.Fatal(errs[0])
			}
			if g := e.ghosts(keys[0]); g != 0 {
				t.Fatalf("%d ghosts left after the remove", g)
			}
			e.waitFor("no I/O in flight", func() bool { return e.s.Stats().IOInFlight == 0 })
			e.reopen()
			mustCodes(t, "removed, after a restart", e.exists(keys), NotFound)
		})
	}
}
