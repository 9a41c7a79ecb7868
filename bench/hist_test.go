package bench

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// exactPercentile is the value of rank ceil(p/100·n) of sorted v.
func exactPercentile(sorted []uint64, p float64) uint64 {
	r := int(math.Ceil(p / 100 * float64(len(sorted))))
	r = max(1, min(r, len(sorted)))
	return sorted[r-1]
}

func TestHistogramAccuracy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dist := range []struct {
		name string
		gen  func() uint64
	}{
		{"lognormal", func() uint64 { return uint64(math.Exp(rng.NormFloat64()*1.5 + 10)) }},
		{"uniform-small", func() uint64 { return rng.Uint64N(300) }},
		{"uniform-wide", func() uint64 { return rng.Uint64N(1 << 40) }},
		{"bimodal", func() uint64 {
			if rng.IntN(10) == 0 {
				return 5_000_000 + rng.Uint64N(1_000_000)
			}
			return 20_000 + rng.Uint64N(2_000)
		}},
	} {
		t.Run(dist.name, func(t *testing.T) {
			var h Histogram
			v := make([]uint64, 200_000)
			var sum float64
			for i := range v {
				v[i] = dist.gen()
				h.Record(v[i])
				sum += float64(v[i])
			}
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			if h.Count() != uint64(len(v)) || h.Min() != v[0] || h.Max() != v[len(v)-1] {
				t.Fatalf("count/min/max = %d/%d/%d, want %d/%d/%d", h.Count(), h.Min(), h.Max(), len(v), v[0], v[len(v)-1])
			}
			if mean := sum / float64(len(v)); math.Abs(h.Mean()-mean) > 1e-9*mean {
				t.Errorf("mean = %g, want %g", h.Mean(), mean)
			}
			for _, p := range append([]float64{0.1, 25, 75}, Percentiles...) {
				want := exactPercentile(v, p)
				got := h.Percentile(p)
				diff := math.Abs(float64(got) - float64(want))
				if diff > HistRelErr*float64(want)+0.5 {
					t.Errorf("p%g = %d, exact %d: relative error %.5f > %.5f", p, got, want, diff/float64(want), HistRelErr)
				}
			}
		})
	}
}

func TestHistogramStddevAndMerge(t *testing.T) {
	var a, b, all Histogram
	rng := rand.New(rand.NewPCG(3, 4))
	var vals []float64
	for i := 0; i < 10_000; i++ {
		x := rng.Uint64N(1_000_000)
		if i%2 == 0 {
			a.Record(x)
		} else {
			b.Record(x)
		}
		all.Record(x)
		vals = append(vals, float64(x))
	}
	var m, q float64
	for _, x := range vals {
		m += x
	}
	m /= float64(len(vals))
	for _, x := range vals {
		q += (x - m) * (x - m)
	}
	sd := math.Sqrt(q / float64(len(vals)-1))
	if math.Abs(all.Stddev()-sd) > 1e-6*sd {
		t.Errorf("stddev = %g, want %g", all.Stddev(), sd)
	}
	a.Merge(&b)
	if a.Count() != all.Count() || a.Min() != all.Min() || a.Max() != all.Max() {
		t.Fatalf("merged count/min/max differ")
	}
	for _, p := range Percentiles {
		if a.Percentile(p) != all.Percentile(p) {
			t.Errorf("merged p%g = %d, want %d", p, a.Percentile(p), all.Percentile(p))
		}
	}
	var empty Histogram
	if empty.Percentile(50) != 0 || empty.Stddev() != 0 || empty.Mean() != 0 {
		t.Error("empty histogram reports values")
	}
}

func TestHistogramBuckets(t *testing.T) {
	// Every value lands in a bucket that contains it, and bucket bounds are
	// contiguous.
	var next uint64
	for i := 0; i < histBuckets-1; i++ {
		lo, w := bucketRange(i)
		if lo != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, next)
		}
		if bucketOf(lo) != i || bucketOf(lo+w-1) != i {
			t.Fatalf("bucket %d [%d,+%d) does not hold its bounds", i, lo, w)
		}
		next = lo + w
	}
	if bucketOf(math.MaxUint64) != histBuckets-1 {
		t.Error("huge value not in the last bucket")
	}
}

func TestHistogramRecordAllocs(t *testing.T) {
	h := new(Histogram)
	n := testing.AllocsPerRun(1000, func() { h.Record(12345) })
	if n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	var h Histogram
	for i := 0; b.Loop(); i++ {
		h.Record(uint64(i) * 7919)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
