package link

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/wire"
)

// TestFabricStalledPeerHoldsUpOneRevocation: a peer that resolved a
// client's exports and then takes the owner's revocations without
// answering (d2 here, until the test lets it go) costs the owner's
// unexports one wait (revokeWait), not one per export: a client that
// unexports many (its buffer goes, its connection closes) must not wait
// that long for each.
func TestFabricStalledPeerHoldsUpOneRevocation(t *testing.T) {
	p := startPair(t, fabric())
	const exports = 3
	var xs []*peer.Export
	for i := range exports {
		name := string(rune('a' + i))
		x, err := p.d1.exports.Export(name, "", p.d1.pool, uint64(2+i)*block, block, wire.RightRead)
		if err != nil {
			t.Fatal(err)
		}
		p.d2.open(t, "d1/"+name, wire.RightRead, wire.TransportRDMA) // resolves it over rdma
		xs = append(xs, x)
	}
	var asked atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	if err := p.d2.p.node.Handle(revokeTenantExchange, func(string, uint64, []byte) ([]byte, error) {
		asked.Add(1)
		<-release
		return nil, errors.New("d2 stalled")
	}); err != nil {
		t.Fatal(err)
	}
	for _, x := range xs {
		x.End(0)
	}
	if !strings.Contains(p.d1.log.String(), "peer did not confirm dropping an export's rdma keys") {
		t.Fatalf("d1 did not wait for d2 to confirm the first revocation\n%s", p.d1.log.String())
	}
	if n := asked.Load(); n > 1 {
		t.Fatalf("d1 waited on the stalled d2 for %d revocations of %d, want the first only\n%s", n, exports, p.d1.log.String())
	}
}
