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
// requests).
func TestQueueFileThroughReactors(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.DataWorkers = 2
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
