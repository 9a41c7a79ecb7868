package link

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
)

// holdDeregister makes the first deregistration of buf's registration on
// dev wait until the returned release (the test's end releases it too);
// entered gets a token when it begins.
func holdDeregister(t *testing.T, dev *rdmatest.Device, buf *shm.Buffer) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, gate := make(chan struct{}, 1), make(chan struct{})
	var once, first sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	addr, size := addrOf(buf.Bytes()), buf.Size()
	dev.OnDeregister(func(r *rdma.Region) {
		if r.Addr() != addr || r.Size() != size {
			return
		}
		first.Do(func() {
			in <- struct{}{}
			<-gate
		})
	})
	return in, release
}

// registeredBuffer is a client buffer of d's, registered for rdma as the
// registration queue does it.
func registeredBuffer(t *testing.T, d *side, id xfer.SegmentID, size uint64) *shm.Buffer {
	t.Helper()
	b := mapBuffer(t, id, size)
	if !d.p.rdma.registerLocal(b) {
		t.Fatalf("%s: registering client buffer %d failed:\n%s", d.id, id, d.log.String())
	}
	return b
}

// TestFabricCloseDeregistersOutsideTheLock: a deregistration takes as long
// as its registration did (seconds for GiBs), and while Close makes one
// (of buffer a's, held here until the test lets it go) the counters and
// the rdma report answer, and another buffer's teardown releases its own
// registration rather than waiting for a's.
func TestFabricCloseDeregistersOutsideTheLock(t *testing.T) {
	devs := fabric()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	d1 := startSide(t, "d1", key, devs)
	a := registeredBuffer(t, d1, 50, 1<<20)
	b := registeredBuffer(t, d1, 51, 1<<20)
	entered, release := holdDeregister(t, devs.fabricDevice("d1"), a)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		d1.stop()
	}()
	wait(t, entered, "d1's Close deregistering buffer a")

	_ = within(t, "d1's counters while Close deregisters a", func() error { d1.p.Counters(nil); return nil })
	_ = within(t, "d1's rdma report while Close deregisters a", func() error { d1.p.rdma.Info(); return nil })
	_ = within(t, "buffer b's teardown while Close deregisters a", b.Close)
	if k := rdma.KeysOf(b); k != nil {
		t.Fatal("buffer b's teardown left its keys on it")
	}
	release()
	wait(t, stopped, "d1's Close once a's deregistration ended")
	if strings.Contains(d1.log.String(), "closing the rdma device") {
		t.Fatalf("d1's device did not close cleanly:\n%s", d1.log.String())
	}
}

// TestFabricCloseWaitsForATeardownsDeregistration: a buffer's teardown
// deregisters its registration itself (held here until the test lets it
// go); links that close meanwhile wait for that deregistration, and the
// device then closes with no region left, rather than failing as busy
// with the deregistration coming after it.
func TestFabricCloseWaitsForATeardownsDeregistration(t *testing.T) {
	devs := fabric()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	d1 := startSide(t, "d1", key, devs)
	a := registeredBuffer(t, d1, 50, 1<<20)
	entered, release := holdDeregister(t, devs.fabricDevice("d1"), a)
	torn := make(chan error, 1)
	go func() { torn <- a.Close() }()
	wait(t, entered, "buffer a's teardown deregistering it")

	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		d1.stop()
	}()
	d1.log.waitFor(t, "closing waits for deregistrations in progress", 10*time.Second)
	release()
	if err := wait(t, torn, "buffer a's teardown"); err != nil {
		t.Fatal(err)
	}
	wait(t, stopped, "d1's Close once a's deregistration ended")
	if strings.Contains(d1.log.String(), "closing the rdma device") {
		t.Fatalf("d1's device did not close cleanly:\n%s", d1.log.String())
	}
}
