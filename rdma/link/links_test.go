package link

import (
	"bytes"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/status"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
	"github.com/tensorcast/tensorcast/xfer/xfertest"
)

// rdmaSizes go up to a pool block.
var rdmaSizes = []uint64{4 << 10, 1 << 20, 4 << 20}

func TestFabricOverRDMA(t *testing.T) { testOverRDMA(t, fabric()) }
func TestVerbsPlaneOverRDMA(t *testing.T) {
	testOverRDMA(t, verbs(t))
}

// testOverRDMA: the first request to a peer goes over tcp and has the link
// set up behind it; then requests from the pool move by RDMA READ and
// WRITE, crc32c checked, with no payload on tcp. A notified WRITE moves
// its bytes by RDMA, its notification follows on the peer channel, and the
// task completes on the owner's answer; with nobody subscribed the owner
// refuses it and the task fails, though its bytes landed. An export of a
// client buffer gets its own registration. Then the owner restarts on its
// address (a new epoch): the old segment fails at once, and the reopened
// one gets a new link.
func testOverRDMA(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	for _, s := range []*side{p.d1, p.d2} {
		if !strings.Contains(s.log.String(), "pool registered for rdma") {
			t.Fatalf("%s did not register its pool:\n%s", s.id, s.log.String())
		}
	}
	if i := p.d2.p.rdma.Info(); i.State != wire.RDMAEnabled || i.PoolRegistered == 0 {
		t.Fatalf("d2's rdma report: %+v", i)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	before := p.d2.tcpBytes()
	p.roundTrip(t, rng, p.kv, 4096, 0, 0)
	// Its WRITE goes to tcp and asks for the link, which the worker may
	// have up before the READ that follows.
	if moved := p.d2.tcpBytes() - before; moved < 4096 {
		t.Fatalf("the first round trip moved %d bytes over tcp; want its WRITE there, before any link", moved)
	}
	p.d2.log.waitFor(t, "peer requests from the pool use rdma", 30*time.Second)
	for _, n := range rdmaSizes {
		before := p.d2.tcpBytes()
		off := (p.block - n) / 3
		p.roundTrip(t, rng, p.kv, n, off, off)
		if moved := p.d2.tcpBytes() - before; moved != 0 {
			t.Fatalf("%d bytes each way moved %d bytes over tcp", n, moved)
		}
	}
	if p.d2.counter(t, "rdma.tasks") < 6 || p.d2.counter(t, "rdma.links") != 1 || p.d2.counter(t, "rdma.links_made") != 1 {
		t.Fatalf("d2's counters after 3 round trips by rdma: %v", p.d2.p.Counters(nil))
	}

	// A notified WRITE.
	in := peer.NewInbox("subscriber", 8)
	if err := p.d1.exports.Subscribe("kv", "", in); err != nil {
		t.Fatal(err)
	}
	fill(rng, p.wMem(p.src, 1<<20))
	w := xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 1 << 20}
	before = p.d2.tcpBytes()
	if err := p.d2.transfer(t, []xfer.Request{w}, [][]byte{[]byte("ready")}, 10*time.Second)[0]; err != nil {
		t.Fatalf("notified WRITE: %v", err)
	}
	if moved := p.d2.tcpBytes() - before; moved >= 64<<10 {
		t.Fatalf("a notified 1 MiB WRITE moved %d bytes over tcp", moved)
	}
	if !bytes.Equal(p.expMem(0, 1<<20), p.wMem(p.src, 1<<20)) {
		t.Fatal("the notified WRITE did not land")
	}
	if notes := in.Take(nil, 10, 1<<20); len(notes) != 1 || string(notes[0].Payload) != "ready" || string(notes[0].Segment) != "kv" {
		t.Fatalf("notification: %+v", notes)
	}
	if p.d2.counter(t, "rdma.notified") != 1 {
		t.Fatalf("rdma.notified %d", p.d2.counter(t, "rdma.notified"))
	}
	// Fail closed.
	in.Close()
	fill(rng, p.wMem(p.src, 1<<20))
	err := p.d2.transfer(t, []xfer.Request{w}, [][]byte{[]byte("anyone?")}, 10*time.Second)[0]
	if code := status.CodeOf(err); code != tcproto.CodeFAILED_PRECONDITION {
		t.Fatalf("notification nobody subscribed to: %v (code %v), want the task failed FAILED_PRECONDITION", err, code)
	}
	if !bytes.Equal(p.expMem(0, 1<<20), p.wMem(p.src, 1<<20)) || p.d2.counter(t, "rdma.notify_failed") != 1 {
		t.Fatal("the refused notification's WRITE did not land, or was not counted")
	}

	// An export of a client's own buffer.
	own := mapBuffer(t, 77, 1<<20)
	if _, err := p.d1.exports.Export("own", "", own, 0, 1<<20, wire.RightRead|wire.RightWrite); err != nil {
		t.Fatal(err)
	}
	ownID, ownRemote := p.d2.open(t, "d1/own", wire.RightRead|wire.RightWrite, wire.TransportAuto)
	fill(rng, p.wMem(p.src, 64<<10))
	w = xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: ownID, TargetOffset: 512, Length: 64 << 10}
	p.d2.untilRDMA(t, ownRemote, w)
	if !bytes.Equal(own.Bytes()[512:512+64<<10], p.wMem(p.src, 64<<10)) {
		t.Fatal("WRITE to a client buffer export did not land")
	}
	if c := strings.Count(p.d1.log.String(), "export registered for rdma"); c != 2 {
		t.Fatalf("d1 registered %d exports for rdma, want kv and own:\n%s", c, p.d1.log.String())
	}
	if c := strings.Count(p.d2.log.String(), "peer requests from the pool use rdma"); c != 1 {
		t.Fatalf("the choice for d1 was logged %d times", c)
	}
	if strings.Contains(p.d2.log.String(), "rdma link closed") {
		t.Fatalf("a healthy link was retired:\n%s", p.d2.log.String())
	}

	// d1 restarts on its address: a new epoch, a new pool registration.
	addr := p.d1.p.Node().Addr()
	oldEpoch := p.d1.p.Node().Epoch()
	p.d1.stop()
	p.d1 = startSideAt(t, "d1", p.key, addr, devs, directory.Peer{ID: "d2"})
	if _, err := p.d1.exports.Export("kv", "", p.d1.pool, 0, p.block, wire.RightRead|wire.RightWrite); err != nil {
		t.Fatal(err)
	}
	if p.d1.p.Node().Epoch() == oldEpoch {
		t.Fatal("the restarted d1 runs the same epoch")
	}
	start := time.Now()
	w = xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 4096}
	if err := p.d2.do(t, w); err == nil {
		t.Fatal("a WRITE to the old epoch's segment completed")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a WRITE to a restarted peer's old segment took %v to fail:\n%s", took, p.d2.log.String())
	}
	kv, kvRemote := p.d2.open(t, "d1/kv", wire.RightRead|wire.RightWrite, wire.TransportAuto)
	w.Target = kv
	p.d2.untilRDMA(t, kvRemote, w)
	if c := strings.Count(p.d2.log.String(), "rdma link up"); c != 2 {
		t.Fatalf("%d rdma links made for two epochs of d1", c)
	}
	before = p.d2.tcpBytes()
	p.roundTrip(t, rng, kv, 1<<20, 4096, 4096)
	if moved := p.d2.tcpBytes() - before; moved != 0 {
		t.Fatalf("after the restart 1 MiB each way moved %d bytes over tcp", moved)
	}
}

// mapBuffer is a client buffer: a sealed memfd mapped as segment id, closed
// at the end of the test.
func mapBuffer(t *testing.T, id xfer.SegmentID, size uint64) *shm.Buffer {
	t.Helper()
	fd, err := shm.NewMemfd("test", size, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := shm.MapBuffer(id, fd, size, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// untilRDMA runs req (its first run may go over tcp and have the link or
// the local registration made behind it), has the link to r's peer made
// and r resolved, and repeats req until a run moves none of its bytes over
// tcp: the link's queue pairs are up (each run's submit waits for them).
func (s *side) untilRDMA(t *testing.T, r *tcp.Remote, req xfer.Request) {
	t.Helper()
	if err := s.do(t, req); err != nil {
		t.Fatalf("%v of %d bytes: %v", req.Op, req.Length, err)
	}
	s.linkUp(t, r)
	testutil.Eventually(t, 20*time.Second, func() bool {
		before := s.tcpBytes()
		if err := s.do(t, req); err != nil {
			t.Fatalf("%v of %d bytes: %v", req.Op, req.Length, err)
		}
		return s.tcpBytes()-before < req.Length
	}, "requests to %s/%s off tcp:\n%s", r.Peer(), r.Name(), s.log)
}

// linkRegionOf reports whether d2's link to d1 resolved the export named
// name (its keys are on a segment d2 opened), and the owner's registration
// of it, which d1 gives any peer that asks.
func (p *pair) linkRegionOf(t *testing.T, name string) (*rdmaLink, rdma.RemoteRegion, bool) {
	t.Helper()
	l := p.d2.link("d1")
	if l == nil {
		t.Fatalf("d2 has no rdma link to d1:\n%s", p.d2.log.String())
	}
	l.mu.Lock()
	found := false
	for r, k := range l.segs {
		if r.Name() == name && rdma.KeysOf(r) == k {
			found = true
		}
	}
	l.mu.Unlock()
	if !found {
		return l, rdma.RemoteRegion{}, false
	}
	resp, err := p.d2.p.node.ExchangeAt("d1", l.epoch, segmentExchange, []byte(name), 0)
	if err != nil {
		t.Fatal(err)
	}
	var reg rdma.RemoteRegion
	if err := reg.UnmarshalBinary(resp); err != nil {
		t.Fatal(err)
	}
	return l, reg, true
}

// postOnLink posts one request on the link's own transport, from local
// (which carries the links' keys) to a segment carrying reg's keys, past
// every check the requesting plane makes: only the owner's device stands
// between it and the owner's memory. Submit waits for a queue pair that
// is up (one a refusal took down is being rebuilt).
func postOnLink(t *testing.T, l *rdmaLink, local xfer.Segment, reg rdma.RemoteRegion, req xfer.Request) error {
	t.Helper()
	k, err := rdma.RemoteKeys(reg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	target := xfertest.SegmentOf(1<<40, xfer.KindRemote, nil)
	target.Regs().Set(xfer.SlotRDMA, k)
	req.Target = target.ID()
	done := make(xfertest.Chan, 1)
	task := &xfer.Task{Req: req, Local: local, Target: target}
	task.SetCompleter(done)
	var last error
	testutil.Eventually(t, 20*time.Second, func() bool {
		n, err := l.tr.Submit([]*xfer.Task{task})
		if n != 1 && !errors.Is(err, rdma.ErrQPDown) && !errors.Is(err, rdma.ErrQueueFull) {
			t.Fatalf("posting %v: %v", req.Op, err)
		}
		last = err
		return n == 1
	}, "posting %v (refused with %v)", req.Op, testutil.Lazy(func() error { return last }))
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case e := <-done:
		return e.Err
	case <-timer.C:
		t.Fatalf("%v posted on the link did not end", req.Op)
		return nil
	}
}

func wantRemAccessErr(t *testing.T, err error, what string) {
	t.Helper()
	var ce *rdma.CompletionError
	if !errors.As(err, &ce) || ce.Status != rdma.WCRemAccessErr {
		t.Fatalf("%s: %v, want IBV_WC_REM_ACCESS_ERR", what, err)
	}
}

func TestFabricExportRightsEnforcedByOwner(t *testing.T) { testExportRights(t, fabric()) }
func TestVerbsExportRightsEnforcedByOwner(t *testing.T) {
	testExportRights(t, verbs(t))
}

// testExportRights: the exporting daemon's device enforces an export's
// rights and its end. The requesting plane's own checks are bypassed by
// posting on its link directly: a WRITE into a read-only export is refused
// by the owner and changes nothing, no peer is given keys to the whole
// pool, and once the export ended the peer has dropped its keys (its
// requests go to tcp, which refuses them NOT_FOUND) and the old keys no
// longer work.
func testExportRights(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	rng := rand.New(rand.NewPCG(6, 6))
	fill(rng, p.wMem(p.src, p.block))
	p.d2.untilRDMA(t, p.kvRemote, xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 64 << 10})

	// A read-only export of another block.
	const roOff = 2 * block
	fill(rng, p.expMem(roOff, p.block))
	if _, err := p.d1.exports.Export("ro", "", p.d1.pool, roOff, p.block, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	ro, roRemote := p.d2.open(t, "d1/ro", wire.RightRead, wire.TransportAuto)
	p.d2.untilRDMA(t, roRemote, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: ro, Length: 64 << 10})
	if !bytes.Equal(p.wMem(p.dst, 64<<10), p.expMem(roOff, 64<<10)) {
		t.Fatal("READ of the read-only export returned other bytes")
	}
	l, roReg, ok := p.linkRegionOf(t, "ro")
	if !ok {
		t.Fatal("d2's link has no registration of d1/ro after an rdma READ of it")
	}
	if got := l.tr.PeerRegions(); len(got) != 0 {
		t.Fatalf("d1 exposed %d regions in its connection data (its pool?), want none", len(got))
	}
	if roReg.Size != p.block {
		t.Fatalf("d1/ro registered as %d bytes, the export is %d", roReg.Size, p.block)
	}
	before := bytes.Clone(p.expMem(roOff, p.block))
	w := xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Length: 4096}
	wantRemAccessErr(t, postOnLink(t, l, p.d2.pool, roReg, w), "WRITE into a read-only export past the sender's check")
	if !bytes.Equal(p.expMem(roOff, p.block), before) {
		t.Fatal("a refused WRITE changed the read-only export")
	}
	// Beyond the export: the registration covers its bytes only.
	beyond := roReg
	beyond.Size += 4096
	beyond.RKeys = append([]uint32(nil), roReg.RKeys...)
	if n := beyond.Size/beyond.ChunkSize + min(beyond.Size%beyond.ChunkSize, 1); int(n) > len(beyond.RKeys) {
		beyond.RKeys = append(beyond.RKeys, roReg.RKeys[len(roReg.RKeys)-1])
	}
	r := xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, TargetOffset: p.block, Length: 4096}
	wantRemAccessErr(t, postOnLink(t, l, p.d2.pool, beyond, r), "READ past the end of an export")

	// The export's end revokes.
	_, kvReg, ok := p.linkRegionOf(t, "kv")
	if !ok {
		t.Fatal("d2's link has no registration of d1/kv after an rdma WRITE to it")
	}
	if !p.kvExport.End(time.Second) {
		t.Fatal("the export's end found peer requests in its range")
	}
	if _, _, ok := p.linkRegionOf(t, "kv"); ok {
		t.Fatalf("d2 still holds d1/kv's keys after the export ended:\n%s", p.d2.log.String())
	}
	if n := p.d1.counter(t, "rdma.exports_revoked"); n != 1 {
		t.Fatalf("d1 counts %d revocations, want 1", n)
	}
	if !strings.Contains(p.d1.log.String(), "export's rdma registration revoked") {
		t.Fatalf("d1 did not log the revocation:\n%s", p.d1.log.String())
	}
	wantRemAccessErr(t, postOnLink(t, l, p.d2.pool, kvReg, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Length: 4096}),
		"READ with an unexported segment's old keys")
	err := p.d2.do(t, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: p.kv, Length: 4096})
	if code := status.CodeOf(err); code != tcproto.CodeNOT_FOUND {
		t.Fatalf("READ of the unexported segment: %v (code %v), want NOT_FOUND from its owner", err, code)
	}
	// The link survives the refusals: the read-only export still moves
	// over rdma once its queue pairs are rebuilt.
	p.d2.untilRDMA(t, roRemote, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: ro, Length: 1 << 20})
	if !bytes.Equal(p.wMem(p.dst, 1<<20), p.expMem(roOff, 1<<20)) {
		t.Fatal("READ of the read-only export after the refusals returned other bytes")
	}
}

func TestFabricUnreachableGIDUsesTCP(t *testing.T) { testUnreachableGID(t, fabric()) }
func TestVerbsUnreachableGIDUsesTCP(t *testing.T) {
	testUnreachableGID(t, verbs(t))
}

// testUnreachableGID: a peer whose queue pairs answer from a GID nothing
// reaches (d1's connection data is rewritten to name one) leaves the link
// down with a clear error (within the probe's timeout on hardware); d2
// says so once and its requests keep moving, over tcp, crc32c checked.
func testUnreachableGID(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	bogus, err := rdma.ParseGID("::ffff:192.0.2.77") // TEST-NET-1: no route
	if err != nil {
		t.Fatal(err)
	}
	accept := rdma.Acceptor(p.d1.p.rdma.accept)
	if err := p.d1.p.Node().Handle(rdma.ExchangeKind, func(from string, epoch uint64, req []byte) ([]byte, error) {
		resp, err := accept(from, epoch, req)
		if err != nil {
			return nil, err
		}
		var ci rdma.ConnInfo
		if err := ci.UnmarshalBinary(resp); err != nil {
			return nil, err
		}
		ci.GID = bogus
		return ci.MarshalBinary()
	}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	start := time.Now()
	p.roundTrip(t, rng, p.kv, 64<<10, 0, 0) // over tcp; asks for the link
	p.d2.log.waitFor(t, "peer requests use tcp", 30*time.Second)
	t.Logf("link to an unreachable GID given up after %v", time.Since(start).Round(time.Millisecond))
	if p.d2.link("d1") != nil {
		t.Fatal("d2 kept a link to an unreachable GID")
	}
	for _, n := range rdmaSizes {
		before := p.d2.tcpBytes()
		off := (p.block - n) / 2
		p.roundTrip(t, rng, p.kv, n, off, off)
		if moved := p.d2.tcpBytes() - before; moved < 2*n {
			t.Fatalf("%d bytes each way moved %d bytes over tcp with the link down", n, moved)
		}
	}
	if c := strings.Count(p.d2.log.String(), "peer requests use tcp"); c != 1 {
		t.Fatalf("d2 said %d times that d1 uses tcp", c)
	}
}

func TestFabricClientBufferOverRDMA(t *testing.T) { testClientBuffer(t, fabric()) }
func TestVerbsClientBufferOverRDMA(t *testing.T) {
	testClientBuffer(t, verbs(t))
}

// testClientBuffer: requests whose local side is a client's own buffer
// move by RDMA once the buffer is registered behind the first one, crc32c
// checked both ways; the buffer's teardown releases its registration and
// takes it out of the link.
func testClientBuffer(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	const bufID xfer.SegmentID = 50
	buf := mapBuffer(t, bufID, 8<<20)
	p.d2.mu.Lock()
	p.d2.segs[bufID] = buf
	p.d2.mu.Unlock()
	mem := buf.Bytes()
	rng := rand.New(rand.NewPCG(8, 8))
	fill(rng, mem[:1<<20])
	if err := p.d2.do(t, xfer.Request{Op: xfer.OpWrite, Local: bufID, Target: p.kv, Length: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	p.d2.log.waitFor(t, "client buffer registered for rdma", 30*time.Second)
	p.d2.untilRDMA(t, p.kvRemote, xfer.Request{Op: xfer.OpWrite, Local: bufID, Target: p.kv, Length: 1 << 20})
	if p.d2.p.rdma.localKeys(buf) == nil {
		t.Fatal("the client buffer has no registration after an rdma WRITE from it")
	}
	for _, n := range rdmaSizes {
		fill(rng, mem[:n])
		want := crc32.Checksum(mem[:n], castagnoli)
		before := p.d2.tcpBytes()
		if err := p.d2.do(t, xfer.Request{Op: xfer.OpWrite, Local: bufID, Target: p.kv, Length: n}); err != nil {
			t.Fatalf("WRITE %d bytes from the buffer: %v", n, err)
		}
		if got := crc32.Checksum(p.expMem(0, n), castagnoli); got != want {
			t.Fatalf("WRITE %d bytes: crc32c %08x landed, %08x sent", n, got, want)
		}
		clear(mem[4<<20 : 4<<20+n])
		if err := p.d2.do(t, xfer.Request{Op: xfer.OpRead, Local: bufID, LocalOffset: 4 << 20, Target: p.kv, Length: n}); err != nil {
			t.Fatalf("READ %d bytes into the buffer: %v", n, err)
		}
		if got := crc32.Checksum(mem[4<<20:4<<20+n], castagnoli); got != want {
			t.Fatalf("READ %d bytes: crc32c %08x read, %08x written", n, got, want)
		}
		if moved := p.d2.tcpBytes() - before; moved >= n {
			t.Fatalf("%d bytes each way from a client buffer moved %d bytes over tcp", n, moved)
		}
	}
	if c := strings.Count(p.d2.log.String(), "client buffer registered for rdma"); c != 1 {
		t.Fatalf("the buffer was registered %d times:\n%s", c, p.d2.log.String())
	}
	if p.d2.counter(t, "rdma.buffers_registered") != 1 {
		t.Fatalf("rdma.buffers_registered %d", p.d2.counter(t, "rdma.buffers_registered"))
	}
	// The client unregisters it: nothing holds it, so its teardown runs
	// now, and its registration goes with it.
	p.d2.mu.Lock()
	delete(p.d2.segs, bufID)
	p.d2.mu.Unlock()
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	if rdma.KeysOf(buf) != nil || p.d2.counter(t, "rdma.buffers_registered") != 0 {
		t.Fatal("the unregistered buffer's rdma registration is still there")
	}
	// The pool keeps moving by rdma.
	before := p.d2.tcpBytes()
	p.roundTrip(t, rng, p.kv, 1<<20, 0, 0)
	if moved := p.d2.tcpBytes() - before; moved != 0 {
		t.Fatalf("pool round trip after the buffer went moved %d bytes over tcp", moved)
	}
}

func TestFabricTransportPerSegment(t *testing.T) { testTransportPerSegment(t, fabric()) }
func TestVerbsTransportPerSegment(t *testing.T) {
	testTransportPerSegment(t, verbs(t))
}

// testTransportPerSegment: the transport chosen when opening a remote
// segment holds for each of its requests: tcp keeps them on tcp with the
// link up; rdma has the open set the link up, so even the first request
// (from a client buffer never used before) moves by RDMA, and while the
// link is down they fail UNAVAILABLE instead of going to tcp, which auto
// segments still use.
func testTransportPerSegment(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	fill(rand.New(rand.NewPCG(4, 4)), p.wMem(p.src, 1<<20))
	viaTCP, _ := p.d2.open(t, "d1/kv", wire.RightRead|wire.RightWrite, wire.TransportTCP)
	viaRDMA, rdmaRemote := p.d2.open(t, "d1/kv", wire.RightRead|wire.RightWrite, wire.TransportRDMA)
	move := func(local, target xfer.SegmentID, n uint64) (uint64, error) {
		t.Helper()
		before := p.d2.tcpBytes()
		w := xfer.Request{Op: xfer.OpWrite, Local: local, Target: target, Length: n}
		if local == poolID {
			w.LocalOffset = p.src
		}
		if err := p.d2.do(t, w); err != nil {
			return 0, err
		}
		return p.d2.tcpBytes() - before, nil
	}
	const bufID xfer.SegmentID = 50
	buf := mapBuffer(t, bufID, 1<<20)
	p.d2.mu.Lock()
	p.d2.segs[bufID] = buf
	p.d2.mu.Unlock()
	if moved, err := move(bufID, viaRDMA, 1<<20); err != nil || moved >= 1<<20 {
		t.Fatalf("first WRITE from a new buffer to a transport-rdma segment: %v, %d bytes on tcp", err, moved)
	}
	if moved, err := move(poolID, viaRDMA, 1<<20); err != nil || moved >= 1<<20 {
		t.Fatalf("pool WRITE to a transport-rdma segment: %v, %d bytes on tcp", err, moved)
	}
	// A link counts what it handed to a transport once that transport's
	// Submit returns, which may be after the request's Done: wait for the
	// counts to catch up with what the test saw end.
	testutil.Eventually(t, 5*time.Second, func() bool { return p.d2.counter(t, "rdma.tasks") >= 2 },
		"rdma.tasks counting the 2 WRITEs by rdma: %v", testutil.Lazy(func() uint64 { return p.d2.counter(t, "rdma.tasks") }))
	tasks, toTCP := p.d2.counter(t, "rdma.tasks"), p.d2.counter(t, "rdma.to_tcp")
	for range 3 {
		if moved, err := move(poolID, viaTCP, 1<<20); err != nil || moved < 1<<20 {
			t.Fatalf("WRITE to a transport-tcp segment with the link up: %v, %d bytes on tcp", err, moved)
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return p.d2.counter(t, "rdma.to_tcp") >= toTCP+3 },
		"rdma.to_tcp counting the 3 transport-tcp WRITEs: %v, want %d", testutil.Lazy(func() uint64 { return p.d2.counter(t, "rdma.to_tcp") }), toTCP+3)
	if p.d2.counter(t, "rdma.tasks") != tasks || p.d2.counter(t, "rdma.to_tcp") != toTCP+3 {
		t.Fatalf("after 3 transport-tcp WRITEs: rdma.tasks %d→%d, rdma.to_tcp %d→%d",
			tasks, p.d2.counter(t, "rdma.tasks"), toTCP, p.d2.counter(t, "rdma.to_tcp"))
	}
	if tasks < 2 || p.d2.counter(t, "rdma.bytes") < 2<<20 || p.d2.counter(t, "rdma.buffers_registered") != 1 || p.d2.counter(t, "rdma.links") != 1 {
		t.Fatalf("rdma counters after 2 WRITEs of 1 MiB by rdma: %v", p.d2.p.Counters(nil))
	}
	// The link goes down: rdma-only requests fail, auto ones use tcp.
	l := p.d2.link("d1")
	if k := rdma.KeysOf(rdmaRemote); k == nil || k.Owner() != any(l) {
		t.Fatalf("the transport-rdma segment carries keys %v, want its link's", k)
	}
	p.d2.p.rdma.retireLink(l, "taken down by the test")
	if k := rdma.KeysOf(rdmaRemote); k != nil {
		t.Fatalf("the retired link's keys stay on the segment (owner %v)", k.Owner())
	}
	if _, err := move(poolID, viaRDMA, 4096); !errors.Is(err, peer.ErrUnavailable) {
		t.Fatalf("transport-rdma WRITE with the link down: %v, want peer.ErrUnavailable", err)
	}
	if p.d2.counter(t, "rdma.unavailable") == 0 || p.d2.counter(t, "rdma.links_closed") != 1 {
		t.Fatalf("after the link went down: %v", p.d2.p.Counters(nil))
	}
	if moved, err := move(poolID, p.kv, 64<<10); err != nil || moved < 64<<10 {
		t.Fatalf("auto WRITE with the link down: %v, %d bytes on tcp", err, moved)
	}
	// The failed request asked for the link again: once it is up and the
	// segment resolved on it (the choice is said again), the segment
	// moves by RDMA again.
	p.d2.log.waitForN(t, "peer requests from the pool use rdma", 2, 30*time.Second)
	if moved, err := move(poolID, viaRDMA, 64<<10); err != nil || moved >= 64<<10 {
		t.Fatalf("transport-rdma WRITE once the link is back: %v, %d bytes on tcp\n%s", err, moved, p.d2.log.String())
	}
}

// TestFabricRemoteCloseReleasesKeys: the owner's keys a link put on a
// remote segment go with the segment: closing it empties its RDMA slot
// and the link forgets it.
func TestFabricRemoteCloseReleasesKeys(t *testing.T) {
	p := startPair(t, fabric())
	p.d2.untilRDMA(t, p.kvRemote, xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: p.kv, Length: 4096})
	l := p.d2.link("d1")
	if k := rdma.KeysOf(p.kvRemote); k == nil || k.Owner() != any(l) || l.resolved() != 1 {
		t.Fatalf("after an rdma WRITE: keys %v on the segment, the link resolved %d", k, l.resolved())
	}
	if err := p.kvRemote.Close(); err != nil {
		t.Fatal(err)
	}
	if k := rdma.KeysOf(p.kvRemote); k != nil || l.resolved() != 0 {
		t.Fatalf("after closing the segment: keys %v on it, the link resolved %d", k, l.resolved())
	}
}

func TestFabricTenantsOverRDMA(t *testing.T) { testTenants(t, fabric()) }
func TestVerbsTenantsOverRDMA(t *testing.T) {
	testTenants(t, verbs(t))
}

// testTenants: an export reaches over RDMA exactly the tenants it reaches
// over tcp. d1's tenants A and B both export "t" (other blocks; A's grants
// tenant C). d2's client of B opening "d1/t" reads B's bytes over rdma, one
// of C opening "d1/A/t" A's; one of B opening "d1/A/t" is refused
// PERMISSION_DENIED and gets no token. A registration is given only for a
// token d1 issued: a made-up one gets no keys, and a daemon before tenants,
// asking by name, reaches the default tenant's exports only.
func testTenants(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	rng := rand.New(rand.NewPCG(7, 7))
	const aOff, bOff = 2 * block, 3 * block
	fill(rng, p.expMem(aOff, p.block))
	fill(rng, p.expMem(bOff, p.block))
	if _, err := p.d1.exports.ExportTo("t", "A", []string{"C"}, p.d1.pool, aOff, p.block, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	if _, err := p.d1.exports.Export("t", "B", p.d1.pool, bOff, p.block, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	read := func(seg xfer.SegmentID, want []byte, who string) {
		t.Helper()
		clear(p.wMem(p.dst, 64<<10))
		if err := p.d2.do(t, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: seg, Length: 64 << 10}); err != nil {
			t.Fatalf("%s: READ: %v\n%s", who, err, p.d1.log.String())
		}
		if !bytes.Equal(p.wMem(p.dst, 64<<10), want) {
			t.Fatalf("%s: READ returned other bytes", who)
		}
	}
	tcpBefore := p.d2.tcpBytes()
	bt, _ := p.d2.openAs(t, "B", "d1/t", wire.RightRead, wire.TransportRDMA)
	read(bt, p.expMem(bOff, 64<<10), "B's client, B's export")
	ct, _ := p.d2.openAs(t, "C", "d1/A/t", wire.RightRead, wire.TransportRDMA)
	read(ct, p.expMem(aOff, 64<<10), "C's client, A's export that grants C")
	if n := p.d2.tcpBytes() - tcpBefore; n != 0 {
		t.Fatalf("%d bytes went over tcp, want every byte over rdma", n)
	}

	_, err := p.d2.p.OpenRemote("d1", tcp.Access{Tenant: "B", Owner: "A", Name: "t"}, wire.RightRead, wire.TransportRDMA)
	if code := status.CodeOf(err); code != tcproto.CodePERMISSION_DENIED {
		t.Fatalf("B's client opening A's export: %v (code %v), want PERMISSION_DENIED", err, code)
	}
	if !strings.Contains(p.d1.log.String(), "request refused: open") {
		t.Fatalf("d1 did not log the refusal:\n%s", p.d1.log.String())
	}

	node := p.d2.p.Node()
	if _, err := node.Exchange("d1", segmentTokenExchange, []byte("not a token d1 issued"), 0); !errors.Is(err, tcp.ErrExchange) ||
		!strings.Contains(err.Error(), "token") {
		t.Fatalf("a registration for a made-up token: %v", err)
	}
	if _, err := node.Exchange("d1", segmentExchange, []byte("t"), 0); !errors.Is(err, tcp.ErrExchange) {
		t.Fatalf("a registration of a tenant's export asked for by name: %v", err)
	}
	if _, err := node.Exchange("d1", segmentExchange, []byte("kv"), 0); err != nil {
		t.Fatalf("a registration of the default tenant's export asked for by name: %v", err)
	}
}

func TestFabricRevokeIsPerTenant(t *testing.T) { testRevokePerTenant(t, fabric()) }
func TestVerbsRevokeIsPerTenant(t *testing.T) {
	testRevokePerTenant(t, verbs(t))
}

// testRevokePerTenant: the end of an export (and with it of its grants)
// takes the keys back from the peers' clients of every tenant it reached,
// and only its own. d1's tenants A (granting C) and B both export "t"; d2's
// clients of C (A's "t") and of B (B's "t") read both over rdma. A's export
// ends: C's segment loses its keys and its reads are refused by d1, while
// B's keeps its keys and still reads over rdma, without a byte on tcp.
func testRevokePerTenant(t *testing.T, devs *devices) {
	p := startPair(t, devs)
	rng := rand.New(rand.NewPCG(8, 8))
	const aOff, bOff = 2 * block, 3 * block
	fill(rng, p.expMem(aOff, p.block))
	fill(rng, p.expMem(bOff, p.block))
	ax, err := p.d1.exports.ExportTo("t", "A", []string{"C"}, p.d1.pool, aOff, p.block, wire.RightRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.d1.exports.Export("t", "B", p.d1.pool, bOff, p.block, wire.RightRead); err != nil {
		t.Fatal(err)
	}
	read := func(seg xfer.SegmentID) error {
		clear(p.wMem(p.dst, 64<<10))
		return p.d2.do(t, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: seg, Length: 64 << 10})
	}
	ct, cRemote := p.d2.openAs(t, "C", "d1/A/t", wire.RightRead, wire.TransportRDMA)
	bt, bRemote := p.d2.openAs(t, "B", "d1/t", wire.RightRead, wire.TransportRDMA)
	for _, s := range []struct {
		seg xfer.SegmentID
		r   *tcp.Remote
		off uint64
	}{{ct, cRemote, aOff}, {bt, bRemote, bOff}} {
		if err := read(s.seg); err != nil {
			t.Fatalf("READ of %s as %q: %v\n%s", s.r.Name(), s.r.Access().Tenant, err, p.d1.log.String())
		}
		if !bytes.Equal(p.wMem(p.dst, 64<<10), p.expMem(s.off, 64<<10)) {
			t.Fatalf("READ of %s as %q returned other bytes", s.r.Name(), s.r.Access().Tenant)
		}
	}
	l := p.d2.link("d1")
	if rdma.KeysOf(cRemote) == nil || rdma.KeysOf(bRemote) == nil || l.resolved() != 2 {
		t.Fatalf("after rdma READs: keys on C's %v, on B's %v, the link resolved %d",
			rdma.KeysOf(cRemote) != nil, rdma.KeysOf(bRemote) != nil, l.resolved())
	}

	if !ax.End(time.Second) {
		t.Fatal("the end of A's export found peer requests in its range")
	}
	if rdma.KeysOf(cRemote) != nil {
		t.Fatalf("C's client still holds the keys of A's ended export:\n%s", p.d2.log.String())
	}
	if k := rdma.KeysOf(bRemote); k == nil || k.Owner() != any(l) || l.resolved() != 1 {
		t.Fatalf("the end of A's \"t\" took the keys of B's \"t\" too (keys %v, the link resolved %d):\n%s",
			k != nil, l.resolved(), p.d2.log.String())
	}
	if !strings.Contains(p.d2.log.String(), `"tenant":"A"`) && !strings.Contains(p.d2.log.String(), "tenant=A") {
		t.Fatalf("d2 did not log whose export's keys were revoked:\n%s", p.d2.log.String())
	}
	// Pinned to rdma, C's segment has no keys left to read with; d1 no
	// longer serves A's "t" to anyone.
	if err := read(ct); err == nil || bytes.Equal(p.wMem(p.dst, 64<<10), p.expMem(aOff, 64<<10)) {
		t.Fatalf("C's READ of A's ended export: %v, want it refused and no byte read", err)
	}
	if _, err := p.d2.p.OpenRemote("d1", tcp.Access{Tenant: "C", Owner: "A", Name: "t"}, wire.RightRead, wire.TransportAuto); err == nil {
		t.Fatal("C's client opened A's ended export again")
	}
	before := p.d2.tcpBytes()
	if err := read(bt); err != nil {
		t.Fatalf("B's READ of its own export after A's ended: %v", err)
	}
	if !bytes.Equal(p.wMem(p.dst, 64<<10), p.expMem(bOff, 64<<10)) {
		t.Fatal("B's READ after A's export ended returned other bytes")
	}
	if n := p.d2.tcpBytes() - before; n != 0 {
		t.Fatalf("B's READ moved %d bytes over tcp after A's export ended, want every byte over rdma", n)
	}
}
