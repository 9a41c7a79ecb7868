package daemon

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
)

// TestStoreAcrossHostsRemovedWhilePinned: a client of d1, the holder of a
// key, pins it (a zero-copy get through its queue); a client of d3 removes
// it. From then on d1's own clients no longer find it either (the queue's
// exists, lookup_prefix and get, the socket's copying get), while the pin
// still reads the exact bytes it pinned; d1's metrics count it hidden
// until the unpin frees it. A put of the key on d1 meanwhile is a new
// value every daemon reads.
func TestStoreAcrossHostsRemovedWhilePinned(t *testing.T) {
	ds := startTrio(t)
	key := []byte("hide/pinned")
	v := putKnown(t, ds[0], ds[1], key, 64<<10)

	c := ds[0].dial(t, "pinner")
	q, err := c.OpenQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := c.NewResults(1)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.NewResults(1)
	if err != nil {
		t.Fatal(err)
	}
	call := func(ud uint64, submit func() (bool, error)) client.Completion {
		t.Helper()
		if ok, err := submit(); !ok || err != nil {
			t.Fatalf("submit %d: %v %v", ud, ok, err)
		}
		cqes := make([]client.Completion, 1)
		if got, err := q.Reap(cqes, 1, 10*time.Second); got != 1 || err != nil || cqes[0].UserData != ud {
			t.Fatalf("reap %d: %d %v %+v", ud, got, err, cqes[0])
		}
		return cqes[0]
	}
	keys := [][]byte{key}
	if cq := call(1, func() (bool, error) { return q.Get(keys, pinned, 1) }); pinned.Check(cq) != nil || pinned.Err(0) != nil {
		t.Fatalf("get on d1: %+v %v", cq, pinned.Err(0))
	}
	if !bytes.Equal(pinned.Value(0), v) {
		t.Fatal("the pinned value is not the one put")
	}

	if err := ds[2].dial(t, "remover").StoreRemove(keys, make([]error, 1)); err != nil {
		t.Fatal(err)
	}
	hiddenGauge := func(want string) bool {
		return strings.Contains(scrapeMetrics(t, ds[0].d.MetricsAddr()), `tensorcast_store_hidden{tenant="default"} `+want+"\n")
	}
	if !hiddenGauge("1") {
		t.Fatal("d1's metrics do not count the removed pinned value hidden")
	}
	call(2, func() (bool, error) { return q.Exists(keys, res, 2) })
	if err := res.Err(0); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("exists on d1 after the removal: %v, want NOT_FOUND", err)
	}
	if cq := call(3, func() (bool, error) { return q.LookupPrefix(keys, true, 3) }); cq.N != 0 {
		t.Fatalf("lookup_prefix with pin on d1 after the removal: %d, want 0", cq.N)
	}
	call(4, func() (bool, error) { return q.Get(keys, res, 4) })
	if err := res.Err(0); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get on d1 after the removal: %v, want NOT_FOUND", err)
	}
	if _, err := c.GetBytes(key); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("copying get on d1 after the removal: %v, want NOT_FOUND", err)
	}
	if !bytes.Equal(pinned.Value(0), v) {
		t.Fatal("the pinned bytes changed after the removal")
	}

	// Put again on d1 while the pin lasts: a new value, for everyone.
	v2 := bytes.Repeat([]byte("put again "), 700)
	if err := c.PutBytes(key, v2, false); err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		testutil.Eventually(t, 10*time.Second, func() bool {
			got, err := d.dial(t, "reader").GetBytes(key)
			return err == nil && bytes.Equal(got, v2)
		}, "%s reading the key put again", d.cfg.DaemonID)
	}
	if !bytes.Equal(pinned.Value(0), v) {
		t.Fatal("the pinned bytes changed under a put of the key")
	}
	// The unpin takes the old value's pin and frees it.
	call(5, func() (bool, error) { return q.Unpin(keys, res, 5) })
	if err := res.Err(0); err != nil {
		t.Fatalf("unpin: %v", err)
	}
	if !hiddenGauge("0") {
		t.Fatal("d1 still counts a hidden value after its last unpin")
	}
	if got, err := c.GetBytes(key); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("the key put again on d1 after the unpin: %d bytes, %v", len(got), err)
	}
}
