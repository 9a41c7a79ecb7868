package link

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
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

// holdNewTransport makes the first transport dev makes from now on wait
// until the returned release (the test's end releases it too); entered
// gets a token when it begins.
func holdNewTransport(t *testing.T, dev *rdmatest.Device) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, gate := make(chan struct{}, 1), make(chan struct{})
	var first atomic.Bool
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	dev.OnNewTransport(func() {
		if first.Swap(true) {
			return
		}
		in <- struct{}{}
		<-gate
	})
	return in, release
}

// TestFabricSlowAcceptHoldsNoOtherPeer: making the transport a peer's
// link lands on takes device calls (queue pairs, completion queues), and
// while d1 makes d2's (it waits here until the test lets it go) d3's link
// to d1 still comes up and d1 still reports its links.
func TestFabricSlowAcceptHoldsNoOtherPeer(t *testing.T) {
	devs := fabric()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	d1 := startSide(t, "d1", key, devs, directory.Peer{ID: "d2"}, directory.Peer{ID: "d3"})
	d2 := startSide(t, "d2", key, devs, directory.Peer{ID: "d1", Addr: d1.p.Node().Addr()})
	d3 := startSide(t, "d3", key, devs, directory.Peer{ID: "d1", Addr: d1.p.Node().Addr()})
	if _, err := d1.exports.Export("kv", "", d1.pool, 0, block, 3); err != nil {
		t.Fatal(err)
	}
	_, r2 := d2.open(t, "d1/kv", 3, 0)
	_, r3 := d3.open(t, "d1/kv", 3, 0)
	entered, release := holdNewTransport(t, devs.fabricDevice("d1"))
	up2 := make(chan error, 1)
	go func() { up2 <- d2.prepare(r2) }()
	wait(t, entered, "d1 making the transport d2's link lands on")

	if err := within(t, "d3's rdma link to d1 while d1 makes d2's", func() error { return d3.prepare(r3) }); err != nil {
		t.Fatalf("d3's rdma link to d1: %v\n%s", err, d1.log.String())
	}
	_ = within(t, "d1's rdma report while it makes d2's transport", func() error { d1.p.rdma.Info(); return nil })
	release()
	if err := wait(t, up2, "d2's rdma link to d1"); err != nil {
		t.Fatalf("d2's rdma link to d1: %v\n%s", err, d1.log.String())
	}
}

// TestFabricCloseDuringAccept: links that close while they make the
// transport a peer's link lands on do not wait for it before releasing
// the rest, and that transport, once made, is closed rather than handed
// out: d1's device has no transport left when it closes (startSide's
// cleanup checks that).
func TestFabricCloseDuringAccept(t *testing.T) {
	devs := fabric()
	p := startPair(t, devs)
	if _, err := p.d2.p.node.Exchange("d1", segmentExchange, []byte("kv"), 0); err != nil {
		t.Fatal(err)
	}
	dev := devs.fabricDevice("d1")
	kv := addrOf(p.expMem(0, block))
	released := make(chan struct{}, 1)
	dev.OnDeregister(func(r *rdma.Region) {
		if r.Addr() == kv && r.Size() == block { // not the pool, at the same address
			select {
			case released <- struct{}{}:
			default:
			}
		}
	})
	entered, release := holdNewTransport(t, dev)
	up := make(chan error, 1)
	go func() { up <- p.d2.prepare(p.kvRemote) }()
	wait(t, entered, "d1 making the transport d2's link lands on")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		p.d1.stop()
	}()
	wait(t, released, "d1's Close releasing kv's registration while it makes d2's transport")
	release()
	wait(t, stopped, "d1's Close once d2's transport was made")
	if err := wait(t, up, "d2's rdma link to d1"); err == nil {
		t.Fatal("d2's link to d1 came up on a transport d1 made while it closed")
	}
	if _, trs := dev.Live(); trs != 0 {
		t.Fatalf("d1's device holds %d transports after Close", trs)
	}
}
