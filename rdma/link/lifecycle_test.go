package link

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestFabricStalledPeerHoldsNoOtherPeer: a peer that takes the links'
// exchanges and never answers them (d3 here: its handler of the segment
// resolution waits until the test lets it go) holds up its own segments
// only. d2's worker is waiting on d3 for one segment, and bringing up the
// link to d1 and resolving d1/kv for an open with transport rdma still
// finishes at once, not after d3's exchange times out.
func TestFabricStalledPeerHoldsNoOtherPeer(t *testing.T) {
	devs := fabric()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	d1 := startSide(t, "d1", key, devs, directory.Peer{ID: "d2"})
	d3 := startSide(t, "d3", key, devs, directory.Peer{ID: "d2"})
	d2 := startSide(t, "d2", key, devs, directory.Peer{ID: "d1", Addr: d1.p.Node().Addr()},
		directory.Peer{ID: "d3", Addr: d3.p.Node().Addr()})
	for _, s := range []*side{d1, d3} {
		if _, err := s.exports.Export("kv", "", s.pool, 0, block, 3); err != nil {
			t.Fatal(err)
		}
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	if err := d3.p.node.Handle(segmentTokenExchange, func(string, uint64, []byte) ([]byte, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil, errors.New("d3 stalled")
	}); err != nil {
		t.Fatal(err)
	}
	_, r1 := d2.open(t, "d1/kv", 3, 0)
	_, r3 := d2.open(t, "d3/kv", 3, 0)

	var wg sync.WaitGroup
	defer wg.Wait()
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = d2.prepare(r3) // fails once d3 is let go
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case <-entered:
	case <-timer.C:
		t.Fatalf("d2 never asked d3 for d3/kv's registration\n%s", d2.log.String())
	}

	done := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- d2.prepare(r1)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("d1/kv over rdma while d3 stalls: %v\n%s", err, d2.log.String())
		}
	case <-timer.C:
		t.Fatalf("d1/kv's rdma link and registration waited for d3, which stalls\n%s", d2.log.String())
	}
}
