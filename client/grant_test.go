package client

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/store"
)

// fillStore puts n new 16 KiB values under prefix through c, numbered
// from first: more than the store holds, so it evicts what is not pinned.
func fillStore(t *testing.T, c *Client, prefix string, first, n int) {
	t.Helper()
	v := bytes.Repeat([]byte{7}, 16<<10)
	for i := first; i < first+n; i++ {
		if err := c.PutBytes([]byte(fmt.Sprintf("%s/%d", prefix, i)), v, false); err != nil {
			t.Fatalf("put %s/%d: %v", prefix, i, err)
		}
	}
}

// fillUntilGone puts 16 KiB values under prefix through c until key is
// no longer stored, and fails after max of them. The store's LRU is per
// shard and evicts in proportion to each shard's list (store.evict), so
// how many puts take a given cold key out varies with the hash seed and
// the maintenance loop's timing; what must hold is that pressure takes
// it.
func fillUntilGone(t *testing.T, c *Client, prefix, key string, max int) {
	t.Helper()
	const step = 64
	for n := 0; n < max; n += step {
		fillStore(t, c, prefix, n, step)
		if !stored(t, c, key) {
			return
		}
	}
	t.Fatalf("%s stayed through %d puts of 16 KiB", key, max)
}

func stored(t *testing.T, c *Client, key string) bool {
	t.Helper()
	_, err := c.StoreStat([]byte(key))
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// Through a daemon: a retention handle keeps its key in the store under
// pressure that evicts its neighbour, after the connection that asked for
// it has closed; its token renews and releases it from another connection;
// released, pressure takes the key. A forged token and a released one are
// refused with PERMISSION_DENIED.
func TestHandleThroughDaemon(t *testing.T) {
	d := startStoreDaemon(t, func(c *store.Config) { c.L1Capacity = 2 << 20 })
	a, err := Dial(d.sock, Options{Name: "issuer"})
	if err != nil {
		t.Fatal(err)
	}
	v := bytes.Repeat([]byte{1}, 16<<10)
	for _, k := range []string{"held", "free"} {
		if err := a.PutBytes([]byte(k), v, false); err != nil {
			t.Fatal(err)
		}
	}
	h, err := a.HandleIssue([][]byte{[]byte("held")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Token) == 0 || h.ID == 0 || time.Until(h.Expiry) <= 0 {
		t.Fatalf("handle %+v", h)
	}
	if _, err := a.HandleIssue([][]byte{[]byte("absent")}, time.Minute); !errors.Is(err, ErrNotFound) {
		t.Fatalf("handle on an absent key: %v, want ErrNotFound", err)
	}
	a.Close()

	b, err := Dial(d.sock, Options{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fillUntilGone(t, b, "a", "free", 4096) // up to 64 MiB through a 2 MiB store
	fillStore(t, b, "a", 4096, 256)        // and 4 MiB more
	if !stored(t, b, "held") {
		t.Fatal("a key under a retention handle was evicted")
	}
	h2, err := b.HandleRenew(h.Token, 2*time.Minute)
	if err != nil || !h2.Expiry.After(h.Expiry) || bytes.Equal(h2.Token, h.Token) {
		t.Fatalf("renew: %+v, %v", h2, err)
	}
	forged := append([]byte(nil), h2.Token...)
	forged[len(forged)-1] ^= 1
	if err := b.HandleRelease(forged); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("forged token: %v, want ErrPermissionDenied", err)
	}
	if err := b.HandleRelease(h2.Token); err != nil {
		t.Fatal(err)
	}
	if err := b.HandleRelease(h2.Token); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("released twice: %v, want ErrPermissionDenied", err)
	}
	fillUntilGone(t, b, "b", "held", 4096) // released, pressure takes it
	if st := d.g.Handles.Stats(); st.Live != 0 || st.Issued != 1 || st.Renewed != 1 || st.Released != 1 {
		t.Fatalf("handle stats %+v", st)
	}
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	counters := map[string]uint64{}
	for _, k := range st.Store {
		counters[k.Name] = k.Value
	}
	if counters["handles_issued"] != 1 || counters["handles_released"] != 1 || counters["handles_live"] != 0 ||
		counters["handles_refused"] != 2 {
		t.Fatalf("store counters %v", counters)
	}
}

// Through a daemon: a lease create retried with the same operation id
// (from another connection too) joins the first, pinning once; the same id
// with other keys is refused with FAILED_PRECONDITION; the release gives
// the pin back.
func TestLeaseThroughDaemon(t *testing.T) {
	d := startStoreDaemon(t)
	a, err := Dial(d.sock, Options{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Dial(d.sock, Options{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, k := range []string{"k1", "k2"} {
		if err := a.PutBytes([]byte(k), []byte("value"), false); err != nil {
			t.Fatal(err)
		}
	}
	ks := [][]byte{[]byte("k1"), []byte("k2")}
	op := []byte("op-42")
	first, err := a.LeaseCreate(op, ks, time.Minute)
	if err != nil || first.Joined {
		t.Fatalf("create: %+v, %v", first, err)
	}
	again, err := b.LeaseCreate(op, ks, time.Minute)
	if err != nil || !again.Joined || !again.Expiry.Equal(first.Expiry) {
		t.Fatalf("retried create: %+v, %v; want the first joined", again, err)
	}
	if info, err := a.StoreStat(ks[0]); err != nil || info.Pins != 1 {
		t.Fatalf("k1 after two creates: %+v, %v; want one pin", info, err)
	}
	if _, err := b.LeaseCreate(op, ks[:1], time.Minute); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("same op, other keys: %v, want ErrFailedPrecondition", err)
	}
	if err := b.LeaseRelease(op); err != nil {
		t.Fatal(err)
	}
	if info, err := a.StoreStat(ks[0]); err != nil || info.Pins != 0 {
		t.Fatalf("k1 after release: %+v, %v", info, err)
	}
	if err := b.LeaseRelease([]byte("nope")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown op: %v, want ErrNotFound", err)
	}
}

// Through a daemon: the mode shows, changes (the test runs as the
// daemon's user) and refuses an unknown name.
func TestModeThroughDaemon(t *testing.T) {
	d := startStoreDaemon(t)
	c, err := Dial(d.sock, Options{Name: "op"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.Mode()
	if err != nil || m.Mode != "budgeted-hybrid" || m.RemoteGets == 0 {
		t.Fatalf("mode: %+v, %v", m, err)
	}
	if m, err = c.SetMode("global-governed"); err != nil || m.Mode != "global-governed" {
		t.Fatalf("set: %+v, %v", m, err)
	}
	if _, err := c.SetMode("everything"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("unknown mode: %v, want ErrInvalidArgument", err)
	}
	if m, err = c.Mode(); err != nil || m.Mode != "global-governed" {
		t.Fatalf("after set: %+v, %v", m, err)
	}
}
