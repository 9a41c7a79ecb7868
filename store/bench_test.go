package store

import (
	"fmt"
	"testing"
	"time"
)

// Benchmarks report ns/key: the daemon CPU one key costs (the calls run on
// the benchmark goroutine, nothing else is involved). Run them on a quiet
// machine:
//
//	go test -run '^$' -bench . -benchtime 2s ./store/
//
// and compare runs with benchstat.

var batches = []int{1, 128}

// sameSize gives every key a value of n bytes.
func sameSize(keys [][]byte, n int) [][]byte {
	vs := make([][]byte, len(keys))
	for i, k := range keys {
		vs[i] = valueFor(k, n)
	}
	return vs
}

func benchEnv(b *testing.B, poolSize uint64, opts ...envOpt) (*testEnv, *Session) {
	b.Helper()
	e := newEnv(b, poolSize, opts...)
	ss := e.s.NewSession()
	b.Cleanup(func() { ss.Close() })
	return e, ss
}

func perKey(b *testing.B, keys int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(keys), "ns/key")
}

// BenchmarkGetRelease: the zero-copy Get of L1-resident keys (pin, return
// locations) and the Unpin that releases them.
func BenchmarkGetRelease(b *testing.B) {
	for _, n := range batches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			e, ss := benchEnv(b, 64<<20)
			keys := keysN("g", 4096)
			mustCodes(b, "put", e.put(ss, keys, sameSize(keys, 100), false), OK)
			locs := make([]Location, n)
			codes := make([]Code, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				k := keys[(i*n)%4096:][:n]
				if _, err := ss.Get(k, locs, codes, nil, nil, 0); err != nil {
					b.Fatal(err)
				}
				if err := ss.Unpin(k, codes); err != nil {
					b.Fatal(err)
				}
			}
			perKey(b, n)
		})
	}
}

// BenchmarkGetReleaseParallel: Get+Unpin at batch 128 from one session per
// goroutine, as many queue workers do at once.
func BenchmarkGetReleaseParallel(b *testing.B) {
	e, ss := benchEnv(b, 64<<20)
	keys := keysN("p", 8192)
	mustCodes(b, "put", e.put(ss, keys, sameSize(keys, 100), false), OK)
	const n = 128
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		my := e.s.NewSession()
		defer my.Close()
		locs := make([]Location, n)
		codes := make([]Code, n)
		for i := 0; pb.Next(); i++ {
			k := keys[(i*n)%8192:][:n]
			if _, err := my.Get(k, locs, codes, nil, nil, 0); err != nil {
				b.Fatal(err)
			}
			if err := my.Unpin(k, codes); err != nil {
				b.Fatal(err)
			}
		}
	})
	perKey(b, n)
}

// BenchmarkExists: existence probes of stored keys.
func BenchmarkExists(b *testing.B) {
	for _, n := range batches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			e, ss := benchEnv(b, 64<<20)
			keys := keysN("e", 4096)
			mustCodes(b, "put", e.put(ss, keys, sameSize(keys, 100), false), OK)
			codes := make([]Code, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := e.s.Exists(keys[(i*n)%4096:][:n], codes); err != nil {
					b.Fatal(err)
				}
			}
			perKey(b, n)
		})
	}
}

// BenchmarkLookupPrefix: a chain of n present keys, without and with the
// pin (the pinned run includes the Unpin that releases the prefix).
func BenchmarkLookupPrefix(b *testing.B) {
	for _, pin := range []bool{false, true} {
		for _, n := range batches {
			b.Run(fmt.Sprintf("pin=%v/batch=%d", pin, n), func(b *testing.B) {
				e, ss := benchEnv(b, 64<<20)
				keys := keysN("c", 4096)
				mustCodes(b, "put", e.put(ss, keys, sameSize(keys, 100), false), OK)
				codes := make([]Code, n)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					k := keys[(i*n)%4096:][:n]
					if got, err := ss.LookupPrefix(k, pin); err != nil || got != n {
						b.Fatal(got, err)
					}
					if pin {
						if err := ss.Unpin(k, codes); err != nil {
							b.Fatal(err)
						}
					}
				}
				perKey(b, n)
			})
		}
	}
}

// BenchmarkCommit: the zero-copy put's commit, with the Reserve before it
// and the Remove that recycles the keys timed apart (each reported per
// key).
func BenchmarkCommit(b *testing.B) {
	for _, n := range batches {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			_, ss := benchEnv(b, 64<<20)
			s := ss.s
			keys := keysN("m", n)
			sizes := make([]uint64, n)
			for i := range sizes {
				sizes[i] = 4096
			}
			locs := make([]Location, n)
			codes := make([]Code, n)
			var reserve, commit, remove time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				if err := ss.Reserve(keys, sizes, locs, codes, nil); err != nil || codes[0] != OK {
					b.Fatal(err, codes[0])
				}
				t1 := time.Now()
				if _, err := ss.Commit(keys, false, codes, nil, nil, 0); err != nil || codes[0] != OK {
					b.Fatal(err, codes[0])
				}
				t2 := time.Now()
				if _, err := s.Remove(keys, codes, nil, nil, 0); err != nil || codes[0] != OK {
					b.Fatal(err, codes[0])
				}
				t3 := time.Now()
				reserve, commit, remove = reserve+t1.Sub(t0), commit+t2.Sub(t1), remove+t3.Sub(t2)
			}
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / float64(n) }
			b.ReportMetric(per(commit), "commit-ns/key")
			b.ReportMetric(per(reserve), "reserve-ns/key")
			b.ReportMetric(per(remove), "remove-ns/key")
		})
	}
}

// BenchmarkZeroCopy256K: what a client moves through the store without a
// copy: Reserve, write the block in place, Commit; Get, read in place,
// Unpin (the reads and writes are the client's memcpy into its own mapped
// pool). BenchmarkCopying256K is the copying form of the same puts and
// gets; BenchmarkMemcpy256K the bare memcpy a copying store pays per hop.
func BenchmarkZeroCopy256K(b *testing.B) {
	const size, n = 256 << 10, 16
	e, ss := benchEnv(b, 64<<20, withCfg(func(c *Config) { c.L1Capacity = 64 << 20 }))
	s := ss.s
	keys := keysN("z", n)
	sizes := make([]uint64, n)
	for i := range sizes {
		sizes[i] = size
	}
	src := make([]byte, size)
	dst := make([]byte, size)
	locs := make([]Location, n)
	codes := make([]Code, n)
	mem := e.pool.Bytes()
	b.SetBytes(2 * size * n)
	b.ResetTimer()
	for b.Loop() {
		if err := ss.Reserve(keys, sizes, locs, codes, nil); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0])
		}
		for _, l := range locs {
			copy(mem[l.Offset:l.Offset+l.Length], src)
		}
		if _, err := ss.Commit(keys, false, codes, nil, nil, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := ss.Get(keys, locs, codes, nil, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err)
		}
		for _, l := range locs {
			copy(dst, mem[l.Offset:l.Offset+l.Length])
		}
		if err := ss.Unpin(keys, codes); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Remove(keys, codes, nil, nil, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCopying256K(b *testing.B) {
	const size, n = 256 << 10, 16
	e, ss := benchEnv(b, 64<<20, withCfg(func(c *Config) { c.L1Capacity = 64 << 20 }))
	keys := keysN("y", n)
	vals := make([][]byte, n)
	dsts := make([][]byte, n)
	for i := range vals {
		vals[i], dsts[i] = make([]byte, size), make([]byte, size)
	}
	lens := make([]uint64, n)
	codes := make([]Code, n)
	b.SetBytes(2 * size * n)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ss.Put(keys, vals, false, codes, nil, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err, codes[0])
		}
		if _, err := e.s.Read(keys, dsts, lens, codes, nil, nil, 0); err != nil || codes[0] != OK {
			b.Fatal(err)
		}
		if _, err := e.s.Remove(keys, codes, nil, nil, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemcpy256K(b *testing.B) {
	src, dst := make([]byte, 256<<10), make([]byte, 256<<10)
	b.SetBytes(256 << 10)
	for b.Loop() {
		copy(dst, src)
	}
}
