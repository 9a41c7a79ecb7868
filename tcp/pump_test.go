package tcp

import (
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// muteListener accepts TCP connections and never says a word: a peer
// whose kernel completes the connect while the daemon itself is stopped.
func muteListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // guards held
	var held []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	return ln
}

// remoteAt stands in for a segment opened on peer id before its session
// went away (Open itself needs a session).
func remoteAt(n *testNode, id string) *Remote {
	r := &Remote{node: n.Node, peer: n.peer(id, true), name: "seg", id: 77, size: 1 << 20, rights: RightRead | RightWrite}
	r.cred.Store(&credential{token: []byte("token"), expiry: time.Now().Add(time.Hour).UnixNano()})
	return r
}

// TestSubmitNeverWaitsForADial: the peer accepts connections and never
// answers a handshake. Submit returns at once; each task ends at its own
// deadline with xfer.ErrTimeout, one Canceled ends at once, the ones past
// the queue bound fail ErrBacklog at once; Close interrupts the dial still
// hanging (and an Open waiting for it) instead of waiting out
// HandshakeTimeout.
func TestSubmitNeverWaitsForADial(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "secret")
	const queue, over = 50, 3
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, HandshakeTimeout: 20 * time.Second,
		RequestTimeout: 30 * time.Second, MaxQueued: queue})
	ln := muteListener(t)
	_ = a.Directory().Update(dirPeer("mute", ln.Addr().String()))
	r := remoteAt(a, "mute")
	local := xfertest.NewSegment(1, 1<<20)
	var mu sync.Mutex // guards endAt
	endAt := map[*xfer.Task]time.Time{}
	col := xfertest.NewRecorder()
	stamp := xfertest.Func(func(tk *xfer.Task, n uint64, err error) {
		mu.Lock()
		endAt[tk] = time.Now()
		mu.Unlock()
		col.TaskDone(tk, n, err)
	})
	const wait = time.Second
	deadline := time.Now().Add(wait)
	tasks := make([]*xfer.Task, queue+over)
	for i := range tasks {
		op := xfer.OpWrite
		if i%2 == 1 {
			op = xfer.OpRead
		}
		tasks[i] = mkTask(col, op, local, uint64(i)*4096, r, uint64(i)*4096, 4096)
		tasks[i].SetCompleter(stamp)
		tasks[i].Deadline = deadline
	}
	start := time.Now()
	k, err := a.Submit(tasks)
	took := time.Since(start)
	if k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	// Bounds below are against the deadline and the dial's 20 s, with
	// slack for a loaded machine: what is shown is what waited for what.
	if took >= wait {
		t.Fatalf("Submit took %v against a peer that never answers (the tasks' deadline is %v away)", took, wait)
	}
	canceled := tasks[7]
	a.Cancel(canceled)

	ends := map[*xfer.Task]xfertest.End{}
	for _, d := range col.Next(t, len(tasks), 10*time.Second) {
		ends[d.Task] = d
	}
	mu.Lock()
	defer mu.Unlock()
	for i, tk := range tasks {
		d, el := ends[tk], endAt[tk].Sub(start)
		switch {
		case i >= queue:
			// Refused at once, and never queued.
			if !errors.Is(d.Err, ErrBacklog) || el >= wait {
				t.Errorf("task %d past the bound of %d: %v after %v, want ErrBacklog at once", i, queue, d.Err, el)
			}
		case tk == canceled:
			if !errors.Is(d.Err, xfer.ErrCanceled) || el >= wait {
				t.Errorf("canceled task: %v after %v, want ErrCanceled at once", d.Err, el)
			}
		default:
			// At the deadline (not before it: el counts from after
			// the tasks were made, the deadline from before), well
			// before the dial's 20 s.
			if !errors.Is(d.Err, xfer.ErrTimeout) || endAt[tk].Before(deadline) || el > wait+3*time.Second {
				t.Errorf("task %d: %v after %v, want ErrTimeout at its deadline (%v)", i, d.Err, el, wait)
			}
		}
	}
	if st := a.Peers(); len(st) != 1 || st[0].Queued != 0 || st[0].Connected {
		t.Fatalf("peer after every task ended: %+v", st)
	}

	// Open waits for the same dial, which still hangs; Close ends both.
	opened := make(chan error, 1)
	go func() { _, err := a.Open("mute", "seg", RightRead); opened <- err }()
	pm := a.peer("mute", false)
	testutil.Eventually(t, 5*time.Second, func() bool {
		pm.mu.Lock()
		defer pm.mu.Unlock()
		return pm.sessWait != nil
	}, "Open waiting for the dial")
	start = time.Now()
	a.Close()
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Close took %v with a handshake hanging", el)
	}
	if err := <-opened; !errors.Is(err, xfer.ErrClosed) {
		t.Fatalf("Open waiting for the hanging dial: %v, want ErrClosed", err)
	}
	if a.active.Load() != 0 {
		t.Fatalf("%d tasks outstanding after Close", a.active.Load())
	}
}

// TestStalledPeerEndsTasksByDeadline: the peer completes the handshake and
// then answers nothing, its connections open (a stopped process). 1,024
// WRITEs: Submit returns at once; the ones that fit the flow-control
// window go on the wire, the rest wait in the queue. Every task ends soon
// after its deadline, long before RequestTimeout: the waiting ones with
// xfer.ErrTimeout, the ones on the wire once their silent connection is
// dropped.
func TestStalledPeerEndsTasksByDeadline(t *testing.T) {
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, SliceSize: 64 << 10, RequestTimeout: 30 * time.Second})
	fake := newFakePeer(t, "stopped", key, func(net.Conn, header, []byte) bool { return true })
	_ = a.Directory().Update(dirPeer("stopped", fake.ln.Addr().String()))
	r, err := a.Open("stopped", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1024
	local := xfertest.NewSegment(1, n*4096)
	col := xfertest.NewRecorder()
	const wait = 1500 * time.Millisecond
	deadline := time.Now().Add(wait)
	tasks := make([]*xfer.Task, n)
	for i := range tasks {
		tasks[i] = mkTask(col, xfer.OpWrite, local, uint64(i)*4096, r, uint64(i)*4096, 4096)
		tasks[i].Deadline = deadline
	}
	start := time.Now()
	if k, err := a.Submit(tasks); k != n || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	// No task can end before its deadline (the peer answers nothing), so
	// one that has ended means Submit waited for the deadline: an event,
	// not a stopwatch, and loaded machines do not fail it.
	if ended := col.Count(); ended != 0 {
		t.Fatalf("Submit of %d tasks to a silent peer returned after %d of them had ended (%v)", n, ended, time.Since(start))
	}
	if st := a.Peers(); len(st) != 1 || st[0].Queued == 0 || st[0].InFlight == 0 {
		t.Fatalf("want some tasks on the wire and some queued: %+v", st)
	}
	var timedOut, lost int
	for _, d := range col.Next(t, n, 10*time.Second) {
		switch {
		case errors.Is(d.Err, xfer.ErrTimeout):
			timedOut++
		case errors.Is(d.Err, ErrConnLost):
			lost++
		default:
			t.Fatalf("task to a silent peer ended with %v", d.Err)
		}
	}
	// Long before RequestTimeout (30 s); the slack is for a loaded machine.
	if el := time.Since(start); el > wait+stallGrace+5*time.Second {
		t.Fatalf("tasks ended %v after Submit; deadline %v, stall grace %v", el, wait, stallGrace)
	}
	if timedOut == 0 || lost == 0 {
		t.Fatalf("%d timed out waiting, %d lost on the wire; want both kinds", timedOut, lost)
	}
	a.logs.waitContains(t, "requests past their deadline and nothing received")
}

// TestPeerAdmission: a key holder under an id the directory does not list
// is refused (and the refusals are logged once, not once each); an id
// whose session is live cannot be taken by a second session of another
// epoch; once that session is gone, it can.
func TestPeerAdmission(t *testing.T) {
	key := []byte("cluster")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf})
	b.exp.add("seg", xfertest.NewSegment(5, 1<<20))
	for i := 0; i < 5; i++ {
		_, h, meta := rawHandshake(t, b, key, "stranger", 42)
		if h.typ != tRefuse || string(meta) != reasonUnknownID {
			t.Fatalf("unlisted id: frame %d %q, want a refusal %q", h.typ, meta, reasonUnknownID)
		}
	}
	if got := strings.Count(b.logs.String(), reasonUnknownID); got != 1 {
		t.Fatalf("5 refusals logged %d times, want once (rate-limited):\n%s", got, b.logs.String())
	}
	if p := b.peer("stranger", false); p != nil {
		t.Fatal("a refused id left peer state behind")
	}

	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf})
	link(t, a, b)
	if _, err := a.Open("b", "seg", RightRead); err != nil {
		t.Fatal(err)
	}
	_, h, meta := rawHandshake(t, b, key, "a", 42)
	if h.typ != tRefuse || string(meta) != reasonIDInUse {
		t.Fatalf("second session under a's live id: frame %d %q, want a refusal %q", h.typ, meta, reasonIDInUse)
	}
	if p := b.Peers(); len(p) != 1 || p[0].Epoch != a.Epoch() {
		t.Fatalf("b's view of a after the refusal: %+v (a runs %#x)", p, a.Epoch())
	}
	a.Close()
	pa := b.peer("a", false)
	testutil.Eventually(t, 5*time.Second, func() bool {
		pa.mu.Lock()
		defer pa.mu.Unlock()
		return !pa.liveLocked()
	}, "b counting a's session gone after a closed")
	if _, h, meta := rawHandshake(t, b, key, "a", 42); h.typ != tAuthOK {
		t.Fatalf("a's id once its session is gone: frame %d %q, want accepted", h.typ, meta)
	}
}

// TestRefusalLogRateLimit drives the refusal log with a fake clock: the
// first refusal of a reason is logged at once, the next ones within
// refuseLogEvery only counted, and the count comes out with the next line.
func TestRefusalLogRateLimit(t *testing.T) {
	var out logBuf
	log := slog.New(slog.NewTextHandler(&out, nil))
	var r refusalLog
	t0 := time.Unix(1000, 0)
	r.note(log, "wrong key", t0, "remote", "10.0.0.1:1")
	r.note(log, "wrong key", t0.Add(time.Second), "remote", "10.0.0.2:1")
	r.note(log, "wrong key", t0.Add(2*time.Second), "remote", "10.0.0.3:1")
	r.note(log, "stale epoch", t0.Add(2*time.Second))
	r.flush(log, t0.Add(5*time.Second))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "refused=1") || !strings.Contains(lines[1], `reason="stale epoch"`) {
		t.Fatalf("before the interval: %q", lines)
	}
	r.flush(log, t0.Add(refuseLogEvery+time.Second))
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], `reason="wrong key"`) || !strings.Contains(lines[2], "refused=2") ||
		!strings.Contains(lines[2], "10.0.0.3:1") {
		t.Fatalf("after the interval: %q", lines)
	}
	r.flush(log, t0.Add(3*refuseLogEvery))
	if n := strings.Count(out.String(), "\n"); n != 3 {
		t.Fatalf("a flush with nothing counted logged: %q", out.String())
	}
}

// TestPumpSeesCreditFreedWhileItTried: the pump tries to send without the
// peer's lock held, so credit can come back between its try (no room) and
// its wait for credit, when nobody waits yet. The hook holds the pump
// there until every request in flight is answered, the window of one
// slice empty: the pump must see that and send on, not wait for a wake-up
// that already went to no one (the task would sit in the queue until
// RequestTimeout, as it once did on a loaded CI machine).
func TestPumpSeesCreditFreedWhileItTried(t *testing.T) {
	const slice = 64 << 10
	nodes := cluster(t, []string{"alpha", "bravo"}, 4<<20, Config{SliceSize: slice, ConnsPerPeer: 1,
		MaxInflightBytes: slice, RequestTimeout: 3 * time.Second})
	a, b := nodes[0], nodes[1]
	var noRoom atomic.Int64
	var stuck atomic.Bool
	a.pumpTried = func(p *peer, st sendState) {
		if st != needRoom {
			return
		}
		noRoom.Add(1)
		if !testutil.Poll(5*time.Second, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.inflight == 0
		}) {
			stuck.Store(true)
		}
	}
	r, err := a.Open(b.ID(), "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	local := xfertest.NewSegment(1, 32*slice)
	// Whether the pump finds the window full depends on how the answers
	// and the pump's tries interleave: write again until it has, at
	// least once (almost always in the first write).
	for try := 0; try < 50 && noRoom.Load() == 0; try++ {
		col := xfertest.NewRecorder()
		for _, d := range submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, 32*slice)}, 20*time.Second) {
			if d.Err != nil || d.N != d.Task.Req.Length {
				t.Fatalf("write of 32 slices through a window of one: n=%d err=%v", d.N, d.Err)
			}
		}
		if stuck.Load() {
			t.Fatal("the requests in flight were never answered")
		}
	}
	if noRoom.Load() == 0 {
		t.Fatal("the pump never found the window full in 50 writes: the test did not test the race")
	}
}

// TestFailedDialsLoggedOnceAnInterval: while a peer is down, every dial
// for its tasks fails and fails them; a client submitting one task after
// another made a log line per dial. The first is logged at once, the rest
// are counted into a line an interval (and at Close), and every task
// still fails.
func TestFailedDialsLoggedOnceAnInterval(t *testing.T) {
	const msg = `msg="tasks failed: no session with the peer"`
	kf := testutil.KeyFile(t, t.TempDir(), "k", "secret")
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a peer whose daemon is gone: every connect is refused
	_ = a.Directory().Update(dirPeer("gone", addr))
	r := remoteAt(a, "gone")
	local := xfertest.NewSegment(1, 1<<20)
	const n = 12
	for i := range n {
		col := xfertest.NewRecorder()
		tk := mkTask(col, xfer.OpRead, local, 0, r, 0, 4096)
		if k, err := a.Submit([]*xfer.Task{tk}); k != 1 || err != nil {
			t.Fatalf("Submit %d = %d, %v", i, k, err)
		}
		if d := col.Next(t, 1, 10*time.Second)[0]; d.Err == nil {
			t.Fatalf("task %d to a peer that refuses every connection ended OK", i)
		}
	}
	if got := strings.Count(a.logs.String(), msg); got >= n/2 {
		t.Fatalf("%d lines for %d failed dials, want a line an interval:\n%s", got, n, a.logs)
	}
	a.Close()
	// Every failed dial is in a line: the first alone, the rest counted.
	events := 0
	for _, l := range strings.Split(a.logs.String(), "\n") {
		if !strings.Contains(l, msg) {
			continue
		}
		c := 1
		if _, after, ok := strings.Cut(l, " count="); ok {
			if c, err = strconv.Atoi(strings.Fields(after)[0]); err != nil {
				t.Fatalf("a count that is not a number: %s", l)
			}
		}
		events += c
	}
	if events != n {
		t.Fatalf("the lines count %d failed dials, want %d:\n%s", events, n, a.logs)
	}
}
