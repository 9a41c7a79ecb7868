package tcp

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// benchPair starts two nodes on loopback; a reads and writes b's "seg".
func benchPair(b *testing.B, conns int) (*testNode, *Remote) {
	kf := testutil.KeyFile(b, b.TempDir(), "k", "bench")
	a := startNode(b, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: conns})
	p := startNode(b, Config{DaemonID: "b", ClusterKeyFile: kf, ConnsPerPeer: conns})
	p.exp.add("seg", xfertest.NewSegment(9, 64<<20))
	link(b, a, p)
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		b.Fatal(err)
	}
	return a, r
}

// pipeline keeps depth requests of size bytes in flight until b.N have
// completed, resubmitting each task as it ends.
func pipeline(b *testing.B, a *testNode, r *Remote, op xfer.Op, size uint64, depth int) {
	local := xfertest.NewSegment(1, 64<<20)
	cc := make(xfertest.Chan, depth) // hands finished tasks back to the driver
	tasks := make([]*xfer.Task, depth)
	slots := uint64(64<<20) / size
	for i := range tasks {
		off := (uint64(i) % slots) * size
		t := &xfer.Task{Req: xfer.Request{Op: op, LocalOffset: off, TargetOffset: off, Length: size}, Local: local, Target: r}
		t.SetCompleter(cc)
		tasks[i] = t
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	start, cpu0 := time.Now(), testutil.ProcessCPU()
	inflight := min(depth, b.N)
	if _, err := a.Submit(tasks[:inflight]); err != nil {
		b.Fatal(err)
	}
	submitted := inflight
	one := make([]*xfer.Task, 1)
	for done := 0; done < b.N; done++ {
		e := <-cc
		if e.Err != nil {
			b.Fatalf("bench task failed: %v", e.Err)
		}
		t := e.Task
		if submitted < b.N {
			one[0] = t
			if _, err := a.Submit(one); err != nil {
				b.Fatal(err)
			}
			submitted++
		}
	}
	el, cpu := time.Since(start), testutil.ProcessCPU()-cpu0
	b.ReportMetric(float64(b.N)/el.Seconds(), "ops/s")
	b.ReportMetric(float64(b.N)*float64(size)*8/el.Seconds()/1e9, "Gbit/s")
	// Both nodes are in this process: the CPU of both ends per GB moved.
	b.ReportMetric(cpu.Seconds()/(float64(b.N)*float64(size)/1e9), "cpu-s/GB")
}

// BenchmarkTransfer (driven by scripts/bench-tcp.sh): bandwidth of READ and WRITE of 1 and 4 MiB requests
// over 1 and 4 connections, and 4 KiB request rates at depth 1 and 64.
func BenchmarkTransfer(b *testing.B) {
	type cfg struct {
		conns int
		size  uint64
		depth int
	}
	// Depths keep about two windows of requests queued (the default window
	// is 4 MiB per connection).
	cases := []cfg{{1, 1 << 20, 8}, {1, 4 << 20, 2}, {4, 1 << 20, 32}, {4, 4 << 20, 8}, {1, 4096, 1}, {4, 4096, 64}}
	for _, c := range cases {
		for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
			name := fmt.Sprintf("%s/size=%d/conns=%d/depth=%d", op, c.size, c.conns, c.depth)
			b.Run(name, func(b *testing.B) {
				a, r := benchPair(b, c.conns)
				pipeline(b, a, r, op, c.size, c.depth)
			})
		}
	}
}

// BenchmarkRawPingPong is the reference for small requests: plain TCP on
// loopback, a 4 KiB request answered by a 4 KiB reply, depth requests in
// flight.
func BenchmarkRawPingPong(b *testing.B) {
	for _, depth := range []int{1, 64} {
		b.Run(fmt.Sprintf("size=4096/depth=%d", depth), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			req := make([]byte, 4096)
			resp := make([]byte, 4096)
			b.SetBytes(4096)
			b.ResetTimer()
			start := time.Now()
			// The writer keeps depth requests ahead of the reader.
			sent := make(chan struct{}, depth)
			go func() {
				for i := 0; i < b.N; i++ {
					sent <- struct{}{}
					if _, err := c.Write(req); err != nil {
						return
					}
				}
			}()
			for i := 0; i < b.N; i++ {
				if _, err := io.ReadFull(c, resp); err != nil {
					b.Fatal(err)
				}
				<-sent
			}
			el := time.Since(start)
			b.ReportMetric(float64(b.N)/el.Seconds(), "ops/s")
			c.Close()
			ln.Close()
			wg.Wait()
		})
	}
}

// BenchmarkReaperLook: one reaper look at a connection with many requests
// outstanding and none due costs the same however many there are (the old
// reaper walked every request each tick, under the peer's lock).
func BenchmarkReaperLook(b *testing.B) {
	for _, outstanding := range []int{16, 4096, 65536} {
		b.Run(fmt.Sprintf("outstanding=%d", outstanding), func(b *testing.B) {
			n := &Node{cfg: Config{RequestTimeout: 30 * time.Second}}
			c := &conn{n: n, reqs: make(map[uint64]*pending, outstanding)}
			now := time.Now().UnixNano()
			for i := 0; i < outstanding; i++ {
				c.addLocked(&pending{kind: pkWrite, id: uint64(i + 1), sent: now,
					ts: &taskState{deadline: now + int64(time.Duration(i)*time.Microsecond) + int64(time.Second)}})
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if late, why := c.expireLocked(now, nil); len(late) != 0 || why != "" {
					b.Fatal("something expired")
				}
			}
		})
	}
}
