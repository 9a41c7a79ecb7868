package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestCrashAtEveryWrite: a store puts durably, removes, and evicts from a
// small L2 (so that regions change slot size: compaction) while every
// write that lands is logged. The file is then rebuilt as a crash after
// each write would leave it, and opened: every durable put acknowledged by
// then reads back with its bytes unless its block header was zeroed
// since (evicted); every removal acknowledged by then holds; no key
// reads bytes that are not its value. It runs with the writes of one
// submission landing in order and in reverse (a device may complete them
// either way), and with one write in ten failing, before it lands or
// after (a device that reports an error for a write it made).
func TestCrashAtEveryWrite(t *testing.T) {
	for _, lifo := range []bool{false, true} {
		for _, fail := range []string{"none", "before", "after"} {
			t.Run(fmt.Sprintf("lifo=%v/fail=%s", lifo, fail), func(t *testing.T) { crashAtEveryWrite(t, lifo, fail) })
		}
	}
}

// crashKey is one key of the workload: when its durable put and its
// removal were acknowledged (the length of the write log then; -1: not).
type crashKey struct {
	key          []byte
	size         int
	acked, freed int
}

type landed struct {
	off  uint64
	data []byte
}

func crashAtEveryWrite(t *testing.T, lifo bool, fail string) {
	const region = 256 << 10
	const fileSize = 4096 + 4*region
	var log []landed // guarded by the file's mu
	e := newEnv(t, 8<<20, withL2(fileSize), func(e *testEnv) {
		e.l2.RegionSize = region
		e.cfg.MaxValueSize = 128 << 10
		d := e.tr
		d.onWrite = func(off uint64, b []byte) { log = append(log, landed{off, bytes.Clone(b)}) }
		frng := rand.New(rand.NewPCG(3, 4))
		d.Update(func(c *xfertest.Config) {
			c.Move = func(task *xfer.Task) (uint64, error) {
				if fail == "none" || task.Req.Op != xfer.OpWrite || frng.IntN(10) != 0 {
					return d.move(task)
				}
				if fail == "after" {
					d.move(task)
				}
				return 0, errInjected
			}
			if lifo {
				c.Hold, c.LIFO = func(*xfer.Task) bool { return true }, true
				c.AfterSubmit = func() { d.release() }
			}
		})
	})
	logLen := func() int {
		e.file.mu.Lock()
		defer e.file.mu.Unlock()
		return len(log)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1000, 5000, 20000, 60000, 120000}
	var keys []*crashKey
	ss := e.s.NewSession()
	codes, errs := make([]Code, 1), make([]error, 1)
	for i := 0; i < 40; i++ {
		k := &crashKey{key: []byte(fmt.Sprintf("c-%03d", i)), size: sizes[rng.IntN(len(sizes))], acked: -1, freed: -1}
		keys = append(keys, k)
		tried := func() uint64 { st := e.s.Stats(); return st.EvictionsL2 + st.InvalidateFailures }
		for try := 0; try < 4; try++ {
			ev := tried()
			if _, err := ss.Put([][]byte{k.key}, [][]byte{valueFor(k.key, k.size)}, true, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			if codes[0] != ResourceExhausted {
				break
			}
			// It started an eviction: wait for it to end, made or failed.
			e.waitFor("L2 evictions", func() bool { return tried() > ev && e.s.Stats().IOInFlight == 0 })
		}
		if codes[0] == OK {
			k.acked = logLen()
		}
		e.dropL1() // everything L2-only: evictable
		if i%5 == 4 {
			r := keys[rng.IntN(len(keys))]
			if _, err := e.s.Remove([][]byte{r.key}, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			if codes[0] == OK && r.freed < 0 {
				r.freed = logLen()
			}
		}
	}
	ss.Close()
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	e.s = nil
	st := func() string {
		return fmt.Sprintf("%d writes, %d regions given a slot size", len(log), regionWrites(log))
	}
	t.Log(st())
	if regionWrites(log) <= 4 {
		t.Fatalf("no region changed slot size: %s", st())
	}

	// A key's block is gone for good once a write zeroed the sector its
	// header was written to.
	zeroedSince := func(k *crashKey, p int) bool {
		for i, w := range log[:p] {
			if h, err := decodeHeader(w.data, magicBlock); err != nil || !bytes.Equal(h.key, k.key) {
				continue
			}
			for _, z := range log[i+1 : p] {
				if z.off == w.off && !anyNonZero(z.data[:hdrMax]) {
					return true
				}
			}
		}
		return false
	}
	dst := make([]byte, 128<<10)
	lens := []uint64{0}
	for p := 0; p <= len(log); p++ {
		file := newFakeFile(fileSize)
		for _, w := range log[:p] {
			copy(file.data[w.off:], w.data)
		}
		s, err := New(e.cfg, e.pool, &L2{Transport: newFakeL2(), File: file, StagingID: stagingID, RegionSize: region})
		if err != nil {
			t.Fatalf("crash after write %d of %s: %v", p, st(), err)
		}
		for _, k := range keys {
			if _, err := s.Read([][]byte{k.key}, [][]byte{dst}, lens, codes, errs, nil, 0); err != nil {
				t.Fatal(err)
			}
			switch {
			case codes[0] == OK && !bytes.Equal(dst[:lens[0]], valueFor(k.key, k.size)):
				t.Fatalf("crash after write %d of %s: %s reads bytes not its value", p, st(), k.key)
			case codes[0] == OK && k.freed >= 0 && k.freed <= p:
				t.Fatalf("crash after write %d of %s: %s, removed after write %d, is back", p, st(), k.key, k.freed)
			case codes[0] != OK && k.acked >= 0 && k.acked <= p && (k.freed < 0 || k.freed > p) && !zeroedSince(k, p):
				t.Fatalf("crash after write %d of %s: %s, put after write %d, reads %v %v", p, st(), k.key, k.acked, codes[0], errs[0])
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// regionWrites counts the region headers in log.
func regionWrites(log []landed) int {
	n := 0
	for _, w := range log {
		if _, err := decodeHeader(w.data, magicRegion); err == nil {
			n++
		}
	}
	return n
}

func anyNonZero(b []byte) bool { return bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) }
