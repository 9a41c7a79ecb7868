package ktrace

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
)

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs fn on an OS thread that has joined network namespace ns
// (sockets fn creates stay in it). The thread goes back to the test's
// namespace afterwards, or is retired if it cannot.
func inNetns(t *testing.T, ns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("back from %s: %w", ns, err) // the thread stays locked and dies with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// lossy attaches, on the ingress of dev in netns ns, a tc program that
// drops one packet in eight at random (this kernel has no netem). Loss on
// the receiving side, not the sender's egress: a packet dropped in the
// sender's own stack is reported to TCP at once and sent again as new
// data, never as a retransmit.
func lossy(t *testing.T, ns, dev string) {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "tc_test_loss",
		Type: ebpf.SchedCLS,
		Instructions: asm.Instructions{
			asm.FnGetPrandomU32.Call(),
			asm.And.Imm(asm.R0, 7),
			asm.JEq.Imm(asm.R0, 0, "drop"),
			asm.Mov.Imm(asm.R0, -1), // TCX_NEXT
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("drop"), // TCX_DROP
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		testutil.Missing(t, testutil.BPF, "cannot load a tc program to induce loss: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	var l link.Link
	inNetns(t, ns, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: p, Attach: ebpf.AttachTCXIngress})
		return err
	})
	t.Cleanup(func() { l.Close() })
}

// TestRetransmitsPerTuple sends data over a veth link between two network
// namespaces whose receiving side drops packets, and finds the retransmits
// counted under that connection's 4-tuple.
func TestRetransmitsPerTuple(t *testing.T) {
	testutil.Require(t, testutil.Netns)
	v := openOrSkip(t, ViewTCP)
	id := os.Getpid() % 100000
	nsA, nsB := fmt.Sprintf("tkA%d", id), fmt.Sprintf("tkB%d", id)
	vA, vB := fmt.Sprintf("tkva%d", id), fmt.Sprintf("tkvb%d", id)
	const addrA, addrB = "10.231.78.1", "10.231.78.2"
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", nsA).Run()
		_ = exec.Command("ip", "netns", "del", nsB).Run()
	})
	ipCmd(t, "netns", "add", nsA)
	ipCmd(t, "netns", "add", nsB)
	ipCmd(t, "link", "add", vA, "netns", nsA, "type", "veth", "peer", "name", vB, "netns", nsB)
	ipCmd(t, "-n", nsA, "addr", "add", addrA+"/24", "dev", vA)
	ipCmd(t, "-n", nsB, "addr", "add", addrB+"/24", "dev", vB)
	ipCmd(t, "-n", nsA, "link", "set", vA, "up")
	ipCmd(t, "-n", nsB, "link", "set", vB, "up")
	lossy(t, nsB, vB)

	var ln net.Listener
	inNetns(t, nsB, func() (err error) {
		ln, err = net.Listen("tcp4", addrB+":0")
		return err
	})
	defer ln.Close()
	const total = 8 << 20
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	var conn net.Conn
	inNetns(t, nsA, func() (err error) {
		d := net.Dialer{Timeout: 20 * time.Second}
		conn, err = d.Dial("tcp4", ln.Addr().String())
		return err
	})
	buf := make([]byte, 64<<10)
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	for sent := 0; sent < total; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	// Half-close and wait until the receiver has everything, so every
	// retransmit has happened before the counts are read.
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n := <-got; n != total {
		t.Fatalf("receiver got %d bytes, want %d", n, total)
	}
	info, err := unix.GetsockoptTCPInfo(fd(t, conn), unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		t.Fatal(err)
	}
	tuple := Tuple{Local: netip.MustParseAddrPort(conn.LocalAddr().String()), Remote: netip.MustParseAddrPort(conn.RemoteAddr().String())}
	conn.Close()
	var count uint64
	for _, r := range v.Retransmits() {
		if r.Tuple == tuple {
			count = r.Count
		}
	}
	t.Logf("tuple %v: %d retransmits counted, TCP_INFO total_retrans %d", tuple, count, info.Total_retrans)
	if info.Total_retrans == 0 {
		t.Fatal("the lossy link caused no retransmit (TCP_INFO total_retrans 0): the loss program did not work")
	}
	if count == 0 {
		t.Fatalf("no retransmits counted for %v (kernel says %d): %+v", tuple, info.Total_retrans, v.Retransmits())
	}
}

func fd(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var out int
	raw.Control(func(f uintptr) { out = int(f) })
	return out
}
