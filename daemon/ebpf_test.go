package daemon

import (
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/ktrace"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestKernelViews runs a daemon with ebpf = on, moves blocks between the
// pool and a file through io_uring, and checks that the kernel-side
// histogram counted exactly the SQEs the ring picked for it: every data
// SQE with ebpf_uring_sample = 1, and never the poller's own wake-up
// reads; and that the views show in the scrape and in tcctl stats.
func TestKernelViews(t *testing.T) {
	t.Run("every request", func(t *testing.T) { kernelViews(t, 1, 12) })
	t.Run("one in 16", func(t *testing.T) { kernelViews(t, 16, 480) })
}

// kernelViews moves n 64 KiB blocks between the pool and a file, in
// Transfers of 4, alternating writes and reads, with ebpf_uring_sample =
// every.
func kernelViews(t *testing.T, every, n int) {
	testutil.Require(t, testutil.BPF)
	if v, errs := ktrace.Open([]ktrace.View{ktrace.ViewUring}, ktrace.Options{}); v == nil {
		testutil.Missing(t, testutil.BPF, "eBPF io_uring view unavailable here: %v", errs[ktrace.ViewUring])
	} else {
		v.Close()
	}
	cfg := testConfig(t.TempDir())
	cfg.EBPF = "on"
	cfg.EBPFUringSample = every
	cfg.StoreL2Path = "off" // the store's own L2 I/O would add to the ring's count
	var logBuf lockedBuffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logBuf, nil)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d.files == nil {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier")
	}
	runDaemon(t, d)
	if !strings.Contains(logBuf.String(), "ebpf views loaded") {
		t.Fatalf("no load line in the log:\n%s", logBuf.String())
	}
	c, err := client.Dial(cfg.Socket, client.Options{Name: "ebpf-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pool, _ := c.Pool()
	const blk = 64 << 10
	fileID, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "k.bin"), true, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 4, blk)
	if err != nil {
		t.Fatal(err)
	}
	reqs := make([]xfer.Request, 4)
	for i := range reqs {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[i], Target: fileID, TargetOffset: uint64(i * blk), Length: blk}
	}
	res := make([]error, len(reqs))
	for k := range n / len(reqs) {
		op := xfer.OpWrite
		if k%2 == 1 {
			op = xfer.OpRead
		}
		for i := range reqs {
			reqs[i].Op = op
		}
		if s, err := c.Transfer(reqs, 5*time.Second, res); err != nil || int(s.Completed) != len(reqs) {
			t.Fatalf("%v: %+v %v %v", op, s, err, res)
		}
	}
	exp := scrapeMetrics(t, d.MetricsAddr())
	sqes := sumSeries(t, exp, `tensorcast_uring_ring_sqes_total{ring="`)
	kernel := sumSeries(t, exp, `tensorcast_kernel_uring_latency_seconds_count{ring="`)
	traced := sumSeries(t, exp, `tensorcast_uring_ring_traced_sqes_total{ring="`)
	// The poller's wake-up eventfd reads are SQEs too, never picked: the
	// kernel counts exactly the picked data SQEs.
	if every == 1 && traced != float64(n) || every > 1 && (traced < float64(n/every/3) || traced > float64(3*n/every)) {
		t.Fatalf("%v of %d SQEs picked at one in %d", traced, n, every)
	}
	if sqes != float64(n) || kernel != traced {
		t.Fatalf("kernel counted %v completions; the ring submitted %v SQEs for %d requests and picked %v:\n%s",
			kernel, sqes, n, traced, exp)
	}
	if v := sample(t, exp, `tensorcast_ebpf_view_loaded{view="uring"}`); v != 1 {
		t.Fatalf("uring view loaded = %v", v)
	}
	if v := sample(t, exp, `tensorcast_ebpf_view_loaded{view="tcp"}`); v != 0 {
		t.Fatalf("tcp view loaded = %v without a peer plane", v)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// One ring per reactor worker: the rings' counters add up to the
	// kernel's count.
	var rings, completions float64
	for _, ct := range st.Transports {
		if strings.HasPrefix(ct.Name, "kernel.uring.ring") && strings.HasSuffix(ct.Name, ".completions") {
			rings++
			completions += float64(ct.Value)
		}
	}
	if rings == 0 || completions != kernel {
		t.Fatalf("tcctl stats' kernel ring counters (%v rings) add up to %v completions, want %v: %+v", rings, completions, kernel, st.Transports)
	}
}

// sumSeries adds the values of every series whose line starts with prefix.
func sumSeries(t *testing.T, exp, prefix string) float64 {
	t.Helper()
	var sum float64
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + `[^}]*\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(exp, -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

func TestViewErrorsOneLine(t *testing.T) {
	want := []ktrace.View{ktrace.ViewUring, ktrace.ViewTCP}
	capErr := errors.Join(ktrace.ErrNoCapability, errors.New("lacks CAP_BPF"))
	got := viewErrors(want, map[ktrace.View]error{ktrace.ViewUring: capErr, ktrace.ViewTCP: capErr})
	if strings.Count(got, "CAP_BPF") != 1 {
		t.Fatalf("capability reason not said once: %q", got)
	}
	got = viewErrors(want, map[ktrace.View]error{ktrace.ViewTCP: errors.Join(ktrace.ErrNoHook, errors.New("tracepoint tcp_retransmit_skb"))})
	if !strings.Contains(got, "tcp view") || !strings.Contains(got, "tcp_retransmit_skb") || strings.Contains(got, "uring") {
		t.Fatalf("hook reason %q", got)
	}
}

func TestMatchRetransmits(t *testing.T) {
	ap := netip.MustParseAddrPort
	conns := []tcp.ConnAddr{
		{Peer: "b", Outbound: true, Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:7400")},
		{Peer: "c", Outbound: false, Local: ap("10.0.0.1:7400"), Remote: ap("10.0.0.3:50000")},
	}
	rs := []ktrace.Retransmit{
		{Tuple: ktrace.Tuple{Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:7400")}, Count: 3},
		{Tuple: ktrace.Tuple{Local: ap("10.0.0.1:7400"), Remote: ap("10.0.0.3:50000")}, Count: 5},
		{Tuple: ktrace.Tuple{Local: ap("10.0.0.2:7400"), Remote: ap("10.0.0.1:40000")}, Count: 9}, // the other end's view
		{Tuple: ktrace.Tuple{Local: ap("10.0.0.1:22"), Remote: ap("10.0.0.9:6000")}, Count: 1},    // not a peer connection
	}
	got := matchRetransmits(conns, rs)
	if len(got) != 2 || got[0].conn.Peer != "b" || got[0].n != 3 || got[1].conn.Peer != "c" || got[1].n != 5 {
		t.Fatalf("matched %+v", got)
	}
}
