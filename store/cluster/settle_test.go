package cluster

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

// lateReadFailed sets up a key that h holds and r reads while the net
// reads late: r's read has failed, its transfer still to land. It returns
// the net, r, the key, its value and r's store's reservations before.
func lateReadFailed(t *testing.T, name string) (f *fakeNet, r *fakeNode, key string, v []byte, base uint64) {
	t.Helper()
	ids := []string{"h", "r", "x"}
	f = newNet(t, ids, Config{Shards: 16, Timeout: time.Second, ProbeEvery: time.Hour, Staleness: -1})
	h := f.node("h")
	r = f.node("r")
	key = keyHomedOn(f, r, name, "x")
	v = value(key, 8192)
	h.put(t, key, v)
	testutil.Eventually(t, 10*time.Second, func() bool { return slices.Equal(f.holders(key), []string{"h"}) }, "h's copy announced")
	base = r.st.Stats().Reserved
	f.readLate(true)
	if _, err := r.read(key, len(v)); err == nil {
		t.Fatal("a read whose transfer failed answered bytes")
	}
	if st := r.c.Stats(); st.Unsettled != 1 {
		t.Fatalf("%d reads waiting for their late transfers, want 1", st.Unsettled)
	}
	return f, r, key, v, base
}

// TestLateReadKeepsItsBlocks: a read from a holder fails at its deadline
// while its transfer has yet to land (an rdma READ cannot be called
// back). The reader's get answers at once with the error, but the block
// it was reading into stays reserved until the transfer has landed: a
// value put meanwhile takes other blocks, and the late bytes corrupt
// nothing. Then the block goes back, and the key reads byte-exact.
func TestLateReadKeepsItsBlocks(t *testing.T) {
	f, r, key, v, base := lateReadFailed(t, "late/read")
	if got := r.st.Stats().Reserved; got <= base {
		t.Fatalf("the late read's block went back before its transfer landed (reserved %d, %d before)", got, base)
	}
	f.readLate(false)

	// A put of the same size meanwhile: it must not take the late read's
	// block.
	other := "late/other"
	ov := value(other, len(v))
	r.put(t, other, ov)
	if n := f.landLate(0xAA); n != 1 {
		t.Fatalf("%d late reads landed, want 1", n)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return r.c.Stats().Unsettled == 0 && r.st.Stats().Reserved == base
	}, "the late read's block back (unsettled %d, reserved %d, %d before)",
		testutil.Lazy(func() int { return r.c.Stats().Unsettled }), testutil.Lazy(func() uint64 { return r.st.Stats().Reserved }), base)
	got, err := r.read(other, len(ov))
	if err != nil || !bytes.Equal(got, ov) {
		t.Fatalf("the value put meanwhile, after the late transfer landed: %v, equal %v", err, bytes.Equal(got, ov))
	}
	got, err = r.read(key, len(v))
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("the key read again: %v, equal %v", err, bytes.Equal(got, v))
	}
}

// TestLateReadAtClose: a failed read still waiting for its late transfer
// does not hold up Close: the daemon is stopping, its blocks go back.
func TestLateReadAtClose(t *testing.T) {
	f, r, _, _, _ := lateReadFailed(t, "late/close")
	closed := make(chan struct{})
	go func() {
		r.c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting for a late transfer after 10s")
	}
	if st := r.c.Stats(); st.Unsettled != 0 {
		t.Fatalf("%d reads still waiting after Close", st.Unsettled)
	}
	f.landLate(0xAA)
}
