package session

import (
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

const testBlock = 4 << 10

// testPool is a pool of testBlock-sized blocks handed out in order, which
// records the blocks given back.
type testPool struct {
	*xfertest.Segment

	// mu guards the fields below.
	mu    sync.Mutex
	next  uint64
	freed []uint64
}

func (p *testPool) Fd() int { return -1 }

func (p *testPool) Alloc(uint64) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	off := p.next
	p.next += testBlock
	return off, nil
}

func (p *testPool) AllocN(size uint64, offs []uint64) error {
	for i := range offs {
		offs[i], _ = p.Alloc(size)
	}
	return nil
}

func (p *testPool) Free(off uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.freed = append(p.freed, off)
	return nil
}

func (p *testPool) BlockSize(uint64) (uint64, bool) { return testBlock, true }

func (p *testPool) freedBlocks() []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.freed)
}

var _ Pool = (*testPool)(nil)

// newTestSession is a session on its own, without a server: an engine
// whose every request goes to tr, a registry, and a pool.
func newTestSession(t *testing.T, tr xfer.Transport) (*Session, *testPool) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	eng := xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), log)
	t.Cleanup(func() { eng.Close() })
	reg := xfer.NewRegistry()
	pool := &testPool{Segment: xfertest.NewSegment(reg.NextID(), 16*testBlock)}
	if err := reg.Add(pool); err != nil {
		t.Fatal(err)
	}
	closing, quiesced := make(chan struct{}), make(chan struct{})
	h := &Host{
		Limits: Limits{MaxBuffers: 4, MaxBufferSize: 1 << 20, MaxBlocks: 16, MaxBatches: 4, MaxBatchCapacity: 16, MaxRequests: 16,
			MaxExports: 4, MaxNotifications: 4, MaxQueues: 1, MaxQueueEntries: 16, MaxQueueData: 4096},
		MaxFrame:    1 << 20,
		DefaultWait: 5 * time.Second,
		// Closing the session gives its busy batch this long before it
		// abandons it.
		ReleaseWait: 10 * time.Millisecond,
		Engine:      eng,
		Registry:    reg,
		MapBuffer: func(id xfer.SegmentID, _ int, size, _ uint64) (Buffer, error) {
			return xfertest.SegmentOf(id, xfer.KindClient, make([]byte, size)), nil
		},
		Exports:  peer.NewExports(nil),
		Closing:  closing,
		Quiesced: quiesced,
		Draining: func() bool { return false },
	}
	s := New(h, 1, log)
	s.SetTenant("t", pool, nil, log)
	return s, pool
}

// TestBlockHeldByATransfer: a pool block that a transfer still moves bytes
// in is refused BUSY to FreeBlocks, survives the session's Close, and is
// given back to the pool by the transfer's end; the session's other
// blocks go back at Close.
func TestBlockHeldByATransfer(t *testing.T) {
	tr := xfertest.New(xfertest.Config{}) // holds every task until Finish
	s, pool := newTestSession(t, tr)
	var r wire.Response
	if err := s.AllocBlocks(&wire.AllocBlocksRequest{N: 2, Size: testBlock}, &r); err != nil {
		t.Fatal(err)
	}
	offs := slices.Clone(r.Body.(*wire.AllocBlocksResponse).Offsets)
	readInto(t, s, pool.ID(), offs[0])
	if tr.Held() != 1 {
		t.Fatalf("transport holds %d tasks, want 1", tr.Held())
	}

	s.FreeBlocks(&wire.FreeBlocksRequest{Offsets: offs[:1]}, &r)
	if codes := r.Body.(*wire.FreeBlocksResponse).Codes; len(codes) != 1 || codes[0] != tcproto.CodeBUSY {
		t.Fatalf("freeing a block in flight: codes %v, want BUSY", codes)
	}

	s.Close()
	if got := pool.freedBlocks(); !slices.Equal(got, offs[1:]) {
		t.Fatalf("blocks given back at close %v, want only the idle one %v", got, offs[1:])
	}
	if n := tr.Finish(); n != 1 {
		t.Fatalf("finished %d tasks, want 1", n)
	}
	if got := pool.freedBlocks(); !slices.Equal(got, []uint64{offs[1], offs[0]}) {
		t.Fatalf("blocks given back after the transfer ended %v, want %v", got, []uint64{offs[1], offs[0]})
	}
}

// readInto submits a read of the pool block at off into a buffer of the
// session's own: a transfer that holds the block until the transport ends
// it.
func readInto(t *testing.T, s *Session, pool xfer.SegmentID, off uint64) {
	t.Helper()
	var r wire.Response
	if err := s.RegisterBuffer(&wire.RegisterBufferRequest{Size: testBlock}, -1, &r); err != nil {
		t.Fatal(err)
	}
	buf := r.Body.(*wire.RegisterBufferResponse).Segment
	if err := s.AllocBatch(&wire.AllocBatchRequest{Capacity: 1}, &r); err != nil {
		t.Fatal(err)
	}
	batch := r.Body.(*wire.AllocBatchResponse).Batch
	read := xfer.Request{Op: xfer.OpRead, Local: pool, LocalOffset: off, Target: xfer.SegmentID(buf), Length: testBlock}
	if err := s.Submit(&wire.Context{}, &wire.SubmitRequest{Batch: batch, Requests: []xfer.Request{read}}, &r); err != nil {
		t.Fatal(err)
	}
	if codes := r.Body.(*wire.SubmitResponse).Codes; len(codes) != 1 || codes[0] != tcproto.CodeOK {
		t.Fatalf("submit codes %v", codes)
	}
}

// TestBlockHeldByAPeerRequest: a pool block under an export that a peer
// request is still in when the session closes (past ReleaseWait) survives
// the Close and goes back to the pool when the last of what is in it
// ends: the peer request, and a transfer of the session when one holds
// the block too. It goes back once, and not before.
func TestBlockHeldByAPeerRequest(t *testing.T) {
	for _, tc := range []struct {
		name          string
		transfer      bool // a transfer holds the block too
		transferFirst bool // and ends before the peer request
	}{
		{name: "peer request only"},
		{name: "transfer ends first", transfer: true, transferFirst: true},
		{name: "peer request ends first", transfer: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := xfertest.New(xfertest.Config{}) // holds every task until Finish
			s, pool := newTestSession(t, tr)
			var r wire.Response
			if err := s.AllocBlocks(&wire.AllocBlocksRequest{N: 2, Size: testBlock}, &r); err != nil {
				t.Fatal(err)
			}
			offs := slices.Clone(r.Body.(*wire.AllocBlocksResponse).Offsets)
			exp := &wire.ExportSegmentRequest{Name: []byte("blk"), Segment: uint64(pool.ID()), Offset: offs[0], Length: testBlock,
				Rights: wire.RightWrite}
			if err := s.ExportSegment(exp, &r); err != nil {
				t.Fatal(err)
			}
			peerReq := s.h.Exports.Get("t", "blk").Segment()
			if !peerReq.Acquire() {
				t.Fatal("a peer request could not take the live export's range")
			}
			ends := []func(){peerReq.Release}
			if tc.transfer {
				readInto(t, s, pool.ID(), offs[0])
				finish := func() {
					if n := tr.Finish(); n != 1 {
						t.Fatalf("finished %d tasks, want 1", n)
					}
				}
				if tc.transferFirst {
					ends = []func(){finish, peerReq.Release}
				} else {
					ends = append(ends, finish)
				}
			}

			s.Close()
			if got := pool.freedBlocks(); !slices.Equal(got, offs[1:]) {
				t.Fatalf("blocks given back at close %v, want only the idle one %v", got, offs[1:])
			}
			for _, end := range ends[:len(ends)-1] {
				end()
				if got := pool.freedBlocks(); !slices.Equal(got, offs[1:]) {
					t.Fatalf("blocks given back while the block is still in use %v, want %v", got, offs[1:])
				}
			}
			ends[len(ends)-1]()
			if got, want := pool.freedBlocks(), []uint64{offs[1], offs[0]}; !slices.Equal(got, want) {
				t.Fatalf("blocks given back once the last use of the block ended %v, want %v", got, want)
			}
		})
	}
}
