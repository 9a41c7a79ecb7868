// Package loghist is a lock-free latency histogram with power-of-two
// buckets, for counters that are written on hot paths and read at scrape
// time. Record is a handful of atomic adds and never allocates; readers
// fold any number of histograms into a Snapshot.
//
// Bucket i counts values v (nanoseconds) with v <= Bound(i): Bound(0) is
// 2^MinShift ns (about 1 µs), each further bound doubles, and the last
// bucket (index Buckets-1) takes everything above Bound(Buckets-2), about
// 34 s. The eBPF views in package ktrace bucket kernel-side latencies with
// the same function, so both fold into the same exposition.
package loghist

import (
	"math"
	"math/bits"
	"sync/atomic"
)

const (
	// MinShift: the first bucket's bound is 2^MinShift ns.
	MinShift = 10
	// Buckets is the number of buckets, the last one unbounded.
	Buckets = 27
)

// Index is the bucket of v nanoseconds.
func Index(v uint64) int {
	if v <= 1<<MinShift {
		return 0
	}
	i := bits.Len64((v - 1) >> MinShift)
	if i > Buckets-1 {
		return Buckets - 1
	}
	return i
}

// Bound is the inclusive upper bound of bucket i in nanoseconds; +Inf for
// the last bucket.
func Bound(i int) float64 {
	if i >= Buckets-1 {
		return math.Inf(1)
	}
	return float64(uint64(1) << (MinShift + i))
}

// Hist is one writer group's histogram: counts per bucket and the exact sum
// of the recorded values. The zero value is ready; it must not be copied
// after first use.
type Hist struct {
	counts [Buckets]atomic.Uint64
	sum    atomic.Uint64
}

// Record adds one value of ns nanoseconds.
func (h *Hist) Record(ns uint64) {
	h.counts[Index(ns)].Add(1)
	h.sum.Add(ns)
}

// RecordN adds n values of ns nanoseconds each.
func (h *Hist) RecordN(ns, n uint64) {
	h.counts[Index(ns)].Add(n)
	h.sum.Add(ns * n)
}

// AddTo folds h into s. Counts are read one by one, so a fold that races
// with Record may see a value in Count before it is in Sum; both are
// monotonic.
func (h *Hist) AddTo(s *Snapshot) {
	for i := range h.counts {
		s.Counts[i] += h.counts[i].Load()
	}
	s.Sum += h.sum.Load()
}

// Snapshot is a folded histogram: counts per bucket (not cumulative) and
// the sum of the values, in nanoseconds.
type Snapshot struct {
	Counts [Buckets]uint64
	Sum    uint64
}

// Count is the number of recorded values.
func (s *Snapshot) Count() uint64 {
	var n uint64
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Add adds o's counts into s.
func (s *Snapshot) Add(o *Snapshot) {
	for i, c := range o.Counts {
		s.Counts[i] += c
	}
	s.Sum += o.Sum
}

// Sub returns s - o, for the values recorded between two snapshots of the
// same histograms (o taken first). A bucket that went backwards (the
// source restarted) counts as zero.
func (s *Snapshot) Sub(o *Snapshot) Snapshot {
	var d Snapshot
	for i := range s.Counts {
		if s.Counts[i] > o.Counts[i] {
			d.Counts[i] = s.Counts[i] - o.Counts[i]
		}
	}
	if s.Sum > o.Sum {
		d.Sum = s.Sum - o.Sum
	}
	return d
}

// Quantile estimates the q-quantile (0 < q <= 1) in nanoseconds by linear
// interpolation inside the bucket that holds it, as Prometheus'
// histogram_quantile does; values in the last bucket report its lower
// bound. It returns 0 for an empty snapshot.
func (s *Snapshot) Quantile(q float64) float64 {
	n := s.Count()
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var cum uint64
	for i, c := range s.Counts {
		if c == 0 {
			continue
		}
		if float64(cum+c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = Bound(i - 1)
			}
			if i == Buckets-1 {
				return lo
			}
			return lo + (Bound(i)-lo)*(rank-float64(cum))/float64(c)
		}
		cum += c
	}
	return Bound(Buckets - 2)
}
