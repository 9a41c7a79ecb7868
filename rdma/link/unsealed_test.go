package link

import (
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestFabricUnsealedBufferOnlyByRDMA(t *testing.T) { testUnsealedBuffer(t, fabric()) }
func TestVerbsUnsealedBufferOnlyByRDMA(t *testing.T) {
	testUnsealedBuffer(t, verbs(t))
}

// testUnsealedBuffer: a client buffer whose owner may shrink it (a memfd
// that cannot be sealed) never goes on tcp, which refuses it: a request to
// a segment opened with transport auto fails with ErrUnsealed while it
// would go there, and one to a segment opened with transport rdma waits
// for the buffer's registration and moves its exact bytes by rdma, the
// first one included.
func testUnsealedBuffer(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	viaRDMA, _ := p.d2.open(t, "d1/kv", wire.RightRead|wire.RightWrite, wire.TransportRDMA)
	const bufID xfer.SegmentID = 51
	const size = 1 << 20
	buf, err := shm.MapBuffer(bufID, testutil.UnsealableMemfd(t, size), size, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	if !buf.Unsealed() {
		t.Fatalf("mapped as %v", buf.Sealing())
	}
	p.d2.mu.Lock()
	p.d2.segs[bufID] = buf
	p.d2.mu.Unlock()
	mem := buf.Bytes()
	fill(rand.New(rand.NewPCG(9, 9)), mem)
	want := crc32.Checksum(mem, castagnoli)
	before := p.d2.tcpBytes()
	if err := p.d2.do(t, xfer.Request{Op: xfer.OpWrite, Local: bufID, Target: p.kv, Length: size}); !errors.Is(err, xfer.ErrUnsealed) {
		t.Fatalf("first WRITE from an unsealed buffer to an auto segment (tcp until registered): %v, want ErrUnsealed", err)
	}
	if err := p.d2.do(t, xfer.Request{Op: xfer.OpWrite, Local: bufID, Target: viaRDMA, Length: size}); err != nil {
		t.Fatalf("WRITE from an unsealed buffer to an rdma segment: %v", err)
	}
	if got := crc32.Checksum(p.expMem(0, size), castagnoli); got != want {
		t.Fatalf("WRITE: crc32c %08x landed, %08x sent", got, want)
	}
	if moved := p.d2.tcpBytes() - before; moved != 0 {
		t.Fatalf("WRITEs from an unsealed buffer moved %d bytes over tcp", moved)
	}
}
