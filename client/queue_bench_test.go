package client

import (
	"os"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// benchQueue dials the daemon at $TENSORCAST_BENCH_SOCKET (the one
// scripts/bench-clib.sh starts and times libtensorcast against, in another
// process), or else an in-process daemon, and opens a queue of 64 entries.
func benchQueue(b *testing.B) (*Client, *Queue) {
	b.Helper()
	sock := os.Getenv("TENSORCAST_BENCH_SOCKET")
	if sock == "" {
		sock = startDaemon(b).sock
	}
	c, err := Dial(sock, Options{Name: "go-qbench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	q, err := c.OpenQueue(64)
	if err != nil {
		b.Fatal(err)
	}
	return c, q
}

// benchRounds times b.N depth-1 round trips through the queue after b.N/10
// of warm-up (the loop of c/bench/queue_bench.c): submit one request (a NOP
// when req is nil), reap its completion.
func benchRounds(b *testing.B, q *Queue, req *xfer.Request) {
	b.Helper()
	cqes := make([]Completion, 1)
	reqs := make([]xfer.Request, 1)
	uds := make([]uint64, 1)
	if req != nil {
		reqs[0] = *req
	}
	round := func(i int) {
		if req == nil {
			if ok, err := q.Nop(uint64(i)); !ok || err != nil {
				b.Fatal(ok, err)
			}
		} else {
			uds[0] = uint64(i)
			if n, err := q.Submit(reqs, uds); n != 1 || err != nil {
				b.Fatal(n, err)
			}
		}
		if n, err := q.Reap(cqes, 1, 10*time.Second); n != 1 || err != nil || cqes[0].Code != tcproto.CodeOK {
			b.Fatal(n, err, cqes[0])
		}
	}
	for i := 0; i < b.N/10; i++ {
		round(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		round(i)
	}
}

// BenchmarkQueueNop is a NOP's round trip through a queue at depth 1: the
// queue's own cost, compared with libtensorcast's by scripts/bench-clib.sh.
func BenchmarkQueueNop(b *testing.B) {
	_, q := benchQueue(b)
	benchRounds(b, q, nil)
}

// BenchmarkQueueWrite4K is a 4 KiB local WRITE (a client buffer into a pool
// block) through a queue at depth 1.
func BenchmarkQueueWrite4K(b *testing.B) {
	c, q := benchQueue(b)
	w := write4K(b, c)
	benchRounds(b, q, &w)
}

// The stream of c/bench/queue_bench.c: 64 KiB local copies, 32 in flight,
// each wait for 16 completions followed by 16 submits (tcbench's local-64k
// job), over a 128 MiB working set on each side.
const (
	streamChunk = 64 << 10
	streamSet   = 128 << 20
	streamDepth = 32
	streamBatch = 16
)

// BenchmarkQueueStream64KWrite streams 64 KiB WRITEs (a client buffer into
// pool blocks) through a queue; scripts/bench-clib.sh compares it with
// libtensorcast's. It reports GiB/s and this process's CPU per request.
func BenchmarkQueueStream64KWrite(b *testing.B) { benchStream(b, xfer.OpWrite) }

// BenchmarkQueueStream64KRead is BenchmarkQueueStream64KWrite with READs
// (pool blocks into a client buffer).
func BenchmarkQueueStream64KRead(b *testing.B) { benchStream(b, xfer.OpRead) }

func benchStream(b *testing.B, op xfer.Op) {
	c, q := benchQueue(b)
	pool, ok := c.Pool()
	if !ok {
		b.Fatal("no pool")
	}
	// The in-process daemon's pool is small: a quarter of it, there.
	slots := int(min(streamSet, pool.Size/4) / streamChunk)
	buf, err := c.RegisterBuffer(uint64(slots) * streamChunk)
	if err != nil {
		b.Fatal(err)
	}
	for i := range buf.Mem {
		buf.Mem[i] = 3 // touched, as the C side's memset
	}
	blocks, err := c.AllocBlocks(nil, slots, streamChunk)
	if err != nil {
		b.Fatal(err)
	}
	// Freed before the next run of another client asks for as many.
	b.Cleanup(func() {
		if err := c.FreeBlocks(blocks, make([]error, len(blocks))); err != nil {
			b.Error(err)
		}
	})
	reqs := make([]xfer.Request, streamDepth)
	uds := make([]uint64, streamDepth)
	cqes := make([]Completion, streamDepth)
	// run completes n requests, keeping streamDepth in flight.
	run := func(n int) {
		issued, done, inflight := 0, 0, 0
		for done < n {
			want := streamBatch
			if inflight == 0 {
				want = streamDepth
			}
			k := 0
			for ; k < want && issued < n; k, issued = k+1, issued+1 {
				i := issued % slots
				reqs[k] = xfer.Request{Op: op, Local: buf.ID, LocalOffset: uint64(i * streamChunk), Target: pool.Segment,
					TargetOffset: blocks[i], Length: streamChunk}
				uds[k] = uint64(issued)
			}
			if k > 0 {
				if got, err := q.Submit(reqs[:k], uds[:k]); got != k || err != nil {
					b.Fatal(got, err)
				}
				inflight += k
			}
			got, err := q.Reap(cqes, min(inflight, streamBatch), 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			for _, cq := range cqes[:got] {
				if cq.Code != tcproto.CodeOK || cq.N != streamChunk {
					b.Fatal(cq)
				}
			}
			inflight -= got
			done += got
		}
	}
	run(max(b.N/10, streamDepth))
	cpu0 := testutil.ProcessCPU()
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)*streamChunk/b.Elapsed().Seconds()/(1<<30), "GiB/s")
	b.ReportMetric(float64((testutil.ProcessCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
