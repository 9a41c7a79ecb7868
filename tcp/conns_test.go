package tcp

import (
	"testing"
	"time"

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
