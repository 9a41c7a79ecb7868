package client

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/control"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

const poolID = xfer.SegmentID(1)

type daemon struct {
	sock string
	pool *shm.Pool
	reg  *xfer.Registry
	eng  *xfer.Engine
	srv  *control.Server
}

// startDaemon runs a control server on the real pool, registry, engine and
// local transport.
func startDaemon(t testing.TB, cfgs ...func(*control.Config)) *daemon {
	t.Helper()
	return startDaemonOn(t, xfer.NewLocal(xfer.LocalConfig{Workers: 1}, slog.New(slog.DiscardHandler)), cfgs...)
}

// startDaemonOn runs a control server on the real pool, registry and
// engine, whose transfers all go to tr; the daemon closes tr.
func startDaemonOn(t testing.TB, tr xfer.Transport, cfgs ...func(*control.Config)) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "tccl")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	d := &daemon{sock: filepath.Join(dir, "d.sock")}
	d.pool, err = shm.NewPool(shm.PoolConfig{ID: poolID, Size: 32 << 20, Hugepages: shm.HugepagesOff}, log)
	if err != nil {
		t.Fatal(err)
	}
	d.reg = xfer.NewRegistry()
	d.reg.Add(d.pool)
	d.eng = xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(tr), log)
	cfg := control.Config{Socket: d.sock, DaemonID: "d-1", Version: "v-test"}
	for _, f := range cfgs {
		f(&cfg)
	}
	d.srv, err = control.NewServer(cfg, control.Deps{Engine: d.eng, Pool: d.pool, Registry: d.reg}, log)
	if err != nil {
		t.Fatal(err)
	}
	d.srv.Start()
	t.Cleanup(func() {
		d.srv.Close()
		d.eng.Close()
		tr.Close()
		d.pool.Close()
		os.RemoveAll(dir)
	})
	return d
}

// waitReleased waits until the daemon holds nothing for any client.
func (d *daemon) waitReleased(t testing.TB) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return d.srv.Connections() == 0 && d.pool.Stats().Blocks == 0 && d.reg.Len() == 1 && d.eng.Stats().BatchesLive == 0
	}, "everything released: conns %v blocks %v segments %v batches %v", testutil.Lazy(d.srv.Connections),
		testutil.Lazy(func() any { return d.pool.Stats().Blocks }), testutil.Lazy(d.reg.Len),
		testutil.Lazy(func() any { return d.eng.Stats().BatchesLive }))
}

// write4K registers a 4 KiB buffer and allocates a 4 KiB pool block on c,
// and returns the WRITE of the one into the other.
func write4K(tb testing.TB, c *Client) xfer.Request {
	tb.Helper()
	buf, err := c.RegisterBuffer(4096)
	if err != nil {
		tb.Fatal(err)
	}
	offs, err := c.AllocBlocks(nil, 1, 4096)
	if err != nil {
		tb.Fatal(err)
	}
	return xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: poolID, TargetOffset: offs[0], Length: 4096}
}

// TestRegisterBufferOnHugePages: a buffer's whole 2 MiB spans go on
// transparent huge pages, as the pool's do (shm's tests hold that the
// daemon's mapping of it then takes 2 MiB entries); the rest, and a buffer
// under 2 MiB, on normal pages. Its bytes start zero.
func TestRegisterBufferOnHugePages(t *testing.T) {
	d := startDaemon(t)
	c, err := Dial(d.sock, Options{Name: "thp"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct{ size, huge uint64 }{{5<<20 + 4<<10, 4 << 20}, {1 << 20, 0}} {
		buf, err := c.RegisterBuffer(tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if buf.Huge != tc.huge {
			if tc.huge != 0 && buf.Huge == 0 {
				testutil.Missing(t, testutil.THP, "a buffer of %d bytes has none on 2 MiB pages", tc.size)
			}
			t.Errorf("a buffer of %d bytes has %d on 2 MiB pages, want %d", tc.size, buf.Huge, tc.huge)
		}
		if i := slices.IndexFunc(buf.Mem, func(b byte) bool { return b != 0 }); i >= 0 {
			t.Errorf("byte %d of a new buffer of %d bytes is %d", i, tc.size, buf.Mem[i])
		}
		if err := c.UnregisterBuffer(buf.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEndToEnd(t *testing.T) {
	d := startDaemon(t)
	maps := mappings(t)
	c, err := Dial(d.sock, Options{Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Hello(); h.DaemonID != "d-1" || h.Version != "v-test" || h.ProtocolVersion != wire.ProtocolVersion {
		t.Fatalf("hello %+v", h)
	}
	pi, ok := c.Pool()
	if !ok || pi.Segment != poolID || pi.Size != 32<<20 || len(c.PoolBytes()) != 32<<20 || len(pi.BlockClasses) == 0 {
		t.Fatalf("pool %+v %v", pi, ok)
	}
	const size = 4 << 20
	buf, err := c.RegisterBuffer(size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf.Mem[:size/2] {
		buf.Mem[i] = byte(i ^ i>>9 ^ i>>17)
	}
	const blk = 256 << 10
	offs, err := c.AllocBlocks(nil, 8, blk)
	if err != nil {
		t.Fatal(err)
	}
	// Buffer → pool, one-shot.
	reqs := make([]xfer.Request, len(offs))
	for i, off := range offs {
		reqs[i] = xfer.Request{Op: xfer.OpWrite, Local: buf.ID, LocalOffset: uint64(i) * blk, Target: poolID, TargetOffset: off, Length: blk}
	}
	results := make([]error, len(reqs))
	sum, err := c.Transfer(reqs, 5*time.Second, results)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range results {
		if e != nil {
			t.Fatalf("transfer %d: %v", i, e)
		}
	}
	if sum.Completed != 8 || sum.Transferred != size/2 {
		t.Fatalf("summary %+v", sum)
	}
	// The client sees the bytes in place in its own pool mapping.
	pool := c.PoolBytes()
	for i, off := range offs {
		for j := uint64(0); j < blk; j++ {
			if pool[off+j] != buf.Mem[uint64(i)*blk+j] {
				t.Fatalf("block %d byte %d", i, j)
			}
		}
	}
	// Change the blocks in place, then pool → buffer with the batch calls.
	for _, off := range offs {
		for j := uint64(0); j < blk; j += 97 {
			pool[off+j]++
		}
	}
	batch, err := c.AllocBatch(len(offs))
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range offs {
		reqs[i] = xfer.Request{Op: xfer.OpRead, Local: buf.ID, LocalOffset: size/2 + uint64(i)*blk, Target: poolID, TargetOffset: off, Length: blk}
	}
	if err := c.Submit(batch, reqs, results); err != nil {
		t.Fatal(err)
	}
	for i, e := range results {
		if e != nil {
			t.Fatalf("submit %d: %v", i, e)
		}
	}
	sum, err = c.Wait(batch, 5*time.Second)
	if err != nil || sum.Completed != 8 {
		t.Fatalf("wait %+v %v", sum, err)
	}
	ts, err := c.TaskStatus(batch, 7)
	if err != nil || ts.State != xfer.StateCompleted || ts.Transferred != blk || ts.Err != nil {
		t.Fatalf("task status %+v %v", ts, err)
	}
	if _, err := c.TaskStatus(batch, 100); !errors.Is(err, ErrInvalidArgument) && !errors.Is(err, ErrNotFound) {
		t.Fatalf("task out of range: %v", err)
	}
	if bs, err := c.BatchStatus(batch); err != nil || bs.Total != 8 {
		t.Fatalf("batch status %+v %v", bs, err)
	}
	if err := c.FreeBatch(batch); err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < size/2; i++ {
		want := buf.Mem[i]
		if i%blk%97 == 0 {
			want++
		}
		if buf.Mem[size/2+i] != want {
			t.Fatalf("byte %d: %d, want %d", i, buf.Mem[size/2+i], want)
		}
	}
	st, err := c.Stats()
	if err != nil || st.Connections != 1 || len(st.Pool) == 0 || len(st.Engine) == 0 {
		t.Fatalf("stats %+v %v", st, err)
	}
	frees := make([]error, 2)
	if err := c.FreeBlocks([]uint64{offs[0], offs[0]}, frees); err != nil {
		t.Fatal(err)
	}
	if frees[0] != nil || !errors.Is(frees[1], ErrNotFound) {
		t.Fatalf("free results %v", frees)
	}
	if err := c.Ping([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after Close: %v", err)
	}
	d.waitReleased(t)
	if m := mappings(t); m != maps {
		t.Fatalf("%d memfd mappings after Close, %d before Dial", m, maps)
	}
}

func TestUnregisterAndIdempotency(t *testing.T) {
	d := startDaemon(t)
	c, err := Dial(d.sock, Options{NoPool: true, Lane: "stream-first", PolicyVersion: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.Pool(); ok || c.PoolBytes() != nil {
		t.Fatal("pool mapped with NoPool")
	}
	buf, err := c.RegisterBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UnregisterBuffer(buf.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.UnregisterBuffer(buf.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second unregister: %v", err)
	}
	a, err := c.AllocBlocks(nil, 2, 4096, WithIdempotencyKey("k1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AllocBlocks(nil, 2, 4096, WithIdempotencyKey("k1"))
	if err != nil || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("retry: %v %v (first %v)", b, err, a)
	}
	if _, err := c.AllocBlocks(nil, 2, 4096, WithIdempotencyKey("k1"), WithLane("catalog-first")); !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("same key, other lane: %v", err)
	}
	if d.pool.Stats().Blocks != 2 {
		t.Fatalf("%d blocks", d.pool.Stats().Blocks)
	}
	if _, _, err := c.RegisterFile("/nonexistent", false, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("register file without an opener: %v", err)
	}
	if _, err := c.RegisterFD(-1, 10); err == nil {
		t.Fatal("bad fd accepted")
	}
}

func TestDialErrors(t *testing.T) {
	_, err := Dial("/nonexistent/tensorcastd.sock", Options{})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/tensorcastd.sock") {
		t.Fatalf("dial error does not name the socket: %v", err)
	}
	d := startDaemon(t, func(c *control.Config) { c.DeniedUIDs = []uint32{uint32(os.Getuid())} })
	if _, err := Dial(d.sock, Options{}); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("refused peer: %v", err)
	}
}

// fakeDaemon answers Hello, then each later request with answer(req),
// which may block until the test lets it answer.
func fakeDaemon(t *testing.T, answer func(*wire.Request) wire.Response) string {
	t.Helper()
	return fakeDaemonFD(t, func(m *wire.Request) (wire.Response, int) { return answer(m), -1 }, nil)
}

// fakeDaemonFD is fakeDaemon whose answers may carry an fd (passed with
// SCM_RIGHTS, then closed here, and then a token sent on closed if it is
// not nil; -1: none).
func fakeDaemonFD(t *testing.T, answer func(*wire.Request) (wire.Response, int), closed chan<- struct{}) string {
	t.Helper()
	return fakeDaemonAll(t, func(m *wire.Request) (wire.Response, int) {
		if _, hello := m.Body.(*wire.HelloRequest); hello {
			return wire.Response{Body: &wire.HelloResponse{DaemonID: []byte("fake")}}, -1
		}
		return answer(m)
	}, closed)
}

// fakeDaemonAll is fakeDaemonFD whose answer says Hello too.
func fakeDaemonAll(t *testing.T, answer func(*wire.Request) (wire.Response, int), closed chan<- struct{}) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tcfake")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "f.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				serveFake(c, answer, closed)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close() // the connections end with their clients
		wg.Wait()
		os.RemoveAll(dir)
	})
	return sock
}

// answerToNone is an answer's RequestID that serveFake sends as 0 (one
// left 0 answers the request read).
const answerToNone = ^uint64(0)

func serveFake(c net.Conn, answer func(*wire.Request) (wire.Response, int), closed chan<- struct{}) {
	defer c.Close()
	b := flatbuffers.NewBuilder(0)
	var m wire.Request
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if err := wire.DecodeRequest(body, wire.DecodeLimits{}, &m); err != nil {
			return
		}
		r, fd := answer(&m)
		switch r.RequestID {
		case 0:
			r.RequestID = m.Ctx.RequestID
		case answerToNone:
			r.RequestID = 0
		}
		frame := wire.EncodeResponse(b, &r)
		var err error
		if fd >= 0 {
			_, _, err = c.(*net.UnixConn).WriteMsgUnix(frame, unix.UnixRights(fd), nil)
			unix.Close(fd)
			if closed != nil {
				closed <- struct{}{}
			}
		} else {
			_, err = c.Write(frame)
		}
		if err != nil {
			return
		}
	}
}

// TestRefusedAnswerFDClosed: an error answer that comes with an fd (to
// OpenQueue, whose answer carries one, and to PoolInfo's) fails the call,
// and the fd it brought is closed, not kept.
func TestRefusedAnswerFDClosed(t *testing.T) {
	closed := make(chan struct{}, 4)
	sock := fakeDaemonFD(t, func(m *wire.Request) (wire.Response, int) {
		fd, err := shm.NewMemfd("refused-answer", 4096, true)
		if err != nil {
			t.Error(err)
			return wire.Response{Status: tcproto.CodeINTERNAL}, -1
		}
		return wire.Response{Status: tcproto.CodeRESOURCE_EXHAUSTED, Message: []byte("no")}, fd
	}, closed)
	held := func() int {
		t.Helper()
		<-closed // the fake's own copy
		fds, err := testutil.HandleFDs()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range fds {
			if strings.Contains(f, "refused-answer") {
				n++
			}
		}
		return n
	}
	// Dial maps the pool: its PoolInfo is refused.
	if c, err := Dial(sock, Options{Name: "refused", CallTimeout: 5 * time.Second}); !errors.Is(err, ErrResourceExhausted) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial whose PoolInfo is refused: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d fds of a refused PoolInfo answer kept", n)
	}
	c, err := Dial(sock, Options{Name: "refused", CallTimeout: 5 * time.Second, NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.OpenQueue(64); !errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("OpenQueue refused: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d fds of a refused OpenQueue answer kept", n)
	}
}

// TestPositionalMismatch: an answer whose per-item count differs from the
// request's fails the whole call, never succeeds, and closes the client.
func TestPositionalMismatch(t *testing.T) {
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}, {Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}}
	cases := []struct {
		name string
		ans  wire.Response
		call func(c *Client) error
	}{
		{"submit one code for two", wire.Response{Body: &wire.SubmitResponse{Codes: []wire.Code{0}}},
			func(c *Client) error { return c.Submit(1, reqs, make([]error, 2)) }},
		{"submit three codes for two", wire.Response{Body: &wire.SubmitResponse{Codes: []wire.Code{0, 0, 0}}},
			func(c *Client) error { return c.Submit(1, reqs, make([]error, 2)) }},
		{"transfer codes short", wire.Response{Body: &wire.TransferResponse{Codes: []wire.Code{0},
			States: []tcproto.TaskState{3, 3}}},
			func(c *Client) error { _, err := c.Transfer(reqs, 0, make([]error, 2)); return err }},
		{"transfer states short", wire.Response{Body: &wire.TransferResponse{Codes: []wire.Code{0, 0},
			States: []tcproto.TaskState{3}}},
			func(c *Client) error { _, err := c.Transfer(reqs, 0, make([]error, 2)); return err }},
		{"free blocks short", wire.Response{Body: &wire.FreeBlocksResponse{}},
			func(c *Client) error { return c.FreeBlocks([]uint64{0, 1}, make([]error, 2)) }},
		{"alloc blocks short", wire.Response{Body: &wire.AllocBlocksResponse{Offsets: []uint64{0}}},
			func(c *Client) error { _, err := c.AllocBlocks(nil, 2, 4096); return err }},
		{"wrong body", wire.Response{Body: &wire.PingResponse{}},
			func(c *Client) error { _, err := c.AllocBatch(1); return err }},
		{"wrong request id", wire.Response{RequestID: 999, Body: &wire.AllocBatchResponse{}},
			func(c *Client) error { _, err := c.AllocBatch(1); return err }},
		// Request id 0 is for refusals only: an OK answer with it is none.
		{"ok answer to request id 0", wire.Response{RequestID: answerToNone, Body: &wire.AllocBatchResponse{}},
			func(c *Client) error { _, err := c.AllocBatch(1); return err }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeDaemon(t, func(*wire.Request) wire.Response { return tc.ans })
			c, err := Dial(sock, Options{NoPool: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := tc.call(c); !errors.Is(err, ErrProtocol) {
				t.Fatalf("got %v, want ErrProtocol", err)
			}
			if err := c.Ping(nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("client still used after a protocol violation: %v", err)
			}
		})
	}
	// The matching count is a success, with per-item errors in place.
	sock := fakeDaemon(t, func(*wire.Request) wire.Response {
		return wire.Response{Body: &wire.SubmitResponse{Codes: []wire.Code{tcproto.CodeOK, tcproto.CodeNOT_FOUND}}}
	})
	c, err := Dial(sock, Options{NoPool: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res := make([]error, 2)
	if err := c.Submit(1, reqs, res); err != nil || res[0] != nil || !errors.Is(res[1], ErrNotFound) {
		t.Fatalf("submit: %v %v", err, res)
	}
}

// TestCallTimeoutLeavesLongCalls: with CallTimeout set, a call the daemon
// may hold by design (a Wait or Transfer up to its timeout, or up to the
// call's deadline, or the daemon's own default; a PollNotifications that
// waits) gets that long on top of CallTimeout, while every other call, and
// one the daemon holds past its own bound, still fails at the deadline.
func TestCallTimeoutLeavesLongCalls(t *testing.T) {
	const (
		callTimeout = 20 * time.Millisecond
		// late is when the fake daemon answers, after it read the request:
		// the daemon answering later than CallTimeout is what is tested.
		late = 400 * time.Millisecond
	)
	sock := fakeDaemon(t, func(m *wire.Request) wire.Response {
		<-time.After(late)
		switch m.Body.(type) {
		case *wire.WaitRequest:
			return wire.Response{Body: &wire.WaitResponse{Summary: Summary{Total: 1, Completed: 1}}}
		case *wire.TransferRequestBody:
			return wire.Response{Body: &wire.TransferResponse{Codes: []wire.Code{tcproto.CodeOK},
				States: []tcproto.TaskState{tcproto.TaskStateCOMPLETED}, Summary: Summary{Total: 1, Completed: 1}}}
		case *wire.PollNotificationsRequest:
			return wire.Response{Body: &wire.PollNotificationsResponse{}}
		}
		return wire.Response{Body: &wire.PingResponse{}}
	})
	reqs := []xfer.Request{{Op: xfer.OpWrite, Local: 2, Target: 1, Length: 1}}
	calls := []struct {
		name string
		ok   bool // answered late but within what the call allows
		call func(c *Client) error
	}{
		{"wait with a timeout", true, func(c *Client) error {
			s, err := c.Wait(1, 5*time.Second)
			if err == nil && s.Completed != 1 {
				err = fmt.Errorf("summary %+v", s)
			}
			return err
		}},
		{"transfer with no timeout: the daemon's default", true, func(c *Client) error {
			_, err := c.Transfer(reqs, 0, make([]error, 1))
			return err
		}},
		{"wait with no timeout but a deadline", true, func(c *Client) error {
			_, err := c.Wait(1, 0, WithDeadline(5*time.Second))
			return err
		}},
		{"poll waiting until the deadline", true, func(c *Client) error {
			_, err := c.PollNotifications(nil, 1, 0, WithDeadline(5*time.Second))
			return err
		}},
		{"ping", false, func(c *Client) error { return c.Ping(nil) }},
		{"wait past its own timeout", false, func(c *Client) error {
			_, err := c.Wait(1, 10*time.Millisecond)
			return err
		}},
		{"poll that does not wait", false, func(c *Client) error {
			_, err := c.PollNotifications(nil, 1, 0)
			return err
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Dial(sock, Options{NoPool: true, CallTimeout: callTimeout})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			err = tc.call(c)
			took := time.Since(start)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("answered after %v: %v", took, err)
			case tc.ok && took < late:
				t.Fatalf("answered after %v, before the daemon's late answer", took)
			case !tc.ok && !errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("after %v: %v, want the socket deadline to end it", took, err)
			case !tc.ok && took >= late:
				t.Fatalf("failed only after %v, when the late answer came", took)
			}
		})
	}
}

// TestSteadyStateAllocs: the hot calls allocate nothing once a client has
// made them, client and daemon together (both run in this process).
func TestSteadyStateAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are noisy with -short runs of other tests")
	}
	d := startDaemon(t)
	c, err := Dial(d.sock, Options{NoPool: true, CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reqs := []xfer.Request{write4K(t, c)}
	batch, err := c.AllocBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	res := make([]error, 1)
	if err := c.Submit(batch, reqs, res); err != nil || res[0] != nil {
		t.Fatal(err, res[0])
	}
	payload := []byte("0123456789abcdef")
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Wait", func() error { _, err := c.Wait(batch, time.Second); return err }},
		{"TaskStatus", func() error { _, err := c.TaskStatus(batch, 0); return err }},
		{"BatchStatus", func() error { _, err := c.BatchStatus(batch); return err }},
		{"Ping", func() error { return c.Ping(payload) }},
		{"Transfer", func() error { _, err := c.Transfer(reqs, time.Second, res); return err }},
	} {
		if err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if n := testing.AllocsPerRun(200, func() {
			if err := tc.call(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}); n != 0 {
			t.Errorf("%s: %v allocations per call", tc.name, n)
		}
	}
}

// TestCallContext: every call carries the context its options set: the
// client's default lane and policy version, or a call's own, which the
// daemon audits.
func TestCallContext(t *testing.T) {
	got := make(chan wire.Context, 2)
	sock := fakeDaemon(t, func(m *wire.Request) wire.Response {
		ctx := m.Ctx
		ctx.Lane = bytes.Clone(ctx.Lane)
		ctx.IdempotencyKey = bytes.Clone(ctx.IdempotencyKey)
		got <- ctx
		return wire.Response{Body: &wire.PingResponse{}}
	})
	c, err := Dial(sock, Options{NoPool: true, Lane: "stream-first", PolicyVersion: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(nil); err != nil {
		t.Fatal(err)
	}
	if ctx := <-got; string(ctx.Lane) != "stream-first" || ctx.PolicyVersion != 4 || ctx.DeadlineMS != 0 || ctx.QoS != 0 {
		t.Fatalf("default context %+v", ctx)
	}
	if err := c.Ping(nil, WithPolicyVersion(9), WithLane("catalog-first"), WithIdempotencyKey("k"),
		WithDeadline(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if ctx := <-got; string(ctx.Lane) != "catalog-first" || ctx.PolicyVersion != 9 || string(ctx.IdempotencyKey) != "k" ||
		ctx.DeadlineMS != 1500 {
		t.Fatalf("call's context %+v", ctx)
	}
}

// TestDialBoundedByDialTimeout: Dial's Hello is bounded by DialTimeout,
// not CallTimeout (a daemon slow to say hello, as on a loaded host, is
// not a failed call), and the calls after Dial are not bounded by the
// dial's deadline.
func TestDialBoundedByDialTimeout(t *testing.T) {
	// How late the fake daemon answers a Hello and a Ping: what is
	// tested, not waits for an event.
	const helloLate, pingLate = 100 * time.Millisecond, 400 * time.Millisecond
	sock := fakeDaemonAll(t, func(m *wire.Request) (wire.Response, int) {
		r, late := wire.Response{Body: &wire.PingResponse{}}, pingLate
		if _, hello := m.Body.(*wire.HelloRequest); hello {
			r, late = wire.Response{Body: &wire.HelloResponse{DaemonID: []byte("slow")}}, helloLate
		}
		<-time.After(late)
		return r, -1
	}, nil)

	c, err := Dial(sock, Options{NoPool: true, CallTimeout: 10 * time.Millisecond, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("a hello later than CallTimeout but within DialTimeout: %v", err)
	}
	if err := c.Ping(nil); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a ping later than CallTimeout: %v, want a deadline error", err)
	}
	c.Close()

	// The ping ends past the dial's deadline: it would fail if Dial had
	// left that deadline on the socket.
	c, err = Dial(sock, Options{NoPool: true, DialTimeout: helloLate + 200*time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(nil); err != nil {
		t.Fatalf("a call after Dial, with no CallTimeout: %v", err)
	}
}
