package control

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"
	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

const (
	testPoolID  = xfer.SegmentID(1)
	testPoolSz  = 16 << 20
	testMinBlk  = 4 << 10
	testMaxBlk  = 1 << 20
	hangLength  = 12345 // requests of this length never end until canceled
	testTimeout = 10 * time.Second
)

// env is a server on the real pool, registry and engine.
type env struct {
	t      testing.TB
	dir    string
	sock   string
	pool   *shm.Pool
	reg    *xfer.Registry
	eng    *xfer.Engine
	tr     xfer.Transport
	srv    *Server
	logBuf *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// hangTransport returns the transport of newEnv(t, true): it copies like
// the local transport, inside Submit, but holds every task of length
// hangLength until it is canceled or the transport closes (or Finish ends
// it, as completed, without moving its bytes).
func hangTransport() *xfertest.Transport {
	return xfertest.New(xfertest.Config{Name: "hang", Inline: true, CancelEnds: true,
		Hold: func(t *xfer.Task) bool { return t.Req.Length == hangLength },
		Move: func(t *xfer.Task) (uint64, error) {
			if t.Req.Length == hangLength { // a held task that Finish ends
				return t.Req.Length, nil
			}
			return xfertest.Copy(t)
		}})
}

// deafHang makes the env's hang transport ignore Cancel, so held tasks
// end only by Finish or Close, and returns it.
func (e *env) deafHang() *xfertest.Transport {
	h := e.tr.(*xfertest.Transport)
	h.Update(func(c *xfertest.Config) { c.CancelEnds = false })
	return h
}

type envOpt func(*Config, *Deps)

func newEnv(t testing.TB, hang bool, opts ...envOpt) *env {
	t.Helper()
	dir, err := os.MkdirTemp("", "tcctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, dir: dir, sock: filepath.Join(dir, "run", "d.sock"), logBuf: &syncBuffer{}}
	log := slog.New(slog.NewTextHandler(e.logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.pool, err = shm.NewPool(shm.PoolConfig{ID: testPoolID, Size: testPoolSz, Hugepages: shm.HugepagesOff,
		MinBlock: testMinBlk, MaxBlock: testMaxBlk}, log)
	if err != nil {
		t.Fatal(err)
	}
	e.reg = xfer.NewRegistry()
	if err := e.reg.Add(e.pool); err != nil {
		t.Fatal(err)
	}
	if hang {
		e.tr = hangTransport()
	} else {
		e.tr = xfer.NewLocal(xfer.LocalConfig{Workers: 1}, log)
	}
	e.eng = xfer.NewEngine(xfer.Config{}, xfertest.RouteAll(e.tr), log)
	cfg := Config{Socket: e.sock, DaemonID: "test-daemon", Version: "test", ReleaseWait: 100 * time.Millisecond}
	deps := Deps{Engine: e.eng, Pool: e.pool, Registry: e.reg}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	e.srv, err = NewServer(cfg, deps, log)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Start()
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	if err := e.srv.Close(); err != nil {
		e.t.Errorf("server close: %v", err)
	}
	e.eng.Close()
	e.tr.Close()
	if err := e.pool.Close(); err != nil {
		e.t.Errorf("pool close: %v", err)
	}
	if e.t.Failed() {
		e.t.Logf("server log:\n%s", e.logBuf.String())
	}
}

// waitIdle waits until the server holds nothing for any client: no
// connections, no pool blocks, only the pool registered, no batches.
func (e *env) waitIdle() {
	e.t.Helper()
	testutil.Eventually(e.t, testTimeout, func() bool {
		return e.srv.Connections() == 0 && e.pool.Stats().Blocks == 0 && e.reg.Len() == 1 && e.eng.Stats().BatchesLive == 0
	}, "everything released: conns %d, pool blocks %d, segments %d, batches %d", testutil.Lazy(e.srv.Connections),
		testutil.Lazy(func() any { return e.pool.Stats().Blocks }), testutil.Lazy(e.reg.Len),
		testutil.Lazy(func() any { return e.eng.Stats().BatchesLive }))
}

// waitReleased waits until the server serves no connection: each one
// served has then released what it held (a connection is counted until
// its release returns).
func (e *env) waitReleased() {
	e.t.Helper()
	testutil.Eventually(e.t, testTimeout, func() bool { return e.srv.Connections() == 0 },
		"no connection served (%d served)", testutil.Lazy(e.srv.Connections))
}

// rawClient speaks frames directly, for protocol edge cases.
type rawClient struct {
	t    testing.TB
	uc   *net.UnixConn
	b    *flatbuffers.Builder
	req  wire.Request
	resp wire.Response
	buf  []byte
	oob  []byte
	hdr  [wire.FrameHeader]byte
	id   uint64
}

func dialRaw(t testing.TB, path string) *rawClient {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{t: t, uc: c, b: flatbuffers.NewBuilder(256), oob: make([]byte, unix.CmsgSpace(4*8))}
	t.Cleanup(func() { c.Close() })
	// Tests that wait for an answer that never comes fail instead of hanging.
	c.SetReadDeadline(time.Now().Add(2 * time.Minute))
	return rc
}

func (c *rawClient) send(frame []byte, fds ...int) error {
	if len(fds) == 0 {
		_, err := c.uc.Write(frame)
		return err
	}
	_, _, err := c.uc.WriteMsgUnix(frame, unix.UnixRights(fds...), nil)
	return err
}

// waitConsumed waits until the server has read every byte sent so far:
// for a unix stream socket, SIOCOUTQ is what the peer has not consumed.
func (c *rawClient) waitConsumed() {
	c.t.Helper()
	raw, err := c.uc.SyscallConn()
	if err != nil {
		c.t.Fatal(err)
	}
	var n int
	testutil.Eventually(c.t, testTimeout, func() bool {
		var ierr error
		if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil || ierr != nil {
			c.t.Fatalf("SIOCOUTQ: %v %v", err, ierr)
		}
		return n == 0
	}, "the server reading every byte sent (%d unread)", testutil.Lazy(func() int { return n }))
}

// recv reads one response frame.
func (c *rawClient) recv() (*wire.Response, []int, error) { return c.recvMsg(false) }

// recvMsg reads one response frame and, with withFDs, the fds that came
// with it.
func (c *rawClient) recvMsg(withFDs bool) (*wire.Response, []int, error) {
	hdr := c.hdr[:]
	var n, oobn int
	var err error
	if withFDs {
		c.uc.SetReadDeadline(time.Now().Add(testTimeout))
		n, oobn, _, _, err = c.uc.ReadMsgUnix(hdr, c.oob)
	} else {
		n, err = c.uc.Read(hdr)
	}
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		fds, err = parseRights(c.oob[:oobn])
		if err != nil {
			return nil, nil, err
		}
	}
	if _, err := io.ReadFull(c.uc, hdr[n:]); err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	size := binary.LittleEndian.Uint32(hdr)
	if cap(c.buf) < int(size) {
		c.buf = make([]byte, size)
	}
	c.buf = c.buf[:size]
	if _, err := io.ReadFull(c.uc, c.buf); err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	if err := wire.DecodeResponse(c.buf, wire.DecodeLimits{}, &c.resp); err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	return &c.resp, fds, nil
}

// call sends body (with fds) and returns the answer; fds that come back
// are closed unless the caller asks for them with callFD.
func (c *rawClient) call(body wire.RequestBody, fds ...int) *wire.Response {
	c.t.Helper()
	return c.callCtx(wire.Context{}, body, fds...)
}

// callCtx is call with the request's context.
func (c *rawClient) callCtx(ctx wire.Context, body wire.RequestBody, fds ...int) *wire.Response {
	c.t.Helper()
	r, back := c.exchange(ctx, body, fds)
	closeFDs(back)
	return r
}

func (c *rawClient) callFD(body wire.RequestBody, fds ...int) (*wire.Response, []int) {
	c.t.Helper()
	return c.exchange(wire.Context{}, body, fds)
}

// send sends body under the next request id without reading the answer.
func (c *rawClient) sendBody(body wire.RequestBody, fds ...int) error {
	c.id++
	c.req.Ctx, c.req.Body = wire.Context{RequestID: c.id}, body
	return c.send(wire.EncodeRequest(c.b, &c.req), fds...)
}

func (c *rawClient) exchange(ctx wire.Context, body wire.RequestBody, fds []int) (*wire.Response, []int) {
	c.t.Helper()
	c.id++
	ctx.RequestID = c.id
	c.req.Ctx, c.req.Body = ctx, body
	if err := c.send(wire.EncodeRequest(c.b, &c.req), fds...); err != nil {
		c.t.Fatalf("send %s: %v", body.Kind(), err)
	}
	var withFD bool
	switch body.(type) {
	case *wire.PoolInfoRequest, *wire.OpenQueueRequest:
		withFD = true
	}
	r, back, err := c.recvMsg(withFD)
	if err != nil {
		c.t.Fatalf("recv for %s: %v", body.Kind(), err)
	}
	if r.RequestID != c.id {
		c.t.Fatalf("answer for request %d, want %d", r.RequestID, c.id)
	}
	return r, back
}

// expectClosed checks the server closed the connection.
func (c *rawClient) expectClosed() {
	c.t.Helper()
	c.uc.SetReadDeadline(time.Now().Add(testTimeout))
	var b [1]byte
	if _, err := c.uc.Read(b[:]); !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET) {
		c.t.Fatalf("connection not closed by the server: %v", err)
	}
}

func expectCode(t testing.TB, r *wire.Response, want Code) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("status %s (%q), want %s", r.Status, r.Message, want)
	}
}

// body returns r's body as a *T, failing the test when r is not an OK
// answer with one.
func body[T any, P interface {
	*T
	wire.ResponseBody
}](t testing.TB, r *wire.Response) P {
	t.Helper()
	p, ok := r.Body.(P)
	if !ok {
		t.Fatalf("answer %s (%s %q), want a %T", r.Kind(), r.Status, r.Message, p)
	}
	return p
}

func newMemfd(t testing.TB, size uint64) int {
	t.Helper()
	fd, err := shm.NewMemfd("test", size, true)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// runHelper is the body of a helper process (see helperEnv): a client that
// takes resources, reports, and waits to be killed or exits.
func runHelper(kind string) int {
	sock := os.Getenv("TENSORCAST_TEST_SOCKET")
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	rc := &rawClient{t: helperTB{}, uc: c, b: flatbuffers.NewBuilder(256), oob: make([]byte, unix.CmsgSpace(32))}
	switch kind {
	case "ping":
		// A refused peer is answered and closed before it sends: a failed
		// send is expected then, the answer is what counts.
		rc.sendBody(&wire.PingRequest{})
		r, _, err := rc.recv()
		if err != nil {
			fmt.Println("recv:", err)
			return 2
		}
		fmt.Println("status", r.Status.String())
		return 0
	case "hold":
		r := rc.call(&wire.AllocBlocksRequest{N: 8, Size: 16384})
		fmt.Println("alloc", r.Status.String(), len(body[wire.AllocBlocksResponse](rc.t, r).Offsets))
		off := body[wire.AllocBlocksResponse](rc.t, r).Offsets[0]
		fd, err := shm.NewMemfd("helper", 1<<20, true)
		if err != nil {
			fmt.Println("memfd:", err)
			return 2
		}
		r = rc.call(&wire.RegisterBufferRequest{Size: 1 << 20}, fd)
		unix.Close(fd)
		seg := body[wire.RegisterBufferResponse](rc.t, r).Segment
		fmt.Println("register", r.Status.String())
		r = rc.call(&wire.AllocBatchRequest{Capacity: 4})
		fmt.Println("batch", r.Status.String())
		r = rc.call(&wire.SubmitRequest{Batch: body[wire.AllocBatchResponse](rc.t, r).Batch, Requests: []xfer.Request{
			{Op: xfer.OpWrite, Local: xfer.SegmentID(seg), Target: testPoolID, TargetOffset: off, Length: 4096},
			{Op: xfer.OpWrite, Local: xfer.SegmentID(seg), Target: testPoolID, TargetOffset: off, Length: hangLength},
		}})
		fmt.Println("submit", r.Status.String(), len(body[wire.SubmitResponse](rc.t, r).Codes))
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n') // killed before this returns
		return 0
	}
	if kind == "tenant" {
		return runTenantHelper()
	}
	if kind == "segments" {
		r := rc.call(&wire.SegmentsRequest{})
		fmt.Println("status", r.Status.String())
		for _, s := range body[wire.SegmentsResponse](rc.t, r).Segments {
			fmt.Println("segment", string(s.Name))
		}
		return 0
	}
	if kind == "idem" {
		// A keyed call with the key and lane it is given.
		r := rc.callCtx(wire.Context{IdempotencyKey: []byte(os.Getenv("TC_KEY")), Lane: []byte(os.Getenv("TC_LANE"))},
			&wire.AllocBatchRequest{Capacity: 4})
		fmt.Println("status", r.Status.String())
		return 0
	}
	if kind == "idem-flood" {
		// TC_CONNS connections open at once, each sending TC_N keyed calls
		// with keys of its own.
		conns, _ := strconv.Atoi(os.Getenv("TC_CONNS"))
		n, _ := strconv.Atoi(os.Getenv("TC_N"))
		cs := []*rawClient{rc}
		for len(cs) < conns {
			uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
			if err != nil {
				fmt.Println("dial:", err)
				return 2
			}
			cs = append(cs, &rawClient{t: helperTB{}, uc: uc, b: flatbuffers.NewBuilder(256), oob: make([]byte, unix.CmsgSpace(32))})
		}
		for i, c := range cs {
			for j := range n {
				r := c.callCtx(wire.Context{IdempotencyKey: fmt.Appendf(nil, "flood-%d-%d", i, j)}, &wire.FreeBlocksRequest{})
				if r.Status != tcproto.CodeOK {
					fmt.Println("status", r.Status.String())
					return 2
				}
			}
		}
		fmt.Println("flooded")
		return 0
	}
	if strings.HasPrefix(kind, "queue-") {
		return runQueueHelper(kind)
	}
	if strings.HasPrefix(kind, "store-") {
		return runStoreHelper(kind)
	}
	fmt.Println("unknown helper", kind)
	return 2
}

// helperTB lets rawClient run outside a test: failures exit the process.
type helperTB struct{ testing.TB }

func (helperTB) Helper() {}
func (helperTB) Fatalf(f string, a ...any) {
	fmt.Printf(f+"\n", a...)
	os.Exit(2)
}
func (helperTB) Fatal(a ...any) {
	fmt.Println(a...)
	os.Exit(2)
}
func (helperTB) Cleanup(func()) {}
