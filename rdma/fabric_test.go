package rdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// The transport's logic over rdmatest's in-memory fabric: everything but
// the verbs themselves, which verbs_linux_test.go covers in the Soft-RoCE
// VM.

// recorder records how tasks ended (xfertest.Recorder).
type recorder = xfertest.Recorder

func newRecorder() *recorder { return xfertest.NewRecorder() }

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

const (
	segLocal  xfer.SegmentID = 1
	segRemote xfer.SegmentID = 2
)

// side is one device of a test fabric with a transport on it, and the
// request segments of its tasks, which carry their keys as a daemon's do.
type side struct {
	dev  *rdmatest.Device
	t    *rdma.Transport
	segs xfertest.Segments
}

// newSide opens a device on f and makes a transport on it; the test's
// cleanup closes the transport and the device and checks nothing made
// from it is left.
func newSide(t *testing.T, f *rdmatest.Fabric, name string, cfg rdma.Config) *side {
	t.Helper()
	dev := f.Open(name, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("device %s: %v", name, err)
		}
	})
	tr, err := dev.NewTransport()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &side{dev: dev, t: tr, segs: xfertest.Segments{}}
}

// local puts r's keys on request segment id, as its local side.
func (s *side) local(t *testing.T, id xfer.SegmentID, r *rdma.Region) {
	t.Helper()
	s.segs.Set(t, id, xfer.SlotRDMA, rdma.LocalKeys(r, nil, nil))
}

// remote puts the keys of a peer's region r on request segment id, as a
// target.
func (s *side) remote(t *testing.T, id xfer.SegmentID, r rdma.RemoteRegion) {
	t.Helper()
	k, err := rdma.RemoteKeys(r, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.segs.Set(t, id, xfer.SlotRDMA, k)
}

// tasks are tasks of reqs on s's request segments, ending on c.
func (s *side) tasks(c xfer.Completer, reqs ...xfer.Request) []*xfer.Task {
	return s.segs.Tasks(c, reqs...)
}

// register registers b on s's device with access until the test ends.
func (s *side) register(t *testing.T, b []byte, access rdma.Access) *rdma.Region {
	t.Helper()
	r, err := s.dev.RegisterAccess(b, access)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: this one before the transport's Close,
	// which is fine, since nothing is in flight when a test returns.
	t.Cleanup(func() {
		if err := s.dev.Deregister(r); err != nil {
			t.Errorf("Deregister: %v", err)
		}
	})
	return r
}

// fakePair is two transports on one fabric, a connected to b, with a's
// segment 1 over la and segment 2 naming b's rb; both registered in
// chunks of 64 KiB.
func fakePair(t *testing.T, cfg rdma.Config, la, rb []byte) (a, b *side) {
	t.Helper()
	f := rdmatest.NewFabric()
	cfg.ChunkSize = 1 << 16
	a, b = newSide(t, f, "a", cfg), newSide(t, f, "b", cfg)
	a.local(t, segLocal, a.register(t, la, rdma.AccessLocal))
	a.remote(t, segRemote, b.register(t, rb, rdma.AccessRemote).Remote(9))
	if err := a.t.Connect(rdma.Loopback{T: b.t}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func TestFakeWriteReadSignalled(t *testing.T) {
	la, rb := make([]byte, 1<<20), make([]byte, 1<<20)
	copy(la, pattern(1<<20, 3))
	a, _ := fakePair(t, rdma.Config{QPs: 2, SignalEvery: 4}, la, rb)
	r := newRecorder()
	var reqs []xfer.Request
	for i := range 40 {
		// 40 writes of 12 KiB + 100 bytes: some cross a 64 KiB chunk.
		off := uint64(i) * (12<<10 + 100)
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: off, Target: segRemote, TargetOffset: off, Length: 12<<10 + 100})
	}
	tasks := a.tasks(r, reqs...)
	before := a.dev.Stats()
	n, err := a.t.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	r.Wait(t, len(tasks))
	r.Check(t, tasks)
	for i, tk := range tasks {
		if n, err := r.Result(tk); n != tk.Req.Length || err != nil {
			t.Fatalf("task %d: n %d err %v", i, n, err)
		}
	}
	end := 40 * (12<<10 + 100)
	if !bytes.Equal(rb[:end], la[:end]) {
		t.Fatal("written bytes differ")
	}
	after := a.dev.Stats()
	posts, posted, signals := after.Posts-before.Posts, after.Posted-before.Posted, after.Signaled-before.Signaled
	if posts != 1 || posted <= 40 {
		t.Errorf("one Submit made %d posts of %d work requests; want 1 linked list of more than 40", posts, posted)
	}
	if want := posted/4 + min(posted%4, 1); signals != want {
		t.Errorf("%d signalled of %d (every 4th + last): got %d", want, posted, signals)
	}

	// Read it back into another part of the local segment.
	clear(la[512<<10:])
	rt := a.tasks(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: 512 << 10, Target: segRemote, Length: 256 << 10})
	if n, err := a.t.Submit(rt); n != 1 || err != nil {
		t.Fatalf("Submit read = %d, %v", n, err)
	}
	r.Wait(t, 1)
	if !bytes.Equal(la[512<<10:768<<10], rb[:256<<10]) {
		t.Fatal("read bytes differ")
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

func TestFakeInvalidTasksEndTyped(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, rdma.Config{}, la, rb)
	r := newRecorder()
	tasks := a.tasks(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 0},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 10},
		xfer.Request{Op: xfer.OpRead, Local: 77, Target: segRemote, Length: 10},
		xfer.Request{Op: 0, Local: segLocal, Target: segRemote, Length: 10},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: 1 << 16, Target: segRemote, Length: 1},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 10},
	)
	// A valid WRITE carrying a notification: this transport has no channel
	// to send it on, so the task fails rather than moving without it.
	notified := tasks[len(tasks)-1]
	notified.Notify = []byte("x")
	n, err := a.t.Submit(tasks)
	if n != len(tasks) || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	r.Wait(t, len(tasks))
	r.Check(t, tasks)
	for i, tk := range tasks {
		moved, err := r.Result(tk)
		switch {
		case i == 1 && err != nil:
			t.Errorf("valid task failed: %v", err)
		case tk == notified:
			if !errors.Is(err, xfer.ErrNotSupported) || moved != 0 {
				t.Errorf("notified task: %d bytes, err = %v, want ErrNotSupported and nothing moved", moved, err)
			}
		case i != 1 && !errors.Is(err, xfer.ErrInvalid) && !errors.Is(err, rdma.ErrNotRegistered):
			t.Errorf("task %d: err = %v, want ErrInvalid or ErrNotRegistered", i, err)
		}
	}
}

func TestFakeQPErrorFailsInFlightAndRecovers(t *testing.T) {
	la, rb := pattern(1<<18, 1), make([]byte, 1<<18)
	a, b := fakePair(t, rdma.Config{QPs: 1}, la, rb)
	r := newRecorder()
	a.dev.Hold()
	conns := b.dev.Stats().Connects
	tasks := a.tasks(r,
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 4096},
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, LocalOffset: 4096, Target: segRemote, TargetOffset: 4096, Length: 200 << 10},
	)
	if n, err := a.t.Submit(tasks); n != 2 || err != nil {
		t.Fatalf("Submit = %d, %v", n, err)
	}
	a.dev.FailQueuePairs()
	r.Wait(t, 2)
	r.Check(t, tasks)
	a.dev.Release() // the reconnect probe (maybe posted already) must run
	for i, tk := range tasks {
		var ce *rdma.CompletionError
		moved, err := r.Result(tk)
		if !errors.As(err, &ce) || ce.Status != rdma.WCWRFlushErr ||
			!strings.Contains(err.Error(), "IBV_WC_WR_FLUSH_ERR") || !errors.Is(err, rdma.ErrCompletion) {
			t.Errorf("task %d: err = %v, want IBV_WC_WR_FLUSH_ERR", i, err)
		}
		if moved != 0 {
			t.Errorf("failed task %d reports %d bytes", i, moved)
		}
	}
	// The queue pair comes back through the peer, and works: Submit waits
	// for it (SubmitWait) while the reconnector brings it up.
	more := a.tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 1 << 18})
	if n, err := a.t.Submit(more); n != 1 || err != nil {
		t.Fatalf("Submit after recovery = %d, %v", n, err)
	}
	r.Wait(t, 1)
	if _, err := r.Result(more[0]); err != nil || !bytes.Equal(la, rb) {
		t.Fatalf("after recovery: %v", err)
	}
	if b.dev.Stats().Connects == conns {
		t.Error("the peer's queue pair was not reconnected")
	}
}

func TestFakeQueueFullAndClose(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, rdma.Config{QPs: 1, SendDepth: 8, SubmitWait: 50 * time.Millisecond}, la, rb)
	r := newRecorder()
	a.dev.Hold()
	var reqs []xfer.Request
	for range 12 {
		reqs = append(reqs, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 64})
	}
	tasks := a.tasks(r, reqs...)
	n, err := a.t.Submit(tasks)
	if n != 8 || !errors.Is(err, rdma.ErrQueueFull) {
		t.Fatalf("Submit into a full queue = %d, %v; want 8, ErrQueueFull", n, err)
	}
	// Close ends the held work (flushed) and waits for it.
	if err := a.t.Close(); err != nil {
		t.Fatal(err)
	}
	r.Check(t, tasks[:8])
	if r.Count() != 8 {
		t.Errorf("%d tasks ended, want the 8 dispatched", r.Count())
	}
	for _, tk := range tasks[8:] {
		if r.Ends(tk) != 0 {
			t.Error("a task that was not dispatched ended")
		}
	}
	for _, tk := range tasks[:8] {
		if r.Err(tk) == nil {
			t.Error("held task ended without error at Close")
		}
	}
	if n, err := a.t.Submit(tasks[8:]); n != 0 || !errors.Is(err, xfer.ErrClosed) {
		t.Errorf("Submit after Close = %d, %v", n, err)
	}
	if err := a.t.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestFakeConnectBadGID(t *testing.T) {
	f := rdmatest.NewFabric()
	a, b := newSide(t, f, "a", rdma.Config{}), newSide(t, f, "b", rdma.Config{})
	start := time.Now()
	err := a.t.Connect(badPeer{b.t})
	if !errors.Is(err, rdma.ErrConnect) {
		t.Fatalf("Connect to a bogus gid: %v, want ErrConnect", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("failing took %v", time.Since(start))
	}
}

// badPeer answers with a GID no device of the fabric has.
type badPeer struct{ t *rdma.Transport }

func (p badPeer) Exchange(l rdma.ConnInfo) (rdma.ConnInfo, error) {
	c, err := p.t.Accept(l)
	c.GID = rdma.GID{0xde, 0xad}
	return c, err
}

func TestFakeSteadyStateAllocs(t *testing.T) {
	la, rb := make([]byte, 1<<16), make([]byte, 1<<16)
	a, _ := fakePair(t, rdma.Config{QPs: 1}, la, rb)
	ch := make(xfertest.Chan, 64)
	tasks := make([]*xfer.Task, 16)
	for i := range tasks {
		tasks[i] = a.tasks(ch, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, TargetOffset: uint64(i) * 4096, Length: 4096})[0]
	}
	run := func() {
		if n, err := a.t.Submit(tasks); n != len(tasks) || err != nil {
			t.Fatalf("Submit = %d, %v", n, err)
		}
		for range tasks {
			<-ch
		}
	}
	run()
	// The fake's own completion list may grow once; steady state then.
	if allocs := testing.AllocsPerRun(50, run); allocs != 0 {
		t.Errorf("Submit + completion of 16 tasks: %v allocations, want 0", allocs)
	}
}

// TestFabricEnforcesKeys: the fabric refuses what a device refuses. A
// WRITE into a region registered read-only, a READ past a region's end and
// a READ with a deregistered region's keys all complete with
// IBV_WC_REM_ACCESS_ERR and change nothing; a local key of another device
// is IBV_WC_LOC_PROT_ERR; after each, the queue pair is reconnected and
// moves bytes again.
func TestFabricEnforcesKeys(t *testing.T) {
	f := rdmatest.NewFabric()
	a, b := newSide(t, f, "a", rdma.Config{QPs: 1, ChunkSize: 1 << 16}), newSide(t, f, "b", rdma.Config{QPs: 1, ChunkSize: 1 << 16})
	la, ro, rw := pattern(1<<16, 1), pattern(1<<16, 2), make([]byte, 1<<16)
	a.local(t, segLocal, a.register(t, la, rdma.AccessLocal))
	roReg := b.register(t, ro, rdma.AccessRemoteRead)
	a.remote(t, segRemote, roReg.Remote(1))
	rwReg, err := b.dev.RegisterAccess(rw, rdma.AccessRemote)
	if err != nil {
		t.Fatal(err)
	}
	const segRW, segBeyond, segForeign xfer.SegmentID = 3, 4, 5
	a.remote(t, segRW, rwReg.Remote(2))
	beyond := roReg.Remote(3)
	beyond.Size += 4096
	beyond.RKeys = append(beyond.RKeys, beyond.RKeys[0])
	a.remote(t, segBeyond, beyond)
	// b's own local registration passed off as a's local side.
	foreign := b.register(t, make([]byte, 1<<16), rdma.AccessLocal)
	a.local(t, segForeign, foreign)
	if err := a.t.Connect(rdma.Loopback{T: b.t}); err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	do := func(req xfer.Request) error {
		t.Helper()
		tk := a.tasks(r, req)
		if n, err := a.t.Submit(tk); n != 1 || err != nil {
			t.Fatalf("Submit %+v = %d, %v", req, n, err)
		}
		r.Wait(t, 1)
		_, err := r.Result(tk[0])
		return err
	}
	wantStatus := func(err error, st rdma.WCStatus, what string) {
		t.Helper()
		var ce *rdma.CompletionError
		if !errors.As(err, &ce) || ce.Status != st {
			t.Fatalf("%s: %v, want %v", what, err, st)
		}
	}
	roBefore := bytes.Clone(ro)
	wantStatus(do(xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 4096}), rdma.WCRemAccessErr,
		"WRITE into a read-only region")
	if !bytes.Equal(ro, roBefore) {
		t.Fatal("a refused WRITE changed the read-only region")
	}
	wantStatus(do(xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segBeyond, TargetOffset: 1 << 16, Length: 4096}), rdma.WCRemAccessErr,
		"READ past a region's end")
	wantStatus(do(xfer.Request{Op: xfer.OpRead, Local: segForeign, Target: segRemote, Length: 4096}), rdma.WCLocProtErr,
		"READ into another device's registration")
	// The read-only region reads, and the writable one takes a WRITE.
	if err := do(xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segRemote, Length: 1 << 16}); err != nil || !bytes.Equal(la, ro) {
		t.Fatalf("READ of the read-only region: %v", err)
	}
	if err := do(xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRW, Length: 1 << 16}); err != nil || !bytes.Equal(rw, la) {
		t.Fatalf("WRITE into the writable region: %v", err)
	}
	// Its keys go with its registration.
	if err := b.dev.Deregister(rwReg); err != nil {
		t.Fatal(err)
	}
	wantStatus(do(xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segRW, Length: 4096}), rdma.WCRemAccessErr,
		"READ with a deregistered region's keys")
	if regs, trs := b.dev.Live(); regs != 2 || trs != 1 {
		t.Fatalf("b has %d regions and %d transports live, want 2 and 1", regs, trs)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(ro)
	runtime.KeepAlive(rw)
}

// directChannel is an Exchanger that calls the named peer's handler in
// this process, as daemon "alpha" at epoch 7.
type directChannel map[string]func(from string, epoch uint64, req []byte) ([]byte, error)

func (c directChannel) Exchange(peer, kind string, req []byte, _ time.Duration) ([]byte, error) {
	h := c[peer+"/"+kind]
	if h == nil {
		return nil, fmt.Errorf("no handler %s/%s", peer, kind)
	}
	return h("alpha", 7, req)
}

// exposedPair builds two transports on one fabric: b exposes rb as region
// 42; a has la as segLocal and is not connected yet.
func exposedPair(t *testing.T, la, rb []byte) (a, b *side) {
	t.Helper()
	f := rdmatest.NewFabric()
	cfg := rdma.Config{QPs: 2, ChunkSize: 1 << 16}
	a, b = newSide(t, f, "a", cfg), newSide(t, f, "b", cfg)
	a.local(t, segLocal, a.register(t, la, rdma.AccessLocal))
	b.t.Expose(42, b.register(t, rb, rdma.AccessRemote))
	return a, b
}

// moveAndCheck writes la[:n] to target segment seg at offset 0, reads it
// back into la[n:2n] and compares.
func moveAndCheck(t *testing.T, a *side, seg xfer.SegmentID, la []byte, n uint64) {
	t.Helper()
	r := newRecorder()
	w := a.tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: seg, Length: n})
	if k, err := a.t.Submit(w); k != 1 || err != nil {
		t.Fatalf("Submit write = %d, %v", k, err)
	}
	r.Wait(t, 1)
	rd := a.tasks(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, LocalOffset: n, Target: seg, Length: n})
	if k, err := a.t.Submit(rd); k != 1 || err != nil {
		t.Fatalf("Submit read = %d, %v", k, err)
	}
	r.Wait(t, 1)
	for _, tk := range append(w, rd...) {
		if moved, err := r.Result(tk); err != nil || moved != n {
			t.Fatalf("task %+v: n %d err %v", tk.Req, moved, err)
		}
	}
	if !bytes.Equal(la[:n], la[n:2*n]) {
		t.Fatal("bytes read back differ from those written")
	}
}

func TestChannelPeerOverFakes(t *testing.T) {
	la, rb := pattern(1<<20, 5), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	var seen []string
	ch := directChannel{"bravo/" + rdma.ExchangeKind: rdma.Acceptor(func(from string, epoch uint64) (*rdma.Transport, error) {
		seen = append(seen, fmt.Sprintf("%s@%d", from, epoch))
		return b.t, nil
	})}
	if err := a.t.Connect(rdma.ChannelPeer{Ch: ch, ID: "bravo"}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || seen[0] != "alpha@7" {
		t.Fatalf("acceptor saw %v; want one exchange per queue pair from alpha@7", seen)
	}
	regs := a.t.PeerRegions()
	if len(regs) != 1 || regs[0].Name != 42 || regs[0].Size != uint64(len(rb)) {
		t.Fatalf("learned regions %+v", regs)
	}
	a.remote(t, segRemote, regs[0])
	moveAndCheck(t, a, segRemote, la, 200<<10)
	if !bytes.Equal(rb[:200<<10], la[:200<<10]) {
		t.Fatal("target bytes differ")
	}

	// A window of the region: target offset 0 is byte 300 KiB + 5 of rb.
	const win xfer.SegmentID = 3
	wk, err := rdma.RemoteRangeKeys(regs[0], 300<<10+5, 128<<10, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.segs.Set(t, win, xfer.SlotRDMA, wk)
	copy(la, pattern(1<<20, 9))
	moveAndCheck(t, a, win, la, 128<<10)
	if !bytes.Equal(rb[300<<10+5:428<<10+5], la[:128<<10]) {
		t.Fatal("window wrote to the wrong place")
	}
	// Past the window's end is refused, not written.
	r := newRecorder()
	over := a.tasks(r, xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: win, TargetOffset: 64 << 10, Length: 64<<10 + 1})
	if k, err := a.t.Submit(over); k != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	r.Wait(t, 1)
	if _, err := r.Result(over[0]); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Fatalf("write past the window: %v, want ErrNotRegistered", err)
	}
	for _, bad := range [][2]uint64{{0, 0}, {1 << 20, 1}, {1<<20 - 4, 5}} {
		if k, err := rdma.RemoteRangeKeys(regs[0], bad[0], bad[1], nil, nil); k != nil || !errors.Is(err, rdma.ErrNotRegistered) {
			t.Fatalf("RemoteRangeKeys(%d, %d) = %v, %v", bad[0], bad[1], k, err)
		}
	}
	a.segs.Clear(win, xfer.SlotRDMA)
	gone := a.tasks(r, xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: win, Length: 1})
	if k, err := a.t.Submit(gone); k != 1 || err != nil {
		t.Fatalf("Submit = %d, %v", k, err)
	}
	r.Wait(t, 1)
	if _, err := r.Result(gone[0]); !errors.Is(err, rdma.ErrNotRegistered) {
		t.Fatalf("removed target: %v", err)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

func TestChannelPeerErrors(t *testing.T) {
	la, rb := pattern(64<<10, 1), make([]byte, 64<<10)
	a, b := exposedPair(t, la, rb)
	refused := errors.New("rdma is off here")
	cases := []struct {
		name string
		h    func(string, uint64, []byte) ([]byte, error)
		want error
	}{
		{"lookup fails", rdma.Acceptor(func(string, uint64) (*rdma.Transport, error) { return nil, refused }), refused},
		{"garbage answer", func(string, uint64, []byte) ([]byte, error) { return []byte("TCRQ"), nil }, rdma.ErrConnInfo},
		{"other queue pair", func(_ string, _ uint64, req []byte) ([]byte, error) {
			var ci rdma.ConnInfo
			if err := ci.UnmarshalBinary(req); err != nil {
				return nil, err
			}
			local, err := b.t.Accept(ci)
			if err != nil {
				return nil, err
			}
			local.QPIndex++
			return local.MarshalBinary()
		}, rdma.ErrConnInfo},
	}
	for _, c := range cases {
		ch := directChannel{"bravo/" + rdma.ExchangeKind: c.h}
		err := a.t.Connect(rdma.ChannelPeer{Ch: ch, ID: "bravo"})
		if !errors.Is(err, rdma.ErrConnect) || !errors.Is(err, c.want) {
			t.Errorf("%s: Connect = %v; want ErrConnect and %v", c.name, err, c.want)
		}
	}
	// The acceptor refuses garbage without calling lookup.
	called := false
	h := rdma.Acceptor(func(string, uint64) (*rdma.Transport, error) { called = true; return b.t, nil })
	if _, err := h("alpha", 1, []byte("not connection data")); !errors.Is(err, rdma.ErrConnInfo) || called {
		t.Fatalf("acceptor on garbage: %v (lookup called: %v)", err, called)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

// tcpPair starts two tcp nodes, alpha and bravo, that know each other.
func tcpPair(t testing.TB) (alpha, bravo *tcp.Node) {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "key", "cluster-secret")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	var nodes []*tcp.Node
	for _, id := range []string{"alpha", "bravo"} {
		n, err := tcp.NewNode(tcp.Config{DaemonID: id, Listen: "127.0.0.1:0", ClusterKeyFile: key, ConnsPerPeer: 1,
			RequestTimeout: 10 * time.Second}, noExports{}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		nodes = append(nodes, n)
	}
	for i, n := range nodes {
		o := nodes[1-i]
		if err := n.Directory().Update(directory.Peer{ID: o.ID(), Addr: o.Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	return nodes[0], nodes[1]
}

// noExports is a tcp.Exporter with nothing exported.
type noExports struct{}

func (noExports) Lookup(name string) (xfer.MemSegment, error) {
	return nil, fmt.Errorf("%q not exported", name)
}
func (noExports) Deliver(string, []byte) error { return errors.New("nothing exported") }

// TestChannelPeerOverTCP: the connection data travels over two real tcp
// nodes' peer channel; the verbs are the fabric's.
func TestChannelPeerOverTCP(t *testing.T) {
	alpha, bravo := tcpPair(t)
	la, rb := pattern(1<<20, 7), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	var from string
	var epoch uint64
	if err := bravo.Handle(rdma.ExchangeKind, rdma.Acceptor(func(f string, e uint64) (*rdma.Transport, error) {
		from, epoch = f, e
		return b.t, nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := a.t.Connect(rdma.ChannelPeer{Ch: alpha, ID: "bravo", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if from != "alpha" || epoch != alpha.Epoch() {
		t.Fatalf("acceptor saw %s@%#x, want alpha@%#x", from, epoch, alpha.Epoch())
	}
	regs := a.t.PeerRegions()
	if len(regs) != 1 {
		t.Fatalf("learned %d regions", len(regs))
	}
	a.remote(t, segRemote, regs[0])
	moveAndCheck(t, a, segRemote, la, 256<<10)
	// Without a handler on the peer, Connect fails with the channel's error.
	if err := bravo.Handle(rdma.ExchangeKind, nil); err != nil {
		t.Fatal(err)
	}
	c := newSide(t, rdmatest.NewFabric(), "c", rdma.Config{QPs: 1})
	if err := c.t.Connect(rdma.ChannelPeer{Ch: alpha, ID: "bravo"}); !errors.Is(err, tcp.ErrNoHandler) {
		t.Fatalf("Connect to a peer without rdma: %v, want tcp.ErrNoHandler", err)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}

// TestKeysOnTheSegment: the transport reads a task's keys from its
// segments' RDMA slots and nothing else. Keys taken back from a segment,
// or released by its teardown, stop its requests (ErrNotRegistered);
// local keys as a target and remote keys as a local side are refused the
// same way.
func TestKeysOnTheSegment(t *testing.T) {
	la, rb := pattern(1<<20, 3), make([]byte, 1<<20)
	a, b := exposedPair(t, la, rb)
	ch := directChannel{"bravo/" + rdma.ExchangeKind: rdma.Acceptor(func(string, uint64) (*rdma.Transport, error) { return b.t, nil })}
	if err := a.t.Connect(rdma.ChannelPeer{Ch: ch, ID: "bravo"}); err != nil {
		t.Fatal(err)
	}
	released := 0
	rk, err := rdma.RemoteKeys(a.t.PeerRegions()[0], "owner", func() { released++ })
	if err != nil || rk.Owner() != "owner" || !rk.Remote() {
		t.Fatalf("RemoteKeys = %v (owner %v, remote %v), %v", rk, rk.Owner(), rk.Remote(), err)
	}
	remote := a.segs.Set(t, segRemote, xfer.SlotRDMA, rk)
	moveAndCheck(t, a, segRemote, la, 64<<10)
	r := newRecorder()
	refused := func(what string, reqs ...xfer.Request) {
		t.Helper()
		tasks := a.tasks(r, reqs...)
		if k, err := a.t.Submit(tasks); k != len(tasks) || err != nil {
			t.Fatalf("%s: Submit = %d, %v", what, k, err)
		}
		r.Wait(t, len(tasks))
		for _, tk := range tasks {
			if _, err := r.Result(tk); !errors.Is(err, rdma.ErrNotRegistered) {
				t.Fatalf("%s: %v %+v: %v, want ErrNotRegistered", what, tk.Req.Op, tk.Req, fmt.Sprint(err))
			}
		}
	}
	refused("sides swapped",
		xfer.Request{Op: xfer.OpWrite, Local: segRemote, Target: segRemote, Length: 4096},
		xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segLocal, Length: 4096})

	a.segs.Clear(segLocal, xfer.SlotRDMA)
	refused("local keys taken back",
		xfer.Request{Op: xfer.OpWrite, Local: segLocal, Target: segRemote, Length: 4096},
		xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segRemote, Length: 4096})
	a.local(t, segLocal, a.register(t, la, rdma.AccessLocal))
	moveAndCheck(t, a, segRemote, la, 4096)

	remote.Regs().Teardown()
	if released != 1 {
		t.Fatalf("the target's teardown released its keys %d times, want once", released)
	}
	refused("target torn down", xfer.Request{Op: xfer.OpRead, Local: segLocal, Target: segRemote, Length: 4096})
	if released != 1 {
		t.Fatalf("keys released %d times, want once", released)
	}
	runtime.KeepAlive(la)
	runtime.KeepAlive(rb)
}
