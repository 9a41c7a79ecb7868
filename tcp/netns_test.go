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

func TestCutLinkInNetns(t *testing.T) {
	testutil.Require(t, testutil.Netns)
	id := os.Getpid() % 100000
	nsA, nsB := fmt.Sprintf("tcA%d", id), fmt.Sprintf("tcB%d", id)
	vA, vB := fmt.Sprintf("tcva%d", id), fmt.Sprintf("tcvb%d", id)
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
	key := testutil.KeyFile(t, t.TempDir(), "key", "netns-secret")

	start := func(role, ns string) (*exec.Cmd, io.WriteCloser, <-chan string, *bytes.Buffer) {
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
		return cmd, stdin, lines, &stderr
	}
	expect := func(lines <-chan string, prefix string, d time.Duration, stderr *bytes.Buffer) string {
		t.Helper()
		timer := time.NewTimer(d)
		defer timer.Stop()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("child exited before %q; its log:\n%s", prefix, stderr.String())
				}
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timer.C:
				t.Fatalf("no %q within %v; child log:\n%s", prefix, d, stderr.String())
			}
		}
	}
	_, _, bLines, bErr := start("server", nsB)
	expect(bLines, "READY", 10*time.Second, bErr)
	aCmd, _, aLines, aErr := start("client", nsA)
	expect(aLines, "TRANSFERRING", 15*time.Second, aErr)
	cut := time.Now()
	run(t, "ip", "-n", nsA, "link", "set", vA, "down")
	res := expect(aLines, "RESULT", netnsReqTimout+15*time.Second, aErr)
	sinceCut := time.Since(cut)
	t.Logf("%s (link cut %v before)", res, sinceCut.Round(time.Millisecond))
	if sinceCut > netnsReqTimout+5*time.Second {
		t.Fatalf("tasks took %v after the cut to end (request timeout %v)", sinceCut, netnsReqTimout)
	}
	if err := aCmd.Wait(); err != nil {
		t.Fatalf("client side: %v: %s\nlog:\n%s", err, res, aErr.String())
	}
	if !strings.Contains(res, "ok=true") {
		t.Fatalf("client side reported %s\nlog:\n%s", res, aErr.String())
	}
}

// netnsChild plays one side of TestCutLinkInNetns and returns the exit
// code.
func netnsChild(role string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := Config{ClusterKeyFile: os.Getenv(netnsKeyEnv), RequestTimeout: netnsReqTimout, HandshakeTimeout: time.Second}
	switch role {
	case "server":
		cfg.DaemonID, cfg.Listen = "b", netnsAddrB+":"+netnsPort
		cfg.Peers = []directory.Peer{{ID: "a"}} // accepted; its address comes with its hello
		exp := newExporter()
		exp.add("seg", xfertest.NewSegment(1, 64<<20))
		n, err := NewNode(cfg, exp, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("READY")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
		n.Close()
		return 0
	case "client":
		return netnsClient(cfg, log)
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
