package daemon

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
)

// TestQueueFileThroughReactors writes pool blocks to a file and reads them
// back through two queues at depth 32, one per reactor worker, and checks
// every byte and that each request ended once. The requests reach the
// kernel on the thread that took them from the queue: the rings' pollers
// are woken through their eventfd to attach the queues and register the
// file, never for a request (uring.ringN.wakeups does not grow with the
// requests). It runs with each doorbell: the futex the rings wait on, and
// the eventfd per queue of kernels whose io_uring cannot (forced here),
// which the client library rings.
func TestQueueFileThroughReactors(t *testing.T) {
	for _, bell := range []string{"futex", "eventfd"} {
		t.Run(bell, func(t *testing.T) { queueFileThroughReactors(t, bell) })
	}
}

func queueFileThroughReactors(t *testing.T, bell string) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.DataWorkers = 2
	cfg.DataDoorbell = bell
	cfg.PoolSize = 32 << 20
	_, c := startClient(t, cfg, discardLogger(), "reactors")
	pool, _ := c.Pool()
	const blk, depth, rounds = 64 << 10, 32, 8
	fileID, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "reactor.bin"), true, 2*depth*blk)
	if errors.Is(err, client.ErrUnavailable) {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	mem := c.PoolBytes()
	type job struct {
		q        *client.Queue
		src, dst []uint64
	}
	var jobs []job
	for qi := 0; qi < 2; qi++ {
		q, err := c.OpenQueue(depth)
		if err != nil {
			t.Fatal(err)
		}
		j := job{q: q}
		for _, p := range []*[]uint64{&j.src, &j.dst} {
			if *p, err = c.AllocBlocks(nil, depth, blk); err != nil {
				t.Fatal(err)
			}
		}
		jobs = append(jobs, j)
	}
	before := ringCounters(t, c, ".wakeups")
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for qi, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- queueRounds(j.q, mem, pool.Segment, fileID, j.src, j.dst, uint64(qi)*depth*blk, blk, rounds)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	after := ringCounters(t, c, ".wakeups")
	if len(after) != 2 {
		t.Fatalf("rings %v, want 2 (one per worker)", after)
	}
	for name, n := range after {
		// A ring reaps an eventfd wake-up with deferred task work at its
		// next enter: the one that attached the second queue may be
		// counted only once the requests run.
		if n > before[name]+1 {
			t.Errorf("%s went from %d to %d over %d requests: the poller was woken from outside for requests it should have taken itself",
				name, before[name], n, 2*depth*rounds)
		}
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	queues := 0
	for _, k := range st.Transports {
		if strings.HasPrefix(k.Name, "reactor.worker") && strings.HasSuffix(k.Name, ".queues") {
			if k.Value != 1 {
				t.Errorf("%s = %d, want the 2 queues one on each worker", k.Name, k.Value)
			}
			queues++
		}
	}
	if queues != 2 {
		t.Errorf("%d reactor workers in the stats, want 2", queues)
	}
	var submitted uint64
	for _, n := range ringCounters(t, c, ".submitted") {
		submitted += n
	}
	if submitted < 2*2*depth*rounds {
		t.Errorf("%d SQEs submitted, want at least %d", submitted, 2*2*depth*rounds)
	}
}

// ringCounters are the uring rings' counters whose names end in suffix.
func ringCounters(t *testing.T, c *client.Client, suffix string) map[string]uint64 {
	t.Helper()
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, k := range st.Transports {
		if strings.HasPrefix(k.Name, "uring.ring") && strings.HasSuffix(k.Name, suffix) {
			out[k.Name] = k.Value
		}
	}
	return out
}

// queueRounds writes src's blocks to the file at base and reads them back
// into dst, depth requests at a time, rounds times, checking the bytes
// and that every request ends exactly once.
func queueRounds(q *client.Queue, mem []byte, poolSeg, file xfer.SegmentID, src, dst []uint64, base, blk uint64, rounds int) error {
	rng := rand.New(rand.NewPCG(base, 7))
	reqs := make([]xfer.Request, len(src))
	uds := make([]uint64, len(src))
	cqes := make([]client.Completion, len(src))
	for r := 0; r < rounds; r++ {
		for _, off := range src {
			for i := off; i < off+blk; i += 8 {
				mem[i] = byte(rng.Uint32())
			}
		}
		for _, op := range []xfer.Op{xfer.OpWrite, xfer.OpRead} {
			for i := range reqs {
				local := src[i]
				if op == xfer.OpRead {
					local = dst[i]
				}
				reqs[i] = xfer.Request{Op: op, Local: poolSeg, LocalOffset: local, Target: file, TargetOffset: base + uint64(i)*blk, Length: blk}
				uds[i] = uint64(r*1000 + i)
			}
			if n, err := q.Submit(reqs, uds); n != len(reqs) || err != nil {
				return errors.Join(errors.New("submit"), err)
			}
			seen := map[uint64]bool{}
			for len(seen) < len(reqs) {
				n, err := q.Reap(cqes, 1, 30*time.Second)
				if err != nil {
					return err
				}
				for _, cq := range cqes[:n] {
					if seen[cq.UserData] || cq.Err() != nil || cq.N != blk {
						return errors.New("a request ended twice, failed or moved a short count")
					}
					seen[cq.UserData] = true
				}
			}
		}
		for i := range src {
			if !bytes.Equal(mem[src[i]:src[i]+blk], mem[dst[i]:dst[i]+blk]) {
				return errors.New("bytes read back differ from those written")
			}
		}
	}
	return nil
}

// TestQueueFileAllocations: a 4 KiB read from a file through a queue, on
// the reactor's ring, makes no allocation on either side (the daemon runs
// in this process, so the count covers both).
func TestQueueFileAllocations(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.DataWorkers = 1
	_, c := startClient(t, cfg, discardLogger(), "reactor-allocs")
	pool, _ := c.Pool()
	fileID, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "allocs.bin"), true, 1<<20)
	if errors.Is(err, client.ErrUnavailable) {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	q, err := c.OpenQueue(8)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []xfer.Request{{Op: xfer.OpRead, Local: pool.Segment, LocalOffset: offs[0], Target: fileID, TargetOffset: 8192, Length: 4096}}
	uds := []uint64{1}
	cqes := make([]client.Completion, 4)
	round := func() {
		if n, err := q.Submit(reqs, uds); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		if n, err := q.Reap(cqes, 1, 30*time.Second); n != 1 || err != nil || cqes[0].Err() != nil {
			t.Fatal(n, err, cqes[0])
		}
	}
	for range 100 {
		round() // warm the stream's slots and timers
	}
	if a := testing.AllocsPerRun(500, round); a != 0 {
		t.Errorf("%v allocations per request, client and daemon", a)
	}
}

// TestShutdownWithRequestsInEveryRing: two clients keep 32 reads each in
// flight through queues on both reactor workers' rings when the daemon
// shuts down. The shutdown is bounded (drain_timeout plus its grace) and
// clean, and no request is answered twice.
func TestShutdownWithRequestsInEveryRing(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.DataWorkers = 2
	cfg.DrainTimeout = Duration(2 * time.Second)
	d, c := startClient(t, cfg, discardLogger(), "reactor-drain")
	pool, _ := c.Pool()
	const blk, depth = 64 << 10, 32
	fileID, _, err := c.RegisterFile(filepath.Join(cfg.DataDir, "drain.bin"), true, 2*depth*blk)
	if errors.Is(err, client.ErrUnavailable) {
		testutil.Missing(t, testutil.IOUring, "the daemon has no file tier: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	var stop sync.WaitGroup
	twice := make(chan uint64, 1)
	for qi := 0; qi < 2; qi++ {
		q, err := c.OpenQueue(depth)
		if err != nil {
			t.Fatal(err)
		}
		offs, err := c.AllocBlocks(nil, depth, blk)
		if err != nil {
			t.Fatal(err)
		}
		stop.Add(1)
		go func() {
			defer stop.Done()
			readUntilClosed(q, pool.Segment, fileID, offs, uint64(qi)*depth*blk, blk, twice)
		}()
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		busy := 0
		for _, n := range ringCounters(t, c, ".in_flight") {
			if n > 0 {
				busy++
			}
		}
		return busy == 2
	}, "requests in flight in both rings at once")
	start := time.Now()
	if err := d.shutdown(); err != nil {
		t.Fatalf("shutdown with requests in every ring: %v", err)
	}
	if took, bound := time.Since(start), time.Duration(cfg.DrainTimeout)+closeGrace; took > bound {
		t.Errorf("shutdown took %v, bound %v", took, bound)
	}
	stop.Wait()
	select {
	case ud := <-twice:
		t.Fatalf("request %d answered twice", ud)
	default:
	}
}

// readUntilClosed keeps every block's read from the file in flight on q
// until the queue fails, reporting to twice a request answered twice.
func readUntilClosed(q *client.Queue, poolSeg, file xfer.SegmentID, offs []uint64, base, blk uint64, twice chan<- uint64) {
	reqs := make([]xfer.Request, 1)
	uds := make([]uint64, 1)
	cqes := make([]client.Completion, len(offs))
	out := map[uint64]bool{}
	next := uint64(0)
	submit := func(i int) bool {
		reqs[0] = xfer.Request{Op: xfer.OpRead, Local: poolSeg, LocalOffset: offs[i], Target: file, TargetOffset: base + uint64(i)*blk, Length: blk}
		uds[0] = next<<8 | uint64(i)
		if n, err := q.Submit(reqs, uds); n != 1 || err != nil {
			return false
		}
		out[uds[0]] = true
		next++
		return true
	}
	for i := range offs {
		if !submit(i) {
			return
		}
	}
	for {
		n, err := q.Reap(cqes, 1, 30*time.Second)
		for _, cq := range cqes[:n] {
			if !out[cq.UserData] {
				select {
				case twice <- cq.UserData:
				default:
				}
				return
			}
			delete(out, cq.UserData)
			if cq.Err() == nil && !submit(int(cq.UserData&0xff)) {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
