package daemon

import (
	"errors"
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
