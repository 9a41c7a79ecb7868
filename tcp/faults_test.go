package tcp

import (
	"bytes"
	crand "crypto/rand"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// fakePeer speaks the handshake and the open call like a real daemon,
// then answers data requests the way a test scripts it.
type fakePeer struct {
	t      *testing.T
	ln     net.Listener
	id     string
	epoch  uint64
	hsKey  []byte
	tokKey []byte
	// answer handles one data request or notification; it may write
	// anything back. Returning false closes the connection.
	answer  func(c net.Conn, h header, payload []byte) bool
	payload atomic.Int64 // data payload bytes received
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newFakePeer(t *testing.T, id string, key []byte, answer func(net.Conn, header, []byte) bool) *fakePeer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePeer{t: t, ln: ln, id: id, epoch: 0xfeed, hsKey: deriveKey(key, "tensorcast handshake v1"),
		tokKey: deriveKey(key, "tensorcast token v1"), answer: answer}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakePeer) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakePeer) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			f.serve(c)
		}()
	}
}

func readFrame(r io.Reader) (header, []byte, []byte, error) {
	var hb [hdrLen]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return header{}, nil, nil, err
	}
	h, err := decodeHeader(hb[:], limits{maxPayload: 64 << 20, maxMeta: 8192})
	if err != nil {
		return h, nil, nil, err
	}
	meta := make([]byte, h.metaLen)
	if _, err := io.ReadFull(r, meta); err != nil {
		return h, nil, nil, err
	}
	payload := make([]byte, h.payloadLen())
	if _, err := io.ReadFull(r, payload); err != nil {
		return h, nil, nil, err
	}
	return h, meta, payload, nil
}

func (f *fakePeer) serve(c net.Conn) {
	h, meta, _, err := readFrame(c)
	if err != nil || h.typ != tHello {
		return
	}
	hs := hello{id: f.id, epoch: f.epoch, addr: f.ln.Addr().String(), maxFrame: 64 << 20, window: 1 << 40}
	_, _ = crand.Read(hs.nonce[:])
	metaS := hs.append(nil)
	reply := append(append([]byte(nil), metaS...), handshakeMAC(f.hsKey, labelServer, meta, metaS)...)
	_ = writeRaw(c, &header{typ: tHelloReply, metaLen: uint16(len(reply))}, reply)
	if h, _, _, err = readFrame(c); err != nil || h.typ != tAuth {
		return
	}
	_ = writeRaw(c, &header{typ: tAuthOK}, nil)
	for {
		h, meta, payload, err := readFrame(c)
		if err != nil {
			return
		}
		f.payload.Add(int64(len(payload)))
		if h.typ == tOpenReq {
			tok := (&token{access: Access{Name: string(meta)}, rights: Rights(h.flags), expiry: time.Now().Add(time.Hour).UnixNano(),
				issuer: f.id, epoch: f.epoch}).sign(f.tokKey)
			_ = writeRaw(c, &header{typ: tOpenResp, id: h.id, arg: 64 << 20, metaLen: uint16(len(tok))}, tok)
			continue
		}
		if !f.answer(c, h, payload) {
			return
		}
	}
}

func TestMisbehavingPeerDropsConnection(t *testing.T) {
	key := []byte("cluster-secret")
	cases := []struct {
		name   string
		op     xfer.Op
		answer func(net.Conn, header, []byte) bool
		reason string
	}{
		{"unknown request id", xfer.OpWrite, func(c net.Conn, h header, _ []byte) bool {
			_ = writeRaw(c, &header{typ: tWriteResp, id: h.id + 1000, n: h.n}, nil)
			return true
		}, "names unknown request"},
		{"count mismatch", xfer.OpWrite, func(c net.Conn, h header, _ []byte) bool {
			_ = writeRaw(c, &header{typ: tWriteResp, id: h.id, n: h.n - 1}, nil)
			return true
		}, "counts"},
		{"read count mismatch", xfer.OpRead, func(c net.Conn, h header, _ []byte) bool {
			_ = writeRaw(c, &header{typ: tReadResp, id: h.id, n: h.n + 1}, nil)
			return true
		}, "counts"},
		{"malformed frame", xfer.OpWrite, func(c net.Conn, h header, _ []byte) bool {
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n0123"))
			return true
		}, "bad magic"},
		{"oversized length", xfer.OpRead, func(c net.Conn, h header, _ []byte) bool {
			b := make([]byte, hdrLen)
			putHeader(b, &header{typ: tReadResp, id: h.id, n: 1 << 30})
			_, _ = c.Write(b)
			return true
		}, "exceeds"},
		{"wrong answer type", xfer.OpWrite, func(c net.Conn, h header, _ []byte) bool {
			_ = writeRaw(c, &header{typ: tNotifyAck, id: h.id}, nil)
			return true
		}, "answer type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kf := testutil.KeyFile(t, dir, "k", string(key))
			a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: 1, SliceSize: 64 << 10})
			b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf})
			b.exp.add("seg", xfertest.NewSegment(5, 1<<20))
			link(t, a, b)
			fake := newFakePeer(t, "evil", key, tc.answer)
			if err := a.Directory().Update(dirPeer("evil", fake.ln.Addr().String())); err != nil {
				t.Fatal(err)
			}
			r, err := a.Open("evil", "seg", RightRead|RightWrite)
			if err != nil {
				t.Fatal(err)
			}
			local := xfertest.NewSegment(1, 1<<20)
			col := xfertest.NewRecorder()
			d := submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, tc.op, local, 0, r, 0, 1000)}, 5*time.Second)[0]
			if !errors.Is(d.Err, ErrConnLost) {
				t.Fatalf("task ended with %v, want a lost connection", d.Err)
			}
			a.logs.waitContains(t, "dropping peer connection")
			a.logs.waitContains(t, tc.reason)
			// The node serves on: a real peer still works.
			rb, err := a.Open("b", "seg", RightWrite)
			if err != nil {
				t.Fatal(err)
			}
			if d := submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, rb, 0, 200<<10)}, 5*time.Second)[0]; d.Err != nil {
				t.Fatalf("write to a good peer after the drop: %v", d.Err)
			}
			for _, p := range a.Peers() {
				if p.ID == "evil" && p.Errors == 0 {
					t.Fatalf("the drop was not counted: %+v", p)
				}
			}
		})
	}
}

func dirPeer(id, addr string) directory.Peer { return directory.Peer{ID: id, Addr: addr} }

// rawClient lists daemon id in n's directory, handshakes with n as that
// id and returns the plain connection.
func rawClient(t *testing.T, n *testNode, key []byte, id string) net.Conn {
	t.Helper()
	if err := n.Directory().Update(dirPeer(id, "127.0.0.1:1")); err != nil {
		t.Fatal(err)
	}
	c, h, meta := rawHandshake(t, n, key, id, 42)
	if h.typ != tAuthOK {
		t.Fatalf("auth: frame %d (%s)", h.typ, meta)
	}
	return c
}

// rawHandshake runs the dialing side of the handshake with n as daemon id
// at epoch, with the right cluster key, and returns the connection and
// the frame that ends the handshake (tAuthOK, or tRefuse with its reason).
func rawHandshake(t *testing.T, n *testNode, key []byte, id string, epoch uint64) (net.Conn, header, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	hk := deriveKey(key, "tensorcast handshake v1")
	hc := hello{id: id, epoch: epoch, addr: "127.0.0.1:1", maxFrame: 1 << 20, window: 4 << 20}
	metaC := hc.append(nil)
	_ = writeRaw(c, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC)
	h, meta, _, err := readFrame(c)
	if err != nil || h.typ != tHelloReply {
		t.Fatalf("hello reply: %v %v", h.typ, err)
	}
	_ = writeRaw(c, &header{typ: tAuth, metaLen: macLen}, handshakeMAC(hk, labelClient, metaC, meta[:len(meta)-macLen]))
	h, meta, _, err = readFrame(c)
	if err != nil {
		t.Fatalf("auth: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, h, meta
}

func TestServerDropsBadClients(t *testing.T) {
	key := []byte("cluster-secret")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, SliceSize: 64 << 10, HandshakeTimeout: 300 * time.Millisecond})
	seg := xfertest.NewSegment(5, 4<<20)
	b.exp.add("seg", seg)
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf})
	link(t, a, b)

	// Garbage before any handshake.
	g, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789"))
	b.logs.waitContains(t, "bad magic")
	g.Close()

	// A connection that never says hello.
	g, _ = net.Dial("tcp", b.Addr())
	b.logs.waitContains(t, "handshake timed out")
	_ = g.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := g.Read(make([]byte, 1)); err == nil {
		t.Fatal("silent connection still open")
	}
	g.Close()

	// A request before authentication.
	g, _ = net.Dial("tcp", b.Addr())
	_ = writeRaw(g, &header{typ: tOpenReq, flags: 1, metaLen: 3}, []byte("seg"))
	b.logs.waitContains(t, "before hello")
	g.Close()

	// An authenticated client claiming an oversized read.
	c := rawClient(t, b, key, "mallory")
	hb := make([]byte, hdrLen)
	putHeader(hb, &header{typ: tReadReq, id: 1, n: 1 << 30, metaLen: 40})
	_, _ = c.Write(append(hb, make([]byte, 40)...))
	b.logs.waitContains(t, "outside 1..")

	// An authenticated client that never reads its answers exceeds its
	// flow-control window and is dropped.
	c = rawClient(t, b, key, "hog")
	tok := (&token{access: Access{Name: "seg"}, rights: RightRead, expiry: time.Now().Add(time.Hour).UnixNano(), issuer: "b", epoch: b.Epoch()}).
		sign(deriveKey(key, "tensorcast token v1"))
	go func() {
		for i := 0; i < 2000; i++ {
			if writeRaw(c, &header{typ: tReadReq, id: uint64(i + 1), n: 64 << 10, metaLen: uint16(len(tok))}, tok) != nil {
				return
			}
		}
	}()
	b.logs.waitContains(t, "flow-control window")
	testutil.Eventually(t, 3*time.Second, func() bool { return seg.Refs() == 0 },
		"segment refs %v after the drop", testutil.Lazy(seg.Refs))

	// The node serves on.
	r, err := a.Open("b", "seg", RightRead)
	if err != nil {
		t.Fatal(err)
	}
	col := xfertest.NewRecorder()
	local := xfertest.NewSegment(1, 1<<20)
	if d := submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpRead, local, 0, r, 0, 1<<20)}, 5*time.Second)[0]; d.Err != nil {
		t.Fatalf("read after the bad clients: %v", d.Err)
	}
}

// TestUnauthenticatedDropsRateLimited: anyone on the network can connect to
// the peer port, so the drops of connections that never authenticated are
// logged once per kind and counted, not once each.
func TestUnauthenticatedDropsRateLimited(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "cluster-secret")
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf})
	garbage := bytes.Repeat([]byte{0xff}, hdrLen)
	for i := 0; i < 5; i++ {
		g, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = g.Write(garbage)
		_ = g.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, g) // returns once b closes the connection
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection %d: garbage not dropped within 5 s", i)
		}
		g.Close()
	}
	logs := b.logs.String()
	if n := strings.Count(logs, "malformed frame before authentication"); n != 1 {
		t.Fatalf("5 malformed connections logged %d times, want once:\n%s", n, logs)
	}
	if strings.Contains(logs, "dropping peer connection") {
		t.Fatalf("an unauthenticated drop logged as a peer's:\n%s", logs)
	}
}

func TestNotificationOnBrokenConnectionFails(t *testing.T) {
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: 1})
	fake := newFakePeer(t, "cutter", key, func(c net.Conn, h header, _ []byte) bool {
		if h.typ == tNotify {
			return false // hang up instead of acknowledging
		}
		_ = writeRaw(c, &header{typ: tWriteResp, id: h.id, n: h.n}, nil)
		return true
	})
	_ = a.Directory().Update(dirPeer("cutter", fake.ln.Addr().String()))
	r, err := a.Open("cutter", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 1<<20)
	col := xfertest.NewRecorder()
	tk := mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	tk.Notify, tk.Deadline = []byte("ready"), time.Now().Add(3*time.Second)
	start := time.Now()
	d := submitWait(t, a.Node, col, []*xfer.Task{tk}, 5*time.Second)[0]
	if !errors.Is(d.Err, ErrConnLost) || time.Since(start) > 2*time.Second {
		t.Fatalf("notification over a broken connection ended with %v after %v", d.Err, time.Since(start))
	}
	p := a.peer("cutter", false)
	p.mu.Lock()
	conns, queued := len(p.sess), len(p.queued)
	p.mu.Unlock()
	if queued != 0 || conns != 0 {
		t.Fatalf("left behind: %d queued tasks, %d connections", queued, conns)
	}
}

func TestFlowControlBoundsInflight(t *testing.T) {
	key := []byte("k")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	const slice = 64 << 10
	a := startNode(t, Config{DaemonID: "a", ClusterKeyFile: kf, ConnsPerPeer: 2, SliceSize: slice,
		MaxInflightBytes: 2 * slice, MaxPeerInflightBytes: 3 * slice, RequestTimeout: 800 * time.Millisecond})
	fake := newFakePeer(t, "sink", key, func(net.Conn, header, []byte) bool { return true }) // never answers
	_ = a.Directory().Update(dirPeer("sink", fake.ln.Addr().String()))
	r, err := a.Open("sink", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 4<<20)
	col := xfertest.NewRecorder()
	tasks := []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r, 0, 2<<20), mkTask(col, xfer.OpWrite, local, 0, r, 0, 2<<20)}
	start := time.Now()
	res := make(chan error, 1)
	go func() { _, err := a.Submit(tasks); res <- err }()
	// The sender stops at the window: a waits for credit with the peer's
	// window in flight, and the peer receives that much, no more.
	pa := a.peer("sink", false)
	inflight := func() int64 {
		pa.mu.Lock()
		defer pa.mu.Unlock()
		if pa.wake == nil {
			return -1 // not waiting for credit
		}
		return pa.inflight
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return inflight() == 3*slice },
		"a waiting for credit with the window of %d in flight (in flight now: %v, -1 when not waiting)", 3*slice, testutil.Lazy(inflight))
	testutil.Eventually(t, 5*time.Second, func() bool { return fake.payload.Load() >= 3*slice },
		"the peer receiving the window of %d bytes (received: %v)", 3*slice, testutil.Lazy(fake.payload.Load))
	if got := fake.payload.Load(); got != 3*slice {
		t.Fatalf("peer received %d payload bytes while nothing was answered, want the window of %d", got, 3*slice)
	}
	for _, d := range col.Next(t, 2, 5*time.Second) {
		if d.Err == nil {
			t.Fatal("task against a silent peer succeeded")
		}
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("silent peer held tasks for %v", el)
	}
	a.logs.waitContains(t, "got no answer within")
}

func TestPeerKilledMidTransferAndRestarted(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "secret")
	cfg := Config{ClusterKeyFile: kf, RequestTimeout: 2 * time.Second, SliceSize: 256 << 10}
	ca, cb := cfg, cfg
	ca.DaemonID, cb.DaemonID = "a", "b"
	a := startNode(t, ca)
	b := startNode(t, cb)
	bseg := xfertest.NewSegment(7, 64<<20)
	b.exp.add("seg", bseg)
	link(t, a, b)
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 64<<20)
	col := xfertest.NewRecorder()
	var tasks []*xfer.Task
	for i := 0; i < 32; i++ {
		tasks = append(tasks, mkTask(col, xfer.OpWrite, local, uint64(i)*(2<<20), r, uint64(i)*(2<<20), 2<<20))
	}
	// The first write b serves stalls the event loop serving it (the
	// exporter's Lookup sleeps): b dies with that loop's requests in
	// flight, however fast the rest went.
	b.exp.stall.Store(int64(time.Second))
	go func() {
		select {
		case <-b.exp.stalled:
		case <-time.After(10 * time.Second): // the wait for the tasks below fails the test
		}
		b.Close()
	}()
	start := time.Now()
	if k, err := a.Submit(tasks); k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d %v", k, err)
	}
	var failed int
	for _, d := range col.Next(t, len(tasks), 10*time.Second) {
		if d.Err != nil {
			failed++
			if !errors.Is(d.Err, ErrConnLost) && !errors.Is(d.Err, xfer.ErrTimeout) {
				t.Fatalf("unexpected error %v", d.Err)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no task failed although the peer died mid-transfer")
	}
	if el := time.Since(start); el > cfg.RequestTimeout+2*time.Second {
		t.Fatalf("tasks took %v to end", el)
	}
	if bseg.Refs() != 0 {
		t.Fatalf("dead peer's segment refs %d", bseg.Refs())
	}
	// Restart with a new epoch on the same address.
	cb.Listen = b.Addr()
	b2 := startNode(t, cb)
	link(t, a, b2)
	b2.exp.add("seg", xfertest.NewSegment(8, 64<<20))
	old := mkTask(col, xfer.OpWrite, local, 0, r, 0, 4096)
	d := submitWait(t, a.Node, col, []*xfer.Task{old}, 5*time.Second)[0]
	if !errors.Is(d.Err, xfer.ErrPermission) {
		t.Fatalf("old token against the new epoch: %v", d.Err)
	}
	b2.logs.waitContains(t, "current epoch")
	r2, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Epoch() != b2.Epoch() || r.Epoch() == r2.Epoch() {
		t.Fatalf("epochs old %#x new %#x b2 %#x", r.Epoch(), r2.Epoch(), b2.Epoch())
	}
	fill(rand.New(rand.NewPCG(1, 2)), local.Bytes()[:8<<20])
	if d := submitWait(t, a.Node, col, []*xfer.Task{mkTask(col, xfer.OpWrite, local, 0, r2, 0, 8<<20)}, 10*time.Second)[0]; d.Err != nil {
		t.Fatal(d.Err)
	}
	if crc(b2.exp.segs["seg"].Bytes()[:8<<20]) != crc(local.Bytes()[:8<<20]) {
		t.Fatal("data differs after reconnect")
	}
	if p := a.Peers()[0]; p.Epoch != b2.Epoch() || !p.Connected {
		t.Fatalf("peer stats after restart %+v", p)
	}
}

func TestConnectionResetFailsOnlyItsRequests(t *testing.T) {
	// Tasks get 30 s, not startNode's 5: the test is about which tasks
	// fail, and under load (a soak beside it) 192 MiB through the three
	// healthy connections ran past 5 s ("no room toward peer b").
	nodes := cluster(t, []string{"a", "b"}, 64<<20, Config{SliceSize: 256 << 10, ConnsPerPeer: 4, RequestTimeout: 30 * time.Second})
	a, b := nodes[0], nodes[1]
	r, err := a.Open("b", "seg", RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 64<<20)
	col := xfertest.NewRecorder()
	var tasks []*xfer.Task
	for i := 0; i < 96; i++ {
		off := uint64(i%32) * (2 << 20)
		tasks = append(tasks, mkTask(col, xfer.OpWrite, local, off, r, off, 2<<20))
	}
	// The first write b serves holds the event loop serving it until a
	// has closed the connection below, so the requests on that loop's
	// connections wait there however fast the rest goes (and are not
	// answered before a's event loop has taken the close). Then the
	// connection with the oldest unanswered request is reset: a's socket
	// closes with SO_LINGER 0, so a loses what it had in flight there and
	// b sees a reset.
	hold := make(chan struct{})
	var release sync.Once
	defer release.Do(func() { close(hold) })
	b.exp.hold.Store(&hold)
	if k, err := a.Submit(tasks); k != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	pa := a.peer("b", false)
	testutil.Eventually(t, 10*time.Second, func() bool {
		// The connection with the oldest unanswered request is one the
		// stalled loop serves.
		pa.mu.Lock()
		defer pa.mu.Unlock()
		var best *conn
		oldest := time.Now().Add(-100 * time.Millisecond).UnixNano()
		for _, c := range pa.sess {
			for _, pd := range c.reqs {
				if pd.sent < oldest {
					oldest, best = pd.sent, c
				}
			}
		}
		if best != nil {
			_ = best.g.SetLinger(0)
			_ = best.g.Close()
		}
		return best != nil
	}, "a request waiting on the stalled event loop, to reset its connection")
	a.logs.waitContains(t, "closed with requests in flight")
	release.Do(func() { close(hold) })
	var failed int
	done := col.Next(t, len(tasks), 20*time.Second)
	for _, d := range done {
		if d.Err != nil {
			failed++
			if !errors.Is(d.Err, ErrConnLost) {
				t.Fatalf("task ended with %v", d.Err)
			}
		}
	}
	if failed == 0 || failed == len(tasks) {
		t.Fatalf("%d of %d tasks failed; want only those on the reset connection\na:\n%s\nb:\n%s", failed, len(tasks), a.logs.String(), b.logs.String())
	}
	a.logs.waitContains(t, "closed with requests in flight")
	// Afterwards every transfer works again.
	for _, d := range submitWait(t, a.Node, col, tasks[:8], 20*time.Second) {
		if d.Err != nil {
			t.Fatalf("after the reset: %v", d.Err)
		}
	}
	if b.exp.segs["seg"].Refs() != 0 {
		t.Fatal("segment refs leaked")
	}
}

func TestCloseRacingSubmit(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 16<<20, Config{SliceSize: 128 << 10, RequestTimeout: 10 * time.Second})
	a := nodes[0]
	r, err := a.Open("b", "seg", RightRead|RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	local := xfertest.NewSegment(1, 16<<20)
	var dispatched, doneCount atomic.Int64
	var mu sync.Mutex
	ends := map[*xfer.Task]int{}
	cc := xfertest.Func(func(tk *xfer.Task, _ uint64, err error) {
		mu.Lock()
		ends[tk]++
		mu.Unlock()
		doneCount.Add(1)
	})
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			// One READ and one WRITE of the goroutine in flight at a time:
			// each kind lands in one range (the READs in the local segment,
			// the WRITEs in the target), and two landing at once (on two
			// connections' event loops) would race on its bytes.
			var turn [2]chan struct{}
			var ccs [2]xfertest.Func
			for k := range turn {
				turn[k] = make(chan struct{}, 1)
				turn[k] <- struct{}{}
				ccs[k] = func(tk *xfer.Task, n uint64, err error) {
					cc.TaskDone(tk, n, err)
					turn[k] <- struct{}{}
				}
			}
			for i := 0; ; i++ {
				op := xfer.OpWrite
				if i%2 == 1 {
					op = xfer.OpRead
				}
				// READs land in the half of the goroutine's range that
				// WRITEs do not read: Submit returns before a task's bytes
				// have moved, so the two would otherwise overlap.
				off := uint64(g)*(4<<20) + uint64(i%2)*(2<<20)
				tk := &xfer.Task{Req: xfer.Request{Op: op, LocalOffset: off, TargetOffset: off, Length: 2 << 20},
					Local: local, Target: r}
				<-turn[i%2]
				tk.SetCompleter(ccs[i%2])
				k, err := a.Submit([]*xfer.Task{tk})
				dispatched.Add(int64(k))
				if k == 0 {
					if !errors.Is(err, xfer.ErrClosed) {
						t.Errorf("Submit refused with %v", err)
					}
					return
				}
			}
		}(g)
	}
	// Close while the goroutines submit: once each of them saw a task end
	// (the next of its tasks is then on its way), transfers are under way.
	testutil.Eventually(t, 10*time.Second, func() bool { return doneCount.Load() >= 8 },
		"8 tasks ended before Close (ended: %v)", testutil.Lazy(doneCount.Load))
	start := time.Now()
	a.Close()
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("Close took %v", el)
	}
	wg.Wait()
	if dispatched.Load() == 0 || doneCount.Load() != dispatched.Load() {
		t.Fatalf("dispatched %d, ended %d\n%s", dispatched.Load(), doneCount.Load(), a.logs.String())
	}
	for tk, k := range ends {
		if k != 1 {
			t.Fatalf("task %p ended %d times", tk, k)
		}
	}
	if a.active.Load() != 0 {
		t.Fatalf("active = %d after Close", a.active.Load())
	}
}

// TestOpenAskedAgainOnLostConnection: an open whose connection is lost
// before the owner answers (as when the owner restarted and this node has
// not yet read the old connection's end) is asked again on a new session
// and succeeds, instead of failing with ErrConnLost.
func TestOpenAskedAgainOnLostConnection(t *testing.T) {
	nodes := cluster(t, []string{"a", "b"}, 1<<20, Config{ConnsPerPeer: 1})
	a, b := nodes[0], nodes[1]
	// The open's Lookup at b waits until its connection has been reset.
	hold := make(chan struct{})
	var release sync.Once
	defer release.Do(func() { close(hold) })
	b.exp.hold.Store(&hold)
	type opened struct {
		r   *Remote
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		r, err := a.Open("b", "seg", RightRead)
		ch <- opened{r, err}
	}()
	testutil.Eventually(t, 10*time.Second, func() bool {
		pa := a.peer("b", false)
		if pa == nil {
			return false
		}
		pa.mu.Lock()
		defer pa.mu.Unlock()
		for _, c := range pa.sess {
			if len(c.reqs) > 0 {
				_ = c.g.SetLinger(0)
				_ = c.g.Close()
				return true
			}
		}
		return false
	}, "the open in flight, to reset its connection")
	a.logs.waitContains(t, "closed with requests in flight")
	release.Do(func() { close(hold) })
	got := <-ch
	if got.err != nil {
		t.Fatalf("open after its connection was lost: %v, want it asked again", got.err)
	}
	if got.r.Epoch() != b.Epoch() {
		t.Fatalf("opened at epoch %#x, b runs %#x", got.r.Epoch(), b.Epoch())
	}
}

// TestAuthThenResetKeepsServing: a listed peer with the cluster key sends
// its auth and its connection breaks before the answer is written (here
// the server's side of the socket is shut for writing just before, as a
// reset from the peer at that moment would leave it). The answer's write
// then fails, and gnet closes the connection inside the write, while the
// handshake is still being handled; what follows must not touch the
// closed connection (a panic there, on the event loop, ends the process).
func TestAuthThenResetKeepsServing(t *testing.T) {
	key := []byte("cluster-secret")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf})
	b.exp.add("seg", xfertest.NewSegment(5, 1<<20))
	if err := b.Directory().Update(dirPeer("m", "127.0.0.1:1")); err != nil {
		t.Fatal(err)
	}
	const conns = 5
	var broken atomic.Int32
	breakIt := func(c *conn) {
		if c.n == b.Node && broken.Load() < conns {
			_ = unix.Shutdown(c.fd, unix.SHUT_WR)
			broken.Add(1)
		}
	}
	beforeAuthOK.Store(&breakIt)
	t.Cleanup(func() { beforeAuthOK.Store(nil) })
	hk := deriveKey(key, "tensorcast handshake v1")
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		hc := hello{id: "m", epoch: 42, addr: "127.0.0.1:1", maxFrame: 1 << 20, window: 4 << 20}
		metaC := hc.append(nil)
		_ = writeRaw(c, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC)
		h, meta, _, err := readFrame(c)
		if err != nil || h.typ != tHelloReply {
			t.Fatalf("hello reply: frame %d, %v", h.typ, err)
		}
		_ = writeRaw(c, &header{typ: tAuth, metaLen: macLen}, handshakeMAC(hk, labelClient, metaC, meta[:len(meta)-macLen]))
		// The server answers nothing: its write failed, and it closed.
		if _, _, _, err := readFrame(c); err == nil {
			t.Fatalf("connection %d: an answer came over a connection whose write side was shut", i)
		}
		c.Close()
	}
	closed := func() int { return strings.Count(b.logs.String(), "inbound peer connection closed") }
	testutil.Eventually(t, 5*time.Second, func() bool { return closed() == conns },
		"every authenticated connection closed (%v of %d)", testutil.Lazy(closed), conns)
	if broken.Load() != conns || !strings.Contains(b.logs.String(), "writev") {
		t.Fatalf("%d of %d answers to an auth failed: the test did not test it:\n%s", broken.Load(), conns, b.logs)
	}
	beforeAuthOK.Store(nil)
	// The node serves on.
	c := rawClient(t, b, key, "honest")
	_ = writeRaw(c, &header{typ: tOpenReq, id: 1, flags: uint16(RightRead), metaLen: 3}, []byte("seg"))
	if h, _, _, err := readFrame(c); err != nil || h.typ != tOpenResp || h.status != stOK {
		t.Fatalf("open after the resets: frame %d status %d, %v", h.typ, h.status, err)
	}
}

// windowBound is the most a server connection keeps unsent before it drops
// its peer (checkWindow).
func windowBound(n *testNode) int64 { return 2*n.cfg.MaxInflightBytes + 64<<10 }

// TestWindowBoundsEveryAnswer: an authenticated peer that pipelines
// requests answered without a payload (here opens, each answered with a
// token) and never reads its socket is dropped once the answers it left
// unread pass the bound, as one that pipelines READs is.
func TestWindowBoundsEveryAnswer(t *testing.T) {
	key := []byte("cluster-secret")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, SliceSize: 64 << 10, MaxInflightBytes: 64 << 10})
	b.exp.add("seg", xfertest.NewSegment(5, 1<<20))
	c := rawClient(t, b, key, "hog")
	// 640 rounds of 1024 opens, 20 MiB of answers at least (a header and a
	// token each): far past the bound and the sockets' buffers, but an end
	// if the peer is never dropped.
	const batch, rounds = 1024, 640
	var reqs []byte
	hb := make([]byte, hdrLen)
	for i := range batch {
		putHeader(hb, &header{typ: tOpenReq, id: uint64(i + 1), flags: uint16(RightRead), metaLen: 3})
		reqs = append(append(reqs, hb...), "seg"...)
	}
	wrote := make(chan error, 1)
	go func() {
		for range rounds {
			if _, err := c.Write(reqs); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	if err := <-wrote; err == nil {
		t.Fatalf("a peer that never reads was not dropped (bound %d bytes unsent):\n%s", windowBound(b), b.logs)
	}
	b.logs.waitContains(t, "flow-control window")
}

// TestWindowBoundsExchangeAnswers: the answers of exchange handlers, which
// are written when the handler returns, not while a frame is handled,
// count against the bound too. The peer sends as many exchanges as run at
// once, their answers come when nothing more arrives, and the peer, which
// never reads, is dropped all the same.
func TestWindowBoundsExchangeAnswers(t *testing.T) {
	key := []byte("cluster-secret")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, SliceSize: 64 << 10, MaxInflightBytes: 64 << 10})
	entered, release := holdingHandler(t, b, "hold", make([]byte, MaxExchange), MaxExchangeHandlers)
	if MaxExchangeHandlers*MaxExchange < 2*windowBound(b) {
		t.Fatalf("%d answers of %d bytes do not pass the bound of %d twice over", MaxExchangeHandlers, MaxExchange, windowBound(b))
	}
	c := rawClient(t, b, key, "hog")
	// Little room in the kernel's buffers on both sides (the node's send
	// buffer would otherwise grow to megabytes), so that the answers stay
	// in the node's own buffer. The connection is open while it is among
	// the peer's inbound ones, under the peer's lock.
	if err := c.(*net.TCPConn).SetReadBuffer(4 << 10); err != nil {
		t.Fatal(err)
	}
	p := b.peer("hog", false)
	p.mu.Lock()
	for sc := range p.inbound {
		if err := syscall.SetsockoptInt(sc.fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<10); err != nil {
			t.Error(err)
		}
	}
	p.mu.Unlock()
	req := appendStr8(nil, "hold")
	for i := range MaxExchangeHandlers {
		if err := writeRaw(c, &header{typ: tExchReq, id: uint64(i + 1), metaLen: uint16(len(req))}, req); err != nil {
			t.Fatal(err)
		}
	}
	for range MaxExchangeHandlers {
		<-entered
	}
	close(release)
	b.logs.waitContains(t, "flow-control window")
}

// TestRefusalsBeforeAuthRateLimited: anyone on the network can connect and
// send a refusal with up to 8 KiB of text. Before hello it is out of order
// (a drop); after our hello (a dialer that refuses it) it is logged. Either
// way, before authentication, it goes through the refusal log, once per
// kind and counted, and the text logged is cut to maxRefuseReason bytes;
// an authenticated peer's refusal is logged each time, cut the same.
func TestRefusalsBeforeAuthRateLimited(t *testing.T) {
	key := []byte("cluster-secret")
	kf := testutil.KeyFile(t, t.TempDir(), "k", string(key))
	b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf})
	long := bytes.Repeat([]byte("A"), 8000)
	refuse := func(c net.Conn) {
		t.Helper()
		_ = writeRaw(c, &header{typ: tRefuse, metaLen: uint16(len(long))}, long)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(io.Discard, c) // returns once b closes the connection
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("a refusal did not end the connection within 5 s")
		}
		c.Close()
	}
	const conns = 5
	for range conns {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		refuse(c)
	}
	for range conns {
		c, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		hc := hello{id: "m", epoch: 42, addr: "127.0.0.1:1", maxFrame: 1 << 20, window: 4 << 20}
		metaC := hc.append(nil)
		_ = writeRaw(c, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC)
		if h, _, _, err := readFrame(c); err != nil || h.typ != tHelloReply {
			t.Fatalf("hello reply: frame %d, %v", h.typ, err)
		}
		refuse(c)
	}
	logs := b.logs.String()
	if n := strings.Count(logs, "protocol violation before authentication"); n != 1 {
		t.Fatalf("%d refusals before hello logged %d times, want once:\n%s", conns, n, logs)
	}
	if n := strings.Count(logs, "peer refused us before authenticating"); n != 1 {
		t.Fatalf("%d refusals of our hello logged %d times, want once:\n%s", conns, n, logs)
	}
	cut := strings.Repeat("A", maxRefuseReason)
	if !strings.Contains(logs, cut) || strings.Contains(logs, cut+"A") {
		t.Fatalf("a refusal's reason not logged cut to %d bytes:\n%s", maxRefuseReason, logs)
	}

	c := rawClient(t, b, key, "honest")
	refuse(c)
	b.logs.waitContains(t, `msg="peer refused us"`)
	logs = b.logs.String()
	if strings.Count(logs, `msg="peer refused us"`) != 1 || strings.Contains(logs, cut+"A") {
		t.Fatalf("an authenticated peer's refusal not logged, cut to %d bytes:\n%s", maxRefuseReason, logs)
	}
}

// TestHandshakeFrameCheckedByItsHeader: a frame the handshake does not take
// is refused as soon as its header is in, not after its metadata: an
// exchange frame, whose metadata may reach 64 KiB, would otherwise make an
// unauthenticated connection hold that much until the handshake timeout.
func TestHandshakeFrameCheckedByItsHeader(t *testing.T) {
	kf := testutil.KeyFile(t, t.TempDir(), "k", "cluster-secret")
	for _, tc := range []struct {
		name  string
		hello bool
		want  string
	}{
		{"before hello", false, "frame 14 before hello"},
		{"before auth", true, "frame 14 before auth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A node of its own: the refusal log has a line per kind.
			b := startNode(t, Config{DaemonID: "b", ClusterKeyFile: kf, HandshakeTimeout: time.Minute})
			c, err := net.Dial("tcp", b.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if tc.hello {
				hc := hello{id: "m", epoch: 42, addr: "127.0.0.1:1", maxFrame: 1 << 20, window: 4 << 20}
				metaC := hc.append(nil)
				_ = writeRaw(c, &header{typ: tHello, metaLen: uint16(len(metaC))}, metaC)
				if h, _, _, err := readFrame(c); err != nil || h.typ != tHelloReply {
					t.Fatalf("hello reply: frame %d, %v", h.typ, err)
				}
			}
			hb := make([]byte, hdrLen)
			putHeader(hb, &header{typ: tExchReq, id: 1, metaLen: 65535})
			if _, err := c.Write(append(hb, make([]byte, 100)...)); err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(io.Discard, c) // returns once b closes the connection
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("an exchange header during the handshake did not end the connection: its metadata was awaited")
			}
			b.logs.waitContains(t, tc.want)
		})
	}
}
