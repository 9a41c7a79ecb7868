package rdma

import (
	"errors"
	"testing"

	"github.com/tensorcast/tensorcast/xfer"
)

func TestPlanTask(t *testing.T) {
	const chunk = 1 << 20
	local, _ := newKeyTable(0x100000, 4*chunk, chunk)
	remote, _ := newKeyTable(0x900000, 4*chunk, chunk)
	for i := range 4 {
		local.lkeys[i] = uint32(10 + i)
		remote.rkeys[i] = uint32(20 + i)
	}
	task := func(op xfer.Op, loff, roff, n uint64) *xfer.Task {
		return &xfer.Task{Req: xfer.Request{Op: op, LocalOffset: loff, TargetOffset: roff, Length: n}}
	}
	// Local crosses a chunk at 1 MiB, the remote at 2 MiB, and the maximum
	// message is 600 KiB: pieces end at every one of those boundaries.
	wrs, err := planTask(nil, task(xfer.OpWrite, chunk-100, 2*chunk-300, 1000), &local, &remote, 600<<10, 256)
	if err != nil {
		t.Fatal(err)
	}
	want := []WorkRequest{
		{laddr: 0x100000 + chunk - 100, raddr: 0x900000 + 2*chunk - 300, length: 100, lkey: 10, rkey: 21, op: opWrite},
		{laddr: 0x100000 + chunk, raddr: 0x900000 + 2*chunk - 200, length: 200, lkey: 11, rkey: 21, op: opWrite},
		{laddr: 0x100000 + chunk + 200, raddr: 0x900000 + 2*chunk, length: 700, lkey: 11, rkey: 22, op: opWrite},
	}
	if len(wrs) != len(want) {
		t.Fatalf("got %d work requests, want %d: %+v", len(wrs), len(want), wrs)
	}
	for i := range want {
		if wrs[i] != want[i] {
			t.Errorf("wr %d = %+v, want %+v", i, wrs[i], want[i])
		}
	}
	wrs, _ = planTask(wrs[:0], task(xfer.OpRead, 0, 0, 2*chunk), &local, &remote, 600<<10, 256)
	if len(wrs) != 4 || wrs[3].length != chunk-(600<<10) || wrs[2].lkey != 11 || wrs[0].op != opRead {
		t.Errorf("2 MiB read split at the chunk and at 600 KiB: %+v", wrs)
	}

	prefix := []WorkRequest{{id: 1}}
	for name, tk := range map[string]*xfer.Task{
		"zero length":  task(xfer.OpWrite, 0, 0, 0),
		"bad op":       {Req: xfer.Request{Op: 9, Length: 1}},
		"local range":  task(xfer.OpWrite, 4*chunk-1, 0, 2),
		"remote range": task(xfer.OpRead, 0, 4*chunk, 1),
	} {
		out, err := planTask(prefix, tk, &local, &remote, 1<<30, 256)
		if !errors.Is(err, xfer.ErrInvalid) && !errors.Is(err, ErrNotRegistered) {
			t.Errorf("%s: err = %v", name, err)
		}
		if len(out) != 1 {
			t.Errorf("%s: out grew to %d on failure", name, len(out))
		}
	}
}

func TestMarkSignals(t *testing.T) {
	cases := []struct {
		n, every int
		want     string
	}{
		{1, 16, "S"},
		{5, 2, ".S.SS"},
		{6, 3, "..S..S"},
		{7, 3, "..S..SS"},
		{4, 0, "SSSS"},
		{0, 4, ""},
	}
	for _, c := range cases {
		wrs := make([]WorkRequest, c.n)
		for i := range wrs {
			wrs[i].signaled = 1 // stale flags from a previous use are cleared
		}
		got := markSignals(wrs, c.every)
		s := ""
		cnt := 0
		for _, w := range wrs {
			if w.signaled == 1 {
				s += "S"
				cnt++
			} else {
				s += "."
			}
		}
		if s != c.want || got != cnt {
			t.Errorf("markSignals(%d, every %d) = %q (%d), want %q", c.n, c.every, s, got, c.want)
		}
	}
}

// TestPlanTaskStopsAtQueueSize: a task that needs more work requests than
// a send queue holds is refused once planning reaches that many, not
// after planning them all: the remote chunks are the peer's to choose (up
// to MaxRegionKeys of them in one request), and planning runs under the
// queue pair's lock.
func TestPlanTaskStopsAtQueueSize(t *testing.T) {
	const chunk, keys, depth = 4096, MaxRegionKeys, 256
	local, _ := newKeyTable(0x100000, keys*chunk, keys*chunk)
	remote, _ := newKeyTable(0x900000000, keys*chunk, chunk)
	task := func(n uint64) *xfer.Task {
		return &xfer.Task{Req: xfer.Request{Op: xfer.OpRead, Length: n}}
	}
	out := make([]WorkRequest, 0, depth)
	wrs, err := planTask(out, task(depth*chunk), &local, &remote, 1<<30, depth)
	if err != nil || len(wrs) != depth {
		t.Fatalf("a task of exactly %d work requests: %d planned, err %v", depth, len(wrs), err)
	}
	wrs, err = planTask(out, task(keys*chunk), &local, &remote, 1<<30, depth)
	if !errors.Is(err, xfer.ErrInvalid) || len(wrs) != 0 {
		t.Fatalf("a task of %d work requests with room for %d: %d planned, err %v", keys, depth, len(wrs), err)
	}
	if cap(wrs) != depth {
		t.Fatalf("planning a task of %d work requests grew the plan to %d entries before refusing it", keys, cap(wrs))
	}
}
