package tcp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The cut-link test runs two Nodes, each in its own network namespace
// joined by a veth pair, as two copies of this test binary started with
// `ip netns exec`. netnsRoleEnv tells a copy which side it plays.
const (
	netnsRoleEnv   = "TENSORCAST_TCP_NETNS_ROLE"
	netnsKeyEnv    = "TENSORCAST_TCP_NETNS_KEY"
	netnsAddrA     = "10.231.77.1"
	netnsAddrB     = "10.231.77.2"
	netnsPort      = "7411"
	netnsReqTimout = 2 * time.Second
)

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// netnsLink makes two network namespaces joined by a veth pair, with
// netnsAddrA on vA in nsA and netnsAddrB on vB in nsB, removed when the
// test ends, and a cluster key for both sides.
func netnsLink(t *testing.T) (nsA, nsB, vA, vB, key string) {
	t.Helper()
	testutil.Require(t, testutil.Netns)
	id := os.Getpid() % 100000
	nsA, nsB = fmt.Sprintf("tcA%d", id), fmt.Sprintf("tcB%d", id)
	vA, vB = fmt.Sprintf("tcva%d", id), fmt.Sprintf("tcvb%d", id)
	t.Cleanup(func() {
		// Deleting a namespace deletes its end of the veth pair, and
		// with it the other end.
		_ = exec.Command("ip", "netns", "del", nsA).Run()
		_ = exec.Command("ip", "netns", "del", nsB).Run()
	})
	run(t, "ip", "netns", "add", nsA)
	run(t, "ip", "netns", "add", nsB)
	run(t, "ip", "link", "add", vA, "netns", nsA, "type", "veth", "peer", "name", vB, "netns", nsB)
	run(t, "ip", "-n", nsA, "addr", "add", netnsAddrA+"/24", "dev", vA)
	run(t, "ip", "-n", nsB, "addr", "add", netnsAddrB+"/24", "dev", vB)
	for _, c := range [][]string{{nsA, vA}, {nsB, vB}} {
		run(t, "ip", "-n", c[0], "link", "set", "lo", "up")
		run(t, "ip", "-n", c[0], "link", "set", c[1], "up")
	}
	return nsA, nsB, vA, vB, testutil.KeyFile(t, t.TempDir(), "key", "netns-secret")
}

// netnsSide is a copy of this test binary playing one side in a
// namespace: its stdin (closing it ends a server), its stdout's lines
// and its log.
type netnsSide struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  <-chan string
	stderr *bytes.Buffer
}

// netnsStart starts a copy of this test binary in namespace ns playing
// role, stopped when the test ends (killed if it has not exited 10 s
// after its stdin closed).
func netnsStart(t *testing.T, role, ns, key string) *netnsSide {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), netnsRoleEnv+"="+role, netnsKeyEnv+"="+key)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return &netnsSide{cmd: cmd, stdin: stdin, lines: lines, stderr: &stderr}
}

// expect waits up to d for a line of the side's output that starts with
// prefix, and returns it; the test fails if none comes.
func (s *netnsSide) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				t.Fatalf("child exited before %q; its log:\n%s", prefix, s.stderr.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timer.C:
			t.Fatalf("no %q within %v; child log:\n%s", prefix, d, s.stderr.String())
		}
	}
}

func TestCutLinkInNetns(t *testing.T) {
	nsA, nsB, vA, _, key := netnsLink(t)
	b := netnsStart(t, "server", nsB, key)
	b.expect(t, "READY", 10*time.Second)
	a := netnsStart(t, "client", nsA, key)
	a.expect(t, "TRANSFERRING", 15*time.Second)
	cut := time.Now()
	run(t, "ip", "-n", nsA, "link", "set", vA, "down")
	res := a.expect(t, "RESULT", netnsReqTimout+15*time.Second)
	sinceCut := time.Since(cut)
	t.Logf("%s (link cut %v before)", res, sinceCut.Round(time.Millisecond))
	if sinceCut > netnsReqTimout+5*time.Second {
		t.Fatalf("tasks took %v after the cut to end (request timeout %v)", sinceCut, netnsReqTimout)
	}
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("client side: %v: %s\nlog:\n%s", err, res, a.stderr.String())
	}
	if !strings.Contains(res, "ok=true") {
		t.Fatalf("client side reported %s\nlog:\n%s", res, a.stderr.String())
	}
}

// TestDropStalledOnCutLink: DropStalled against a link the network cut,
// not a stand-in. Two Nodes in namespaces joined by a veth pair; once an
// exchange from a to b has gone, b's address is taken away, so a's next
// exchange leaves a's socket with bytes b never acknowledges, which TCP
// retransmits on a backed-off timer. a's DropStalled, asked until it
// finds that socket (at TCP's first retransmission, about 200 ms), must
// close it: the exchange on it ends with ErrConnLost. Once the address is
// back, an exchange sent then is answered within a second. (That the
// decision is TCP_INFO's is what this test adds to TestDropStalled and
// TestDropStalledLeavesNoGap, which run over loopback.)
func TestDropStalledOnCutLink(t *testing.T) {
	nsA, nsB, _, vB, key := netnsLink(t)
	b := netnsStart(t, "stall-server", nsB, key)
	b.expect(t, "READY", 10*time.Second)
	a := netnsStart(t, "stall-client", nsA, key)
	a.expect(t, "UP", 15*time.Second)
	// The cut: b no longer has its address, so what a sends leaves a's
	// link and is lost on the way, as in a network that dropped it (a
	// link of a's that went down would fail a's sends at once instead,
	// and leave nothing unacknowledged).
	run(t, "ip", "-n", nsB, "addr", "del", netnsAddrB+"/24", "dev", vB)
	fmt.Fprintln(a.stdin, "CUT")
	t.Log(a.expect(t, "STALLED", 20*time.Second))
	run(t, "ip", "-n", nsB, "addr", "add", netnsAddrB+"/24", "dev", vB)
	fmt.Fprintln(a.stdin, "HEALED")
	res := a.expect(t, "RESULT", 20*time.Second)
	t.Log(res)
	if err := a.cmd.Wait(); err != nil || !strings.Contains(res, "ok=true") {
		t.Fatalf("client side: %v: %s\nlog:\n%s", err, res, a.stderr.String())
	}
}

// netnsChild plays one side of TestCutLinkInNetns or
// TestDropStalledOnCutLink (role) and returns the exit code.
func netnsChild(role string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := Config{ClusterKeyFile: os.Getenv(netnsKeyEnv), RequestTimeout: netnsReqTimout, HandshakeTimeout: time.Second}
	switch role {
	case "server":
		exp := newExporter()
		exp.add("seg", xfertest.NewSegment(1, 64<<20))
		return netnsServe(cfg, exp, log, func(*Node) error { return nil })
	case "client":
		return netnsClient(cfg, log)
	case "stall-server":
		return stallServer(cfg, log)
	case "stall-client":
		return stallClient(cfg, log)
	}
	return 2
}

func netnsClient(cfg Config, log *slog.Logger) int {
	baseline := goleak.IgnoreCurrent()
	cfg.DaemonID, cfg.Listen = "a", netnsAddrA+":0"
	cfg.Peers = []directory.Peer{{ID: "b", Addr: netnsAddrB + ":" + netnsPort}}
	n, err := NewNode(cfg, newExporter(), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// b listens (it said READY); the node's session to it comes up on
	// its own, and Open fails until it has.
	var r *Remote
	if !testutil.Poll(5*time.Second, func() bool {
		r, err = n.Open("b", "seg", RightWrite)
		return err == nil
	}) {
		fmt.Println("RESULT ok=false open:", err)
		n.Close()
		return 1
	}
	local := xfertest.NewSegment(1, 64<<20)
	const depth, size = 8, 4 << 20
	cc := make(xfertest.Chan, depth)
	tasks := make([]*xfer.Task, depth)
	for i := range tasks {
		tasks[i] = &xfer.Task{Req: xfer.Request{Op: xfer.OpWrite, LocalOffset: uint64(i) * size, TargetOffset: uint64(i) * size, Length: size},
			Local: local, Target: r}
		tasks[i].SetCompleter(cc)
	}
	// Keep depth writes in flight until one fails (the link is cut), then
	// let the rest end; none may outlive the request timeout by much.
	var mu sync.Mutex
	okCount, failed, outstanding := 0, 0, depth
	var firstFail time.Time
	if k, err := n.Submit(tasks); k != depth {
		fmt.Println("RESULT ok=false submit:", err)
		return 1
	}
	announced := false
	deadline := time.After(60 * time.Second)
	for outstanding > 0 {
		select {
		case d := <-cc:
			outstanding--
			mu.Lock()
			if d.Err != nil {
				if failed == 0 {
					firstFail = time.Now()
				}
				failed++
				if !errors.Is(d.Err, ErrConnLost) && !errors.Is(d.Err, xfer.ErrTimeout) {
					fmt.Fprintln(os.Stderr, "unexpected error:", d.Err)
					okCount = -1 << 30
				}
			} else {
				okCount++
			}
			stop := failed > 0
			mu.Unlock()
			if okCount >= 4 && !announced {
				announced = true
				fmt.Println("TRANSFERRING")
			}
			if !stop {
				if k, _ := n.Submit([]*xfer.Task{d.Task}); k == 1 {
					outstanding++
				}
			}
		case <-deadline:
			fmt.Printf("RESULT ok=false hang: %d tasks outstanding\n", outstanding)
			return 1
		}
	}
	tail := time.Since(firstFail)
	closeStart := time.Now()
	n.Close()
	closeTook := time.Since(closeStart)
	leak := testutil.GoroutineLeak(baseline)
	good := failed > 0 && okCount >= 4 && tail < netnsReqTimout+2*time.Second && closeTook < 5*time.Second && leak == nil
	fmt.Printf("RESULT ok=%v completed=%d failed=%d last-failure-after=%v close=%v leak=%v\n",
		good, okCount, failed, tail.Round(time.Millisecond), closeTook.Round(time.Millisecond), leak)
	if !good {
		return 1
	}
	return 0
}

// stallTimeout is the request timeout of TestDropStalledOnCutLink's
// sides: long enough that no exchange of the test times out, and the
// reaper (which drops connections with requests past their deadline)
// never acts first.
const stallTimeout = 20 * time.Second

// stallBody is the size of TestDropStalledOnCutLink's exchanges.
const stallBody = 32 << 10

// netnsServe is b of both tests: a Node at netnsAddrB, set up by setup
// (its handlers), that says READY and serves until the parent closes
// stdin.
func netnsServe(cfg Config, exp *exporter, log *slog.Logger, setup func(*Node) error) int {
	cfg.DaemonID, cfg.Listen = "b", netnsAddrB+":"+netnsPort
	cfg.Peers = []directory.Peer{{ID: "a"}} // accepted; its address comes with its hello
	n, err := NewNode(cfg, exp, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Close()
	if err := setup(n); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("READY")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// stallServer is b of TestDropStalledOnCutLink: it answers "echo" with
// the length of what it got.
func stallServer(cfg Config, log *slog.Logger) int {
	cfg.RequestTimeout = stallTimeout
	return netnsServe(cfg, newExporter(), log, func(n *Node) error {
		return n.Handle("echo", func(_ string, _ uint64, req []byte) ([]byte, error) {
			return fmt.Appendf(nil, "%d", len(req)), nil
		})
	})
}

// stallClient is a of TestDropStalledOnCutLink; each step waits for the
// parent's line on stdin (CUT, then HEALED) and says on stdout what it
// saw: UP once an exchange is answered, STALLED once DropStalled closed
// the stalled socket, RESULT at the end.
func stallClient(cfg Config, log *slog.Logger) int {
	cfg.RequestTimeout = stallTimeout
	cfg.DaemonID, cfg.Listen = "a", netnsAddrA+":0"
	cfg.Peers = []directory.Peer{{ID: "b", Addr: netnsAddrB + ":" + netnsPort}}
	n, err := NewNode(cfg, newExporter(), log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Close()
	fail := func(format string, args ...any) int {
		fmt.Printf("RESULT ok=false "+format+"\n", args...)
		return 1
	}
	// b said READY; a's session to it comes up on its own.
	if !testutil.Poll(10*time.Second, func() bool {
		_, err = n.Exchange("b", "echo", []byte("up"), time.Second)
		return err == nil
	}) {
		return fail("no exchange answered before the cut: %v", err)
	}
	fmt.Println("UP")
	parent := bufio.NewScanner(os.Stdin)
	if !parent.Scan() || parent.Text() != "CUT" {
		return fail("the parent said %q, not CUT", parent.Text())
	}
	if n := n.DropStalled("b", "the link was just cut, nothing sent on it since"); n != 0 {
		return fail("DropStalled closed %d connections with nothing sent since the cut", n)
	}
	// More than one segment, so that a socket is left with bytes
	// unacknowledged (within MaxExchange).
	cut := time.Now()
	lost := make(chan error, 1)
	go func() { _, err := n.Exchange("b", "echo", make([]byte, stallBody), stallTimeout); lost <- err }()
	// TCP_INFO is the kernel's own state: no event says a socket began
	// to retransmit, so it is polled.
	dropped := 0
	if !testutil.Poll(15*time.Second, func() bool {
		dropped = n.DropStalled("b", "the test's link is cut")
		return dropped > 0
	}) {
		return fail("DropStalled found no stalled connection within 15 s of the cut")
	}
	fmt.Printf("STALLED connections=%d after=%v\n", dropped, time.Since(cut).Round(time.Millisecond))
	var lostErr error
	select {
	case lostErr = <-lost:
	case <-time.After(10 * time.Second):
		return fail("the exchange on the dropped connection did not end within 10 s")
	}
	if !errors.Is(lostErr, ErrConnLost) {
		return fail("the exchange on the dropped connection ended with %v, want ErrConnLost", lostErr)
	}
	if !parent.Scan() || parent.Text() != "HEALED" {
		return fail("the parent said %q, not HEALED", parent.Text())
	}
	healed := time.Now()
	resp, err := n.Exchange("b", "echo", make([]byte, stallBody), stallTimeout)
	took := time.Since(healed)
	if err != nil || string(resp) != fmt.Sprint(stallBody) {
		return fail("the exchange after the heal: %q, %v", resp, err)
	}
	if took > time.Second {
		return fail("the exchange after the heal took %v", took)
	}
	fmt.Printf("RESULT ok=true dropped=%d lost=%q after-heal=%v\n", dropped, lostErr, took.Round(time.Millisecond))
	return 0
}
