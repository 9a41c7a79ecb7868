package daemon

import (
	"errors"
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
