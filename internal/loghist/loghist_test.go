package loghist

import (
	"math"
	"sync"
	"testing"
)

func TestIndexBounds(t *testing.T) {
	cases := []struct {
		v    uint64
		want int
	}{
		{0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {2049, 2}, {4096, 2},
		{1 << 20, 10}, {1<<20 + 1, 11}, {1 << 35, 25}, {1<<35 + 1, 26}, {math.MaxUint64, 26},
	}
	for _, c := range cases {
		if got := Index(c.v); got != c.want {
			t.Errorf("Index(%d) = %d, want %d", c.v, got, c.want)
		}
	}
	// Every value lands in the first bucket whose bound holds it.
	for i := 0; i < Buckets-1; i++ {
		b := uint64(Bound(i))
		if Index(b) != i || Index(b+1) != i+1 {
			t.Errorf("bound %d (%d ns): Index(b)=%d Index(b+1)=%d", i, b, Index(b), Index(b+1))
		}
	}
	if !math.IsInf(Bound(Buckets-1), 1) {
		t.Errorf("last bound %v, want +Inf", Bound(Buckets-1))
	}
}

func TestRecordFoldConcurrent(t *testing.T) {
	var hs [4]Hist
	var wg sync.WaitGroup
	for w := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				hs[w].Record(uint64(500 + i%3*1500)) // 500, 2000, 3500 ns
			}
		}()
	}
	wg.Wait()
	var s Snapshot
	for i := range hs {
		hs[i].AddTo(&s)
	}
	if s.Count() != 4000 {
		t.Fatalf("count %d, want 4000", s.Count())
	}
	// 1000 iterations: i%3 == 0 334 times, 1 and 2 333 times each.
	if s.Counts[0] != 4*334 || s.Counts[1] != 4*333 || s.Counts[2] != 4*333 {
		t.Fatalf("counts %v", s.Counts[:4])
	}
	if want := uint64(4 * (334*500 + 333*2000 + 333*3500)); s.Sum != want {
		t.Fatalf("sum %d, want %d", s.Sum, want)
	}
}

func TestQuantile(t *testing.T) {
	var h Hist
	for range 90 {
		h.Record(1500) // bucket 1: (1024, 2048]
	}
	for range 10 {
		h.Record(100_000) // bucket 7: (65536, 131072]
	}
	var s Snapshot
	h.AddTo(&s)
	if q := s.Quantile(0.5); q <= 1024 || q > 2048 {
		t.Errorf("p50 = %v, want inside (1024, 2048]", q)
	}
	if q := s.Quantile(0.99); q <= 65536 || q > 131072 {
		t.Errorf("p99 = %v, want inside (65536, 131072]", q)
	}
	var empty Snapshot
	if empty.Quantile(0.5) != 0 {
		t.Error("empty snapshot has a quantile")
	}
	d := s.Sub(&empty)
	if d.Count() != 100 {
		t.Errorf("delta count %d", d.Count())
	}
	if back := empty.Sub(&s); back.Count() != 0 || back.Sum != 0 {
		t.Errorf("a snapshot that went backwards gave %v", back)
	}
}

func TestRecordAllocs(t *testing.T) {
	var h Hist
	if n := testing.AllocsPerRun(1000, func() { h.Record(12345) }); n != 0 {
		t.Fatalf("Record allocates %v times", n)
	}
}
