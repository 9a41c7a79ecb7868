package daemon

import (
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestOpenRemoteTransportWithoutRDMA: on a host without RDMA, a segment
// opened with transport rdma is refused with the reason (never quietly
// served over tcp), and one opened with transport tcp works.
func TestOpenRemoteTransportWithoutRDMA(t *testing.T) {
	if os.Getenv("RXE_DEV") != "" {
		t.Skip("RXE_DEV is set: this host has RDMA (rdma/link's TestVerbsTransportPerSegment covers it)")
	}
	p := startRDMAPair(t, "auto")
	_, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportRDMA)
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("OpenRemoteVia rdma without a device: %v, want UNAVAILABLE", err)
	}
	if log, why := p.d2.log.String(), p.d2.d.peers.RDMAInfo().Reason; !strings.Contains(log, "transport rdma asked for, and this daemon has no RDMA") ||
		why == "" || !strings.Contains(log, why) {
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

// TestVerbsRegistrationOffSubmitPath: a large client buffer's first
// requests to a segment opened with transport rdma wait for its
// registration off the submit path. Submit returns at once; a request with
// a deadline shorter than the registration ends Timeout at its deadline;
// the others, submitted in two calls while it registers, share the one
// registration and complete by RDMA once it is done; meanwhile pool
// requests on the same link keep moving.
func TestVerbsRegistrationOffSubmitPath(t *testing.T) {
	testutil.Require(t, testutil.RDMA)
	p := startRDMAPair(t, "on")
	viaRDMA, err := p.wr.OpenRemoteVia("d1/kv", client.RightRead|client.RightWrite, client.TransportRDMA)
	if err != nil {
		t.Fatalf("OpenRemoteVia rdma: %v\n%s", err, p.d2.log.String())
	}
	// A memfd nobody has touched yet, as an engine's own may be: its
	// registration faults every page in, a second or more on Soft-RoCE
	// under TCG. (A buffer the client library makes is resident from its
	// creation, on 2 MiB pages, and registers in tens of milliseconds:
	// rdma's TestVerbsRegisterLarge.)
	const size = 256 << 20
	buf := normalPagesBuffer(t, p.wr, size)
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

// normalPagesBuffer registers a client buffer of size bytes on c that is
// on normal pages and not faulted in: a sealed memfd of the test's own
// (RegisterFD), not one RegisterBuffer makes (those are placed on 2 MiB
// pages, and so resident, at creation).
func normalPagesBuffer(t *testing.T, c *client.Client, size uint64) *client.Buffer {
	t.Helper()
	fd, err := shm.NewMemfd("normal-pages", size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shm.Unmap(mem) })
	id, err := c.RegisterFD(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	return &client.Buffer{ID: id, Mem: mem}
}
