package tcp

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/invariants"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestWriterBlockedOnAFullSocket: a peer that stops reading once
// authenticated fills the socket, and the connection's writer waits for
// room. The tasks still end, by their deadline plus stallGrace (the
// reaper drops the silent connection, which wakes the writer); the node
// then closes without waiting, and every descriptor it opened, the
// writer's duplicate too, is closed.
func TestWriterBlockedOnAFullSocket(t *testing.T) {
	before := openFDs(t)
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	a, err := NewNode(Config{DaemonID: "a", Listen: "127.0.0.1:0", ClusterKeyFile: kf, ConnsPerPeer: 1,
		SliceSize: 1 << 20, MaxInflightBytes: 64 << 20, MaxPeerInflightBytes: 64 << 20, RequestTimeout: 30 * time.Second},
		newExporter(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	stop := make(chan struct{})
	fake := newFakePeer(t, "deaf", key, func(net.Conn, header, []byte) bool {
		<-stop // reads nothing more
		return false
	})
	if err := a.Directory().Update(dirPeer("deaf", fake.ln.Addr().String())); err != nil {
		t.Fatal(err)
	}
	r, err := a.Open("deaf", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 64<<20)
	col := xfertest.NewRecorder()
	const wait = 500 * time.Millisecond
	deadline := time.Now().Add(wait)
	var tasks []*xfer.Task
	for i := 0; i < 16; i++ {
		tk := mkTask(col, xfer.OpWrite, local, uint64(i)<<20, r, uint64(i)<<20, 1<<20)
		tk.Deadline = deadline
		tasks = append(tasks, tk)
	}
	start := time.Now()
	if k, err := a.Submit(tasks); k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	for _, d := range col.Next(t, len(tasks), 10*time.Second) {
		if !errors.Is(d.Err, ErrConnLost) && !errors.Is(d.Err, xfer.ErrTimeout) {
			t.Fatalf("task to a peer that reads nothing ended with %v", d.Err)
		}
	}
	if el := time.Since(start); el > wait+stallGrace+5*time.Second {
		t.Fatalf("tasks ended %v after Submit; deadline %v, stall grace %v", el, wait, stallGrace)
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs with a writer that waited for room")
	}
	close(stop)
	fake.close()
	testutil.Eventually(t, 2*time.Second, func() bool { return openFDs(t) <= before },
		"%v descriptors open after close, %d before", testutil.Lazy(func() int { return openFDs(t) }), before)
}

// TestLargeFrameAllocations: a 1 MiB WRITE, which its connection's writer
// sends, allocates nothing in the steady state either.
func TestLargeFrameAllocations(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 4<<20, Config{ConnsPerPeer: 1})
	a := nodes[0]
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 4<<20)
	cc := make(xfertest.Chan, 1)
	tk := &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, Length: 1 << 20}, Local: local, Target: r}
	tk.SetCompleter(cc)
	one := []*xfer.Task{tk}
	for i := 0; i < 20; i++ {
		a.Submit(one)
		<-cc
	}
	allocs := testing.AllocsPerRun(100, func() {
		a.Submit(one)
		if d := <-cc; d.Err != nil {
			t.Fatal(d.Err)
		}
	})
	limit := 0.0
	if invariants.RaceEnabled {
		limit = 4
	}
	if allocs > limit {
		t.Errorf("%.1f allocations per 1 MiB request", allocs)
	}
}
