package client

import (
	"os"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
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
