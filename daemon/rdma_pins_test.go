package daemon

import (
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestOpenRemoteTransportWithoutRDMA: on a host without RDMA, a segment
// opened with transport rdma is refused with the reason (never quietly
// served over tcp), and one opened with transport tcp works.
func TestOpenRemoteTransportWithoutRDMA(t *testing.T) {
	if os.Getenv("RXE_DEV") != "" {
		t.Skip("RXE_DEV is set: this host has RDMA (TestVerbsTransportPerSegment covers it)")
	}
	p := startRDMAPair(t, "auto")
	_, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportRDMA)
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("OpenRemoteVia rdma without a device: %v, want UNAVAILABLE", err)
	}
	if log := p.d2.log.String(); !strings.Contains(log, "transport rdma asked for, and this daemon has no RDMA") ||
		p.d2.d.peers.noRDMA == "" || !strings.Contains(log, p.d2.d.peers.noRDMA) {
		t.Fatalf("d2 did not log why it refused transport rdma:\n%s", log)
	}
	if _, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead, 7); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("OpenRemoteVia with transport 7: %v, want INVALID_ARGUMENT", err)
	}
	rs, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportTCP)
	if err != nil {
		t.Fatal(err)
	}
	p.rs = rs
	if err := p.roundTrip(rand.New(rand.NewPCG(3, 3)), 64<<10, 0); err != nil {
		t.Fatal(err)
	}
}

// TestVerbsTransportPerSegment: with an RDMA device (make test-rdma runs
// it in the Soft-RoCE VM), the transport chosen when opening a remote
// segment holds for each of its requests: tcp keeps them on tcp with the
// link up; rdma has the open set the link up, so even the first request
// (from a client buffer never used before) moves by RDMA, and while the
// link is down they fail UNAVAILABLE instead of going to tcp, which auto
// segments still use.
func TestVerbsTransportPerSegment(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no RDMA device: RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
	}
	p := startRDMAPair(t, "on")
	fill(rand.New(rand.NewPCG(4, 4)), p.wMem[p.src:p.src+1<<20])
	viaTCP, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportTCP)
	if err != nil {
		t.Fatal(err)
	}
	viaRDMA, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportRDMA)
	if err != nil {
		t.Fatalf("OpenRemoteVia rdma: %v\n%s", err, p.d2.log.String())
	}
	res := make([]error, 1)
	move := func(local xfer.SegmentID, target xfer.SegmentID, n uint64) (uint64, error) {
		t.Helper()
		before := tcpBytes(p.d2)
		w := xfer.Request{Op: xfer.OpWrite, Local: local, Target: target, Length: n}
		if local == p.pool {
			w.LocalOffset = p.src
		}
		sum, err := p.wr.Transfer([]xfer.Request{w}, 10*time.Second, res)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Completed != 1 {
			return 0, res[0]
		}
		return tcpBytes(p.d2) - before, nil
	}
	stat := func(name string) uint64 {
		t.Helper()
		st, err := p.wr.Stats()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range st.Transports {
			if c.Name == name {
				return c.Value
			}
		}
		t.Fatalf("no %s in tcctl stats: %+v", name, st.Transports)
		return 0
	}
	buf, err := p.wr.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := move(buf.ID, viaRDMA.ID, 1<<20); err != nil || moved >= 1<<20 {
		t.Fatalf("first WRITE from a new buffer to a transport-rdma segment: %v, %d bytes on tcp", err, moved)
	}
	if moved, err := move(p.pool, viaRDMA.ID, 1<<20); err != nil || moved >= 1<<20 {
		t.Fatalf("pool WRITE to a transport-rdma segment: %v, %d bytes on tcp", err, moved)
	}
	tasks, toTCP := stat("rdma.tasks"), stat("rdma.to_tcp")
	for range 3 {
		if moved, err := move(p.pool, viaTCP.ID, 1<<20); err != nil || moved < 1<<20 {
			t.Fatalf("WRITE to a transport-tcp segment with the link up: %v, %d bytes on tcp", err, moved)
		}
	}
	if stat("rdma.tasks") != tasks || stat("rdma.to_tcp") != toTCP+3 {
		t.Fatalf("after 3 transport-tcp WRITEs: rdma.tasks %d→%d, rdma.to_tcp %d→%d", tasks, stat("rdma.tasks"), toTCP, stat("rdma.to_tcp"))
	}
	if tasks < 2 || stat("rdma.bytes") < 2<<20 || stat("rdma.buffers_registered") != 1 || stat("rdma.links") != 1 {
		t.Fatalf("rdma counters after 2 WRITEs of 1 MiB by rdma: tasks %d, bytes %d, buffers %d, links %d",
			tasks, stat("rdma.bytes"), stat("rdma.buffers_registered"), stat("rdma.links"))
	}
	// The link goes down: rdma-only requests fail, auto ones use tcp.
	l := (*p.d2.d.rdma.links.Load())["d1"]
	p.d2.d.rdma.retireLink(l, "taken down by the test")
	if _, err := move(p.pool, viaRDMA.ID, 4096); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("transport-rdma WRITE with the link down: %v, want UNAVAILABLE", err)
	}
	if stat("rdma.unavailable") == 0 || stat("rdma.links_closed") != 1 {
		t.Fatalf("after the link went down: rdma.unavailable %d, rdma.links_closed %d", stat("rdma.unavailable"), stat("rdma.links_closed"))
	}
	if moved, err := move(p.pool, p.rs.ID, 64<<10); err != nil || moved < 64<<10 {
		t.Fatalf("auto WRITE with the link down: %v, %d bytes on tcp", err, moved)
	}
	// The failed request asked for the link again; once it is up the
	// segment moves by RDMA again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		moved, err := move(p.pool, viaRDMA.ID, 64<<10)
		if err == nil && moved < 64<<10 {
			break
		}
		if err != nil && !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("transport-rdma WRITE while the link comes back: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the transport-rdma segment did not move by RDMA again:\n%s", p.d2.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVerbsRegistrationOffSubmitPath: a large client buffer's first
// requests to a segment opened with transport rdma wait for its
// registration off the submit path. Submit returns at once; a request with
// a deadline shorter than the registration ends Timeout at its deadline;
// the others, submitted in two calls while it registers, share the one
// registration and complete by RDMA once it is done; meanwhile pool
// requests on the same link keep moving.
func TestVerbsRegistrationOffSubmitPath(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no RDMA device: RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
	}
	p := startRDMAPair(t, "on")
	viaRDMA, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportRDMA)
	if err != nil {
		t.Fatalf("OpenRemoteVia rdma: %v\n%s", err, p.d2.log.String())
	}
	const size = 256 << 20 // registers for a second or more on Soft-RoCE under TCG
	buf, err := p.wr.RegisterBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	fill(rand.New(rand.NewPCG(6, 6)), buf.Mem[:1<<20])
	w := func(off uint64) xfer.Request {
		return xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: off, Target: viaRDMA.ID, TargetOffset: off, Length: 64 << 10}
	}
	submit := func(deadline time.Duration, reqs ...xfer.Request) xfer.BatchID {
		t.Helper()
		b, err := p.wr.AllocBatch(len(reqs))
		if err != nil {
			t.Fatal(err)
		}
		res := make([]error, len(reqs))
		start := time.Now()
		if err := p.wr.Submit(b, reqs, res, client.WithDeadline(deadline)); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Fatalf("Submit from a buffer being registered took %v", took)
		}
		return b
	}
	start := time.Now()
	short := submit(100*time.Millisecond, w(0))
	b1 := submit(60*time.Second, w(64<<10), w(128<<10))
	b2 := submit(60*time.Second, w(192<<10))
	if sum, err := p.wr.Wait(short, 10*time.Second); err != nil || sum.Timeout != 1 {
		t.Fatalf("request with a 100 ms deadline behind a registration: %+v, %v", sum, err)
	}
	timedOut := time.Since(start)
	// Pool requests keep moving by RDMA while the buffer registers.
	if err := p.roundTrip(rand.New(rand.NewPCG(7, 7)), 64<<10, 1<<20); err != nil {
		t.Fatal(err)
	}
	for _, b := range []xfer.BatchID{b1, b2} {
		if sum, err := p.wr.Wait(b, 60*time.Second); err != nil || sum.Completed != sum.Total {
			t.Fatalf("requests that waited for the registration: %+v, %v\n%s", sum, err, p.d2.log.String())
		}
	}
	registered := time.Since(start)
	if got := crc32.Checksum(p.expMem[p.expOff+64<<10:p.expOff+256<<10], castagnoli); got != crc32.Checksum(buf.Mem[64<<10:256<<10], castagnoli) {
		t.Fatal("bytes written from the registered buffer differ")
	}
	if n := strings.Count(p.d2.log.String(), "client buffer registered for rdma"); n != 1 {
		t.Fatalf("buffer registered %d times, want once:\n%s", n, p.d2.log.String())
	}
	t.Logf("the short request timed out after %v; the %d MiB buffer's requests completed after %v",
		timedOut.Round(time.Millisecond), size>>20, registered.Round(time.Millisecond))
	for _, b := range []xfer.BatchID{short, b1, b2} {
		if err := p.wr.FreeBatch(b); err != nil {
			t.Fatal(err)
		}
	}
}
