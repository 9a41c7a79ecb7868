package ktrace

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/tensorcast/tensorcast/internal/loghist"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// openOrSkip loads view w or skips the test naming what is missing.
func openOrSkip(t *testing.T, w View, opts ...Options) *Views {
	t.Helper()
	testutil.Require(t, testutil.BPF)
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	v, errs := Open([]View{w}, o)
	if err := errs[w]; err != nil {
		if errors.Is(err, ErrNoCapability) || errors.Is(err, ErrNoHook) {
			testutil.Missing(t, testutil.BPF, "eBPF view %s unavailable: %v", w, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return v
}

func total(rs []Ring) (n uint64) {
	for _, r := range rs {
		n += r.Latency.Count()
	}
	return n
}

// TestUringLatencyCounts submits a known number of io_uring requests on
// two rings of this process and finds exactly that many in the kernel-side
// histograms, per ring.
func TestUringLatencyCounts(t *testing.T) {
	v := openOrSkip(t, ViewUring)
	if rs := v.Rings(); total(rs) != 0 {
		t.Fatalf("%d completions counted before any request: %+v", total(rs), rs)
	}
	a := newNopRing(t, 32)
	a.nops(t, 32, 1000)
	a.nops(t, 5, 2000)
	rs := v.Rings()
	if len(rs) != 1 || rs[0].ID != 1 || rs[0].Latency.Count() != 37 {
		t.Fatalf("after 37 NOPs on one ring: %+v", rs)
	}
	if rs[0].Latency.Sum == 0 {
		t.Error("latency sum is zero")
	}
	b := newNopRing(t, 8)
	b.nops(t, 8, 0)
	rs = v.Rings()
	if len(rs) != 2 || rs[0].ID != 1 || rs[0].Latency.Count() != 37 || rs[1].ID != 2 || rs[1].Latency.Count() != 8 {
		t.Fatalf("after 8 more on a second ring: %+v", rs)
	}
	// A NOP completes within microseconds; nothing should be in the
	// unbounded bucket.
	if rs[0].Latency.Counts[loghist.Buckets-1] != 0 {
		t.Errorf("NOP latencies past %v ns: %v", loghist.Bound(loghist.Buckets-2), rs[0].Latency.Counts)
	}
}

// TestUringFlagTimesOnlyFlagged: with Options.UringFlag the view counts
// exactly the requests whose user_data carries the bit.
func TestUringFlagTimesOnlyFlagged(t *testing.T) {
	const flag = 1 << 60
	v := openOrSkip(t, ViewUring, Options{UringFlag: flag})
	r := newNopRing(t, 32)
	r.nops(t, 20, 0)
	r.nops(t, 12, flag)
	r.nops(t, 7, 100)
	if rs := v.Rings(); len(rs) != 1 || rs[0].Latency.Count() != 12 {
		t.Fatalf("after 12 flagged NOPs among 39: %+v", rs)
	}
}

func TestOpenRefusesAFlagOfTwoBits(t *testing.T) {
	v, errs := Open([]View{ViewUring}, Options{UringFlag: 3})
	if v != nil || errs[ViewUring] == nil || !strings.Contains(errs[ViewUring].Error(), "more than one bit") {
		t.Fatalf("Open with a two-bit flag: %v, %v", v, errs)
	}
}

// TestLog2BucketMatchesLoghist runs the program's bucket computation in
// the kernel (BPF_PROG_TEST_RUN of a tiny program around it) against
// loghist.Index.
func TestLog2BucketMatchesLoghist(t *testing.T) {
	testutil.Require(t, testutil.BPF)
	run := bucketRunner(t)
	for _, v := range []uint64{0, 1, 1024, 1025, 2048, 2049, 4096, 1 << 20, 1<<20 + 1, 123456789, 1 << 35, 1<<35 + 1, 1 << 62} {
		if got, want := run(v), loghist.Index(v); got != want {
			t.Errorf("bucket(%d) = %d in the kernel, loghist.Index = %d", v, got, want)
		}
	}
}

// bucketRunner loads log2Bucket in a raw tracepoint program that returns
// the bucket of its first argument, run with BPF_PROG_TEST_RUN.
func bucketRunner(t *testing.T) func(uint64) int {
	t.Helper()
	ins := asm.Instructions{asm.LoadMem(asm.R8, asm.R1, 0, asm.DWord)}
	ins = append(ins, log2Bucket("done")...)
	ins = append(ins, asm.Mov.Reg(asm.R0, asm.R9).WithSymbol("done"), asm.Return())
	p, err := newProgram("tc_bucket_test", ins)
	if err != nil {
		testutil.Missing(t, testutil.BPF, "cannot load a raw tracepoint program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return func(v uint64) int {
		ctx := make([]byte, 8)
		binary.NativeEndian.PutUint64(ctx, v)
		ret, err := p.Run(&ebpf.RunOptions{Context: ctx})
		if err != nil {
			t.Fatalf("test run: %v", err)
		}
		return int(ret)
	}
}
