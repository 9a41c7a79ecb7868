package daemon

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/xfer"
)

// TestVerbsClientBufferOverRDMA: with an RDMA device (make test-rdma runs
// it in the Soft-RoCE VM), requests whose local side is a client's own
// buffer move by RDMA once the buffer is registered behind the first one,
// crc32c checked both ways; unregistering the buffer releases its
// registration and takes it out of the link.
func TestVerbsClientBufferOverRDMA(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no RDMA device: RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
	}
	p := startRDMAPair(t, "on")
	buf, err := p.wr.RegisterBuffer(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	fill(rng, buf.Mem[:1<<20])
	p.untilNoTCP(t, xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: p.rs.ID, Length: 1 << 20})
	if p.d2.d.rdma.localRegion(buf.ID) == nil {
		t.Fatal("the client buffer has no registration after an rdma WRITE from it")
	}
	for _, n := range []uint64{4 << 10, 1 << 20, 4 << 20} {
		fill(rng, buf.Mem[:n])
		want := crc32.Checksum(buf.Mem[:n], castagnoli)
		before := tcpBytes(p.d2)
		res := make([]error, 1)
		w := xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: p.rs.ID, Length: n}
		if sum, err := p.wr.Transfer([]xfer.Request{w}, 30*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
			t.Fatalf("WRITE %d bytes from the buffer: %v, %v, %+v", n, err, res[0], sum)
		}
		if got := crc32.Checksum(p.expMem[p.expOff:p.expOff+n], castagnoli); got != want {
			t.Fatalf("WRITE %d bytes: crc32c %08x landed, %08x sent", n, got, want)
		}
		clear(buf.Mem[4<<20 : 4<<20+n])
		r := xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: 4 << 20, Target: p.rs.ID, Length: n}
		if sum, err := p.wr.Transfer([]xfer.Request{r}, 30*time.Second, res); err != nil || res[0] != nil || sum.Completed != 1 {
			t.Fatalf("READ %d bytes into the buffer: %v, %v, %+v", n, err, res[0], sum)
		}
		if got := crc32.Checksum(buf.Mem[4<<20:4<<20+n], castagnoli); got != want {
			t.Fatalf("READ %d bytes: crc32c %08x read, %08x written", n, got, want)
		}
		if moved := tcpBytes(p.d2) - before; moved >= n {
			t.Fatalf("%d bytes each way from a client buffer moved %d bytes over tcp", n, moved)
		}
	}
	if !strings.Contains(p.d2.log.String(), "client buffer registered for rdma") {
		t.Fatalf("d2 did not log the buffer's registration:\n%s", p.d2.log.String())
	}
	if err := p.wr.UnregisterBuffer(buf.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.d2.d.rdma.localRegion(buf.ID) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the unregistered buffer's rdma registration is still there")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l := (*p.d2.d.rdma.links.Load())["d1"]
	if _, ok := (*l.ids.Load())[buf.ID]; ok {
		t.Fatal("the link still lists the unregistered buffer")
	}
	// The pool keeps moving by rdma.
	if err := p.roundTrip(rng, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.expMem[p.expOff:p.expOff+1<<20], p.wMem[p.src:p.src+1<<20]) {
		t.Fatal("pool WRITE after the buffer went away did not land")
	}
}
