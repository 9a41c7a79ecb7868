package link

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorcast/tensorcast/directory"
	"github.com/tensorcast/tensorcast/internal/testutil"
	"github.com/tensorcast/tensorcast/peer"
	"github.com/tensorcast/tensorcast/rdma"
	"github.com/tensorcast/tensorcast/rdma/rdmatest"
	"github.com/tensorcast/tensorcast/shm"
	"github.com/tensorcast/tensorcast/tcp"
	"github.com/tensorcast/tensorcast/wire"
	"github.com/tensorcast/tensorcast/xfer"
)

// Two daemons' peer planes in one process, each with its tcp node, export
// table, pool, links and an engine that routes remote targets to them: d1
// exports, d2 writes and reads. Their RDMA devices come from an rdmatest fabric
// (the TestFabric* tests, anywhere) or are the host's (the TestVerbs*
// tests, which make test-rdma runs in the Soft-RoCE VM).

func TestMain(m *testing.M) { testutil.Main(m) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// logSink is a log that tests wait on: every write wakes waitFor.
type logSink struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
	// wrote has room for one token, left by each write.
	wrote chan struct{}
}

func newLogSink() *logSink { return &logSink{wrote: make(chan struct{}, 1)} }

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	n, err := l.b.Write(p)
	l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return n, err
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until the log holds s (woken by each write), failing the
// test after d.
func (l *logSink) waitFor(t *testing.T, s string, d time.Duration) {
	t.Helper()
	l.waitForN(t, s, 1, d)
}

// waitForN waits until the log holds s n times.
func (l *logSink) waitForN(t *testing.T, s string, n int, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for strings.Count(l.String(), s) < n {
		select {
		case <-l.wrote:
		case <-timer.C:
			t.Fatalf("%q logged fewer than %d times within %v:\n%s", s, n, d, l.String())
		}
	}
}

// devices is where a test's planes get their RDMA devices.
type devices struct {
	fab *rdmatest.Fabric // nil: the host's device, RXE_DEV
	// deliver, when set, is where the planes' tcp nodes deliver the
	// notifications peers send, instead of their export tables.
	deliver func(name string, payload []byte) error
	mu      sync.Mutex // guards opened
	// opened are the fabric's devices by daemon id.
	opened map[string]*rdmatest.Device
}

// fabric is an in-memory RDMA fabric: every test can run.
func fabric() *devices {
	return &devices{fab: rdmatest.NewFabric(), opened: map[string]*rdmatest.Device{}}
}

// verbs is the host's RDMA device, named by RXE_DEV: make test-rdma sets it
// inside the Soft-RoCE VM; elsewhere the test skips.
func verbs(t *testing.T) *devices {
	t.Helper()
	testutil.Require(t, testutil.RDMA)
	return &devices{}
}

// config is the RDMA config of daemon id: rdma = on, on this source's
// device.
func (d *devices) config(id string) Config {
	c := Config{Mode: "on"}
	if d.fab == nil {
		c.Device = os.Getenv("RXE_DEV")
		return c
	}
	c.Open = func(rc rdma.Config, log *slog.Logger) (Device, error) {
		dev := d.fab.Open(id, rc, log)
		d.mu.Lock()
		d.opened[id] = dev
		d.mu.Unlock()
		return dev, nil
	}
	return c
}

// fabricDevice is daemon id's device on the fabric, nil for real verbs.
func (d *devices) fabricDevice(id string) *rdmatest.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opened[id]
}

// plane is one daemon's peer plane as these tests need it: its tcp node
// and its links, routed and opened through as package peer/plane does.
type plane struct {
	node *tcp.Node
	rdma *Links
}

// Node is the plane's tcp node.
func (p *plane) Node() *tcp.Node { return p.node }

// Counters are the links' counters.
func (p *plane) Counters(dst []wire.Counter) []wire.Counter { return p.rdma.Counters(dst) }

// Route is the link Route gives, else the tcp node.
func (p *plane) Route(local, target xfer.Segment) xfer.Transport {
	if l := p.rdma.Route(local, target); l != nil {
		return l
	}
	return p.node
}

// OpenRemote opens segment on peerID, pinned to transport unless it is
// auto.
func (p *plane) OpenRemote(peerID, segment string, rights, transport uint8) (*tcp.Remote, error) {
	r, err := p.node.Open(peerID, segment, tcp.Rights(rights))
	if err != nil {
		return nil, err
	}
	if transport != wire.TransportAuto {
		if err := p.rdma.Pin(r, transport); err != nil {
			_ = r.Close()
			return nil, fmt.Errorf("%w: %s/%s with transport rdma: %w", peer.ErrUnavailable, peerID, segment, err)
		}
	}
	return r, nil
}

// Close closes the links, then the node.
func (p *plane) Close() {
	p.rdma.Close()
	_ = p.node.Close()
}

// side is one daemon's peer plane. Request segment ids are the side's own
// (as a daemon's registry's are): its pool is 1, remote segments it opens
// are 1000 and up.
type side struct {
	id      string
	log     *logSink
	exports *peer.Exports
	pool    *shm.Pool
	p       *plane
	eng     *xfer.Engine

	mu     sync.Mutex // guards segs and nextID
	segs   map[xfer.SegmentID]xfer.Segment
	nextID xfer.SegmentID

	// stops are the side's closers, last first; stop runs them once.
	stops    []func()
	stopOnce sync.Once
}

// stop closes the engine, the plane and the pool (the test's cleanup
// does, if the test did not).
func (s *side) stop() {
	s.stopOnce.Do(func() {
		for i := len(s.stops) - 1; i >= 0; i-- {
			s.stops[i]()
		}
	})
}

const poolID xfer.SegmentID = 1

// startSide starts daemon id's plane on 127.0.0.1, accepting peers.
func startSide(t *testing.T, id, key string, devs *devices, peers ...directory.Peer) *side {
	t.Helper()
	return startSideAt(t, id, key, "127.0.0.1:0", devs, peers...)
}

// startSideAt is startSide listening on listen.
func startSideAt(t *testing.T, id, key, listen string, devs *devices, peers ...directory.Peer) *side {
	t.Helper()
	s := &side{id: id, log: newLogSink(), segs: map[xfer.SegmentID]xfer.Segment{}, nextID: 1000}
	t.Cleanup(s.stop)
	log := slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var err error
	if s.pool, err = shm.NewPool(shm.PoolConfig{ID: poolID, Name: id, Size: 32 << 20, Hugepages: shm.HugepagesOff}, log); err != nil {
		t.Fatal(err)
	}
	s.stops = append(s.stops, func() {
		if err := s.pool.Close(); err != nil {
			t.Errorf("%s: closing the pool: %v", id, err)
		}
	})
	s.segs[poolID] = s.pool
	s.exports = peer.NewExports(nil)
	node, err := tcp.NewNode(tcp.Config{DaemonID: id, Listen: listen, ClusterKeyFile: key, ConnsPerPeer: 1,
		SliceSize: 64 << 10, Peers: peers}, nodeExports{s.exports, devs.deliver}, log)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	links, why, err := New(devs.config(id), []xfer.MemSegment{s.pool}, node, s.exports, log)
	if err != nil || links == nil {
		_ = node.Close()
		t.Fatalf("%s: no links (%s): %v", id, why, err)
	}
	s.p = &plane{node: node, rdma: links}
	s.stops = append(s.stops, func() {
		s.p.Close()
		if dev := devs.fabricDevice(id); dev != nil {
			if regs, trs := dev.Live(); regs != 0 || trs != 0 {
				t.Errorf("%s: %d regions and %d transports left on its device after Close", id, regs, trs)
			}
		}
	})
	s.eng = xfer.NewEngine(xfer.Config{}, remoteRoute{s.p}, log)
	s.stops = append(s.stops, func() {
		if err := s.eng.Close(); err != nil {
			t.Errorf("%s: closing the engine: %v", id, err)
		}
	})
	return s
}

// remoteRoute sends every request to the plane's transport for its target.
type remoteRoute struct{ p *plane }

func (r remoteRoute) Route(local, target xfer.Segment) (xfer.Transport, error) {
	if target.Kind() != xfer.KindRemote {
		return nil, fmt.Errorf("%w: the test routes remote targets only", xfer.ErrNotSupported)
	}
	return r.p.Route(local, target), nil
}

// Resolve implements xfer.Resolver over the side's segments.
func (s *side) Resolve(id xfer.SegmentID) (xfer.Segment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg, ok := s.segs[id]
	return seg, ok
}

// add makes seg a request segment under a new id.
func (s *side) add(seg xfer.Segment) xfer.SegmentID {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	s.nextID++
	s.segs[id] = seg
	return id
}

// open opens name ("peer/segment") with rights and transport as a
// request segment, closed at the end of the test.
func (s *side) open(t *testing.T, name string, rights, transport uint8) (xfer.SegmentID, *tcp.Remote) {
	t.Helper()
	pid, seg, err := peer.SplitRemote(name)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.p.OpenRemote(pid, seg, rights, transport)
	if err != nil {
		t.Fatalf("%s: OpenRemote %s: %v\n%s", s.id, name, err, s.log.String())
	}
	t.Cleanup(func() { rs.Close() })
	return s.add(rs), rs
}

// nodeExports is the export table as the tcp node serves peers from it;
// deliver, when set, takes the notifications instead.
type nodeExports struct {
	*peer.Exports
	deliver func(name string, payload []byte) error
}

// Deliver implements tcp.Exporter.
func (x nodeExports) Deliver(name string, payload []byte) error {
	if x.deliver != nil {
		return x.deliver(name, payload)
	}
	return x.Exports.Deliver(name, payload)
}

// Granted implements tcp.RightsExporter.
func (x nodeExports) Granted(name string) (tcp.Rights, bool) {
	r, ok := x.Exports.Granted(name)
	return tcp.Rights(r), ok
}

// transfer runs reqs (notify positional, or nil) in one batch and returns
// each request's error: nil when it completed.
func (s *side) transfer(t *testing.T, reqs []xfer.Request, notify [][]byte, timeout time.Duration) []error {
	t.Helper()
	id, err := s.eng.AllocateBatch(len(reqs))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]error, len(reqs))
	deadline := time.Now().Add(timeout)
	if err := s.eng.Submit(id, reqs, xfer.SubmitOptions{Resolver: s, Deadline: deadline, Notify: notify}, out); err != nil {
		t.Fatal(err)
	}
	if _, err := s.eng.Wait(id, deadline.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if out[i] != nil {
			continue // refused at submit
		}
		st, err := s.eng.Status(id, i)
		switch {
		case err != nil:
			out[i] = err
		case st.State != xfer.StateCompleted:
			out[i] = fmt.Errorf("%v: %w", st.State, st.Err)
			if st.Err == nil {
				out[i] = fmt.Errorf("ended %v", st.State)
			}
		}
	}
	if err := s.eng.Free(id); err != nil {
		t.Fatal(err)
	}
	return out
}

// do runs one request and returns its error.
func (s *side) do(t *testing.T, r xfer.Request) error {
	t.Helper()
	return s.transfer(t, []xfer.Request{r}, nil, 20*time.Second)[0]
}

// tcpBytes is what the side's tcp node moved to and from its peers.
func (s *side) tcpBytes() uint64 {
	var n uint64
	for _, p := range s.p.Node().Peers() {
		n += p.BytesIn + p.BytesOut
	}
	return n
}

// counter is the side's RDMA counter name (tcctl stats).
func (s *side) counter(t *testing.T, name string) uint64 {
	t.Helper()
	for _, c := range s.p.Counters(nil) {
		if c.Name == name {
			return c.Value
		}
	}
	t.Fatalf("%s has no counter %s", s.id, name)
	return 0
}

// linkUp has the side's RDMA worker bring the link to r's peer up and
// resolve r now, as OpenRemote with transport rdma does; it fails the test
// when that fails.
func (s *side) linkUp(t *testing.T, r *tcp.Remote) {
	t.Helper()
	if err := s.prepare(r); err != nil {
		t.Fatalf("%s: rdma link to %s for %s: %v\n%s", s.id, r.Peer(), r.Name(), err, s.log.String())
	}
}

// prepare is the worker's attempt at r's link and registration.
func (s *side) prepare(r *tcp.Remote) error {
	j := pinJob{r: r, done: make(chan error, 1)}
	s.p.rdma.prep <- j
	return <-j.done
}

// link is the side's rdma link to peer, or nil.
func (s *side) link(id string) *rdmaLink { return (*s.p.rdma.links.Load())[id] }

// pair is d1, which exports kv (block bytes of its pool, read and write),
// and d2, which opened d1/kv as kv. d2's requests use its pool's first
// block (src) and second (dst).
type pair struct {
	d1, d2   *side
	kvExport *peer.Export
	kv       xfer.SegmentID // d2's request segment for d1/kv
	kvRemote *tcp.Remote
	block    uint64
	src, dst uint64
	key      string // the cluster key file
}

const block = 4 << 20

func startPair(t *testing.T, devs *devices) *pair {
	t.Helper()
	key := testutil.KeyFile(t, t.TempDir(), "cluster.key", "tensorcast peer plane test key")
	p := &pair{block: block, src: 0, dst: block, key: key}
	p.d1 = startSide(t, "d1", key, devs, directory.Peer{ID: "d2"})
	p.d2 = startSide(t, "d2", key, devs, directory.Peer{ID: "d1", Addr: p.d1.p.Node().Addr()})
	var err error
	if p.kvExport, err = p.d1.exports.Export("kv", "", p.d1.pool, 0, block, 3); err != nil {
		t.Fatal(err)
	}
	p.kv, p.kvRemote = p.d2.open(t, "d1/kv", 3, 0)
	return p
}

// expMem is d1's exported bytes at off.
func (p *pair) expMem(off, n uint64) []byte { return p.d1.pool.Bytes()[off : off+n] }

// wMem is d2's pool at off.
func (p *pair) wMem(off, n uint64) []byte { return p.d2.pool.Bytes()[off : off+n] }

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// roundTrip writes n bytes from d2's pool into target at toff (d1's pool
// at expAt), reads them back into d2's dst and checks crc32c on both ends.
func (p *pair) roundTrip(t *testing.T, rng *rand.Rand, target xfer.SegmentID, n, toff, expAt uint64) {
	t.Helper()
	src := p.wMem(p.src, n)
	fill(rng, src)
	want := crc32.Checksum(src, castagnoli)
	if err := p.d2.do(t, xfer.Request{Op: xfer.OpWrite, Local: poolID, LocalOffset: p.src, Target: target, TargetOffset: toff, Length: n}); err != nil {
		t.Fatalf("WRITE %d bytes: %v", n, err)
	}
	if got := crc32.Checksum(p.expMem(expAt, n), castagnoli); got != want {
		t.Fatalf("WRITE %d bytes: crc32c %08x landed, %08x sent", n, got, want)
	}
	dst := p.wMem(p.dst, n)
	clear(dst)
	if err := p.d2.do(t, xfer.Request{Op: xfer.OpRead, Local: poolID, LocalOffset: p.dst, Target: target, TargetOffset: toff, Length: n}); err != nil {
		t.Fatalf("READ %d bytes: %v", n, err)
	}
	if got := crc32.Checksum(dst, castagnoli); got != want {
		t.Fatalf("READ %d bytes: crc32c %08x read, %08x written", n, got, want)
	}
}
