package bench

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// lowRateGap is BenchmarkDaemonCPUAtLowRate's time between two requests:
// an engine asking for a block every decode step, 50 a second.
const lowRateGap = 20 * time.Millisecond

// BenchmarkDaemonCPUAtLowRate measures what a daemon's CPU costs per
// request when requests come 20 ms apart (the daemon sleeps between
// them), beside a raw unix-socket echo server (a Go process, this test
// binary's ping-pong child) answering 4 KiB at the same pace:
//
//	daemon    a client gets a 4 KiB key through its queue and unpins it,
//	          then waits for the next tick; the daemon's CPU (/proc) per get;
//	pingpong  4 KiB there and back over a unix socket, at the same ticks;
//	          the echo process's CPU per round trip.
//
// The pace is the workload: a request at each tick of a 20 ms clock.
// Each reports cpu-µs/req and cpu-ms/s of the server side.
//
//	go test -run '^$' -bench '^BenchmarkDaemonCPUAtLowRate$' -benchtime 300x ./bench/
func BenchmarkDaemonCPUAtLowRate(b *testing.B) {
	b.Run("daemon", func(b *testing.B) {
		d, err := spawnDaemon(buildDaemon(b), 64<<20, nil, []string{"--rdma", "off", "--store-l2-path", "off"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Stop() })
		c := dialBench(b, d, "lowrate")
		key := []byte("lowrate/key")
		if err := c.PutBytes(key, make([]byte, 4096), false); err != nil {
			b.Fatal(err)
		}
		g := newRemoteGetter(b, c, 1)
		keys := [][]byte{key}
		lowRate(b, d.cmd.Process.Pid, func() {
			if err := g.get(keys, true); err != nil {
				b.Fatal(err)
			}
			g.unpin(keys)
		})
	})
	b.Run("pingpong", func(b *testing.B) {
		c, proc, stop, err := dialPingPong(context.Background(), "unix")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(stop)
		msg, back := make([]byte, 4096), make([]byte, 4096)
		lowRate(b, proc.Pid, func() {
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, back); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// lowRate runs b.N requests, each at the next tick of a lowRateGap clock,
// after a warm one, and reports the CPU time of process pid per request
// and per second.
func lowRate(b *testing.B, pid int, request func()) {
	pace := time.NewTicker(lowRateGap)
	defer pace.Stop()
	request()
	<-pace.C
	before, start := testutil.ProcCPU(b, pid), time.Now()
	b.ResetTimer()
	for range b.N {
		request()
		<-pace.C
	}
	b.StopTimer()
	cpu, el := testutil.ProcCPU(b, pid)-before, time.Since(start)
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
	b.ReportMetric(float64(cpu.Milliseconds())/el.Seconds(), "cpu-ms/s")
}
