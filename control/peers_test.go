package control

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/client"
	"github.com/tensorcast/tensorcast/fbs/tcproto"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// fakeRemote is a remote segment that records its Close.
type fakeRemote struct {
	size   uint64
	closed atomic.Bool
}

func (r *fakeRemote) ID() xfer.SegmentID { return 1 }
func (r *fakeRemote) Kind() xfer.Kind    { return xfer.KindRemote }
func (r *fakeRemote) Size() uint64       { return r.size }
func (r *fakeRemote) Acquire() bool      { return !r.closed.Load() }
func (r *fakeRemote) Release()           {}
func (r *fakeRemote) Epoch() uint64      { return 42 }
func (r *fakeRemote) Close() error       { r.closed.Store(true); return nil }

// fakePlane records what the server asks of the peer plane.
type fakePlane struct {
	mu     sync.Mutex // guards the fields below
	opened []*fakeRemote
	names  []string
	via    []uint8
}

func (p *fakePlane) OpenRemote(_ OpenContext, peer, segment string, rights, transport uint8) (RemoteSegment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if peer != "d2" {
		return nil, ErrNotFound
	}
	r := &fakeRemote{size: 1 << 20}
	p.opened = append(p.opened, r)
	p.names = append(p.names, peer+"/"+segment)
	p.via = append(p.via, transport)
	return r, nil
}

func (p *fakePlane) Peers() []wire.PeerInfo {
	return []wire.PeerInfo{{ID: []byte("d2"), Addr: []byte("127.0.0.1:1"), Epoch: 42, Connected: true}}
}

func withPeers(p PeerPlane, maxNotes int) envOpt {
	return func(c *Config, d *Deps) {
		d.Peers = p
		c.Limits.MaxNotifications = maxNotes
	}
}

func withExports(x *peer.Exports) envOpt {
	return func(_ *Config, d *Deps) { d.Exports = x }
}

// catalogEvents is a peer.Catalog that says when each name leaves the
// table: the moment an export's end starts waiting for its peer requests.
type catalogEvents struct{ unexported chan string }

func (c catalogEvents) Exported(string, uint64, uint8) {}
func (c catalogEvents) Unexported(name string)         { c.unexported <- name }

func registerBuffer(t *testing.T, c *rawClient, size uint64) xfer.SegmentID {
	t.Helper()
	fd := newMemfd(t, size)
	defer unix.Close(fd)
	r := c.call(&wire.RegisterBufferRequest{Size: size}, fd)
	expectCode(t, r, tcproto.CodeOK)
	return xfer.SegmentID(body[wire.RegisterBufferResponse](t, r).Segment)
}

func TestExportsAndNotifications(t *testing.T) {
	cat := catalogEvents{unexported: make(chan string, 16)}
	exp := peer.NewExports(cat)
	e := newEnv(t, false, withPeers(&fakePlane{}, 3), withExports(exp))
	owner := dialRaw(t, e.sock)
	seg := registerBuffer(t, owner, 1<<16)
	export := func(c *rawClient, name string, seg xfer.SegmentID, off, n uint64, rights uint8) *wire.Response {
		return c.call(&wire.ExportSegmentRequest{Name: []byte(name), Segment: uint64(seg),
			Offset: off, Length: n, Rights: rights})
	}
	r := export(owner, "kv", seg, 4096, 0, wire.RightRead|wire.RightWrite)
	expectCode(t, r, tcproto.CodeOK)
	if body[wire.ExportSegmentResponse](t, r).Size != 1<<16-4096 {
		t.Fatalf("exported size %d", body[wire.ExportSegmentResponse](t, r).Size)
	}
	other := dialRaw(t, e.sock)
	oseg := registerBuffer(t, other, 4096)
	expectCode(t, export(other, "kv", oseg, 0, 0, wire.RightRead), tcproto.CodeALREADY_EXISTS)
	expectCode(t, export(other, "a/b", oseg, 0, 0, wire.RightRead), tcproto.CodeINVALID_ARGUMENT)
	expectCode(t, export(other, "r0", oseg, 0, 0, 0), tcproto.CodeINVALID_ARGUMENT)
	expectCode(t, export(other, "big", oseg, 0, 8192, wire.RightRead), tcproto.CodeINVALID_ARGUMENT)
	expectCode(t, export(other, "theirs", seg, 0, 0, wire.RightRead), tcproto.CodeNOT_FOUND)
	expectCode(t, export(other, "pool", testPoolID, 0, 4096, wire.RightRead), tcproto.CodePERMISSION_DENIED)
	expectCode(t, other.call(&wire.UnexportSegmentRequest{Name: []byte("kv")}), tcproto.CodeNOT_FOUND)

	x, err := exp.Resolve("", "", "kv")
	if err != nil || x.Size() != 1<<16-4096 || len(x.Segment().Bytes()) != 1<<16-4096 {
		t.Fatalf("Resolve: %v, %v", x, err)
	}
	v := x.Segment()
	if _, err := exp.Resolve("", "", "nope"); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Resolve of an unknown name: %v", err)
	}
	if err := x.Deliver([]byte("x")); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Deliver without subscribers: %v", err)
	}

	// The subscriber's queue holds 3; a fourth is refused, nothing lost.
	expectCode(t, other.call(&wire.SubscribeRequest{Name: []byte("nope")}), tcproto.CodeNOT_FOUND)
	expectCode(t, other.call(&wire.SubscribeRequest{Name: []byte("kv")}), tcproto.CodeOK)
	for i, p := range []string{"n1", "n2", "n3"} {
		if err := deliverExport(exp, "kv", []byte(p)); err != nil {
			t.Fatalf("Deliver %d: %v", i, err)
		}
	}
	if err := deliverExport(exp, "kv", []byte("n4")); !errors.Is(err, peer.ErrLimit) {
		t.Fatalf("Deliver to a full queue: %v", err)
	}
	if err := deliverExport(exp, "kv", make([]byte, wire.MaxNotify+1)); !errors.Is(err, peer.ErrLimit) {
		t.Fatalf("Deliver of an oversized notification: %v", err)
	}
	poll := func(max, timeoutMS uint32) []string {
		r := other.call(&wire.PollNotificationsRequest{Max: max, TimeoutMS: timeoutMS})
		expectCode(t, r, tcproto.CodeOK)
		var out []string
		for _, n := range body[wire.PollNotificationsResponse](t, r).Notifications {
			if string(n.Segment) != "kv" {
				t.Fatalf("notification for %q", n.Segment)
			}
			out = append(out, string(n.Payload))
		}
		return out
	}
	if got := poll(2, 0); strings.Join(got, ",") != "n1,n2" {
		t.Fatalf("first poll: %v", got)
	}
	if got := poll(0, 0); strings.Join(got, ",") != "n3" {
		t.Fatalf("second poll: %v", got)
	}
	start := time.Now()
	if got := poll(0, 60); len(got) != 0 || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("empty poll: %v after %v", got, time.Since(start))
	}
	// A poll that waits answers with what is delivered meanwhile, long
	// before its timeout (that it sleeps until the wake-up, rather than
	// polling, is the inbox's test in package peer).
	if err := other.sendBody(&wire.PollNotificationsRequest{TimeoutMS: 60000}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := deliverExport(exp, "kv", []byte("late")); err != nil {
		t.Fatal(err)
	}
	r, _, err = other.recv()
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, tcproto.CodeOK)
	if n := body[wire.PollNotificationsResponse](t, r).Notifications; len(n) != 1 || string(n[0].Payload) != "late" || time.Since(start) > 30*time.Second {
		t.Fatalf("waiting poll: %+v after %v", n, time.Since(start))
	}

	// Segments lists the export; unexport ends delivery and lookups, and
	// waits for a peer request still holding the range.
	r = other.call(&wire.SegmentsRequest{})
	if len(body[wire.SegmentsResponse](t, r).Segments) != 1 || string(body[wire.SegmentsResponse](t, r).Segments[0].Name) != "kv" || body[wire.SegmentsResponse](t, r).Segments[0].Segment != uint64(seg) || body[wire.SegmentsResponse](t, r).Segments[0].Rights != 3 {
		t.Fatalf("segments: %+v", body[wire.SegmentsResponse](t, r).Segments)
	}
	if !v.Acquire() {
		t.Fatal("Acquire of a live export failed")
	}
	// The unexport's answer is read on its own goroutine, which notes
	// whether the range was released by then.
	released := make(chan struct{})
	type answer struct {
		r     *wire.Response
		early bool
	}
	done := make(chan answer, 1)
	go func() {
		r := owner.call(&wire.UnexportSegmentRequest{Name: []byte("kv")})
		select {
		case <-released:
			done <- answer{r: r}
		default:
			done <- answer{r: r, early: true}
		}
	}()
	// The name leaves the table first (the catalog hears of it); then the
	// unexport waits for the reference this test holds.
	if name := <-cat.unexported; name != "kv" {
		t.Fatalf("catalog told %q left, want kv", name)
	}
	if _, err := lookupExport(exp, "kv"); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Lookup while the unexport waits: %v", err)
	}
	close(released)
	v.Release()
	a := <-done
	expectCode(t, a.r, tcproto.CodeOK)
	if a.early {
		t.Fatal("UnexportSegment answered before the peer request released the range")
	}
	if v.Acquire() {
		t.Fatal("Acquire of an unexported segment succeeded")
	}
	if _, err := lookupExport(exp, "kv"); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Lookup after unexport: %v", err)
	}
	if err := deliverExport(exp, "kv", nil); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Deliver after unexport: %v", err)
	}

	// Pool blocks: exportable when held, not freeable while exported;
	// everything goes with the connection.
	r = owner.call(&wire.AllocBlocksRequest{N: 1, Size: 16384})
	off := body[wire.AllocBlocksResponse](t, r).Offsets[0]
	expectCode(t, export(owner, "blk", testPoolID, off, 16384, wire.RightWrite), tcproto.CodeOK)
	r = owner.call(&wire.FreeBlocksRequest{Offsets: []uint64{off}})
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 1 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeFAILED_PRECONDITION {
		t.Fatalf("free of an exported block: %+v", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	// A peer request that outlives unexport's wait keeps the block from
	// being freed until it ends.
	bv, err := lookupExport(exp, "blk")
	if err != nil || !bv.Acquire() {
		t.Fatalf("Lookup blk: %v", err)
	}
	expectCode(t, owner.call(&wire.UnexportSegmentRequest{Name: []byte("blk")}), tcproto.CodeOK)
	r = owner.call(&wire.FreeBlocksRequest{Offsets: []uint64{off}})
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 1 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeFAILED_PRECONDITION {
		t.Fatalf("free of a block a peer request still holds: %+v", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	bv.Release()
	r = owner.call(&wire.FreeBlocksRequest{Offsets: []uint64{off}})
	if len(body[wire.FreeBlocksResponse](t, r).Codes) != 1 || body[wire.FreeBlocksResponse](t, r).Codes[0] != tcproto.CodeOK {
		t.Fatalf("free once the peer request ended: %+v", body[wire.FreeBlocksResponse](t, r).Codes)
	}
	expectCode(t, export(owner, "kv2", seg, 0, 0, wire.RightRead), tcproto.CodeOK)
	expectCode(t, other.call(&wire.SubscribeRequest{Name: []byte("kv2")}), tcproto.CodeOK)
	// Unregistering a buffer unexports what came from it.
	expectCode(t, owner.call(&wire.UnregisterBufferRequest{Segment: uint64(seg)}), tcproto.CodeOK)
	if _, err := lookupExport(exp, "kv2"); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Lookup after the buffer went: %v", err)
	}
	r = owner.call(&wire.AllocBlocksRequest{N: 1, Size: 16384})
	expectCode(t, export(owner, "blk2", testPoolID, body[wire.AllocBlocksResponse](t, r).Offsets[0], 16384, wire.RightWrite), tcproto.CodeOK)
	owner.uc.Close()
	other.uc.Close()
	e.waitIdle()
	if _, err := lookupExport(exp, "blk2"); !errors.Is(err, peer.ErrNotFound) {
		t.Fatalf("Lookup after the owner closed: %v", err)
	}
}

func TestOpenRemoteAndNotifyArgs(t *testing.T) {
	p := &fakePlane{}
	e := newEnv(t, false, withPeers(p, 0))
	c := dialRaw(t, e.sock)
	seg := registerBuffer(t, c, 1<<16)
	open := func(name string, rights uint8) *wire.Response {
		return c.call(&wire.OpenRemoteRequest{Name: []byte(name), Rights: rights})
	}
	expectCode(t, open("nopeer", wire.RightRead), tcproto.CodeINVALID_ARGUMENT)
	expectCode(t, open("d2/kv", 4), tcproto.CodeINVALID_ARGUMENT)
	expectCode(t, open("d9/kv", wire.RightRead), tcproto.CodeNOT_FOUND)
	r := open("d2/kv", wire.RightRead|wire.RightWrite)
	expectCode(t, r, tcproto.CodeOK)
	or := body[wire.OpenRemoteResponse](t, r)
	rid := xfer.SegmentID(or.Segment)
	if or.Size != 1<<20 || or.Epoch != 42 || rid == 0 || rid == seg || rid == testPoolID {
		t.Fatalf("open: %+v", or)
	}
	r = c.call(&wire.PeersRequest{})
	if len(body[wire.PeersResponse](t, r).Peers) != 1 || string(body[wire.PeersResponse](t, r).Peers[0].ID) != "d2" || !body[wire.PeersResponse](t, r).Peers[0].Connected {
		t.Fatalf("peers: %+v", body[wire.PeersResponse](t, r).Peers)
	}
	r = c.call(&wire.SegmentsRequest{})
	if len(body[wire.SegmentsResponse](t, r).Segments) != 1 || string(body[wire.SegmentsResponse](t, r).Segments[0].Peer) != "d2" || body[wire.SegmentsResponse](t, r).Segments[0].Segment != uint64(rid) || body[wire.SegmentsResponse](t, r).Segments[0].Epoch != 42 {
		t.Fatalf("segments: %+v", body[wire.SegmentsResponse](t, r).Segments)
	}

	// Notifications travel with their requests, positionally, to the
	// transport, which says whether it can carry them: here the test
	// router sends everything to the local transport, which carries none,
	// so each notified item fails UNAVAILABLE (xfer.ErrNoNotify) at its own
	// position, a twin included, and the plain local item beside them
	// completes.
	local := xfer.Request{Op: xfer.OpWrite, Local: seg, Target: seg, TargetOffset: 8192, Length: 16}
	r = c.call(&wire.TransferRequestBody{TimeoutMS: 2000,
		Requests: []xfer.Request{local, local, local}, Notify: [][]byte{[]byte("a"), nil, []byte("a")}})
	expectCode(t, r, tcproto.CodeOK)
	for i, want := range []Code{tcproto.CodeUNAVAILABLE, tcproto.CodeOK, tcproto.CodeUNAVAILABLE} {
		if body[wire.TransferResponse](t, r).Codes[i] != want {
			t.Fatalf("codes %v, want item %d %s", body[wire.TransferResponse](t, r).Codes, i, want)
		}
	}
	if st := body[wire.TransferResponse](t, r).States; st[1] != tcproto.TaskStateCOMPLETED || st[0] != tcproto.TaskStateFAILED {
		t.Fatalf("states %v", st)
	}
	// The same through Submit: one code per item at submit time (all
	// accepted), the notified ones Failed in their status.
	r = c.call(&wire.AllocBatchRequest{Capacity: 4})
	expectCode(t, r, tcproto.CodeOK)
	batch := body[wire.AllocBatchResponse](t, r).Batch
	r = c.call(&wire.SubmitRequest{Batch: batch,
		Requests: []xfer.Request{local, local}, Notify: [][]byte{nil, []byte("b")}})
	expectCode(t, r, tcproto.CodeOK)
	for i, want := range []tcproto.TaskState{tcproto.TaskStateCOMPLETED, tcproto.TaskStateFAILED} {
		r = c.call(&wire.TaskStatusRequest{Batch: batch, Index: uint32(i)})
		expectCode(t, r, tcproto.CodeOK)
		if got := body[wire.TaskStatusResponse](t, r); got.State != want {
			t.Fatalf("submitted item %d: %+v, want %v", i, got, want)
		}
	}
	expectCode(t, c.call(&wire.FreeBatchRequest{Batch: batch}), tcproto.CodeOK)

	expectCode(t, c.call(&wire.CloseRemoteRequest{Segment: 999}), tcproto.CodeNOT_FOUND)
	expectCode(t, c.call(&wire.CloseRemoteRequest{Segment: uint64(rid)}), tcproto.CodeOK)
	// The transport asked for reaches the plane; an unknown one is refused.
	expectCode(t, c.call(&wire.OpenRemoteRequest{Name: []byte("d2/kv"), Rights: wire.RightRead, Transport: 3}),
		tcproto.CodeINVALID_ARGUMENT)
	for _, via := range []uint8{wire.TransportTCP, wire.TransportRDMA} {
		r := c.call(&wire.OpenRemoteRequest{Name: []byte("d2/kv"), Rights: wire.RightRead, Transport: via})
		expectCode(t, r, tcproto.CodeOK)
		id := body[wire.OpenRemoteResponse](t, r).Segment
		r = c.call(&wire.SegmentsRequest{})
		i := slices.IndexFunc(body[wire.SegmentsResponse](t, r).Segments, func(si wire.SegmentInfo) bool { return si.Segment == id })
		if i < 0 || body[wire.SegmentsResponse](t, r).Segments[i].Transport != via {
			t.Fatalf("segments after opening with transport %d: %+v", via, body[wire.SegmentsResponse](t, r).Segments)
		}
		expectCode(t, c.call(&wire.CloseRemoteRequest{Segment: id}), tcproto.CodeOK)
	}
	p.mu.Lock()
	via := slices.Clone(p.via)
	p.mu.Unlock()
	if !slices.Equal(via, []uint8{wire.TransportAuto, wire.TransportTCP, wire.TransportRDMA}) {
		t.Fatalf("transports the plane was asked for: %v", via)
	}
	p.mu.Lock()
	first := p.opened[0]
	p.mu.Unlock()
	if !first.closed.Load() {
		t.Fatal("CloseRemote did not close the segment")
	}
	expectCode(t, open("d2/kv", wire.RightRead), tcproto.CodeOK)
	c.uc.Close()
	e.waitIdle()
	p.mu.Lock()
	second := p.opened[3]
	p.mu.Unlock()
	if !second.closed.Load() {
		t.Fatal("closing the connection did not close its remote segment")
	}
}

func TestPeerCallsWithoutPlane(t *testing.T) {
	e := newEnv(t, false)
	c := dialRaw(t, e.sock)
	seg := registerBuffer(t, c, 1<<16)
	expectCode(t, c.call(&wire.OpenRemoteRequest{Name: []byte("d2/kv"), Rights: wire.RightRead}),
		tcproto.CodeUNAVAILABLE)
	expectCode(t, c.call(&wire.PeersRequest{}), tcproto.CodeUNAVAILABLE)
	r := c.call(&wire.TransferRequestBody{TimeoutMS: 2000,
		Requests: []xfer.Request{{Op: xfer.OpWrite, Local: seg, Target: seg, TargetOffset: 4096, Length: 16}},
		Notify:   [][]byte{[]byte("x")}})
	expectCode(t, r, tcproto.CodeOK)
	if body[wire.TransferResponse](t, r).Codes[0] != tcproto.CodeUNAVAILABLE {
		t.Fatalf("notification without a peer plane: %v", body[wire.TransferResponse](t, r).Codes)
	}
	// Exports work without a plane (nothing reaches them, but they list).
	expectCode(t, c.call(&wire.ExportSegmentRequest{Name: []byte("kv"), Segment: uint64(seg),
		Rights: wire.RightRead}), tcproto.CodeOK)
	c.uc.Close()
	e.waitIdle()
}

// TestSegmentsListPerTenant: a tenant's client is told only its own
// tenant's exports; a connection in no tenant (root) is told every one.
func TestSegmentsListPerTenant(t *testing.T) {
	e, poolB := tenantEnv(t)
	bin := openToAll(t, e)
	for _, x := range []struct {
		name, tenant string
		seg          *shm.Pool
	}{{"from-a", "a", e.pool}, {"from-b", "b", poolB}} {
		exp, err := e.srv.exports.Export(x.name, x.tenant, x.seg, 0, 4096, wire.RightRead)
		if err != nil {
			t.Fatal(err)
		}
		defer exp.End(0)
	}
	for _, c := range []struct {
		uid  uint32
		want string
	}{{uidA, "status OK\nsegment from-a"}, {uidB, "status OK\nsegment from-b"}} {
		if got := runAs(t, e, bin, "segments", c.uid, c.uid, nil); got != c.want {
			t.Errorf("uid %d lists:\n%s\nwant:\n%s", c.uid, got, c.want)
		}
	}
	r := dialRaw(t, e.sock).call(&wire.SegmentsRequest{})
	if s := body[wire.SegmentsResponse](t, r).Segments; len(s) != 2 {
		t.Errorf("root lists %d segments, want both tenants' 2", len(s))
	}
}

// TestQueueToRemoteSegment: a queue request to a peer's segment, whose own
// id is the peer plane's and not the one its client names it by, reaches
// the transport as the same request through a Transfer call does, and
// ends with the same code (here the test router's local transport, which
// cannot write to a peer: not NOT_FOUND, which a resolution by the wrong
// id would give).
func TestQueueToRemoteSegment(t *testing.T) {
	e := newEnv(t, false, withPeers(&fakePlane{}, 0))
	c, q := queueClient(t, e, 8)
	buf, err := c.RegisterBuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.OpenRemote("d2/kv", wire.RightRead|wire.RightWrite)
	if err != nil {
		t.Fatal(err)
	}
	req := xfer.Request{Op: xfer.OpWrite, Local: buf.ID, Target: rs.ID, TargetOffset: 4096, Length: 4096}
	res := make([]error, 1)
	if _, err := c.Transfer([]xfer.Request{req}, testTimeout, res); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Submit([]xfer.Request{req}, []uint64{9}); n != 1 || err != nil {
		t.Fatalf("submit: %d %v", n, err)
	}
	got := reapAll(t, q, 1)[9].Err() // the code's sentinel
	if errors.Is(got, client.ErrNotFound) || (got == nil) != (res[0] == nil) || got != nil && !errors.Is(res[0], got) {
		t.Fatalf("through the queue: %v; through Transfer: %v", got, res[0])
	}
}

// lookupExport and deliverExport are a peer request of the default
// tenant (the clients of these tests') for the export named name.
func lookupExport(exp *peer.Exports, name string) (xfer.MemSegment, error) {
	x, err := exp.Resolve("", "", name)
	if err != nil {
		return nil, err
	}
	return x.Segment(), nil
}

func deliverExport(exp *peer.Exports, name string, payload []byte) error {
	x, err := exp.Resolve("", "", name)
	if err != nil {
		return err
	}
	return x.Deliver(payload)
}
