package client

import (
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// BenchmarkClientTaskStatus is a TaskStatus round trip through the Go
// client (compare with control's BenchmarkRawPingPongTaskStatusSize).
func BenchmarkClientTaskStatus(b *testing.B) {
	d := startDaemon(b)
	c, err := Dial(d.sock, Options{NoPool: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	w := write4K(b, c)
	batch, err := c.AllocBatch(1)
	if err != nil {
		b.Fatal(err)
	}
	res := make([]error, 1)
	if err := c.Submit(batch, []xfer.Request{w}, res); err != nil || res[0] != nil {
		b.Fatal(err, res[0])
	}
	if _, err := c.Wait(batch, time.Second); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if st, err := c.TaskStatus(batch, 0); err != nil || st.State != xfer.StateCompleted {
			b.Fatal(st, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
}

// BenchmarkClientTransfer4K is a one-shot 4 KiB Transfer through the Go
// client (compare with control's BenchmarkRawPingPongTransferSize).
func BenchmarkClientTransfer4K(b *testing.B) {
	d := startDaemon(b)
	c, err := Dial(d.sock, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	reqs := []xfer.Request{write4K(b, c)}
	res := make([]error, 1)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Transfer(reqs, time.Second, res); err != nil || res[0] != nil {
			b.Fatal(err, res[0])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
}
