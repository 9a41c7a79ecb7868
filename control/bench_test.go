package control

import (
	"io"
	"net"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// frameSizes returns the sizes of the request and response frames of a
// call, to size the raw ping-pong it is compared with.
func frameSizes(e *env, c *rawClient, m *wire.Request) (req, resp int) {
	req = len(wire.EncodeRequest(c.b, m))
	c.call(m.Body)
	resp = len(wire.EncodeResponse(c.b, &c.resp))
	return req, resp
}

// rawPingPong is the reference: a unix stream socket pair of processes'
// worth of work without the protocol: write req bytes, the peer reads them
// and writes resp bytes back.
func rawPingPong(b *testing.B, dir string, req, resp int) {
	path := filepath.Join(dir, "raw.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	out, in := make([]byte, req), make([]byte, resp)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
	c.Close()
	<-done
}

func taskStatusSetup(b *testing.B) (*env, *rawClient, *wire.Request) {
	e := newEnv(b, false)
	c := dialRaw(b, e.sock)
	fd := newMemfd(b, 4096)
	r := c.call(&wire.RegisterBufferRequest{Size: 4096}, fd)
	unix.Close(fd)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](b, r).Segment)
	off := body[wire.AllocBlocksResponse](b, c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})).Offsets[0]
	batch := body[wire.AllocBatchResponse](b, c.call(&wire.AllocBatchRequest{Capacity: 1})).Batch
	r = c.call(&wire.SubmitRequest{Batch: batch, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: 4096}}})
	if r.Status != tcproto.CodeOK || body[wire.SubmitResponse](b, r).Codes[0] != tcproto.CodeOK {
		b.Fatalf("submit: %+v", r)
	}
	c.call(&wire.WaitRequest{Batch: batch})
	return e, c, &wire.Request{Body: &wire.TaskStatusRequest{Batch: batch}}
}

// BenchmarkRawPingPongTaskStatusSize is the raw socket reference for
// BenchmarkControlTaskStatus.
func BenchmarkRawPingPongTaskStatusSize(b *testing.B) {
	e, c, m := taskStatusSetup(b)
	req, resp := frameSizes(e, c, m)
	b.Logf("frames: request %d bytes, response %d bytes", req, resp)
	rawPingPong(b, e.dir, req, resp)
}

// BenchmarkControlTaskStatus is a whole control round trip: encode, write,
// server read + decode + engine Status + encode + write, read, decode.
func BenchmarkControlTaskStatus(b *testing.B) {
	_, c, m := taskStatusSetup(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.id++
		m.Ctx.RequestID = c.id
		if err := c.send(wire.EncodeRequest(c.b, m)); err != nil {
			b.Fatal(err)
		}
		r, _, err := c.recv()
		if err != nil || r.Status != tcproto.CodeOK || body[wire.TaskStatusResponse](b, r).State != tcproto.TaskStateCOMPLETED {
			b.Fatalf("%+v %v", r, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
}

func transferSetup(b *testing.B) (*env, *rawClient, *wire.Request) {
	e := newEnv(b, false)
	c := dialRaw(b, e.sock)
	fd := newMemfd(b, 1<<16)
	r := c.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](b, r).Segment)
	r = c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})
	return e, c, &wire.Request{Body: &wire.TransferRequestBody{Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: body[wire.AllocBlocksResponse](b, r).Offsets[0], Length: 4096}}}}
}

// BenchmarkRawPingPongTransferSize is the raw socket reference for
// BenchmarkControlTransfer4K.
func BenchmarkRawPingPongTransferSize(b *testing.B) {
	e, c, m := transferSetup(b)
	req, resp := frameSizes(e, c, m)
	b.Logf("frames: request %d bytes, response %d bytes", req, resp)
	rawPingPong(b, e.dir, req, resp)
}

// BenchmarkControlTransfer4K is one one-shot Transfer of 4 KiB from a
// client buffer into a pool block: allocate, submit, copy, wait, free.
func BenchmarkControlTransfer4K(b *testing.B) {
	_, c, m := transferSetup(b)
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.id++
		m.Ctx.RequestID = c.id
		if err := c.send(wire.EncodeRequest(c.b, m)); err != nil {
			b.Fatal(err)
		}
		r, _, err := c.recv()
		if err != nil || r.Status != tcproto.CodeOK || body[wire.TransferResponse](b, r).Codes[0] != tcproto.CodeOK {
			b.Fatalf("%+v %v", r, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rt/s")
}

// TestServeAllocs: serving a steady-state TaskStatus or Ping allocates
// nothing (client and server together, both in this process).
func TestServeAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are noisy with -short runs of other tests")
	}
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	fd := newMemfd(t, 4096)
	r := c.call(&wire.RegisterBufferRequest{Size: 4096}, fd)
	unix.Close(fd)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	off := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})).Offsets[0]
	batch := body[wire.AllocBatchResponse](t, c.call(&wire.AllocBatchRequest{Capacity: 1})).Batch
	c.call(&wire.SubmitRequest{Batch: batch, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: 4096}}})
	c.call(&wire.WaitRequest{Batch: batch})
	for _, m := range []*wire.Request{
		{Body: &wire.TaskStatusRequest{Batch: batch}},
		{Body: &wire.PingRequest{Payload: []byte("0123456789abcdef")}},
	} {
		call := func() {
			c.id++
			m.Ctx.RequestID = c.id
			if err := c.send(wire.EncodeRequest(c.b, m)); err != nil {
				t.Fatal(err)
			}
			if r, _, err := c.recv(); err != nil || r.Status != tcproto.CodeOK {
				t.Fatalf("%+v %v", r, err)
			}
		}
		call()
		if n := testing.AllocsPerRun(200, call); n > 0 {
			t.Errorf("%s: %v allocations per round trip", m.Kind(), n)
		}
	}
}
