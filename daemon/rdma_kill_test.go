package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// childDaemonEnv, when set in the environment, makes this test binary a
// daemon (TestVerbsDaemonKilledMidTransfer re-executes itself so that one
// daemon of the pair is a process it can SIGKILL). Its value is the
// directory the child keeps its socket and data in; childListenEnv and
// childKeyEnv give its peer address and cluster key file.
const (
	childDaemonEnv = "TENSORCAST_TEST_CHILD_DAEMON"
	childListenEnv = "TENSORCAST_TEST_CHILD_LISTEN"
	childKeyEnv    = "TENSORCAST_TEST_CHILD_KEY"
)

// killPool is each daemon's pool in the kill test: room for the export, the
// writer's two blocks and slack, small enough for two daemons in the VM.
const killPool = 64 << 20

// runChildDaemon is the child side: daemon "d1" with rdma = on, serving
// until its stdin closes (the parent's clean stop) or it is killed.
func runChildDaemon(t *testing.T, dir string) {
	cfg := testConfig(dir)
	cfg.DaemonID = "d1"
	cfg.PeerListen = os.Getenv(childListenEnv)
	cfg.Peers = []PeerConfig{{ID: "d2"}} // d2 dials in
	cfg.ClusterKeyFile = os.Getenv(childKeyEnv)
	cfg.PeerSliceSize = 64 << 10
	cfg.PoolSize = killPool
	cfg.RDMA = "on"
	cfg.RDMADevice = os.Getenv("RXE_DEV")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := New(cfg, log, env(nil))
	if err != nil {
		t.Fatalf("child daemon: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stdinDone := make(chan struct{})
	go func() {
		defer close(stdinDone)
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := d.Run(ctx); err != nil {
		t.Errorf("child daemon Run: %v", err)
	}
	<-stdinDone
}

// childDaemon is daemon d1 running as a child process of the test.
type childDaemon struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	socket string
	out    *lockedBuffer // its stdout and stderr (the daemon's log)
	exited chan error    // cmd.Wait's result, once
	killed bool
}

// startChildDaemon starts d1 in a child process listening for peers on
// listen and waits until its control socket accepts.
func startChildDaemon(t *testing.T, key, listen string) *childDaemon {
	t.Helper()
	dir := t.TempDir()
	c := &childDaemon{socket: filepath.Join(dir, "tc.sock"), out: &lockedBuffer{}, exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestVerbsDaemonKilledMidTransfer$", "-test.timeout=10m")
	c.cmd.Env = append(os.Environ(), childDaemonEnv+"="+dir, childListenEnv+"="+listen, childKeyEnv+"="+key)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting the child daemon: %v", err)
	}
	go func() { c.exited <- c.cmd.Wait() }()
	t.Cleanup(func() {
		if c.killed {
			return
		}
		c.stdin.Close()
		select {
		case err := <-c.exited:
			if err != nil {
				t.Errorf("child daemon d1 exited: %v\n%s", err, c.out.String())
			}
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
			t.Errorf("child daemon d1 did not stop within 30 s of its stdin closing\n%s", c.out.String())
		}
	})
	testutil.Eventually(t, 30*time.Second, func() bool {
		select {
		case err := <-c.exited:
			c.killed = true // nothing left to stop
			t.Fatalf("child daemon d1 exited during start-up: %v\n%s", err, c.out.String())
		default:
		}
		conn, err := net.Dial("unix", c.socket)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, "child daemon d1's socket accepting\n%s", c.out)
	return c
}

// kill sends SIGKILL and reaps the process.
func (c *childDaemon) kill(t *testing.T) {
	t.Helper()
	c.killed = true
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the child daemon: %v", err)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the child daemon did not die within 10 s of SIGKILL")
	}
}

// dialExporter connects to the child, exports one pool block (the
// largest) as "kv" and returns the pair's exporter side: the pool block's
// offset and the child's pool as mapped here. It also returns the child's
// peer address.
func (c *childDaemon) dialExporter(t *testing.T, p *rdmaPair) string {
	t.Helper()
	exp, err := client.Dial(c.socket, client.Options{Name: "exporter", CallTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exp.Close() })
	pi, ok := exp.Pool()
	if !ok {
		t.Fatal("exporter has no pool mapping")
	}
	offs, err := exp.AllocBlocks(nil, 1, p.block)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exp.ExportSegment("kv", pi.Segment, offs[0], p.block, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	p.exp, p.expOff, p.expMem = exp, offs[0], exp.PoolBytes()
	return exp.Hello().PeerAddr
}

// counter is the named counter's value, or -1 when the daemon reports none.
func counter(cs []wire.Counter, name string) int64 {
	for _, c := range cs {
		if c.Name == name {
			return int64(c.Value)
		}
	}
	return -1
}

// writerBlocks gives the writer two pool blocks and opens d1/kv.
func (p *rdmaPair) writerBlocks(t *testing.T) {
	t.Helper()
	offs, err := p.wr.AllocBlocks(nil, 2, p.block)
	if err != nil {
		t.Fatal(err)
	}
	p.src, p.dst = offs[0], offs[1]
	if p.rs, err = p.wr.OpenRemote("d1/kv", client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
}

// TestVerbsDaemonKilledMidTransfer: the exporting daemon d1 is a separate
// process, SIGKILLed while a client of d2 has RDMA READs and WRITEs of
// 4 MiB (the pool's largest block) to its export in flight. Every task
// ends Failed well within its deadline; once the batch, the blocks and
// the remote segment are given back, d2 holds nothing (no task in flight,
// no live batch, its pool as before the client allocated); and when d1
// comes back (a new epoch) and exports again, d2 reconnects: transfers
// move over a new rdma link, crc32c checked on both ends.
func TestVerbsDaemonKilledMidTransfer(t *testing.T) {
	if dir := os.Getenv(childDaemonEnv); dir != "" {
		runChildDaemon(t, dir)
		return
	}
	testutil.Require(t, testutil.RDMA)
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast rdma kill test key")
	mut := func(c *Config) {
		c.PoolSize = killPool
		c.RDMA = "on"
		c.RDMADevice = os.Getenv("RXE_DEV")
	}
	p := &rdmaPair{block: 4 << 20, key: key, mut: mut}
	child := startChildDaemon(t, key, "127.0.0.1:0")
	addr := child.dialExporter(t, p)
	if addr == "" {
		t.Fatal("the child daemon reports no peer address")
	}
	p.d2 = startPeerWith(t, "d2", key, "", mut, PeerConfig{ID: "d1", Addr: addr})
	p.wr = p.d2.dial(t, "writer")
	wi, ok := p.wr.Pool()
	if !ok {
		t.Fatal("writer has no pool mapping")
	}
	p.pool, p.wMem = wi.Segment, p.wr.PoolBytes()
	st, err := p.wr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	poolUsed, poolBlocks := counter(st.Pool, "used"), counter(st.Pool, "blocks")
	if poolUsed < 0 || poolBlocks < 0 {
		t.Fatalf("d2 reports no pool used/blocks counters: %+v", st.Pool)
	}
	p.writerBlocks(t)
	rng := rand.New(rand.NewPCG(5, 5))
	t.Logf("rdma link to d1 up after %v", p.untilRDMA(t, rng).Round(time.Millisecond))
	if err := p.roundTrip(rng, 4<<20, 0); err != nil {
		t.Fatal(err)
	}

	// A batch of 4 MiB WRITEs and READs, alternating, all on the export:
	// 256 MiB, seconds of work for Soft-RoCE.
	const tasks = 64
	const taskDeadline = 20 * time.Second
	reqs := make([]xfer.Request, tasks)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: p.pool, LocalOffset: p.src, Target: p.rs.ID, Length: p.block}
		if i%2 == 1 {
			reqs[i].Op, reqs[i].LocalOffset = xfer.OpRead, p.dst
		}
	}
	batch, err := p.wr.AllocBatch(tasks)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, tasks)
	tcpBefore := tcpBytes(p.d2)
	if err := p.wr.Submit(batch, reqs, res, client.WithDeadline(taskDeadline)); err != nil {
		t.Fatal(err)
	}
	for i, e := range res {
		if e != nil {
			t.Fatalf("task %d refused: %v", i, e)
		}
	}
	// Kill d1 once some tasks have moved (or 2 s have passed: a loaded
	// host) and others are with the transport.
	var atKill client.Summary
	submitted := time.Now()
	testutil.Eventually(t, 30*time.Second, func() bool {
		if atKill, err = p.wr.BatchStatus(batch); err != nil {
			t.Fatal(err)
		}
		if atKill.Completed+atKill.Failed+atKill.Timeout+atKill.Canceled == tasks {
			t.Fatalf("the batch ended before the kill (%+v): make it larger", atKill)
		}
		return atKill.Pending > 0 && (atKill.Completed >= 1 || time.Since(submitted) > 2*time.Second)
	}, "the batch with tasks pending and one completed (%+v)", testutil.Lazy(func() client.Summary { return atKill }))
	stKill, err := p.wr.Stats()
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	child.kill(t)
	if moved := tcpBytes(p.d2) - tcpBefore; moved != 0 {
		t.Fatalf("the batch moved %d bytes over tcp before the kill: not an rdma test", moved)
	}
	if pending := counter(stKill.Engine, "pending"); pending < 1 {
		t.Fatalf("d2's engine had %d tasks pending at the kill (batch %+v)", pending, atKill)
	}
	t.Logf("killed d1 with the batch at %+v (d2 engine: %d pending)", atKill, counter(stKill.Engine, "pending"))

	sum, err := p.wr.Wait(batch, taskDeadline+5*time.Second)
	ended := time.Since(killed)
	if err != nil {
		t.Fatalf("Wait across the kill: %v", err)
	}
	t.Logf("batch ended %v after the kill: %+v", ended.Round(time.Millisecond), sum)
	if sum.Waiting+sum.Pending != 0 {
		t.Fatalf("tasks still live %v after the kill: %+v", ended, sum)
	}
	if sum.Timeout != 0 || sum.Canceled != 0 || sum.Failed == 0 || sum.Completed+sum.Failed != tasks {
		t.Fatalf("batch across the kill: %+v (want every task not completed before the kill Failed, none Timeout)", sum)
	}
	if sum.Completed < atKill.Completed || sum.Failed < 1 {
		t.Fatalf("batch across the kill: %+v, at the kill %+v", sum, atKill)
	}
	// Well within the deadline: the lost tcp session retires the link.
	if limit := taskDeadline / 2; ended > limit {
		t.Fatalf("tasks to the killed daemon took %v to fail (deadline %v)\n%s", ended, taskDeadline, p.d2.log.String())
	}
	for i := range tasks {
		ts, err := p.wr.TaskStatus(batch, i)
		if err != nil {
			t.Fatal(err)
		}
		if ts.State != xfer.StateCompleted && (ts.State != xfer.StateFailed || ts.Err == nil) {
			t.Fatalf("task %d after the kill: %v, %v", i, ts.State, ts.Err)
		}
	}

	// Give everything back; d2 must hold nothing of it.
	if err := p.wr.FreeBatch(batch); err != nil {
		t.Fatalf("FreeBatch after the kill: %v", err)
	}
	if err := p.wr.FreeBlocks([]uint64{p.src, p.dst}, make([]error, 2)); err != nil {
		t.Fatalf("FreeBlocks after the kill: %v", err)
	}
	if err := p.wr.CloseRemote(p.rs.ID); err != nil {
		t.Fatalf("CloseRemote of the killed daemon's segment: %v", err)
	}
	var leaks []string
	testutil.Eventually(t, 5*time.Second, func() bool {
		var err error
		if st, err = p.wr.Stats(); err != nil {
			t.Fatal(err)
		}
		leaks = leaks[:0]
		for _, c := range []struct {
			set  []wire.Counter
			name string
			want int64
		}{
			{st.Engine, "waiting", 0}, {st.Engine, "pending", 0},
			{st.Engine, "batches_live", 0}, {st.Engine, "batches_retiring", 0},
			{st.Pool, "used", poolUsed}, {st.Pool, "blocks", poolBlocks},
			{st.Connection, "blocks", 0}, {st.Connection, "batches", 0}, {st.Connection, "remotes", 0},
		} {
			if got := counter(c.set, c.name); got != c.want {
				leaks = append(leaks, fmt.Sprintf("%s = %d, want %d", c.name, got, c.want))
			}
		}
		return len(leaks) == 0
	}, "d2 releasing all after the kill; holds %v\nengine %+v\npool %+v\nconnection %+v",
		testutil.Lazy(func() string { return strings.Join(leaks, ", ") }), testutil.Lazy(func() any { return st.Engine }),
		testutil.Lazy(func() any { return st.Pool }), testutil.Lazy(func() any { return st.Connection }))
	// The tasks may fail before the link check sees the lost session
	// (the queue pairs report first); the link goes within a few checks.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return rdmaCounter(t, p.d2, "rdma.links") == 0 && strings.Contains(p.d2.log.String(), "rdma link closed")
	}, "d2 closing its rdma links after its only peer was killed (links: %v):\n%s",
		testutil.Lazy(func() any { return rdmaCounter(t, p.d2, "rdma.links") }), p.d2.log)

	// d1 comes back on its address (a new epoch) and exports again.
	old := p.rs
	child = startChildDaemon(t, key, addr)
	if got := child.dialExporter(t, p); got != addr {
		t.Fatalf("restarted d1 listens on %s, want %s", got, addr)
	}
	t0 := time.Now()
	p.writerBlocks(t)
	if p.rs.Epoch == old.Epoch {
		t.Fatalf("reopened segment %+v has the killed daemon's epoch", p.rs)
	}
	t.Logf("reconnected: rdma to the new d1 after %v", (time.Since(t0) + p.untilRDMA(t, rng)).Round(time.Millisecond))
	for _, n := range rdmaSizes {
		before := tcpBytes(p.d2)
		if err := p.roundTrip(rng, n, p.block-n); err != nil {
			t.Fatal(err)
		}
		if moved := tcpBytes(p.d2) - before; moved != 0 {
			t.Fatalf("after the restart %d bytes each way moved %d bytes over tcp", n, moved)
		}
	}
	if c := strings.Count(p.d2.log.String(), "rdma link up"); c != 2 {
		t.Fatalf("%d rdma links made for two lives of d1:\n%s", c, p.d2.log.String())
	}
}
