package control

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

func TestHelloPingStats(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	r := c.call(&wire.HelloRequest{ProtocolVersion: wire.ProtocolVersion, ClientName: []byte("t")})
	expectCode(t, r, tcproto.CodeOK)
	if string(body[wire.HelloResponse](t, r).DaemonID) != "test-daemon" || body[wire.HelloResponse](t, r).ProtocolVersion != wire.ProtocolVersion || body[wire.HelloResponse](t, r).Limits.MaxFrame != wire.DefaultMaxFrame {
		t.Fatalf("hello: %+v", r)
	}
	r = c.call(&wire.PingRequest{Payload: []byte("0123456789")})
	expectCode(t, r, tcproto.CodeOK)
	if string(body[wire.PingResponse](t, r).Payload) != "0123456789" {
		t.Fatalf("ping payload %q", body[wire.PingResponse](t, r).Payload)
	}
	c.call(&wire.AllocBlocksRequest{N: 3, Size: 4096})
	r = c.call(&wire.StatsRequest{})
	expectCode(t, r, tcproto.CodeOK)
	find := func(cs []wire.Counter, name string) (uint64, bool) {
		for _, c := range cs {
			if c.Name == name {
				return c.Value, true
			}
		}
		return 0, false
	}
	if v, ok := find(body[wire.StatsResponse](t, r).Pool, "blocks"); !ok || v != 3 {
		t.Fatalf("pool blocks counter %d %v in %+v", v, ok, body[wire.StatsResponse](t, r).Pool)
	}
	if v, ok := find(body[wire.StatsResponse](t, r).Connection, "blocks"); !ok || v != 3 {
		t.Fatalf("connection blocks counter %d %v", v, ok)
	}
	if _, ok := find(body[wire.StatsResponse](t, r).Engine, "batches_live"); !ok {
		t.Fatalf("no engine counters: %+v", body[wire.StatsResponse](t, r).Engine)
	}
	if body[wire.StatsResponse](t, r).Connections != 1 {
		t.Fatalf("connections %d", body[wire.StatsResponse](t, r).Connections)
	}
	fi, err := os.Stat(e.sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v, %v", fi.Mode(), err)
	}
}

// TestCopyThroughPool registers a client buffer, writes a pattern, copies
// it into pool blocks and back into another part of the buffer, and checks
// every byte, through the real socket, memfds, pool and engine.
func TestCopyThroughPool(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	const size = 1 << 20
	fd := newMemfd(t, size)
	mem, err := shm.MapShared(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Unmap(mem)
	r := c.call(&wire.RegisterBufferRequest{Size: size}, fd)
	unix.Close(fd)
	expectCode(t, r, tcproto.CodeOK)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	for i := 0; i < size/2; i++ {
		mem[i] = byte(i*7 + i>>8)
	}
	r = c.call(&wire.AllocBlocksRequest{N: 8, Size: 64 << 10})
	expectCode(t, r, tcproto.CodeOK)
	offs := append([]uint64(nil), body[wire.AllocBlocksResponse](t, r).Offsets...)
	var in, out []xfer.Request
	for i, off := range offs {
		in = append(in, xfer.Request{Op: xfer.OpWrite, Local: seg, LocalOffset: uint64(i) << 16, Target: testPoolID, TargetOffset: off, Length: 64 << 10})
		out = append(out, xfer.Request{Op: xfer.OpRead, Local: seg, LocalOffset: size/2 + uint64(i)<<16, Target: testPoolID, TargetOffset: off, Length: 64 << 10})
	}
	r = c.call(&wire.TransferRequestBody{Requests: in})
	expectCode(t, r, tcproto.CodeOK)
	if len(body[wire.TransferResponse](t, r).Codes) != len(in) || body[wire.TransferResponse](t, r).Summary.Completed != uint32(len(in)) || body[wire.TransferResponse](t, r).Summary.Transferred != size/2 {
		t.Fatalf("transfer in: %+v", r)
	}
	// The pool bytes, seen from the daemon's side, are the pattern.
	pool := e.pool.Bytes()
	for i, off := range offs {
		for j := 0; j < 64<<10; j++ {
			if pool[off+uint64(j)] != mem[i<<16+j] {
				t.Fatalf("pool block %d byte %d differs", i, j)
			}
		}
	}
	// Back out with the batch calls.
	r = c.call(&wire.AllocBatchRequest{Capacity: uint32(len(out))})
	expectCode(t, r, tcproto.CodeOK)
	batch := body[wire.AllocBatchResponse](t, r).Batch
	r = c.call(&wire.SubmitRequest{Batch: batch, Requests: out})
	expectCode(t, r, tcproto.CodeOK)
	for i, code := range body[wire.SubmitResponse](t, r).Codes {
		if code != tcproto.CodeOK {
			t.Fatalf("submit item %d: %s", i, code)
		}
	}
	r = c.call(&wire.WaitRequest{Batch: batch, TimeoutMS: 5000})
	expectCode(t, r, tcproto.CodeOK)
	if body[wire.WaitResponse](t, r).Summary.Completed != uint32(len(out)) {
		t.Fatalf("wait: %+v", body[wire.WaitResponse](t, r).Summary)
	}
	r = c.call(&wire.TaskStatusRequest{Batch: batch, Index: 3})
	if body[wire.TaskStatusResponse](t, r).State != tcproto.TaskStateCOMPLETED || body[wire.TaskStatusResponse](t, r).Transferred != 64<<10 || body[wire.TaskStatusResponse](t, r).Code != tcproto.CodeOK {
		t.Fatalf("task status %+v", *body[wire.TaskStatusResponse](t, r))
	}
	expectCode(t, c.call(&wire.FreeBatchRequest{Batch: batch}), tcproto.CodeOK)
	for i := 0; i < size/2; i++ {
		if mem[size/2+i] != mem[i] {
			t.Fatalf("byte %d: %d after the round trip, want %d", i, mem[size/2+i], mem[i])
		}
	}
	r = c.call(&wire.FreeBlocksRequest{Offsets: append(offs, 1<<40)})
	expectCode(t, r, tcproto.CodeOK)
	for i, code := range body[wire.FreeBlocksResponse](t, r).Codes {
		want := tcproto.CodeOK
		if i == len(offs) {
			want = tcproto.CodeNOT_FOUND
		}
		if code != want {
			t.Fatalf("free item %d: %s, want %s", i, code, want)
		}
	}
	expectCode(t, c.call(&wire.UnregisterBufferRequest{Segment: uint64(seg)}), tcproto.CodeOK)
	if e.pool.Stats().Blocks != 0 || e.reg.Len() != 1 {
		t.Fatalf("after freeing: %d blocks, %d segments", e.pool.Stats().Blocks, e.reg.Len())
	}
}

func TestPoolInfoPassesMemfd(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	r, fds := c.callFD(&wire.PoolInfoRequest{})
	expectCode(t, r, tcproto.CodeOK)
	if len(fds) != 1 {
		t.Fatalf("%d fds with PoolInfo", len(fds))
	}
	defer closeFDs(fds)
	if body[wire.PoolInfoResponse](t, r).Segment != uint64(testPoolID) || body[wire.PoolInfoResponse](t, r).Size != testPoolSz || len(body[wire.PoolInfoResponse](t, r).BlockClasses) == 0 || body[wire.PoolInfoResponse](t, r).BlockClasses[0] != testMinBlk {
		t.Fatalf("pool info %+v", r)
	}
	mem, err := shm.MapShared(fds[0], body[wire.PoolInfoResponse](t, r).Size)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Unmap(mem)
	r = c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})
	off := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	copy(mem[off:], "written in place by the client")
	if got := string(e.pool.Bytes()[off : off+30]); got != "written in place by the client" {
		t.Fatalf("daemon sees %q", got)
	}
}

func TestScopeAndLimits(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.Limits.MaxBlocks = 4; c.Limits.MaxBatches = 1 })
	a, b := dialRaw(t, e.sock), dialRaw(t, e.sock)
	fd := newMemfd(t, 1<<16)
	r := a.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	expectCode(t, r, tcproto.CodeOK)
	segA := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	r = a.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})
	offA := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	fd = newMemfd(t, 1<<16)
	r = b.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	segB := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	r = b.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})
	offB := body[wire.AllocBlocksResponse](t, r).Offsets[0]

	// b may not name a's buffer nor a's block; out of bounds and zero
	// length are refused; one good request in the middle still runs.
	r = b.call(&wire.TransferRequestBody{Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: segA, Target: testPoolID, TargetOffset: offB, Length: 16},
		{Op: xfer.OpWrite, Local: segB, Target: testPoolID, TargetOffset: offA, Length: 16},
		{Op: xfer.OpWrite, Local: segB, Target: testPoolID, TargetOffset: offB, Length: 16},
		{Op: xfer.OpWrite, Local: segB, Target: testPoolID, TargetOffset: offB + 4000, Length: 200},
		{Op: xfer.OpWrite, Local: segB, LocalOffset: 1 << 16, Target: testPoolID, TargetOffset: offB, Length: 1},
		{Op: 9, Local: segB, Target: testPoolID, TargetOffset: offB, Length: 1},
	}})
	expectCode(t, r, tcproto.CodeOK)
	want := []Code{tcproto.CodeNOT_FOUND, tcproto.CodePERMISSION_DENIED, tcproto.CodeOK,
		tcproto.CodePERMISSION_DENIED, tcproto.CodeINVALID_ARGUMENT, tcproto.CodeINVALID_ARGUMENT}
	if len(body[wire.TransferResponse](t, r).Codes) != len(want) {
		t.Fatalf("%d codes for %d requests", len(body[wire.TransferResponse](t, r).Codes), len(want))
	}
	for i := range want {
		if body[wire.TransferResponse](t, r).Codes[i] != want[i] {
			t.Errorf("request %d: %s, want %s", i, body[wire.TransferResponse](t, r).Codes[i], want[i])
		}
	}
	if body[wire.TransferResponse](t, r).Summary.Completed != 1 {
		t.Errorf("summary %+v", body[wire.TransferResponse](t, r).Summary)
	}
	// b may not free a's block, unregister a's buffer or use a's batch.
	r = b.call(&wire.FreeBlocksRequest{Offsets: []uint64{offA}})
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 1 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeNOT_FOUND {
		t.Fatalf("free of another's block: %+v", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	expectCode(t, b.call(&wire.UnregisterBufferRequest{Segment: uint64(segA)}), tcproto.CodeNOT_FOUND)
	r = a.call(&wire.AllocBatchRequest{Capacity: 1})
	expectCode(t, r, tcproto.CodeOK)
	expectCode(t, b.call(&wire.WaitRequest{Batch: body[wire.AllocBatchResponse](t, r).Batch}), tcproto.CodeNOT_FOUND)
	// Per-connection limits.
	expectCode(t, a.call(&wire.AllocBatchRequest{Capacity: 1}), tcproto.CodeRESOURCE_EXHAUSTED)
	expectCode(t, a.call(&wire.AllocBlocksRequest{N: 4, Size: 4096}), tcproto.CodeRESOURCE_EXHAUSTED)
	expectCode(t, a.call(&wire.AllocBlocksRequest{N: 3, Size: 4096}), tcproto.CodeOK)
	expectCode(t, a.call(&wire.RegisterFileRequest{Path: []byte("/x")}), tcproto.CodeUNAVAILABLE)
	if e.pool.Stats().Blocks != 5 {
		t.Fatalf("pool blocks %d", e.pool.Stats().Blocks)
	}
}

func TestFramingErrors(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.MaxFrame = 4096 })
	good := dialRaw(t, e.sock)
	ping := &wire.Request{Body: &wire.PingRequest{}}
	expectCode(t, good.call(ping), tcproto.CodeOK)

	t.Run("oversized", func(t *testing.T) {
		c := dialRaw(t, e.sock)
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], 4097)
		c.send(hdr[:])
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, r, tcproto.CodeRESOURCE_EXHAUSTED)
		c.expectClosed()
	})
	t.Run("random bytes", func(t *testing.T) {
		c := dialRaw(t, e.sock)
		junk := []byte{60, 0, 0, 0}
		for i := 0; i < 60; i++ {
			junk = append(junk, byte(i*37+11))
		}
		c.send(junk)
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, r, tcproto.CodeINVALID_ARGUMENT)
		c.expectClosed()
	})
	t.Run("truncated then EOF", func(t *testing.T) {
		c := dialRaw(t, e.sock)
		frame := wire.EncodeRequest(c.b, ping)
		c.send(frame[:len(frame)-3])
		c.uc.CloseWrite()
		c.expectClosed()
	})
	t.Run("tiny frame", func(t *testing.T) {
		c := dialRaw(t, e.sock)
		c.send([]byte{2, 0, 0, 0, 1, 2})
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, r, tcproto.CodeINVALID_ARGUMENT)
		c.expectClosed()
	})
	t.Run("many frames in one write", func(t *testing.T) {
		c := dialRaw(t, e.sock)
		var all []byte
		for i := 1; i <= 50; i++ {
			all = append(all, wire.EncodeRequest(c.b, &wire.Request{Ctx: wire.Context{RequestID: uint64(i)}, Body: &wire.PingRequest{}})...)
		}
		c.send(all)
		for i := 1; i <= 50; i++ {
			r, _, err := c.recv()
			if err != nil || r.RequestID != uint64(i) {
				t.Fatalf("answer %d: %+v %v", i, r, err)
			}
		}
	})
	// The first connection was served throughout.
	expectCode(t, good.call(ping), tcproto.CodeOK)
}

func TestFDRules(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK) // accepted by now
	before, _ := testutil.HandleFDs()

	// Missing fd.
	expectCode(t, c.call(&wire.RegisterBufferRequest{Size: 4096}), tcproto.CodeINVALID_ARGUMENT)
	// Unexpected fd: refused, and the server closes its copy.
	fd := newMemfd(t, 4096)
	expectCode(t, c.call(&wire.PingRequest{}, fd), tcproto.CodeINVALID_ARGUMENT)
	// Two fds where one is expected.
	fd2 := newMemfd(t, 4096)
	expectCode(t, c.call(&wire.RegisterBufferRequest{Size: 4096}, fd, fd2), tcproto.CodeINVALID_ARGUMENT)
	// Wrong fd: a pipe is not mappable, nor is a directory.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	expectCode(t, c.call(&wire.RegisterBufferRequest{Size: 4096}, p[0]), tcproto.CodeINVALID_ARGUMENT)
	dir, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, c.call(&wire.RegisterBufferRequest{Size: 4096}, dir), tcproto.CodeINVALID_ARGUMENT)
	// Declared size larger than the memfd.
	expectCode(t, c.call(&wire.RegisterBufferRequest{Size: 8192}, fd), tcproto.CodeINVALID_ARGUMENT)
	// An fd sent with the second of two frames in one write goes with it.
	var two []byte
	two = append(two, wire.EncodeRequest(c.b, &wire.Request{Ctx: wire.Context{RequestID: 100}, Body: &wire.PingRequest{}})...)
	c.send(two)
	frame := wire.EncodeRequest(c.b, &wire.Request{Ctx: wire.Context{RequestID: 101}, Body: &wire.RegisterBufferRequest{Size: 4096}})
	c.send(frame, fd)
	for _, want := range []uint64{100, 101} {
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.RequestID != want || r.Status != tcproto.CodeOK {
			t.Fatalf("answer %d: status %s", r.RequestID, r.Status)
		}
	}
	for _, f := range []int{fd, fd2, p[0], p[1], dir} {
		unix.Close(f)
	}
	// The daemon holds exactly one mapping now and no stray fd: its fd
	// table is back where it was (the mapping needs no fd).
	after, _ := testutil.HandleFDs()
	if len(after) > len(before) {
		t.Fatalf("fds before %v, after %v", before, after)
	}
	// Still served.
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	// A stray fd, sent with the second half of a frame (so with no frame's
	// first bytes), goes with no request and is closed.
	stray := newMemfd(t, 4096)
	ping := wire.EncodeRequest(c.b, &wire.Request{Ctx: wire.Context{RequestID: 200}, Body: &wire.PingRequest{}})
	half := len(ping) / 2
	c.send(ping[:half])
	c.waitConsumed() // the server read the first half alone
	c.send(ping[half:], stray)
	unix.Close(stray)
	if r, _, err := c.recv(); err != nil || r.RequestID != 200 || r.Status != tcproto.CodeOK {
		t.Fatalf("split ping: %+v %v", r, err)
	}
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	if after, _ := testutil.HandleFDs(); len(after) > len(before) {
		t.Fatalf("stray fd kept: before %v, after %v", before, after)
	}
	if !strings.Contains(e.logBuf.String(), "closing file descriptors sent without a frame") {
		t.Fatal("stray fd not reported")
	}
	if e.reg.Len() != 2 {
		t.Fatalf("%d segments registered, want the pool and one buffer", e.reg.Len())
	}
}

func TestIdempotency(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	key := wire.Context{IdempotencyKey: []byte("alloc-1"), Lane: []byte("stream-first"), PolicyVersion: 1}
	r := c.callCtx(key, &wire.AllocBlocksRequest{N: 2, Size: 4096})
	expectCode(t, r, tcproto.CodeOK)
	first := append([]uint64(nil), body[wire.AllocBlocksResponse](t, r).Offsets...)
	r = c.callCtx(key, &wire.AllocBlocksRequest{N: 2, Size: 4096})
	expectCode(t, r, tcproto.CodeOK)
	if len(body[wire.AllocBlocksResponse](t, r).Offsets) != 2 || body[wire.AllocBlocksResponse](t, r).Offsets[0] != first[0] || body[wire.AllocBlocksResponse](t, r).Offsets[1] != first[1] {
		t.Fatalf("retry got %v, first %v", body[wire.AllocBlocksResponse](t, r).Offsets, first)
	}
	if r.RequestID != c.id {
		t.Fatalf("replayed answer carries request id %d, want %d", r.RequestID, c.id)
	}
	if n := e.pool.Stats().Blocks; n != 2 {
		t.Fatalf("retry allocated again: %d blocks", n)
	}
	expectCode(t, c.callCtx(key, &wire.AllocBlocksRequest{N: 3, Size: 4096}), tcproto.CodeFAILED_PRECONDITION)
	other := key
	other.Lane = []byte("catalog-first")
	expectCode(t, c.callCtx(other, &wire.AllocBlocksRequest{N: 2, Size: 4096}), tcproto.CodeFAILED_PRECONDITION)
	if !strings.Contains(e.logBuf.String(), "idempotency_key=alloc-1") || !strings.Contains(e.logBuf.String(), "lane=stream-first") ||
		!strings.Contains(e.logBuf.String(), "policy_version=1") {
		t.Fatalf("no audit record with the audit keys:\n%s", e.logBuf.String())
	}
}

// panicEngine panics in Status, to check a panic costs one request only.
type panicEngine struct{ Engine }

func (panicEngine) Status(xfer.BatchID, int) (xfer.TaskStatus, error) { panic("injected") }

func TestPanicBecomesInternal(t *testing.T) {
	e := newEnv(t, false, func(_ *Config, d *Deps) { d.Engine = panicEngine{d.Engine} })
	c := dialRaw(t, e.sock)
	r := c.call(&wire.AllocBatchRequest{Capacity: 1})
	expectCode(t, r, tcproto.CodeOK)
	r = c.call(&wire.TaskStatusRequest{Batch: body[wire.AllocBatchResponse](t, r).Batch})
	expectCode(t, r, tcproto.CodeINTERNAL)
	if string(r.Message) != "internal error" {
		t.Fatalf("client sees %q", r.Message)
	}
	expectCode(t, c.call(&wire.PingRequest{}), tcproto.CodeOK)
	if !strings.Contains(e.logBuf.String(), "injected") {
		t.Fatal("panic not logged")
	}
	// Served on, but unhealthy: the watchdog's restart brings it back whole.
	if err := e.srv.Health(); !errors.Is(err, ErrUnavailable) || e.srv.Panics() != 1 {
		t.Fatalf("after a recovered panic: Health %v, Panics %d; want ErrUnavailable, 1", err, e.srv.Panics())
	}
}

func TestReleaseOnClose(t *testing.T) {
	e := newEnv(t, true)
	c := dialRaw(t, e.sock)
	fd := newMemfd(t, 1<<16)
	r := c.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	r = c.call(&wire.AllocBlocksRequest{N: 5, Size: 16384})
	off := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	r = c.call(&wire.AllocBatchRequest{Capacity: 2})
	busy := body[wire.AllocBatchResponse](t, r).Batch
	r = c.call(&wire.SubmitRequest{Batch: busy, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: hangLength},
	}})
	if len(body[wire.SubmitResponse](t, r).Codes) != 1 || body[wire.SubmitResponse](t, r).Codes[0] != tcproto.CodeOK {
		t.Fatalf("submit: %+v", r)
	}
	expectCode(t, c.call(&wire.FreeBatchRequest{Batch: busy}), tcproto.CodeBUSY)
	c.call(&wire.AllocBatchRequest{Capacity: 2})
	if e.eng.Stats().BatchesLive != 2 || e.pool.Stats().Blocks != 5 || e.reg.Len() != 2 {
		t.Fatal("resources not taken")
	}
	c.uc.Close()
	e.waitIdle()
	if !strings.Contains(e.logBuf.String(), "abandoning a busy batch") {
		t.Fatal("busy batch not abandoned")
	}
}

// TestKilledClientReleased runs a client in another process, lets it take
// buffers, blocks and batches (one busy), kills it with SIGKILL and checks
// the pool, registry and engine are back to baseline.
func TestKilledClientReleased(t *testing.T) {
	e := newEnv(t, true)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"=hold", "TENSORCAST_TEST_SOCKET="+e.sock)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	sc := bufio.NewScanner(stdout)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if sc.Text() == "ready" {
			break
		}
	}
	if len(lines) == 0 || lines[len(lines)-1] != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper did not get ready: %q", lines)
	}
	if ps := e.pool.Stats(); ps.Blocks != 8 || e.reg.Len() != 2 || e.eng.Stats().BatchesLive != 1 {
		t.Fatalf("helper holds: %d blocks, %d segments, %d batches (%q)", ps.Blocks, e.reg.Len(), e.eng.Stats().BatchesLive, lines)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, stdout)
	cmd.Wait()
	e.waitIdle()
}

// TestPeerCredentials: a peer whose uid and gid are not allowed gets
// PERMISSION_DENIED and is closed; allowed peers keep being served.
func TestPeerCredentials(t *testing.T) {
	t.Run("config excludes us", func(t *testing.T) {
		e := newEnv(t, false, func(c *Config, _ *Deps) { c.DeniedUIDs = []uint32{uint32(os.Getuid())} })
		c := dialRaw(t, e.sock)
		r, _, err := c.recv()
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, r, tcproto.CodePERMISSION_DENIED)
		c.expectClosed()
	})
	t.Run("other uid process", func(t *testing.T) {
		testutil.Require(t, testutil.Root) // to run a helper process as uid 65534 (setuid)
		e := newEnv(t, false, func(c *Config, _ *Deps) { c.Mode = 0o666 })
		if err := os.Chmod(e.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Dir(e.sock), 0o755); err != nil {
			t.Fatal(err)
		}
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		// The test binary's own directory may be private: run a copy.
		bin := filepath.Join(e.dir, "helper")
		data, err := os.ReadFile(exe)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		good := dialRaw(t, e.sock)
		run := func(uid, gid uint32) string {
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), helperEnv+"=ping", "TENSORCAST_TEST_SOCKET="+e.sock)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("helper as %d: %v: %s", uid, err, out)
			}
			return strings.TrimSpace(string(out))
		}
		if got := run(65534, 65534); got != "status PERMISSION_DENIED" {
			t.Fatalf("uid 65534 got %q", got)
		}
		expectCode(t, good.call(&wire.PingRequest{}), tcproto.CodeOK)
		if got := run(0, 0); got != "status OK" {
			t.Fatalf("root got %q", got)
		}
		if !strings.Contains(e.logBuf.String(), "peer refused") {
			t.Fatal("refusal not logged")
		}
	})
}

func TestMaxConns(t *testing.T) {
	e := newEnv(t, false, func(c *Config, _ *Deps) { c.MaxConns = 1 })
	a := dialRaw(t, e.sock)
	expectCode(t, a.call(&wire.PingRequest{}), tcproto.CodeOK)
	b := dialRaw(t, e.sock)
	r, _, err := b.recv()
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, tcproto.CodeRESOURCE_EXHAUSTED)
	expectCode(t, a.call(&wire.PingRequest{}), tcproto.CodeOK)
}

func TestStaleSocketAndInUse(t *testing.T) {
	e := newEnv(t, false)
	// A second server on a live socket is refused.
	_, err := NewServer(Config{Socket: e.sock}, Deps{Engine: e.eng, Pool: e.pool, Registry: e.reg}, nil)
	if !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("second server: %v", err)
	}
	// A stale socket file (nobody listening) is replaced.
	stale := filepath.Join(e.dir, "stale", "s.sock")
	os.MkdirAll(filepath.Dir(stale), 0o755)
	fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	s, err := NewServer(Config{Socket: stale}, Deps{Engine: e.eng, Pool: e.pool, Registry: e.reg}, nil)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	s.Close()
	// A regular file is not removed.
	file := filepath.Join(e.dir, "file.sock")
	os.WriteFile(file, nil, 0o600)
	if _, err := NewServer(Config{Socket: file}, Deps{Engine: e.eng, Pool: e.pool, Registry: e.reg}, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("regular file: %v", err)
	}
}

func TestDrain(t *testing.T) {
	e := newEnv(t, true)
	a, b := dialRaw(t, e.sock), dialRaw(t, e.sock)
	fd := newMemfd(t, 1<<16)
	r := a.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)
	unix.Close(fd)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
	r = a.call(&wire.AllocBlocksRequest{N: 1, Size: 16384})
	off := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	// a is inside a one-shot Transfer that will not end by itself.
	a.id++
	a.send(wire.EncodeRequest(a.b, &wire.Request{Ctx: wire.Context{RequestID: a.id}, Body: &wire.TransferRequestBody{TimeoutMS: 60000,
		Requests: []xfer.Request{{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: hangLength}}}}))
	testutil.Eventually(t, testTimeout, func() bool { return e.srv.inflight.Load() != 0 }, "a's transfer in flight")
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	go func() { done <- e.srv.Drain(ctx) }()
	testutil.Eventually(t, testTimeout, e.srv.draining.Load, "the server draining")
	// New work is answered UNAVAILABLE while a's request is in flight.
	expectCode(t, b.call(&wire.PingRequest{}), tcproto.CodeUNAVAILABLE)
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain: %v", err)
	}
	// a's in-flight request is answered (UNAVAILABLE: the server closed
	// under it) or its connection is closed; either way all is released.
	if r, _, err := a.recv(); err == nil && r.Status == tcproto.CodeOK {
		t.Fatalf("in-flight transfer answered OK: %+v", r)
	}
	e.waitIdle()
	if _, err := os.Stat(e.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left behind: %v", err)
	}
}

// fileSeg is a file segment for the RegisterFile test.
type fileSeg struct {
	id     xfer.SegmentID
	size   uint64
	closed chan struct{}
}

func (f *fileSeg) ID() xfer.SegmentID { return f.id }
func (f *fileSeg) Kind() xfer.Kind    { return xfer.KindFile }
func (f *fileSeg) Size() uint64       { return f.size }
func (f *fileSeg) Acquire() bool      { return true }
func (f *fileSeg) Release()           {}
func (f *fileSeg) Close() error       { close(f.closed); return nil }

type opener struct{ opened chan *fileSeg }

func (o opener) OpenFile(id xfer.SegmentID, path string, direct bool, size uint64) (FileSegment, error) {
	if path != "/data/kv.bin" || !direct {
		return nil, os.ErrNotExist
	}
	f := &fileSeg{id: id, size: 1 << 20, closed: make(chan struct{})}
	o.opened <- f
	return f, nil
}

func TestRegisterFile(t *testing.T) {
	op := opener{opened: make(chan *fileSeg, 2)}
	e := newEnv(t, false, func(_ *Config, d *Deps) { d.FileOpener = op })
	c := dialRaw(t, e.sock)
	expectCode(t, c.call(&wire.RegisterFileRequest{Path: []byte("/etc/shadow"), Direct: true}), tcproto.CodeNOT_FOUND)
	r := c.call(&wire.RegisterFileRequest{Path: []byte("/data/kv.bin"), Direct: true})
	expectCode(t, r, tcproto.CodeOK)
	f := <-op.opened
	if body[wire.RegisterFileResponse](t, r).Segment != uint64(f.id) || body[wire.RegisterFileResponse](t, r).Size != 1<<20 {
		t.Fatalf("register file: %+v", r)
	}
	if s, ok := e.reg.Resolve(f.id); !ok || s != xfer.Segment(f) {
		t.Fatal("file segment not registered")
	}
	// Out of the file's bounds is refused before the engine sees it.
	off := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 1, Size: 4096})).Offsets[0]
	r = c.call(&wire.TransferRequestBody{Requests: []xfer.Request{
		{Op: xfer.OpRead, Local: testPoolID, LocalOffset: off, Target: f.id, TargetOffset: 1 << 20, Length: 4096}}})
	if len(body[wire.TransferResponse](t, r).Codes) != 1 || body[wire.TransferResponse](t, r).Codes[0] != tcproto.CodeINVALID_ARGUMENT {
		t.Fatalf("out of bounds: %+v", body[wire.TransferResponse](t, r).Codes)
	}
	// Closing the connection closes and unregisters the file.
	c.uc.Close()
	select {
	case <-f.closed:
	case <-time.After(testTimeout):
		t.Fatal("file not closed with its connection")
	}
	e.waitIdle()
}

// TestBlocksOutliveAbandonedTasks: a closed connection's pool blocks are not
// freed while an abandoned task that may still write into them runs.
func TestBlocksOutliveAbandonedTasks(t *testing.T) {
	e := newEnv(t, true, func(c *Config, _ *Deps) { c.ReleaseWait = 100 * time.Millisecond })
	h := e.deafHang()
	c := dialRaw(t, e.sock)
	fd := newMemfd(t, 1<<16)
	seg := xfer.SegmentID(body[wire.RegisterBufferResponse](t, c.call(&wire.RegisterBufferRequest{Size: 1 << 16}, fd)).Segment)
	unix.Close(fd)
	off := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 1, Size: 16384})).Offsets[0]
	batch := body[wire.AllocBatchResponse](t, c.call(&wire.AllocBatchRequest{Capacity: 1})).Batch
	r := c.call(&wire.SubmitRequest{Batch: batch, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: off, Length: hangLength}}})
	if body[wire.SubmitResponse](t, r).Codes[0] != tcproto.CodeOK {
		t.Fatalf("submit %+v", body[wire.SubmitResponse](t, r).Codes)
	}
	c.uc.Close()
	// The connection waits ReleaseWait for the batch, abandons it, and
	// releases the rest: the block stays allocated, for the abandoned task
	// that still runs to free when it ends.
	e.waitReleased()
	if st := e.eng.Stats(); st.BatchesLive != 0 || st.BatchesRetiring != 1 {
		t.Fatalf("engine %+v after the connection's release, want its batch abandoned and still owed a Done", st)
	}
	if n := e.pool.Stats().Blocks; n != 1 {
		t.Fatalf("%d pool blocks while the abandoned task runs, want 1", n)
	}
	h.Finish()
	e.waitIdle()
}

// TestAuditLevels: calls that change what a connection holds are audited at
// AuditLevel, the per-transfer data-path calls one level below it.
func TestAuditLevels(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	ctx := wire.Context{IdempotencyKey: []byte("k-alloc"), Lane: []byte("stream-first")}
	expectCode(t, c.callCtx(ctx, &wire.AllocBlocksRequest{N: 1, Size: 4096}), tcproto.CodeOK)
	c.callCtx(wire.Context{IdempotencyKey: []byte("k-file")}, &wire.RegisterFileRequest{Path: []byte("/nonexistent")})
	var data, hold bool
	for _, line := range strings.Split(e.logBuf.String(), "\n") {
		if !strings.Contains(line, "msg=audit") {
			continue
		}
		switch {
		case strings.Contains(line, "idempotency_key=k-alloc"):
			data = true
			if !strings.Contains(line, "level=DEBUG") {
				t.Errorf("data-path call audited above Debug: %s", line)
			}
		case strings.Contains(line, "idempotency_key=k-file"):
			hold = true
			if !strings.Contains(line, "level=INFO") {
				t.Errorf("RegisterFile not audited at Info: %s", line)
			}
		}
	}
	if !data || !hold {
		t.Fatalf("audit records missing (data-path %v, RegisterFile %v):\n%s", data, hold, e.logBuf.String())
	}
}

// TestFreeBlockBusyWhileTransferInFlight: a block a transfer may still
// write into (its task timed out, but the transport has not let go of it)
// cannot be freed, so it cannot be handed to another client; once the
// transport ends the task it can.
func TestFreeBlockBusyWhileTransferInFlight(t *testing.T) {
	e := newEnv(t, true)
	h := e.deafHang()
	c := dialRaw(t, e.sock)
	seg := registerBuffer(t, c, 1<<16)
	offs := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 2, Size: 16384})).Offsets
	r := c.call(&wire.TransferRequestBody{TimeoutMS: 50, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: offs[0], Length: hangLength}}})
	if body[wire.TransferResponse](t, r).Summary.Timeout != 1 {
		t.Fatalf("transfer summary %+v, want 1 timed out", body[wire.TransferResponse](t, r).Summary)
	}
	r = c.call(&wire.FreeBlocksRequest{Offsets: offs})
	expectCode(t, r, tcproto.CodeOK)
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 2 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeBUSY || body[wire.FreeBlocksResponse](t, r).Codes[1] != tcproto.CodeOK {
		t.Fatalf("free codes %v, want [BUSY OK]: the timed-out transfer's block must stay", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	if n := e.pool.Stats().Blocks; n != 1 {
		t.Fatalf("%d pool blocks, want the busy one only", n)
	}
	h.Finish()
	r = c.call(&wire.FreeBlocksRequest{Offsets: offs[:1]})
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 1 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeOK {
		t.Fatalf("free after the transport let go: %v", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	c.uc.Close()
	e.waitIdle()
}

// TestClosedConnectionBlockFreedAtLastDrop: a connection that closes while
// a transfer still holds one of its blocks leaves that block allocated and
// it is freed when the transfer ends, not before and not never.
func TestClosedConnectionBlockFreedAtLastDrop(t *testing.T) {
	e := newEnv(t, true, func(c *Config, _ *Deps) { c.ReleaseWait = 50 * time.Millisecond })
	h := e.deafHang()
	c := dialRaw(t, e.sock)
	seg := registerBuffer(t, c, 1<<16)
	offs := body[wire.AllocBlocksResponse](t, c.call(&wire.AllocBlocksRequest{N: 3, Size: 16384})).Offsets
	batch := body[wire.AllocBatchResponse](t, c.call(&wire.AllocBatchRequest{Capacity: 1})).Batch
	r := c.call(&wire.SubmitRequest{Batch: batch, Requests: []xfer.Request{
		{Op: xfer.OpWrite, Local: seg, Target: testPoolID, TargetOffset: offs[1], Length: hangLength}}})
	if body[wire.SubmitResponse](t, r).Codes[0] != tcproto.CodeOK {
		t.Fatalf("submit %+v", body[wire.SubmitResponse](t, r).Codes)
	}
	c.uc.Close()
	// Once the connection's release has returned, only the transfer's end
	// can free the block it holds.
	e.waitReleased()
	if n := e.pool.Stats().Blocks; n != 1 {
		t.Fatalf("%d blocks after the connection's release, want only the one in flight", n)
	}
	h.Finish()
	e.waitIdle()
}
