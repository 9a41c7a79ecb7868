//go:build linux

package shm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// model is the reference the allocator is checked against: the live blocks
// and, derived from them, which class holds each slab. It knows nothing of
// free lists; it only says what a correct allocator may answer.
type model struct {
	minBlock, maxBlock, nslabs uint64
	live                       map[uint64]uint64 // offset -> requested size
	slabClass                  map[uint64]uint64 // slab -> block size, for slabs with live blocks
	slabLive                   map[uint64]uint64 // slab -> live blocks
}

func newModel(minBlock, maxBlock, nslabs uint64) *model {
	return &model{minBlock: minBlock, maxBlock: maxBlock, nslabs: nslabs,
		live: map[uint64]uint64{}, slabClass: map[uint64]uint64{}, slabLive: map[uint64]uint64{}}
}

func (m *model) class(size uint64) uint64 {
	c := m.minBlock
	for c < size {
		c *= 2
	}
	return c
}

// room is how many blocks of class c the pool can still give.
func (m *model) room(c uint64) uint64 {
	per := m.maxBlock / c
	n := (m.nslabs - uint64(len(m.slabLive))) * per
	for s, bs := range m.slabClass {
		if bs == c {
			n += per - m.slabLive[s]
		}
	}
	return n
}

// took checks a block the allocator handed out and records it.
func (m *model) took(t *testing.T, off, size uint64) {
	t.Helper()
	c := m.class(size)
	s := off / m.maxBlock
	switch {
	case off%c != 0 || s >= m.nslabs:
		t.Fatalf("Alloc(%d) = %d: not a %d-aligned block in the pool", size, off, c)
	case m.live[off] != 0:
		t.Fatalf("Alloc(%d) = %d: already live", size, off)
	case m.slabLive[s] > 0 && m.slabClass[s] != c:
		t.Fatalf("Alloc(%d) = %d: in slab %d, held by class %d", size, off, s, m.slabClass[s])
	}
	m.live[off] = size
	m.slabClass[s] = c
	m.slabLive[s]++
}

func (m *model) freed(off uint64) {
	s := off / m.maxBlock
	delete(m.live, off)
	if m.slabLive[s]--; m.slabLive[s] == 0 {
		delete(m.slabLive, s)
		delete(m.slabClass, s)
	}
}

func (m *model) compare(t *testing.T, st PoolStats) {
	t.Helper()
	var used, req uint64
	perClass := map[uint64]uint64{}
	slabs := map[uint64]uint64{}
	for off, size := range m.live {
		c := m.class(size)
		used += c
		req += size
		perClass[c]++
		_ = off
	}
	for _, c := range m.slabClass {
		slabs[c]++
	}
	if st.Blocks != uint64(len(m.live)) || st.Used != used || st.Requested != req ||
		st.FreeSlabs != m.nslabs-uint64(len(m.slabLive)) || st.FreeBytes != st.Size-used {
		t.Fatalf("stats %+v; model: %d blocks, %d used, %d requested, %d slabs held", st, len(m.live), used, req, len(m.slabLive))
	}
	for _, cs := range st.Classes {
		if cs.Live != perClass[cs.BlockSize] || cs.Slabs != slabs[cs.BlockSize] {
			t.Fatalf("class %d: %+v; model: %d live in %d slabs", cs.BlockSize, cs, perClass[cs.BlockSize], slabs[cs.BlockSize])
		}
	}
}

func TestModel(t *testing.T) {
	const nslabs, minBlock, maxBlock = 6, 4 * kib, 64 * kib
	for seed := uint64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed*7919))
		p := newTestPool(t, nslabs, minBlock, maxBlock)
		m := newModel(minBlock, maxBlock, nslabs)
		size := func() uint64 {
			switch rng.IntN(20) {
			case 0:
				return 0
			case 1:
				return maxBlock + 1 + rng.Uint64N(maxBlock)
			case 2:
				return maxBlock
			}
			return 1 + rng.Uint64N(uint64(rng.IntN(16)+1)*kib)
		}
		anyLive := func() (uint64, bool) {
			for off := range m.live {
				return off, true
			}
			return 0, false
		}
		var recent []uint64
		var exhausted, refusedN, badFrees int
		offs := make([]uint64, 40)
		for op := 0; op < 6000; op++ {
			switch k := rng.IntN(10); {
			case k < 4: // Alloc
				sz := size()
				off, err := p.Alloc(sz)
				switch {
				case sz == 0:
					if !errors.Is(err, ErrInvalidSize) {
						t.Fatalf("Alloc(0) = %v", err)
					}
				case sz > maxBlock:
					if !errors.Is(err, ErrTooLarge) {
						t.Fatalf("Alloc(%d) = %v", sz, err)
					}
				case m.room(m.class(sz)) == 0:
					if !errors.Is(err, ErrPoolExhausted) {
						t.Fatalf("seed %d op %d: Alloc(%d) with no room = %d, %v", seed, op, sz, off, err)
					}
					exhausted++
				default:
					if err != nil {
						t.Fatalf("seed %d op %d: Alloc(%d) with room for %d: %v", seed, op, sz, m.room(m.class(sz)), err)
					}
					m.took(t, off, sz)
				}
			case k < 5: // AllocN
				sz := 1 + rng.Uint64N(uint64(1+rng.IntN(16))*kib)
				n := 1 + rng.IntN(len(offs))
				room := m.room(m.class(sz))
				err := p.AllocN(sz, offs[:n])
				if uint64(n) > room {
					if !errors.Is(err, ErrPoolExhausted) {
						t.Fatalf("seed %d op %d: AllocN(%d, %d) with room for %d = %v", seed, op, sz, n, room, err)
					}
					refusedN++
					break
				}
				if err != nil {
					t.Fatalf("seed %d op %d: AllocN(%d, %d) with room for %d: %v", seed, op, sz, n, room, err)
				}
				for _, off := range offs[:n] {
					m.took(t, off, sz)
				}
			case k < 9: // Free a live block
				off, ok := anyLive()
				if !ok {
					break
				}
				if bs, ok := p.BlockSize(off); !ok || bs != m.class(m.live[off]) {
					t.Fatalf("BlockSize(%d) = %d, %v; model says %d", off, bs, ok, m.class(m.live[off]))
				}
				if err := p.Free(off); err != nil {
					t.Fatalf("seed %d op %d: Free(live %d): %v", seed, op, off, err)
				}
				m.freed(off)
				recent = append(recent, off)
			default: // Free something that is not a live block
				var off uint64
				if len(recent) > 0 && rng.IntN(2) == 0 {
					off = recent[rng.IntN(len(recent))]
				} else {
					off = rng.Uint64N(p.Size() + maxBlock)
				}
				if _, live := m.live[off]; live {
					break
				}
				if err := p.Free(off); !errors.Is(err, ErrBadFree) {
					t.Fatalf("seed %d op %d: Free(%d), not live, = %v", seed, op, off, err)
				}
				badFrees++
			}
			if op%97 == 0 {
				m.compare(t, p.Stats())
				checkPool(t, p)
			}
		}
		m.compare(t, p.Stats())
		checkPool(t, p)
		// The run must have reached the interesting edges, or it proves little.
		if exhausted == 0 || refusedN == 0 || badFrees == 0 {
			t.Errorf("seed %d never hit an edge: %d exhausted, %d AllocN refused, %d bad frees", seed, exhausted, refusedN, badFrees)
		}
		t.Logf("seed %d: %d exhausted, %d AllocN refused, %d bad frees, %d live at end", seed, exhausted, refusedN, badFrees, len(m.live))
	}
}

// TestConcurrentAllocFree runs allocating goroutines that stamp their blocks
// and check nobody else wrote there before freeing them.
func TestConcurrentAllocFree(t *testing.T) {
	p := newTestPool(t, 16, 4*kib, 64*kib)
	mem := p.Bytes()
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			tag := byte(w + 1)
			type blk struct{ off, size uint64 }
			var held []blk
			offs := make([]uint64, 4)
			for i := 0; i < 3000; i++ {
				if len(held) < 6 && rng.IntN(3) > 0 {
					size := 1 + rng.Uint64N(32*kib)
					n := len(held)
					if rng.IntN(4) == 0 {
						if err := p.AllocN(size, offs); err == nil {
							for _, off := range offs {
								held = append(held, blk{off, size})
							}
						} else if !errors.Is(err, ErrPoolExhausted) {
							errs <- err
							return
						}
					} else if off, err := p.Alloc(size); err == nil {
						held = append(held, blk{off, size})
					} else if !errors.Is(err, ErrPoolExhausted) {
						errs <- err
						return
					}
					for _, b := range held[n:] {
						for j := range b.size {
							mem[b.off+j] = tag
						}
					}
					continue
				}
				if len(held) == 0 {
					continue
				}
				k := rng.IntN(len(held))
				b := held[k]
				held[k] = held[len(held)-1]
				held = held[:len(held)-1]
				for j := range b.size {
					if mem[b.off+j] != tag {
						errs <- errors.New("a block was written by another holder: blocks overlap")
						return
					}
				}
				if err := p.Free(b.off); err != nil {
					errs <- err
					return
				}
			}
			for _, b := range held {
				if err := p.Free(b.off); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Snapshots taken while the workers run must add up.
	stop := make(chan struct{})
	var statsWG sync.WaitGroup
	statsWG.Add(1)
	go func() {
		defer statsWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := p.Stats()
			var slabs, live, used uint64
			for _, c := range st.Classes {
				slabs += c.Slabs
				live += c.Live
				used += c.Live * c.BlockSize
			}
			if slabs+st.FreeSlabs != st.Slabs || live != st.Blocks || used != st.Used ||
				st.Used+st.FreeBytes != st.Size || st.Fragmentation < 0 || st.Fragmentation > 1 {
				errs <- fmt.Errorf("inconsistent snapshot: %+v", st)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	statsWG.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Blocks != 0 || st.FreeSlabs != st.Slabs {
		t.Fatalf("after all workers freed everything: %+v", st)
	}
	checkPool(t, p)
}
