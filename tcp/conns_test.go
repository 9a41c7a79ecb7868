package tcp

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// TestConnAddrs: each side lists its connections with the other, and one
// side's outbound (local, remote) is the other's inbound (remote, local).
func TestConnAddrs(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b := nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 1<<20)
	col := xfertest.NewRecorder()
	for _, d := range submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)}, 20*time.Second) {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
	}
	type pair struct{ l, r string }
	out := map[pair]bool{}
	for _, c := range a.ConnAddrs() {
		if c.Peer != "b" || !c.Outbound {
			t.Fatalf("a lists %+v", c)
		}
		out[pair{c.Local.String(), c.Remote.String()}] = true
	}
	if len(out) != 2 {
		t.Fatalf("a lists %d connections to b, want 2: %+v", len(out), a.ConnAddrs())
	}
	in := 0
	for _, c := range b.ConnAddrs() {
		if c.Peer == "a" && !c.Outbound {
			in++
			if !out[pair{c.Remote.String(), c.Local.String()}] {
				t.Fatalf("b's inbound %+v is none of a's outbound %v", c, out)
			}
		}
	}
	if in != 2 {
		t.Fatalf("b lists %d inbound connections from a, want 2: %+v", in, b.ConnAddrs())
	}
}

// heldExchange starts two nodes with two connections from alpha to bravo,
// and an exchange of req from alpha whose handler on bravo holds it until
// release is closed; it returns once the handler runs, with the
// exchange's error to come on got.
func heldExchange(t *testing.T, req []byte) (a, b *testNode, got <-chan error, release chan struct{}) {
	t.Helper()
	nodes := cluster(t, []string{"alpha", "bravo"}, 1<<20, Config{ConnsPerPeer: 2})
	a, b = nodes[0], nodes[1]
	started, release := holdingHandler(t, b, "slow", []byte("late"), 1)
	res := make(chan error, 1)
	go func() { _, err := a.Exchange("bravo", "slow", req, 10*time.Second); res <- err }()
	<-started
	return a, b, res, release
}

// holdingHandler has b handle kind by answering reply once release is
// closed; each call signals entered first (room for n at once).
func holdingHandler(t *testing.T, b *testNode, kind string, reply []byte, n int) (entered, release chan struct{}) {
	t.Helper()
	entered, release = make(chan struct{}, n), make(chan struct{})
	if err := b.Handle(kind, func(string, uint64, []byte) ([]byte, error) {
		entered <- struct{}{}
		<-release
		return reply, nil
	}); err != nil {
		t.Fatal(err)
	}
	return entered, release
}

// TestDropStalled: DropStalled closes only connections whose bytes the
// network stalled. Over loopback every byte is acknowledged: a connection
// with an exchange in flight that its handler holds for as long as it
// likes is live, and stays, and the exchange gets its answer. (A link cut
// in network namespaces, the case it is for, is TestDropStalledOnCutLink's;
// its decision, by TCP_INFO, is stalledTCP's, below.)
func TestDropStalled(t *testing.T) {
	a, _, got, release := heldExchange(t, bytes.Repeat([]byte("x"), 32<<10))
	if n := a.DropStalled("bravo", "the test asks"); n != 0 {
		t.Fatalf("DropStalled closed %d live connections", n)
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatalf("the exchange in flight: %v", err)
	}
	if n := a.DropStalled("nobody", "no such peer"); n != 0 {
		t.Fatalf("DropStalled of an unknown peer closed %d", n)
	}
}

// TestDropStalledLeavesNoGap: the connections DropStalled closes leave the
// peer's session at once: an exchange sent the moment it returns dials
// afresh and is answered (it does not find only connections on their way
// out, "no session"), while the exchange that was in flight on a closed
// one ends with ErrConnLost. Which connections are stalled is the test's
// (connStalled replaced); TestDropStalledOnCutLink stalls a real one.
func TestDropStalledLeavesNoGap(t *testing.T) {
	a, b, got, release := heldExchange(t, nil)
	if err := b.Handle("echo", func(string, uint64, []byte) ([]byte, error) { return []byte("here"), nil }); err != nil {
		t.Fatal(err)
	}
	defer close(release)
	real := connStalled
	connStalled = func(*conn) bool { return true }
	defer func() { connStalled = real }()
	if n := a.DropStalled("bravo", "the test takes them for stalled"); n != 2 {
		t.Fatalf("DropStalled closed %d connections, want both", n)
	}
	connStalled = real
	if resp, err := a.Exchange("bravo", "echo", nil, 5*time.Second); err != nil || string(resp) != "here" {
		t.Fatalf("the exchange sent as DropStalled returned: %q, %v", resp, err)
	}
	if err := <-got; !errors.Is(err, ErrConnLost) {
		t.Fatalf("the exchange in flight on a dropped connection: %v, want ErrConnLost", err)
	}
}

// TestStalledTCP: a socket is stalled when it has unacknowledged bytes and
// retransmits them on a backed-off timer (or is retransmitting now); one
// held up by the peer's zero window (probes back off, nothing is
// unacknowledged) or with nothing to retransmit is not.
func TestStalledTCP(t *testing.T) {
	for _, tc := range []struct {
		ti   unix.TCPInfo
		want bool
	}{
		{unix.TCPInfo{Unacked: 4, Backoff: 3}, true},
		{unix.TCPInfo{Unacked: 1, Retransmits: 1}, true},
		{unix.TCPInfo{Unacked: 4}, false},
		{unix.TCPInfo{Backoff: 5, Probes: 5}, false},
		{unix.TCPInfo{}, false},
	} {
		if got := stalledTCP(&tc.ti); got != tc.want {
			t.Errorf("stalledTCP(unacked %d, backoff %d, retransmits %d) = %v, want %v", tc.ti.Unacked, tc.ti.Backoff,
				tc.ti.Retransmits, got, tc.want)
		}
	}
}
