package daemon

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/rdma"
)

// TestVerbsUnreachableGIDUsesTCP: with an RDMA device (make test-rdma runs
// it in the Soft-RoCE VM), a peer whose queue pairs answer from a GID
// nothing reaches (d1's connection data is rewritten to name one) leaves
// the link down with a clear error within seconds; d2 says so once and
// its requests keep moving, over tcp, crc32c checked.
func TestVerbsUnreachableGIDUsesTCP(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("no RDMA device: RXE_DEV is unset (make test-rdma runs this in the Soft-RoCE VM)")
	}
	p := startRDMAPair(t, "on")
	bogus, err := rdma.ParseGID("::ffff:192.0.2.77") // TEST-NET-1: no route
	if err != nil {
		t.Fatal(err)
	}
	accept := rdma.Acceptor(p.d1.d.rdma.accept)
	if err := p.d1.d.peers.node.Handle(rdma.ExchangeKind, func(from string, epoch uint64, req []byte) ([]byte, error) {
		resp, err := accept(from, epoch, req)
		if err != nil {
			return nil, err
		}
		var ci rdma.ConnInfo
		if err := ci.UnmarshalBinary(resp); err != nil {
			return nil, err
		}
		ci.GID = bogus
		return ci.MarshalBinary()
	}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	for !strings.Contains(p.d2.log.String(), "peer requests use tcp") {
		if time.Now().After(deadline) {
			t.Fatalf("d2 never said why d1 stays on tcp:\n%s", p.d2.log.String())
		}
		if err := p.roundTrip(rng, 64<<10, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("link to an unreachable GID given up after %v", time.Since(start).Round(time.Millisecond))
	if l := (*p.d2.d.rdma.links.Load())["d1"]; l != nil {
		t.Fatal("d2 kept a link to an unreachable GID")
	}
	for _, n := range rdmaSizes {
		before := tcpBytes(p.d2)
		if err := p.roundTrip(rng, n, (p.block-n)/2); err != nil {
			t.Fatal(err)
		}
		if moved := tcpBytes(p.d2) - before; moved < 2*n {
			t.Fatalf("%d bytes each way moved %d bytes over tcp with the link down", n, moved)
		}
	}
	if c := strings.Count(p.d2.log.String(), "peer requests use tcp"); c != 1 {
		t.Fatalf("d2 said %d times that d1 uses tcp", c)
	}
}
