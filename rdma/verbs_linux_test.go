//go:build linux && cgo

package rdma

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// These tests need a real RDMA device. `make test-rdma` runs them inside a
// VM with Soft-RoCE (rxe0) and sets RXE_DEV there; in that case a missing
// device is a failure, elsewhere it is a skip.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func testLogger() *slog.Logger {
	if os.Getenv("RXE_DEV") != "" && testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// openDevice opens the test device or skips when the host has no
// libibverbs or no RDMA device (fails inside the VM, and on a device that
// is there but does not open).
func openDevice(tb testing.TB, cfg Config) *Device {
	tb.Helper()
	dev := os.Getenv("RXE_DEV")
	cfg.Device = dev
	d, err := Open(cfg, testLogger())
	if err != nil {
		if dev == "" && (errors.Is(err, ErrNoLibrary) || len(ListDevices()) == 0) {
			testutil.Missing(tb, testutil.RDMA, "no RDMA device; run make test-rdma (%v)", err)
		}
		tb.Fatalf("Open %q: %v", dev, err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("device Close: %v", err)
		}
	})
	return d
}

// mmapBuf is memory outside the Go heap, as segments are.
func mmapBuf(tb testing.TB, n int) []byte {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatalf("mmap %d: %v", n, err)
	}
	tb.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// hugeBuf is n bytes of a memfd placed on transparent 2 MiB pages, as the
// client libraries' buffers are (shm.Collapse).
func hugeBuf(tb testing.TB, n int) []byte {
	tb.Helper()
	fd, err := shm.NewMemfd("rdma-huge", uint64(n), true)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(fd)
	b, err := shm.MapShared(fd, uint64(n))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = shm.Unmap(b) })
	if done, spans, err := shm.Collapse(b); done != spans {
		testutil.Missing(tb, testutil.THP, "%d of %d spans on 2 MiB pages: %v", done, spans, err)
	}
	return b
}

func register(tb testing.TB, d *Device, b []byte) *Region {
	tb.Helper()
	r, err := d.Register(b)
	if err != nil {
		tb.Fatalf("Register %d bytes: %v", len(b), err)
	}
	tb.Cleanup(func() {
		if err := d.Deregister(r); err != nil {
			tb.Errorf("Deregister: %v", err)
		}
	})
	return r
}

// verbsPair is two transports on one device, a connected to b over
// loopback queue pairs; a's segLocal carries la's keys, its segRemote b's
// rb's, learned from b's connection data.
type verbsPair struct {
	d      *Device
	a, b   *Transport
	la, rb []byte
	segs   xfertest.Segments
}

func newVerbsPair(tb testing.TB, cfg Config, size int) *verbsPair {
	tb.Helper()
	d := openDevice(tb, cfg)
	p := &verbsPair{d: d, la: mmapBuf(tb, size), rb: mmapBuf(tb, size), segs: xfertest.Segments{}}
	lr, rr := register(tb, d, p.la), register(tb, d, p.rb)
	var err error
	if p.a, err = d.NewTransport(); err != nil {
		tb.Fatal(err)
	}
	if p.b, err = d.NewTransport(); err != nil {
		p.a.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.a.Close(); err != nil {
			tb.Errorf("Close a: %v", err)
		}
		if err := p.b.Close(); err != nil {
			tb.Errorf("Close b: %v", err)
		}
	})
	p.b.Expose(77, rr)
	p.segs.Set(tb, segLocal, xfer.SlotRDMA, LocalKeys(lr, nil, nil))
	if err := p.a.Connect(Loopback{p.b}); err != nil {
		tb.Fatalf("Connect: %v", err)
	}
	regs := p.a.PeerRegions()
	if len(regs) != 1 || regs[0].Name != 77 || regs[0].Size != uint64(size) {
		tb.Fatalf("peer regions from the connection data: %+v", regs)
	}
	rk, err := RemoteKeys(regs[0], nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	p.segs.Set(tb, segRemote, xfer.SlotRDMA, rk)
	return p
}

// run submits tasks and waits for all of them to end.
func run(tb testing.TB, tr *Transport, r *recorder, tasks []*xfer.Task) {
	tb.Helper()
	for off := 0; off < len(tasks); {
		n, err := tr.Submit(tasks[off:])
		off += n
		if err != nil && !errors.Is(err, ErrQueueFull) {
			tb.Fatalf("Submit: %v", err)
		}
	}
	r.Wait(tb.(*testing.T), len(tasks))
}

func TestVerbsWriteReadCRC(t *testing.T) {
	const size = 40 << 20
	p := newVerbsPair(t, Config{QPs: 2}, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{4 << 10, 64 << 10, 1 << 20, 16 << 20} {
		t.Run(strconv.Itoa(n>>10)+"KiB", func(t *testing.T) {
			for i := range p.la[:n] {
				p.la[i] = byte(rng.Uint32())
			}
			want := crc32.Checksum(p.la[:n], castagnoli)
			roff := uint64(size - n - 4096) // away from offset 0, not page aligned at the end
			r := newRecorder()
			w := p.segs.Tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, TargetOffset: roff, Length: uint64(n)})
			start := time.Now()
			run(t, p.a, r, w)
			wdur := time.Since(start)
			if err := r.Err(w[0]); err != nil || r.N(w[0]) != uint64(n) {
				t.Fatalf("WRITE: n %d, %v", r.N(w[0]), err)
			}
			if got := crc32.Checksum(p.rb[roff:roff+uint64(n)], castagnoli); got != want {
				t.Fatalf("WRITE: crc32c %08x at the target, %08x at the source", got, want)
			}
			loff := uint64(size - n)
			clear(p.la[loff:])
			rd := p.segs.Tasks(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: loff, Target: segRemote, TargetOffset: roff, Length: uint64(n)})
			start = time.Now()
			run(t, p.a, r, rd)
			rdur := time.Since(start)
			if err := r.Err(rd[0]); err != nil {
				t.Fatalf("READ: %v", err)
			}
			if got := crc32.Checksum(p.la[loff:loff+uint64(n)], castagnoli); got != want {
				t.Fatalf("READ: crc32c %08x read back, %08x written", got, want)
			}
			t.Logf("%d KiB: write %v, read %v, crc32c %08x", n>>10, wdur, rdur, want)
		})
	}
}

func TestVerbsManySmallSignalled(t *testing.T) {
	p := newVerbsPair(t, Config{QPs: 2, SignalEvery: 8}, 4<<20)
	for i := range p.la {
		p.la[i] = byte(i * 13)
	}
	r := newRecorder()
	var reqs []xfer.Request
	for i := range 1000 {
		off := uint64(i) * 4096
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: 4096})
	}
	tasks := p.segs.Tasks(r, reqs...)
	run(t, p.a, r, tasks)
	r.Check(t, tasks)
	for i, tk := range tasks {
		if r.Err(tk) != nil {
			t.Fatalf("task %d: %v", i, r.Err(tk))
		}
	}
	if !bytes.Equal(p.la[:1000*4096], p.rb[:1000*4096]) {
		t.Fatal("bytes differ after 1000 signalled-every-8 writes")
	}
}

func TestVerbsQPErrorFailsInFlightAndRecovers(t *testing.T) {
	const chunk = 4 << 20
	p := newVerbsPair(t, Config{QPs: 1}, 16*chunk)
	r := newRecorder()
	var reqs []xfer.Request
	for i := range 16 {
		off := uint64(i) * chunk
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: chunk})
	}
	tasks := p.segs.Tasks(r, reqs...)
	n, err := p.a.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	if err := p.a.failQP(0); err != nil {
		t.Fatalf("forcing the queue pair to ERR: %v", err)
	}
	r.Wait(t, len(tasks))
	r.Check(t, tasks)
	failed := 0
	for i, tk := range tasks {
		err := r.Err(tk)
		if err == nil {
			continue // finished before the error
		}
		failed++
		var ce *CompletionError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "IBV_WC_") {
			t.Errorf("task %d: %v, want a completion error naming the status", i, err)
		}
		if i == len(tasks)-1 && ce != nil && ce.Status != WCWRFlushErr {
			t.Errorf("last task: %v, want IBV_WC_WR_FLUSH_ERR", err)
		}
	}
	if failed == 0 {
		t.Fatal("no task was in flight when the queue pair failed")
	}
	t.Logf("%d of %d tasks failed with the queue pair (first: %v)", failed, len(tasks), r.Err(tasks[len(tasks)-1]))

	testutil.Eventually(t, 20*time.Second, func() bool { return qpIsUp(p.a, 0) }, "the queue pair re-established")
	for i := range 1 << 20 {
		p.la[i] = byte(i * 31)
	}
	again := p.segs.Tasks(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, TargetOffset: 8 << 20, Length: 1 << 20},
		xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: 2 << 20, Target: segRemote, TargetOffset: 8 << 20, Length: 1 << 20},
	)
	run(t, p.a, r, again[:1])
	run(t, p.a, r, again[1:])
	for _, tk := range again {
		if r.Err(tk) != nil {
			t.Fatalf("after recovery: %v", r.Err(tk))
		}
	}
	if !bytes.Equal(p.la[:1<<20], p.la[2<<20:3<<20]) {
		t.Fatal("after recovery: bytes read back differ")
	}
}

func qpIsUp(t *Transport, i int) bool {
	q := t.qps[i]
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state == qpUp
}

// bogusPeer answers with a GID nobody has (and no route reaches).
type bogusPeer struct{ t *Transport }

func (p bogusPeer) Exchange(l ConnInfo) (ConnInfo, error) {
	c, err := p.t.Accept(l)
	c.GID, _ = ParseGID("::ffff:198.18.0.1")
	return c, err
}

func TestVerbsConnectBogusGIDFailsInTime(t *testing.T) {
	d := openDevice(t, Config{QPs: 1, ConnectTimeout: 3 * time.Second, Timeout: 12, RetryCount: 2})
	a, err := d.NewTransport()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := d.NewTransport()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	start := time.Now()
	err = a.Connect(bogusPeer{b})
	took := time.Since(start)
	if !errors.Is(err, ErrConnect) {
		t.Fatalf("Connect to an unreachable GID: %v, want ErrConnect", err)
	}
	if took > 10*time.Second {
		t.Fatalf("failing took %v", took)
	}
	t.Logf("unreachable GID: %v after %v", err, took.Round(time.Millisecond))
}

// TestVerbsRegisterLarge registers RXE_REG_MB (512) MiB and logs how long
// it took: anonymous memory not yet faulted in, as one chunk and as four
// at once; the same faulted in first; and a memfd on 2 MiB pages, as the
// client libraries make their buffers. Each is looked up at its last byte.
func TestVerbsRegisterLarge(t *testing.T) {
	mb := 512
	if s := os.Getenv("RXE_REG_MB"); s != "" {
		mb, _ = strconv.Atoi(s)
	}
	size := mb << 20
	// resident faults an anonymous buffer in first, so that only the
	// registration's own work is timed, as for the 2 MiB pages (collapsed
	// before: resident too).
	resident := func(tb testing.TB, n int) []byte {
		b := mmapBuf(tb, n)
		if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil {
			tb.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		pages   string
		chunks  int
		workers int
		buf     func(tb testing.TB, n int) []byte
	}{
		{"4KiB", 1, 1, mmapBuf},
		{"4KiB", 4, 4, mmapBuf},
		{"4KiB-resident", 1, 1, resident},
		{"2MiB", 1, 1, hugeBuf}, // as the client libraries make their buffers
	} {
		// A subtest each, so that each buffer is gone before the next
		// (the VM's memory holds one).
		t.Run(fmt.Sprintf("%s/chunks=%d", c.pages, c.chunks), func(t *testing.T) {
			d := openDevice(t, Config{ChunkSize: uint64(size / c.chunks), RegisterWorkers: c.workers})
			buf := c.buf(t, size)
			start := time.Now()
			r, err := d.Register(buf)
			took := time.Since(start)
			if err != nil {
				t.Fatalf("Register %d MiB: %v", mb, err)
			}
			if _, lk, rk, _, ok := r.Lookup(uint64(size-1), 1); !ok || lk == 0 && rk == 0 {
				t.Errorf("lookup of the last byte: ok %v keys %d/%d", ok, lk, rk)
			}
			start = time.Now()
			if err := d.Deregister(r); err != nil {
				t.Fatal(err)
			}
			t.Logf("MR registration: %d MiB on %s pages as %d chunk(s) on %d goroutine(s): register %v, deregister %v",
				mb, c.pages, r.Chunks(), c.workers, took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			fmt.Printf("REGISTER %dMiB pages=%s chunks=%d workers=%d ms=%d\n", mb, c.pages, r.Chunks(), c.workers, took.Milliseconds())
		})
	}
}

// Benchmarks: the work perftest does with its defaults, on one queue pair
// over rxe0 loopback, so that the two figures compare like with like.
//
// ib_write_bw / ib_read_bw -s SIZE -n ITERS keep tx-depth messages
// outstanding (128, or ITERS when that is smaller: -n 100 runs at depth
// 100), post each one as soon as a completion frees its slot (one work
// request per ibv_post_send, every one signalled: the header says "CQ
// Moderation: 1" on rxe) and busy-poll the completion queue; messages over
// half a page all use one buffer. ib_write_lat has one WRITE in flight.
//
// pipeline does the same through the transport with its default poller:
// depth tasks outstanding (at most b.N, as perftest caps tx-depth at -n),
// submitted as one list at the start, then each ended task submitted again
// on its own from its completion. The buffers cycle over at most
// benchSlots messages, which keeps the registration small at 1 MiB.
//
// On rxe the depth hardly matters for WRITE: the driver carries a user
// queue pair's WRITEs out inside the ibv_post_send that rings its doorbell
// (it shows as the poster's system time), so one message in flight moves
// about as fast as 128. READs are answered from softirq context instead.

// perftestDepth is ib_write_bw's and ib_read_bw's default tx-depth.
const perftestDepth = 128

// benchSlots bounds how many distinct message buffers a benchmark uses.
const benchSlots = 16

func benchPair(b *testing.B, size int) *verbsPair {
	b.Helper()
	d := openDevice(b, Config{QPs: 1, SendDepth: perftestDepth})
	p := &verbsPair{d: d, la: mmapBuf(b, size), rb: mmapBuf(b, size), segs: xfertest.Segments{}}
	lr, rr := register(b, d, p.la), register(b, d, p.rb)
	var err error
	if p.a, err = d.NewTransport(); err != nil {
		b.Fatal(err)
	}
	if p.b, err = d.NewTransport(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.a.Close(); p.b.Close() })
	p.segs.Set(b, segLocal, xfer.SlotRDMA, LocalKeys(lr, nil, nil))
	rk, err := RemoteKeys(rr.Remote(1), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	p.segs.Set(b, segRemote, xfer.SlotRDMA, rk)
	if err := p.a.Connect(Loopback{p.b}); err != nil {
		b.Fatal(err)
	}
	return p
}

// pipeline keeps depth tasks of msg bytes outstanding until b.N have
// ended, submitted in lists of batch. As perftest posts from its polling
// loop, ended tasks are resubmitted from their completion (on the poller);
// the benchmark goroutine only waits for the end.
func pipeline(b *testing.B, op xfer.Op, msg, depth, batch int) {
	depth = min(depth, b.N)
	slots := min(depth, benchSlots)
	p := benchPair(b, msg*slots)
	c := &resubmitter{tr: p.a, left: int64(b.N - depth), done: make(chan struct{}), batch: batch}
	tasks := make([]*xfer.Task, depth)
	for i := range tasks {
		off := uint64(i%slots) * uint64(msg)
		tasks[i] = p.segs.Tasks(c, xfer.Request{Op: op, Local: segLocal, LocalOffset: off,
			Target: segRemote, TargetOffset: off, Length: uint64(msg)})[0]
	}
	c.pending = make([]*xfer.Task, 0, batch)
	c.outstanding.Store(int64(depth))
	b.SetBytes(int64(msg))
	b.ResetTimer()
	start := time.Now()
	if n, err := p.a.Submit(tasks); n != len(tasks) {
		b.Fatalf("Submit: %v", err)
	}
	<-c.done
	el := time.Since(start)
	b.StopTimer()
	if f := c.failed.Load(); f != 0 {
		b.Fatalf("%d tasks failed", f)
	}
	b.ReportMetric(float64(b.N)*float64(msg)*8/el.Seconds()/1e9, "Gbit/s")
	b.ReportMetric(float64(el.Microseconds())/float64(b.N), "us/op")
}

// resubmitter submits ended tasks again, batch at a time, until left runs
// out, then closes done when the last one has ended. It runs on the poller.
type resubmitter struct {
	tr          *Transport
	batch       int
	pending     []*xfer.Task // only the poller touches it
	left        int64        // only the poller touches it
	outstanding atomic.Int64
	failed      atomic.Int32
	done        chan struct{}
}

func (c *resubmitter) TaskDone(t *xfer.Task, _ uint64, err error) {
	if err != nil {
		c.failed.Add(1)
	}
	if c.left > 0 && err == nil {
		c.left--
		c.pending = append(c.pending, t)
		if len(c.pending) < c.batch && c.left > 0 {
			return
		}
		n, _ := c.tr.Submit(c.pending)
		c.failed.Add(int32(len(c.pending) - n))
		c.outstanding.Add(int64(n - len(c.pending)))
		c.pending = c.pending[:0]
		if n > 0 {
			return
		}
	}
	if c.outstanding.Add(-1) == 0 {
		close(c.done)
	}
}

// BenchmarkVerbsWriteBW is ib_write_bw -s 65536 / -s 1048576 (see above).
func BenchmarkVerbsWriteBW(b *testing.B) {
	for _, msg := range []int{64 << 10, 1 << 20} {
		b.Run(strconv.Itoa(msg>>10)+"KiB", func(b *testing.B) { pipeline(b, xfer.OpWrite, msg, perftestDepth, 1) })
	}
}

// BenchmarkVerbsReadBW is ib_read_bw -s 65536 / -s 1048576.
func BenchmarkVerbsReadBW(b *testing.B) {
	for _, msg := range []int{64 << 10, 1 << 20} {
		b.Run(strconv.Itoa(msg>>10)+"KiB", func(b *testing.B) { pipeline(b, xfer.OpRead, msg, perftestDepth, 1) })
	}
}

// BenchmarkVerbsWriteLat is one 4 KiB WRITE at a time: submit to Done, a
// full round trip (the request and its acknowledgement).
func BenchmarkVerbsWriteLat(b *testing.B) {
	b.Run("4KiB", func(b *testing.B) { pipeline(b, xfer.OpWrite, 4<<10, 1, 1) })
}

func TestABILayout(t *testing.T) {
	if err := abiCheck(); err != nil {
		t.Fatal(err)
	}
}

func TestVerbsDiscovery(t *testing.T) {
	p := newVerbsPair(t, Config{QPs: 1}, 1<<20)
	name := p.d.Name()
	var found *DeviceInfo
	devs := ListDevices()
	for i := range devs {
		if devs[i].Name == name {
			found = &devs[i]
		}
	}
	if found == nil || len(found.Ports) == 0 || !found.Ports[0].Active() {
		t.Fatalf("ListDevices = %+v; want %s with an active port", devs, name)
	}
	if nd := os.Getenv("RXE_NETDEV"); nd != "" {
		if !slices.Contains(found.Ports[0].Netdevs, nd) {
			t.Errorf("port netdevs %v lack %s", found.Ports[0].Netdevs, nd)
		}
	}
	if ip := os.Getenv("RXE_IP"); ip != "" {
		if got := p.d.Addr().GID.String(); got != "::ffff:"+ip {
			t.Errorf("chosen GID %s, want the netdev address ::ffff:%s", got, ip)
		}
		if idx := os.Getenv("RXE_GID_INDEX"); idx != strconv.Itoa(p.d.Addr().GIDIndex) {
			t.Errorf("chosen GID index %d, the harness found %s", p.d.Addr().GIDIndex, idx)
		}
	}
	t.Logf("device %s port 1 netdevs %v, gid %s (index %d), mtu %d",
		name, found.Ports[0].Netdevs, p.d.Addr().GID, p.d.Addr().GIDIndex, p.d.Addr().MTU.Bytes())
}

func TestVerbsSteadyStateAllocs(t *testing.T) {
	p := newVerbsPair(t, Config{QPs: 1}, 1<<20)
	ch := make(xfertest.Chan, 64)
	tasks := make([]*xfer.Task, 16)
	for i := range tasks {
		tasks[i] = p.segs.Tasks(ch, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: uint64(i) * 4096,
			Target: segRemote, TargetOffset: uint64(i) * 4096, Length: 4096})[0]
	}
	round := func() {
		if n, err := p.a.Submit(tasks); n != len(tasks) || err != nil {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		for range tasks {
			<-ch
		}
	}
	round()
	if allocs := testing.AllocsPerRun(20, round); allocs != 0 {
		t.Errorf("Submit + completion of 16 WRITEs over verbs: %v allocations, want 0", allocs)
	}
}
