package control

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/queue"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// queueClient dials e with the Go client and opens a queue of entries.
func queueClient(t testing.TB, e *env, entries int, opts ...client.QueueOption) (*client.Client, *client.Queue) {
	t.Helper()
	c, err := client.Dial(e.sock, client.Options{Name: "queue-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	q, err := c.OpenQueue(entries, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, q
}

// reapAll reaps until n completions came, failing after testTimeout.
func reapAll(t testing.TB, q *client.Queue, n int) map[uint64]client.Completion {
	t.Helper()
	got := make(map[uint64]client.Completion, n)
	cqes := make([]client.Completion, 256)
	for len(got) < n {
		k, err := q.Reap(cqes, 1, testTimeout)
		if err != nil {
			t.Fatalf("reap after %d of %d: %v", len(got), n, err)
		}
		for _, c := range cqes[:k] {
			if _, dup := got[c.UserData]; dup {
				t.Fatalf("second completion for %d", c.UserData)
			}
			got[c.UserData] = c
		}
	}
	return got
}

func connCounter(t testing.TB, c *client.Client, name string) uint64 {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range st.Connection {
		if k.Name == name {
			return k.Value
		}
	}
	t.Fatalf("no connection counter %q in %v", name, st.Connection)
	return 0
}

// TestQueueTransfers moves bytes both ways through a queue and checks
// them, then the per-entry refusals, each with its own code.
func TestQueueTransfers(t *testing.T) {
	e := newEnv(t, false)
	c, q := queueClient(t, e, 64)
	buf, err := c.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 16, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range buf.Mem {
		buf.Mem[i] = byte(rng.Uint32())
	}
	reqs := make([]xfer.Request, len(offs))
	uds := make([]uint64, len(offs))
	for i, off := range offs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: uint64(i) << 16, Target: testPoolID, TargetOffset: off, Length: 64 << 10}
		uds[i] = uint64(i)
	}
	if n, err := q.Submit(reqs, uds); n != len(reqs) || err != nil {
		t.Fatalf("submit: %d %v", n, err)
	}
	for ud, cq := range reapAll(t, q, len(reqs)) {
		if cq.Err() != nil || cq.N != 64<<10 || cq.State != xfer.StateCompleted {
			t.Fatalf("write %d: %+v", ud, cq)
		}
	}
	pool := c.PoolBytes()
	for i, off := range offs {
		if !bytes.Equal(pool[off:off+64<<10], buf.Mem[i<<16:(i+1)<<16]) {
			t.Fatalf("block %d differs after the write", i)
		}
	}
	// Read back into the buffer's second half.
	for i, off := range offs {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: 1<<19 + uint64(i)<<15, Target: testPoolID, TargetOffset: off, Length: 32 << 10}
		uds[i] = 100 + uint64(i)
	}
	q.Submit(reqs, uds)
	reapAll(t, q, len(reqs))
	for i, off := range offs {
		if !bytes.Equal(buf.Mem[1<<19+i<<15:1<<19+(i+1)<<15], pool[off:off+32<<10]) {
			t.Fatalf("block %d differs after the read", i)
		}
	}

	// Refusals: one per kind, each answered by its own CQE with its code.
	maxOff := slices.Max(offs)
	bad := []xfer.Request{
		{Op: xfer.OpWrite, Local: buf.ID, Target: testPoolID, TargetOffset: maxOff + 4096, Length: 64 << 10}, // past the blocks held
		{Op: 7, Local: buf.ID, Target: testPoolID, TargetOffset: offs[0], Length: 16},                        // no such op
		{Op: xfer.OpWrite, Local: buf.ID, Target: testPoolID, TargetOffset: offs[0], Length: 0},              // nothing to move
		{Op: xfer.OpWrite, Local: 999, Target: testPoolID, TargetOffset: offs[0], Length: 16},                // unknown segment
		{Op: xfer.OpRead, Local: buf.ID, LocalOffset: 1 << 20, Target: testPoolID, TargetOffset: offs[0], Length: 16},
	}
	want := []Code{tcproto.CodePERMISSION_DENIED, tcproto.CodeINVALID_ARGUMENT, tcproto.CodeINVALID_ARGUMENT,
		tcproto.CodeNOT_FOUND, tcproto.CodeINVALID_ARGUMENT}
	bu := []uint64{200, 201, 202, 203, 204}
	if n, err := q.Submit(bad, bu); n != len(bad) || err != nil {
		t.Fatal(n, err)
	}
	got := reapAll(t, q, len(bad))
	for i, ud := range bu {
		if got[ud].Code != want[i] || got[ud].Err() == nil {
			t.Errorf("bad request %d: %+v, want code %s", i, got[ud], want[i])
		}
	}
	// A buffer unregistered after requests named it: the next request
	// naming it is refused, not served from what the queue remembered.
	buf2, err := c.RegisterBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	use := []xfer.Request{{Op: xfer.OpWrite, Local: buf2.ID, Target: testPoolID, TargetOffset: offs[0], Length: 4096}}
	q.Submit(use, []uint64{250})
	if got := reapAll(t, q, 1)[250]; got.Err() != nil {
		t.Fatalf("request on a new buffer: %+v", got)
	}
	if err := c.UnregisterBuffer(buf2.ID); err != nil {
		t.Fatal(err)
	}
	q.Submit(use, []uint64{251})
	if got := reapAll(t, q, 1)[251]; got.Code != tcproto.CodeNOT_FOUND {
		t.Fatalf("request on an unregistered buffer: %+v, want NOT_FOUND", got)
	}
	if ok, err := q.Nop(300); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if got := reapAll(t, q, 1); got[300].Code != tcproto.CodeOK {
		t.Errorf("nop: %+v", got[300])
	}
	if n := connCounter(t, c, "queues"); n != 1 {
		t.Errorf("queues counter %d", n)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if n := connCounter(t, c, "queues"); n != 0 {
		t.Errorf("queues counter %d after close", n)
	}
	if _, err := q.Submit(reqs[:1], uds[:1]); !errors.Is(err, client.ErrClosed) {
		t.Errorf("submit after close: %v", err)
	}
}

// TestQueueDeadline: a request past its deadline gets a Timeout CQE, and
// its pool block stays busy until the transport lets go of it.
func TestQueueDeadline(t *testing.T) {
	e := newEnv(t, true)
	h := e.deafHang()
	c, q := queueClient(t, e, 8, client.WithRequestTimeout(30*time.Millisecond))
	buf, _ := c.RegisterBuffer(1 << 16)
	offs, _ := c.AllocBlocks(nil, 1, 16<<10)
	start := time.Now()
	q.Submit([]xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: testPoolID, TargetOffset: offs[0], Length: hangLength}}, []uint64{1})
	got := reapAll(t, q, 1)[1]
	if got.State != xfer.StateTimeout || got.Code != tcproto.CodeDEADLINE_EXCEEDED || !errors.Is(got.Err(), client.ErrDeadlineExceeded) {
		t.Fatalf("held request ended %+v", got)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("timed out after %v, before its 30ms deadline", d)
	}
	res := make([]error, 1)
	if err := c.FreeBlocks(offs, res); err != nil || !errors.Is(res[0], client.ErrBusy) {
		t.Errorf("freeing a block a timed-out request still holds: %v %v", err, res[0])
	}
	h.Finish()
	testutil.Eventually(t, testTimeout, func() bool {
		c.FreeBlocks(offs, res)
		return res[0] == nil
	}, "the block freed once the request ended (last: %v)", testutil.Lazy(func() error { return res[0] }))
}

// TestQueueNeverReaps: a client that does not reap gets backpressure, not
// lost completions; other clients keep working; closing its queue releases
// everything.
func TestQueueNeverReaps(t *testing.T) {
	e := newEnv(t, false)
	c, q := queueClient(t, e, 16, client.WithCompletionEntries(32))
	// 32 completions fill the ring and 16 entries then wait behind them:
	// 48 nops go in (as fast as the daemon takes them), the 49th does not.
	submitted := 0
	testutil.Eventually(t, testTimeout, func() bool {
		for submitted < 48 {
			ok, err := q.Nop(uint64(submitted))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return false // the daemon has not taken the earlier ones yet
			}
			submitted++
		}
		return true
	}, "48 nops taken (taken: %d)", testutil.Lazy(func() int { return submitted }))
	testutil.Eventually(t, testTimeout, func() bool { return connCounter(t, c, "queue_unreaped") == 32 }, "32 completions unreaped")
	if ok, _ := q.Nop(48); ok {
		t.Fatal("a 49th nop went in: the daemon took entries it had no completion slot for")
	}
	oc, other := queueClient(t, e, 4)
	for i := range 100 {
		other.Nop(uint64(i))
		reapAll(t, other, 1)
	}
	got := reapAll(t, q, 48)
	if len(got) != 48 {
		t.Fatalf("%d completions", len(got))
	}
	q.Close()
	c.Close()
	oc.Close()
	e.waitIdle()
}

// TestQueueAllocations: submit and reap make no allocation on either side.
func TestQueueAllocations(t *testing.T) {
	e := newEnv(t, false)
	c, q := queueClient(t, e, 64)
	buf, _ := c.RegisterBuffer(1 << 16)
	offs, _ := c.AllocBlocks(nil, 1, 64<<10)
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: buf.ID, Target: testPoolID, TargetOffset: offs[0], Length: 4096}}
	uds := []uint64{1}
	cqes := make([]client.Completion, 4)
	round := func() {
		if n, err := q.Submit(reqs, uds); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		if n, err := q.Reap(cqes, 1, testTimeout); n != 1 || err != nil || cqes[0].Err() != nil {
			t.Fatal(n, err, cqes[0])
		}
	}
	for range 100 {
		round() // warm the stream's slots and timers
	}
	// The daemon runs in this process, so the count covers both sides.
	if a := testing.AllocsPerRun(500, round); a != 0 {
		t.Errorf("%v allocations per request, client and daemon", a)
	}
}

// TestQueueClientKilled: a client SIGKILLed with 4096 requests in flight
// leaves nothing behind: pool blocks, tasks, segments and fds return to
// what they were.
func TestQueueClientKilled(t *testing.T) {
	e := newEnv(t, true)
	fdsBefore, _ := testutil.HandleFDs()
	cmd, out := startHelper(t, e, "queue-hold")
	waitLine(t, out, "ready")
	testutil.Eventually(t, testTimeout, func() bool { return e.eng.Stats().Pending == 4096 },
		"4096 requests pending (pending: %d)", testutil.Lazy(func() any { return e.eng.Stats().Pending }))
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	e.waitIdle()
	testutil.Eventually(t, testTimeout, func() bool { st := e.eng.Stats(); return st.Streams == 0 && st.Pending == 0 },
		"no stream and nothing pending: %+v", testutil.Lazy(e.eng.Stats))
	testutil.Eventually(t, testTimeout, func() bool {
		after, _ := testutil.HandleFDs()
		return len(after) <= len(fdsBefore)
	}, "the handles back to the %d before", len(fdsBefore))
}

// TestQueueHostileClient: another process scribbles over its own queue's
// whole mapping while this one moves bytes through its own queue; the
// daemon does not crash, the other client's data stays exact, and the
// scribbler's queue is refused or works, hurting only itself.
func TestQueueHostileClient(t *testing.T) {
	e := newEnv(t, false)
	cmd, out := startHelper(t, e, "queue-scribble")
	waitLine(t, out, "scribbling")
	c, q := queueClient(t, e, 32)
	buf, _ := c.RegisterBuffer(1 << 20)
	offs, _ := c.AllocBlocks(nil, 4, 64<<10)
	for round := 0; round < 200; round++ {
		for i := range buf.Mem[:256<<10] {
			buf.Mem[i] = byte(i*7 + round)
		}
		reqs := make([]xfer.Request, 4)
		uds := make([]uint64, 4)
		for i, off := range offs {
			reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: uint64(i) << 16, Target: testPoolID, TargetOffset: off, Length: 64 << 10}
			uds[i] = uint64(round*4 + i)
		}
		q.Submit(reqs, uds)
		for ud, cq := range reapAll(t, q, 4) {
			if cq.Err() != nil {
				t.Fatalf("round %d request %d: %+v", round, ud, cq)
			}
		}
		for i, off := range offs {
			if !bytes.Equal(c.PoolBytes()[off:off+64<<10], buf.Mem[i<<16:(i+1)<<16]) {
				t.Fatalf("round %d: block %d corrupted", round, i)
			}
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	q.Close()
	c.Close()
	e.waitIdle()
	testutil.Eventually(t, testTimeout, func() bool { return e.eng.Stats().Streams == 0 }, "no stream left")
}

// startHelper runs the test binary as a helper client of kind against e.
func startHelper(t *testing.T, e *env, kind string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+kind, "TENSORCAST_TEST_SOCKET="+e.sock)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, _ = os.Open(os.DevNull)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewReader(stdout)
}

// waitLine reads the helper's output until a line that is want.
func waitLine(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("helper output ended before %q: %v", want, err)
		}
		if strings.TrimSpace(l) == want {
			return
		}
		if strings.HasPrefix(l, "error") {
			t.Fatalf("helper: %s", l)
		}
	}
}

// runQueueHelper is the body of the queue helper clients.
func runQueueHelper(kind string) int {
	c, err := client.Dial(os.Getenv("TENSORCAST_TEST_SOCKET"), client.Options{Name: kind})
	if err != nil {
		fmt.Println("error", err)
		return 2
	}
	switch kind {
	case "queue-hold":
		q, err := c.OpenQueue(4096, client.WithCompletionEntries(8192))
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		buf, err := c.RegisterBuffer(1 << 20)
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		offs, err := c.AllocBlocks(nil, 64, 16<<10)
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		reqs := make([]xfer.Request, 4096)
		uds := make([]uint64, 4096)
		for i := range reqs {
			reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: testPoolID, TargetOffset: offs[i%64], Length: hangLength}
			uds[i] = uint64(i)
		}
		for done := 0; done < len(reqs); {
			n, err := q.Submit(reqs[done:], uds[done:])
			if err != nil {
				fmt.Println("error", err)
				return 2
			}
			done += n
		}
		// Wait until the daemon has taken them all: the stats say so.
		for {
			st, err := c.Stats()
			if err != nil {
				fmt.Println("error", err)
				return 2
			}
			taken := false
			for _, k := range st.Connection {
				if k.Name == "queue_inflight" && k.Value == 4096 {
					taken = true
				}
			}
			if taken {
				break
			}
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		select {} // killed here
	case "queue-scribble":
		// The raw protocol, so that the mapping is this process's own to
		// scribble on.
		c.Close()
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv("TENSORCAST_TEST_SOCKET"), Net: "unix"})
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		rc := &rawClient{t: helperTB{}, uc: uc, b: flatbuffers.NewBuilder(256), oob: make([]byte, unix.CmsgSpace(32))}
		r, fds := rc.callFD(&wire.OpenQueueRequest{SQEntries: 64})
		if r.Status != tcproto.CodeOK || len(fds) != 1 {
			fmt.Println("error open queue", r.Status, len(fds))
			return 2
		}
		size := body[wire.OpenQueueResponse](rc.t, r).Size
		mem, err := shm.MapShared(fds[0], size)
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		ring, err := queue.NewClientRing(mem)
		if err != nil {
			fmt.Println("error", err)
			return 2
		}
		fmt.Println("scribbling")
		rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 9))
		for {
			off := rng.IntN(len(mem) / 4)
			v := rng.Uint32()
			if rng.IntN(4) == 0 {
				v = uint32(rng.IntN(300)) // small values: plausible indices
			}
			mem[4*off], mem[4*off+1], mem[4*off+2], mem[4*off+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
			if rng.IntN(64) == 0 {
				// Ring the doorbell now and then, with entries of any kind.
				e := queue.SQE{Op: uint8(rng.IntN(4)), UserData: rng.Uint64(), Local: rng.Uint64N(4), Target: 1,
					Length: rng.Uint64N(1 << 20), TargetOff: rng.Uint64()}
				ring.Stage(&e, nil)
				ring.Submit()
			}
		}
	}
	fmt.Println("error unknown helper", kind)
	return 2
}

// TestQueueSlotsFreeOnAnswer: once a no-op's completion is reaped, its
// submission slot is free again (the daemon publishes its head before it
// answers), so a client counting slots by completions never finds the
// ring full.
func TestQueueSlotsFreeOnAnswer(t *testing.T) {
	e := newEnv(t, false)
	_, q := queueClient(t, e, 2)
	cqes := make([]client.Completion, 2)
	for i := 0; i < 2000; i++ {
		for k := 0; k < 2; k++ {
			if ok, err := q.Nop(uint64(2*i + k)); !ok || err != nil {
				t.Fatalf("round %d: nop %d not taken (%v, %v) although every earlier one was reaped", i, k, ok, err)
			}
		}
		for got := 0; got < 2; {
			n, err := q.Reap(cqes[got:], 1, testTimeout)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
}

// TestQueueBreakersCountedByTheDaemon: a client that breaks queue after
// queue gets one warning and a count, not a line per queue, and the
// violation count it sees in stats is the daemon's own: a forged violation
// word in the shared mapping changes nothing.
func TestQueueBreakersCountedByTheDaemon(t *testing.T) {
	const queues = 40
	e := newEnv(t, false, func(c *Config, _ *Deps) {
		c.Limits.MaxQueues = queues
		c.LogInterval = time.Hour // the count comes with Close
	})
	rc := dialRaw(t, e.sock)
	const (
		offCQHead    = 0x100 // queue/doc.go
		offViolation = 0x1c4
	)
	rings := make([]*queue.ClientRing, queues)
	for i := range rings {
		r, fds := rc.callFD(&wire.OpenQueueRequest{SQEntries: 8})
		if r.Status != tcproto.CodeOK || len(fds) != 1 {
			t.Fatalf("open queue %d: %v, %d fds", i, r.Status, len(fds))
		}
		mem, err := shm.MapShared(fds[0], body[wire.OpenQueueResponse](t, r).Size)
		unix.Close(fds[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { shm.Unmap(mem) })
		if rings[i], err = queue.NewClientRing(mem); err != nil {
			t.Fatal(err)
		}
		// A completion head past anything posted, then an entry for the
		// daemon to take: it refuses the head and breaks the queue.
		(*atomic.Uint32)(unsafe.Pointer(&mem[offCQHead])).Store(1000)
		(*atomic.Uint32)(unsafe.Pointer(&mem[offViolation])).Store(3_000_000_000)
		rings[i].Stage(&queue.SQE{Op: queue.OpNop}, nil)
		rings[i].Submit()
	}
	testutil.Eventually(t, testTimeout, func() bool {
		for _, r := range rings {
			if !errors.Is(r.Err(), queue.ErrBroken) {
				return false
			}
		}
		return true
	}, "every queue broken")
	st := body[wire.StatsResponse](t, rc.call(&wire.StatsRequest{}))
	if i := slices.IndexFunc(st.Connection, func(k wire.Counter) bool { return k.Name == "queue_violations" }); i < 0 {
		t.Errorf("no queue_violations in %v", st.Connection)
	} else if v := st.Connection[i].Value; v != queues {
		t.Errorf("queue_violations %d for %d broken queues, each with its shared word forged to 3e9", v, queues)
	}
	const msg = "queue broken by the client"
	// The last worker's line is logged once it has left its loop.
	testutil.Eventually(t, testTimeout, func() bool { return strings.Contains(e.logBuf.String(), msg) }, "the warning")
	rc.uc.Close()
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	log := e.logBuf.String()
	if n := strings.Count(log, msg); n != 2 {
		t.Fatalf("%d warnings for %d broken queues, want the first and one count:\n%s", n, queues, log)
	}
	if !strings.Contains(log, fmt.Sprintf("count=%d", queues-1)) {
		t.Fatalf("the broken queues after the first are not counted:\n%s", log)
	}
}
