package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// procDaemonEnv, when set, makes this test binary a daemon process: its
// value is a config file; the daemon runs until SIGTERM, as tensorcastd
// does, and the process exits with Run's outcome.
const procDaemonEnv = "TENSORCAST_TEST_PROC_DAEMON"

// runProcDaemon is the child side of procDaemon.
func runProcDaemon(path string) {
	cfg, err := Load([]string{"--config", path}, env(nil))
	if err != nil {
		fmt.Fprintln(os.Stderr, "config:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := New(cfg, log, env(nil))
	if err != nil {
		log.Error("start-up failed", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		log.Error("shutdown", "err", err)
		// What did not close, for the test's log.
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		os.Exit(1)
	}
	os.Exit(0)
}

// procDaemon is a daemon running as a child process of the test, so that
// the test can stop it (SIGSTOP) or terminate it (SIGTERM) as an operator
// would.
type procDaemon struct {
	id     string
	socket string
	cmd    *exec.Cmd
	log    *lockedBuffer // its stderr: the daemon's log
	ready  chan struct{} // closed when it logged "tensorcastd ready"
	exited chan struct{} // closed when it exited; err then holds cmd.Wait's result
	err    error
}

// startProcDaemon runs a daemon with id in a child process, listening for
// peers on 127.0.0.1, with the given config lines added, and waits until
// it serves.
func startProcDaemon(t *testing.T, id, key string, extra ...string) *procDaemon {
	t.Helper()
	return startProcDaemonRun(t, "TestStalledPeerDaemon", id, key, extra...)
}

// startProcDaemonRun is startProcDaemon from test run, whose body turns
// the child into the daemon (see procDaemonEnv).
func startProcDaemonRun(t *testing.T, run, id, key string, extra ...string) *procDaemon {
	t.Helper()
	dir := t.TempDir()
	p := &procDaemon{id: id, socket: filepath.Join(dir, "tc.sock"), log: &lockedBuffer{},
		ready: make(chan struct{}), exited: make(chan struct{})}
	conf := []string{
		fmt.Sprintf("socket = %q", p.socket),
		fmt.Sprintf("data_dir = %q", filepath.Join(dir, "data")),
		`pool_size = "64MiB"`,
		fmt.Sprintf("daemon_id = %q", id),
		`peer_listen = "127.0.0.1:0"`,
		fmt.Sprintf("cluster_key_file = %q", key),
		`peer_slice_size = "64KiB"`,
		`rdma = "off"`,
		`metrics_address = "off"`, // side by side with the other daemons of the test
	}
	path := filepath.Join(dir, "tensorcastd.toml")
	if err := os.WriteFile(path, []byte(strings.Join(append(conf, extra...), "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(os.Args[0], "-test.run=^"+run+"$")
	// A race-enabled binary sleeps 1 s at exit (GORACE atexit_sleep_ms) to
	// let late reports in; the test times the exit, so the child does not.
	p.cmd.Env = append(os.Environ(), procDaemonEnv+"="+path, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting daemon %s: %v", id, err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(p.log, line+"\n")
			if strings.Contains(line, "tensorcastd ready") {
				once.Do(func() { close(p.ready) })
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	select {
	case <-p.ready:
	case <-p.exited:
		t.Fatalf("daemon %s exited during start-up: %v\n%s", id, p.err, p.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon %s not ready after 30 s\n%s", id, p.log.String())
	}
	return p
}

func (p *procDaemon) dial(t *testing.T, name string) *client.Client {
	t.Helper()
	c, err := client.Dial(p.socket, client.Options{Name: name, CallTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (p *procDaemon) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		t.Fatalf("%v to daemon %s: %v", s, p.id, err)
	}
}

// holdings are what a daemon's stats say is held: pool blocks, live and
// retiring batches, live tasks.
type holdings struct{ blocks, batches, retiring, live int64 }

func holdingsOf(t *testing.T, c *client.Client) holdings {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	h := holdings{counter(st.Pool, "blocks"), counter(st.Engine, "batches_live"), counter(st.Engine, "batches_retiring"),
		counter(st.Engine, "waiting") + counter(st.Engine, "pending")}
	if h.blocks < 0 || h.batches < 0 || h.retiring < 0 {
		t.Fatalf("stats without the counters: %+v %+v", st.Pool, st.Engine)
	}
	return h
}

// TestStalledPeerDaemon: two daemons as processes; d1 exports a segment
// and is then stopped (SIGSTOP: its connections stay open, nothing
// answers). A client of d2 has 1,024 WRITEs from its pool blocks to d1 in
// flight through the batch calls:
//   - Submit returns at once, well before the requests' deadline;
//   - every task ends by its deadline, Timeout or UNAVAILABLE, none
//     Completed;
//   - another client of d2 moves bytes locally all the while;
//   - when the client leaves, its pool blocks and batch are released;
//   - with a second client's tasks waiting on a dial d1 never answers and
//     its Wait in flight, SIGTERM ends d2 within drain_timeout + 1 s, and
//     d2 logs what it abandoned per transport and per peer.
func TestStalledPeerDaemon(t *testing.T) {
	if path := os.Getenv(procDaemonEnv); path != "" {
		runProcDaemon(path)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "stalled peer cluster key")
	d1 := startProcDaemon(t, "d1", key, "[[peers]]", `id = "d2"`)
	exp := d1.dial(t, "exporter")
	ebuf, err := exp.RegisterBuffer(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exp.ExportSegment("kv", ebuf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	const drain = 3 * time.Second
	d2 := startProcDaemon(t, "d2", key, fmt.Sprintf("drain_timeout = %q", drain.String()),
		"[[peers]]", `id = "d1"`, fmt.Sprintf("addr = %q", exp.Hello().PeerAddr))

	w := d2.dial(t, "writer")
	w2 := d2.dial(t, "second-writer")
	l := d2.dial(t, "local")
	base := holdingsOf(t, l)
	pool, _ := w.Pool()
	rs, err := w.OpenRemote("d1/kv", client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	rs2, err := w2.OpenRemote("d1/kv", client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	const block = 64 << 10
	offs, err := w.AllocBlocks(nil, 16, block)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 1)
	warm := xfer.Request{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[0], Target: rs.ID, Length: block}
	if sum, err := w.Transfer([]xfer.Request{warm}, 10*time.Second, res); err != nil || sum.Completed != 1 {
		t.Fatalf("WRITE to d1 before it stops: %+v, %v, %v", sum, err, res[0])
	}

	d1.signal(t, syscall.SIGSTOP)

	// The local client keeps moving bytes while the peer is stalled.
	lbuf, err := l.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	loffs, err := l.AllocBlocks(nil, 1, block)
	if err != nil {
		t.Fatal(err)
	}
	stopLocal := make(chan struct{})
	type localRun struct {
		n       int
		slowest time.Duration
		err     error
	}
	localDone := make(chan localRun, 1)
	go func() {
		var r localRun
		lres := make([]error, 1)
		lreq := []xfer.Request{{Op: xfer.OpWrite, Local: lbuf.ID, Target: pool.Segment, TargetOffset: loffs[0], Length: block}}
		for {
			select {
			case <-stopLocal:
				localDone <- r
				return
			default:
			}
			start := time.Now()
			sum, err := l.Transfer(lreq, 5*time.Second, lres)
			if err == nil && sum.Completed != 1 {
				err = fmt.Errorf("local transfer: %+v, %v", sum, lres[0])
			}
			if err != nil {
				r.err = err
				localDone <- r
				return
			}
			r.n++
			r.slowest = max(r.slowest, time.Since(start))
		}
	}()

	// 1,024 WRITEs of 64 KiB: 64 MiB, far beyond the flow-control window.
	const n = 1024
	const deadline = 5 * time.Second
	reqs := make([]xfer.Request, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[i%len(offs)], Target: rs.ID,
			TargetOffset: uint64(i%128) * block, Length: block}
	}
	batch, err := w.AllocBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	results := make([]error, n)
	start := time.Now()
	if err := w.Submit(batch, reqs, results, client.WithDeadline(deadline)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Submit of %d requests to a stopped peer took %v (their deadline is %v)", n, took, deadline)
	}
	for i, err := range results {
		if err != nil {
			t.Fatalf("request %d refused at submit: %v", i, err)
		}
	}
	sum, err := w.Wait(batch, 3*deadline)
	ended := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Waiting+sum.Pending != 0 || sum.Completed != 0 || sum.Timeout+sum.Failed != n {
		t.Fatalf("batch to a stopped peer: %+v; want every task Timeout or Failed, none Completed", sum)
	}
	if ended > deadline+time.Second {
		t.Fatalf("the batch ended %v after Submit; the deadline was %v", ended, deadline)
	}
	for i := 0; i < n; i += 37 {
		st, err := w.TaskStatus(batch, i)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != xfer.StateTimeout && !(st.State == xfer.StateFailed && errors.Is(st.Err, client.ErrUnavailable)) {
			t.Fatalf("task %d: %+v, want Timeout or UNAVAILABLE", i, st)
		}
	}
	close(stopLocal)
	if r := <-localDone; r.err != nil || r.n == 0 || r.slowest > time.Second {
		t.Fatalf("local transfers during the stall: %d done, slowest %v, err %v", r.n, r.slowest, r.err)
	} else {
		t.Logf("during the stall: %d local transfers, slowest %v; the stopped peer's batch ended %v after Submit",
			r.n, r.slowest.Round(time.Millisecond), ended.Round(time.Millisecond))
	}

	// The writer leaves without freeing its batch or its blocks.
	w.Close()
	var held holdings
	testutil.Eventually(t, 5*time.Second, func() bool {
		held = holdingsOf(t, l)
		return held.blocks == base.blocks+1 && held.batches == base.batches && held.retiring == base.retiring && held.live == 0
	}, "d2 releasing what the writer held; holds %+v, before it came %+v (+1 block of the local client)\n%s",
		testutil.Lazy(func() holdings { return held }), base, d2.log)

	// A second writer's tasks wait for a session with d1 (whose
	// connections were dropped as silent); its dial hangs in the
	// handshake. It waits on them when d2 is told to stop.
	offs2, err := w2.AllocBlocks(nil, 1, block)
	if err != nil {
		t.Fatal(err)
	}
	reqs2 := make([]xfer.Request, 64)
	for i := range reqs2 {
		reqs2[i] = xfer.Request{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs2[0], Target: rs2.ID,
			TargetOffset: uint64(i) * block, Length: block}
	}
	batch2, err := w2.AllocBatch(len(reqs2))
	if err != nil {
		t.Fatal(err)
	}
	res2 := make([]error, len(reqs2))
	start = time.Now()
	if err := w2.Submit(batch2, reqs2, res2, client.WithDeadline(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("second Submit took %v", took)
	}
	type waitResult struct {
		sum client.Summary
		err error
	}
	waited := make(chan waitResult, 1)
	go func() {
		sum, err := w2.Wait(batch2, 30*time.Second)
		waited <- waitResult{sum, err}
	}()
	if h := holdingsOf(t, l); h.live != int64(len(reqs2)) {
		t.Fatalf("d2 holds %+v after the second Submit, want its %d tasks live", h, len(reqs2))
	}
	start = time.Now()
	d2.signal(t, syscall.SIGTERM)
	select {
	case <-d2.exited:
	case <-time.After(drain + 10*time.Second):
		t.Fatalf("d2 still running %v after SIGTERM (drain_timeout %v)\n%s", time.Since(start), drain, d2.log.String())
	}
	took := time.Since(start)
	if took > drain+time.Second {
		t.Fatalf("SIGTERM to exit took %v, want at most drain_timeout (%v) + 1 s\n%s", took, drain, d2.log.String())
	}
	// The drain ends the Wait: with the tasks canceled when the engine
	// closes, or UNAVAILABLE when the connection goes; never a success.
	if r := <-waited; r.err == nil && (r.sum.Waiting+r.sum.Pending != 0 || r.sum.Completed != 0) {
		t.Fatalf("the second writer's Wait across the shutdown: %+v", r.sum)
	} else {
		t.Logf("the second writer's Wait across the shutdown: %+v, %v", r.sum, r.err)
	}
	logs := d2.log.String()
	for _, want := range []string{"shutting down: draining", "abandoning the tasks still in flight",
		`msg="abandoned tasks" transport=tcp`, `msg="abandoned peer requests" peer=d1 transport=tcp`, "tensorcastd stopped"} {
		if !strings.Contains(logs, want) {
			t.Fatalf("d2's log lacks %q:\n%s", want, logs)
		}
	}
	if d2.err != nil {
		t.Fatalf("d2 exited with %v\n%s", d2.err, logs)
	}
	t.Logf("SIGTERM to exit: %v (drain_timeout %v)", took.Round(time.Millisecond), drain)

	d1.signal(t, syscall.SIGCONT)
	d1.signal(t, syscall.SIGTERM)
	select {
	case <-d1.exited:
	case <-time.After(drain + 10*time.Second):
		t.Fatalf("d1 did not stop after SIGCONT and SIGTERM\n%s", d1.log.String())
	}
}

// TestStalledPeerQueue: the stalled peer of TestStalledPeerDaemon, through
// a client's queue instead of the batch calls: 1,024 WRITEs are taken at
// once and every one is answered by a CQE by its own deadline, none OK,
// while another client of the same daemon keeps its latency.
func TestStalledPeerQueue(t *testing.T) {
	if path := os.Getenv(procDaemonEnv); path != "" {
		runProcDaemon(path)
		return
	}
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "stalled peer queue cluster key")
	d1 := startProcDaemonRun(t, "TestStalledPeerQueue", "d1", key, "[[peers]]", `id = "d2"`)
	exp := d1.dial(t, "exporter")
	ebuf, err := exp.RegisterBuffer(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exp.ExportSegment("kv", ebuf.ID, 0, 0, client.RightRead|client.RightWrite); err != nil {
		t.Fatal(err)
	}
	d2 := startProcDaemonRun(t, "TestStalledPeerQueue", "d2", key, "[[peers]]", `id = "d1"`, fmt.Sprintf("addr = %q", exp.Hello().PeerAddr))
	w := d2.dial(t, "writer")
	pool, _ := w.Pool()
	rs, err := w.OpenRemote("d1/kv", client.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	const block, n, deadline = 64 << 10, 1024, 5 * time.Second
	offs, err := w.AllocBlocks(nil, 16, block)
	if err != nil {
		t.Fatal(err)
	}
	q, err := w.OpenQueue(n, client.WithRequestTimeout(deadline))
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]xfer.Request, n)
	uds := make([]uint64, n)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: pool.Segment, LocalOffset: offs[i%len(offs)], Target: rs.ID,
			TargetOffset: uint64(i%128) * block, Length: block}
		uds[i] = uint64(i)
	}
	// One WRITE while d1 answers, so that the session is up.
	if k, err := q.Submit(reqs[:1], uds[:1]); k != 1 || err != nil {
		t.Fatal(k, err)
	}
	cqes := make([]client.Completion, n)
	if k, err := q.Reap(cqes, 1, 10*time.Second); k != 1 || err != nil || cqes[0].Err() != nil {
		t.Fatalf("WRITE to d1 before it stops: %d %v %+v", k, err, cqes[0])
	}

	d1.signal(t, syscall.SIGSTOP)
	defer d1.signal(t, syscall.SIGCONT)

	l := d2.dial(t, "local")
	lbuf, err := l.RegisterBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	loffs, err := l.AllocBlocks(nil, 1, block)
	if err != nil {
		t.Fatal(err)
	}
	lq, err := l.OpenQueue(4)
	if err != nil {
		t.Fatal(err)
	}
	stopLocal := make(chan struct{})
	type localRun struct {
		n       int
		slowest time.Duration
		err     error
	}
	localDone := make(chan localRun, 1)
	lpool, _ := l.Pool()
	go func() {
		var r localRun
		lreq := []xfer.Request{{Op: xfer.OpWrite, Local: lbuf.ID, Target: lpool.Segment, TargetOffset: loffs[0], Length: block}}
		lcq := make([]client.Completion, 1)
		for {
			select {
			case <-stopLocal:
				localDone <- r
				return
			default:
			}
			start := time.Now()
			if _, err := lq.Submit(lreq, []uint64{1}); err != nil {
				r.err = err
				localDone <- r
				return
			}
			if _, err := lq.Reap(lcq, 1, 5*time.Second); err != nil || lcq[0].Err() != nil {
				r.err = fmt.Errorf("local request: %v %+v", err, lcq[0])
				localDone <- r
				return
			}
			r.n++
			r.slowest = max(r.slowest, time.Since(start))
		}
	}()

	start := time.Now()
	if k, err := q.Submit(reqs, uds); k != n || err != nil {
		t.Fatalf("queue submit to a stopped peer: %d of %d, %v", k, n, err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("queue Submit of %d requests to a stopped peer took %v", n, took)
	}
	for got := 0; got < n; {
		k, err := q.Reap(cqes[got:], 1, 3*deadline)
		if err != nil {
			t.Fatalf("reap after %d of %d: %v", got, n, err)
		}
		for _, c := range cqes[got : got+k] {
			if !errors.Is(c.Err(), client.ErrDeadlineExceeded) && !errors.Is(c.Err(), client.ErrUnavailable) {
				t.Fatalf("queued WRITE %d to a stopped peer ended %+v, want DEADLINE_EXCEEDED or UNAVAILABLE", c.UserData, c)
			}
		}
		got += k
	}
	ended := time.Since(start)
	if ended > deadline+time.Second {
		t.Fatalf("the queued requests ended %v after Submit; their deadline was %v", ended, deadline)
	}
	close(stopLocal)
	if r := <-localDone; r.err != nil || r.n == 0 || r.slowest > time.Second {
		t.Fatalf("local requests during the stall: %d done, slowest %v, err %v", r.n, r.slowest, r.err)
	} else {
		t.Logf("the stopped peer's %d queued requests all ended %v after Submit; meanwhile %d local requests, slowest %v",
			n, ended.Round(time.Millisecond), r.n, r.slowest.Round(time.Millisecond))
	}
}
