package daemon

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
)

// Retention handles across two daemons: a handle d1 issued is renewed and
// released by a client of d2, the calls routed to d1 over the peer
// channel, where its key's pin changes; a released token and one of an
// issuer that restarted (another epoch) are refused at d2.
func TestHandleRoutedToIssuer(t *testing.T) {
	d1, d2 := startPair(t, "handles cluster key")
	a := d1.dial(t, "issuer")
	if err := a.PutBytes([]byte("kv/held"), []byte("prefix kv"), false); err != nil {
		t.Fatal(err)
	}
	h, err := a.HandleIssue([][]byte{[]byte("kv/held")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pins := func() uint32 {
		info, err := a.StoreStat([]byte("kv/held"))
		if err != nil {
			t.Fatal(err)
		}
		return info.Pins
	}
	if pins() != 1 {
		t.Fatalf("%d pins after issue", pins())
	}

	b := d2.dial(t, "elsewhere")
	h2, err := b.HandleRenew(h.Token, 2*time.Minute)
	if err != nil {
		t.Fatalf("renew at d2: %v", err)
	}
	if !h2.Expiry.After(h.Expiry) {
		t.Fatalf("renewed to %v from %v", h2.Expiry, h.Expiry)
	}
	if st := d1.d.grants[0].Handles.Stats(); st.Renewed != 1 {
		t.Fatalf("d1 counted %d renewals", st.Renewed)
	}
	if st := d2.d.grants[0].Handles.Stats(); st.Live != 0 || st.Renewed != 0 {
		t.Fatalf("d2 holds handles: %+v", st)
	}
	if err := b.HandleRelease(h2.Token); err != nil {
		t.Fatalf("release at d2: %v", err)
	}
	if pins() != 0 {
		t.Fatal("the release routed to d1 left its pin")
	}
	if err := b.HandleRelease(h2.Token); !errors.Is(err, client.ErrPermissionDenied) {
		t.Fatalf("second release at d2: %v, want PERMISSION_DENIED", err)
	}

	// d1 restarts on its address: its old tokens are of another epoch.
	h3, err := a.HandleIssue([][]byte{[]byte("kv/held")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	addr := d1.d.PeerAddr()
	if err := d1.stop(); err != nil {
		t.Fatal(err)
	}
	startPeer(t, "d1", d1.cfg.ClusterKeyFile, addr, dialsIn("d2"))
	_, err = b.HandleRenew(h3.Token, time.Minute)
	if !errors.Is(err, client.ErrPermissionDenied) && !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("renew of a token of d1's last run: %v, want it refused", err)
	}
	t.Logf("a token of d1's last run, at d2: %v", err)
}

// A tenant's retention handles and placement leases pin, together, at most
// store_max_grant_pinned bytes (by default half of the tenant's L1): each
// pins in a store session of its own, which store_max_session_pinned
// bounds alone, so many of them could pin most of L1 and leave every put
// without room. A handle or lease past the bound is RESOURCE_EXHAUSTED and
// pins nothing; the refusals are counted in Stats and on the metrics
// endpoint; a release makes room again.
func TestGrantPinsBoundedPerTenant(t *testing.T) {
	cfg := testConfig(t.TempDir())
	d, err := New(cfg, discardLogger(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := d.grants[0].Pins.Stats().Limit; got != uint64(cfg.PoolSize)/4*3/2 {
		t.Errorf("default bound %d, want half of the L1 capacity (%d)", got, uint64(cfg.PoolSize)/4*3/2)
	}
	d.closeParts()

	cfg = testConfig(t.TempDir())
	cfg.StoreMaxGrantPinned = 4 << 20
	if d, err = New(cfg, discardLogger(), env(nil)); err != nil {
		t.Fatal(err)
	}
	runUntil(t, d)
	c := dialStore(t, cfg.Socket)
	key := func(i int) []byte { return []byte(fmt.Sprintf("kv/%d", i)) }
	for i := 0; i < 5; i++ {
		if err := c.PutBytes(key(i), make([]byte, 1<<20), false); err != nil {
			t.Fatal(err)
		}
	}
	h, err := c.HandleIssue([][]byte{key(0), key(1)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.LeaseCreate([]byte("op"), [][]byte{key(2), key(3)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HandleIssue([][]byte{key(4)}, time.Minute); !errors.Is(err, client.ErrResourceExhausted) {
		t.Fatalf("a handle past store_max_grant_pinned: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := c.LeaseCreate([]byte("op-2"), [][]byte{key(4)}, time.Minute); !errors.Is(err, client.ErrResourceExhausted) {
		t.Fatalf("a lease past store_max_grant_pinned: %v, want RESOURCE_EXHAUSTED", err)
	}
	if info, err := c.StoreStat(key(4)); err != nil || info.Pins != 0 {
		t.Fatalf("a refused handle or lease pinned: %+v, %v", info, err)
	}
	st := storeCounters(t, c)
	if st["grant_pin_limit"] != 2 || st["grant_pinned_bytes"] != 4<<20 || st["grant_pin_limit_bytes"] != 4<<20 {
		t.Fatalf("stats: refused %d, pinned %d of %d", st["grant_pin_limit"], st["grant_pinned_bytes"], st["grant_pin_limit_bytes"])
	}
	exp := scrapeMetrics(t, d.MetricsAddr())
	if got := sample(t, exp, `tensorcast_store_grant_pin_limit_total{tenant="default"}`); got != 2 {
		t.Fatalf("tensorcast_store_grant_pin_limit_total = %v, want 2", got)
	}
	if got := sample(t, exp, `tensorcast_store_grant_pinned_bytes{tenant="default"}`); got != 4<<20 {
		t.Fatalf("tensorcast_store_grant_pinned_bytes = %v", got)
	}
	if err := c.HandleRelease(h.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HandleIssue([][]byte{key(4)}, time.Minute); err != nil {
		t.Fatalf("a handle after a release made room: %v", err)
	}
}
