package bench

import (
	"math"
	"math/bits"
)

// Histogram is a log-linear latency histogram (HDR-style): values below
// 2^subBits are counted exactly; above, each power of two is split into
// 2^subBits equal buckets, so a bucket's width is at most 1/2^subBits of
// its lower bound and a reported value (the bucket's midpoint) is within
// 1/2^(subBits+1) of every value the bucket holds. Record never allocates;
// histograms of the same shape merge by adding counts.
//
// A Histogram is not safe for concurrent use; each worker records into its
// own and the runner merges them.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	min    uint64
	max    uint64
	sum    float64
	sumsq  float64
}

const (
	subBits  = 7
	subCount = 1 << subBits
	// maxExp is the largest power of two kept apart; larger values land in
	// the last bucket (2^48 ns is more than three days).
	maxExp      = 47
	histBuckets = subCount + (maxExp-subBits+1)*subCount
)

// HistRelErr is the histogram's bound on the relative error of a reported
// percentile.
const HistRelErr = 1.0 / (2 * subCount)

func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	e := bits.Len64(v) - 1
	if e > maxExp {
		return histBuckets - 1
	}
	shift := uint(e - subBits)
	sub := int(v>>shift) - subCount
	return subCount + (e-subBits)*subCount + sub
}

// bucketRange returns the smallest value and the width of bucket i.
func bucketRange(i int) (lo, width uint64) {
	if i < subCount {
		return uint64(i), 1
	}
	k := i - subCount
	e := k/subCount + subBits
	sub := uint64(k % subCount)
	shift := uint(e - subBits)
	return (subCount + sub) << shift, 1 << shift
}

// Record adds one value (nanoseconds, for latencies).
func (h *Histogram) Record(v uint64) {
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	f := float64(v)
	h.sum += f
	h.sumsq += f * f
}

// Merge adds o's counts into h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
	h.sumsq += o.sumsq
}

// Reset empties h.
func (h *Histogram) Reset() { *h = Histogram{} }

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Min is the smallest recorded value (exact), 0 when empty.
func (h *Histogram) Min() uint64 { return h.min }

// Max is the largest recorded value (exact), 0 when empty.
func (h *Histogram) Max() uint64 { return h.max }

// Mean is the exact mean of the recorded values.
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Stddev is the sample standard deviation of the recorded values.
func (h *Histogram) Stddev() float64 {
	if h.n < 2 {
		return 0
	}
	n := float64(h.n)
	v := (h.sumsq - h.sum*h.sum/n) / (n - 1)
	if v < 0 {
		return 0
	}
	return math.Sqrt(v)
}

// Percentile returns the value at percentile p (0 < p ≤ 100): the value of
// rank ceil(p/100·n) in sorted order, within HistRelErr, clamped to the
// exact min and max.
func (h *Histogram) Percentile(p float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(p / 100 * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	if rank > h.n {
		rank = h.n
	}
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= rank {
			lo, w := bucketRange(i)
			v := lo + (w-1)/2
			if v < h.min {
				v = h.min
			}
			if v > h.max {
				v = h.max
			}
			return v
		}
	}
	return h.max
}

// Buckets calls fn for every non-empty bucket, in increasing order, with its
// lower bound, width and count (for plots).
func (h *Histogram) Buckets(fn func(lo, width, count uint64)) {
	for i, c := range h.counts {
		if c != 0 {
			lo, w := bucketRange(i)
			fn(lo, w, c)
		}
	}
}

// Percentiles are the points fio reports by default.
var Percentiles = []float64{1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}
